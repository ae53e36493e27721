"""An MLP on scikit-learn's 8x8 digits as a seedgrid trainer (docs/user-guide.md, own code)."""

import torch
from sklearn.datasets import load_digits

from trainers import trainer


@trainer(
    metrics=("accuracy", "loss"),
    defaults={"hidden": 32, "lr": 0.2, "epochs": 10, "init_scale": 1.0},
)
def mlp_digits(config, run):
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16, dtype=torch.float32), torch.tensor(y)
    order = torch.randperm(len(y), generator=run.sources.data)  # the split varies with the seed
    train, test = order[:1400], order[1400:]
    model = torch.nn.Sequential(
        torch.nn.Linear(64, config.hidden), torch.nn.ReLU(), torch.nn.Linear(config.hidden, 10)
    )
    for weight in (model[0].weight, model[2].weight):
        torch.nn.init.normal_(
            weight, std=config.init_scale / weight.shape[1] ** 0.5, generator=run.sources.init
        )
    optimiser = torch.optim.SGD(model.parameters(), lr=config.lr)
    for epoch in range(config.epochs):
        for batch in train[torch.randperm(len(train), generator=run.sources.data)].split(64):
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        if run.log(epoch, {"loss": loss.item()}, epoch=epoch):  # True: cancelled or diverged
            break
    accuracy = (model(x[test]).argmax(dim=1) == y[test]).float().mean().item()
    return {"accuracy": accuracy, "loss": loss.item()}
