"""`ssl`: embedding norms in SimCLR, SimSiam and BYOL, with Cut-initialisation and GradScale
(paper 001, Draganov et al., ICML 2025, arXiv:2502.09252).

Specification: shared/papers/ssl-embedding-norms.md. Under a loss that sees z only through
z/||z||, the gradient is orthogonal to z, so plain steps only grow ||z|| and the angular step
shrinks as 1/||z||^2. Cut-initialisation (divide every parameter by c) starts from small norms;
GradScale (multiply the embedding's gradient by ||z||^p) undoes the 1/||z|| of the gradient.
The trainer logs embedding norms (overall, per class, in- vs out-of-distribution) and kNN
accuracy on backbone features; `ssl_sim` (trainers/ssl_sim.py) runs the paper's simulations.
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from scipy import stats as scipy_stats
from torch import nn

from trainers.base import Reporter, ResourceEstimate, RunResult, provenance
from trainers.data import DataConfig, ImageSplits, Split, prepare_splits
from trainers.data.augment import simclr_augment
from trainers.estimates import (
    FLOAT32,
    FLOAT64,
    INT64,
    Term,
    dataset_bytes,
    dataset_fields,
    dataset_shape,
    decode_phase,
    linear_parameters,
    peak,
    split_sizes,
    training_state_bytes,
)
from trainers.init import init_linear
from trainers.random_sources import random_sources
from trainers.runtime import deterministic_cpu, pick_device

MAX_CLASSES_LOGGED = 100
Method = Literal["simclr", "simsiam", "byol"]

# The official configs (spec section 3); None in a Config means "the method's default".
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "simclr": {"lr": 0.6, "weight_decay": 1e-6, "temperature": 0.5, "proj_dim": 128},
    "simsiam": {"lr": 0.2, "weight_decay": 5e-4, "temperature": 1.0, "proj_dim": 2048},
    "byol": {"lr": 0.2, "weight_decay": 5e-4, "temperature": 1.0, "proj_dim": 2048},
}


class SSLConfig(DataConfig):
    method: Method = "simclr"
    # Cut-initialisation: every parameter divided by cut at the start (1 = off; paper: 3).
    cut: float = Field(1.0, ge=1.0, le=1000.0)
    # GradScale power p: the embedding's gradient is multiplied by ||z||^p (0 = off; paper: 1).
    grad_scale_power: float = Field(0.0, ge=-4.0, le=4.0)
    # None: the method's default (SimCLR 1e-6, SimSiam/BYOL 5e-4).
    weight_decay: float | None = Field(None, ge=0.0, le=1.0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    # Peak learning rate; None: the method's default (SimCLR 0.6, SimSiam/BYOL 0.2).
    lr: float | None = Field(None, gt=0.0, le=100.0)
    # nominal: warm-up to lr, cosine to lr * 1e-3 (the intended schedule); squared: peak lr^2
    # and floor lr * 1e-3, the schedule the official code runs by accident (quirk 1).
    lr_schedule: Literal["nominal", "squared"] = "nominal"
    warmup_epochs: int = Field(10, ge=0, le=100_000)
    # None: SimCLR 0.5, SimSiam/BYOL 1.0.
    temperature: float | None = Field(None, gt=0.0, le=100.0)
    epochs: int = Field(512, ge=1, le=100_000)
    batch_size: int = Field(512, ge=2, le=65_536)
    # resnet18: the paper's CIFAR ResNet-18 (3x3 stem, no max-pool, zero-init residuals);
    # resnet_small: the same design with widths 16/32/64, one block per stage, for CPUs.
    backbone: Literal["resnet_small", "resnet18"] = "resnet18"
    # Projector width (None: SimCLR 128, SimSiam/BYOL 2048) and SimSiam/BYOL predictor hidden.
    proj_dim: int | None = Field(None, ge=2, le=16_384)
    pred_hidden: int = Field(512, ge=2, le=16_384)
    byol_tau: float = Field(0.99, ge=0.0, lt=1.0)
    # SimCLR view augmentation strength (0.5: the paper's jitter 0.4/0.4/0.4/0.1).
    view_strength: float = Field(0.5, ge=0.0, le=1.0)
    # The last held_out_classes classes are removed from training: their test images are the
    # out-of-distribution set for the norm comparison.
    held_out_classes: int = Field(0, ge=0, le=1000)
    # kNN monitor on backbone features: k, similarity temperature, how often (epochs).
    knn_k: int = Field(200, ge=1, le=10_000)
    knn_temperature: float = Field(0.1, gt=0.0, le=10.0)
    eval_every: int = Field(1, ge=1, le=100_000)
    # Epochs to reach this kNN accuracy are reported (null if never reached).
    target_knn_accuracy: float = Field(0.5, ge=0.0, le=1.0)
    # SSL uses its own views, not the shared crop pipeline; no validation split by default.
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    augment_strength: float = Field(0.0, ge=0.0, le=1.0)
    image_size: int | None = Field(32, ge=4, le=512)
    device: Literal["auto", "cpu", "cuda"] = "auto"

    def resolved(self, name: str) -> Any:
        value = getattr(self, name)
        return METHOD_DEFAULTS[self.method][name] if value is None else value


# ---------------------------------------------------------------------------------------------
# GradScale, Cut-initialisation and the losses


class GradScale(torch.autograd.Function):
    """Identity forward; backward multiplies each sample's gradient by ||z||^power (norm over
    the last dimension). Inserted on un-normalised embeddings just before normalisation.
    power = 0 is exactly the identity; power = 1 makes the gradient's magnitude independent of
    ||z||, undoing the 1/||z|| of a cosine loss (the paper's setting)."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, power: float) -> torch.Tensor:
        ctx.save_for_backward(z)
        ctx.power = power
        return z.view_as(z)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (z,) = ctx.saved_tensors
        return grad * z.norm(dim=-1, keepdim=True) ** ctx.power, None


def grad_scale(z: torch.Tensor, power: float) -> torch.Tensor:
    return GradScale.apply(z, power)


@torch.no_grad()
def cut_init(model: nn.Module, cut: float) -> None:
    """Cut-initialisation: divide every parameter tensor (weights, biases, norm-layer affine
    parameters) by `cut`, as the official `cut_weights` does. Buffers (BatchNorm running
    statistics) are not parameters and stay."""
    for p in model.parameters():
        p.div_(cut)


def decoupled_nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """The official one-directional, decoupled NT-Xent on L2-normalised z1, z2 (B x d):

        L = -(1/B) sum_i s_ii / t + (1/B) sum_i log sum_{j != i} exp(s_ij / t),  s = z1 z2^T

    (view-1 anchors against view-2 candidates; the positive is left out of the denominator)."""
    s = z1 @ z2.T / temperature
    eye = torch.eye(len(s), dtype=torch.bool, device=s.device)
    negatives = torch.logsumexp(s.masked_fill(eye, -math.inf), dim=1)
    return (negatives - s.diagonal()).mean()


def symmetric_attractive_loss(
    p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor, temperature: float
) -> torch.Tensor:
    """SimSiam/BYOL: L = -(1/2)[mean cos(sg z2, p1) + mean cos(sg z1, p2)] / t."""
    return -0.5 * (F.cosine_similarity(z2.detach(), p1).mean()
                   + F.cosine_similarity(z1.detach(), p2).mean()) / temperature


def negative_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """-mean_i cos(a_i, b_i), the loss whose gradient is orthogonal to a and b."""
    return -F.cosine_similarity(a, b, dim=-1).mean()


# ---------------------------------------------------------------------------------------------
# models


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem, no max-pool, global average pool; `features` wide."""

    def __init__(self, channels: int, widths: tuple[int, ...], blocks: tuple[int, ...]) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for stage, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            for index in range(count):
                layers.append(BasicBlock(cin, width, 2 if stage > 0 and index == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*layers)
        self.features = cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x)).mean(dim=(2, 3))


# Stage widths and blocks per stage of each backbone.
BACKBONES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "resnet18": ((64, 128, 256, 512), (2, 2, 2, 2)),
    "resnet_small": ((16, 32, 64), (1, 1, 1)),
}


def build_backbone(kind: str, channels: int) -> ResNet:
    return ResNet(channels, *BACKBONES[kind])


def build_projector(method: str, features: int, dim: int) -> nn.Sequential:
    if method == "simclr":  # Linear-ReLU-Linear, no BN
        return nn.Sequential(nn.Linear(features, dim), nn.ReLU(), nn.Linear(dim, dim))
    return nn.Sequential(  # three Linear layers, BN after each (the last included)
        nn.Linear(features, dim), nn.BatchNorm1d(dim), nn.ReLU(),
        nn.Linear(dim, dim), nn.BatchNorm1d(dim), nn.ReLU(),
        nn.Linear(dim, dim), nn.BatchNorm1d(dim),
    )


def build_predictor(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, dim))


def init_parameters(model: nn.Module, generator: torch.Generator) -> None:
    """torchvision's ResNet init (kaiming-normal fan_out convs, BN 1/0, zero-init of each
    block's last BN) and PyTorch's default Linear init, drawn from the run's `init` source."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu",
                                    generator=generator)
        elif isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            init_linear(module, generator)
    for module in model.modules():
        if isinstance(module, BasicBlock):
            nn.init.zeros_(module.bn2.weight)


class SSLModel(nn.Module):
    def __init__(self, config: SSLConfig, channels: int, generator: torch.Generator) -> None:
        super().__init__()
        self.method = config.method
        self.power = config.grad_scale_power
        dim = config.resolved("proj_dim")
        self.backbone = build_backbone(config.backbone, channels)
        self.projector = build_projector(config.method, self.backbone.features, dim)
        self.predictor = (build_predictor(dim, config.pred_hidden)
                          if config.method != "simclr" else None)
        init_parameters(self, generator)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Backbone features h and un-normalised projector output z."""
        h = self.backbone(x)
        return h, self.projector(h)


def ssl_loss(
    model: SSLModel,
    target: SSLModel | None,
    v1: torch.Tensor,
    v2: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The method's loss on two views, with GradScale on the un-normalised embeddings (SimCLR:
    both projector outputs; SimSiam/BYOL: the predictor outputs). Returns (loss, z of view 1)."""
    _, z1 = model.embed(v1)
    _, z2 = model.embed(v2)
    if model.method == "simclr":
        a = F.normalize(grad_scale(z1, model.power), dim=1)
        b = F.normalize(grad_scale(z2, model.power), dim=1)
        return decoupled_nt_xent(a, b, temperature), z1
    assert model.predictor is not None
    p1 = grad_scale(model.predictor(z1), model.power)
    p2 = grad_scale(model.predictor(z2), model.power)
    if target is not None:  # BYOL: targets from the EMA network
        with torch.no_grad():
            _, z1 = target.embed(v1)
            _, z2 = target.embed(v2)
    return symmetric_attractive_loss(p1, p2, z1, z2, temperature), z1


def learning_rate(config: SSLConfig, step: int, total_steps: int, steps_per_epoch: int) -> float:
    """Linear warm-up over warmup_epochs, then cosine decay to lr * 1e-3 at the last step."""
    lr = config.resolved("lr")
    peak = lr**2 if config.lr_schedule == "squared" else lr
    floor = lr * 1e-3
    warmup = config.warmup_epochs * steps_per_epoch
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------------------------
# evaluation


@torch.no_grad()
def knn_accuracy(
    bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor,
    query_labels: torch.Tensor, num_classes: int, k: int = 200, temperature: float = 0.1,
) -> float:
    """Weighted kNN top-1 (the paper's monitor): cosine similarity on L2-normalised features,
    the k most similar bank items vote with weight exp(sim / temperature)."""
    bank = F.normalize(bank, dim=1)
    queries = F.normalize(queries, dim=1)
    k = min(k, len(bank))
    correct = 0
    for start in range(0, len(queries), 1024):
        sim = queries[start : start + 1024] @ bank.T
        weights, index = sim.topk(k, dim=1)
        votes = torch.zeros(len(sim), num_classes, device=sim.device, dtype=sim.dtype)
        votes.scatter_add_(1, bank_labels[index], (weights / temperature).exp())
        correct += int((votes.argmax(1) == query_labels[start : start + 1024]).sum())
    return correct / max(len(queries), 1)


def knn_accuracy_by_norm(
    embeddings: np.ndarray, labels: np.ndarray, min_count: int = 10, bin_width: float = 0.05,
    k: int = 10,
) -> list[dict[str, float]]:
    """The paper's "kNN accuracy vs norm": min-max normalise the norms to [0, 1], bin them in
    steps of 0.05; per bin the accuracy of a k = 10 kNN (sklearn) fit on the L2-normalised
    embeddings and evaluated on the same samples; bins with fewer than min_count dropped."""
    from sklearn.neighbors import KNeighborsClassifier

    norms = np.linalg.norm(embeddings, axis=1)
    span = norms.max() - norms.min()
    scaled = (norms - norms.min()) / span if span > 0 else np.zeros_like(norms)
    unit = embeddings / np.maximum(norms[:, None], 1e-12)
    knn = KNeighborsClassifier(n_neighbors=min(k, len(unit))).fit(unit, labels)
    hit = knn.predict(unit) == labels
    bins = np.minimum((scaled / bin_width).astype(int), int(round(1 / bin_width)) - 1)
    out = []
    for b in np.unique(bins):
        members = bins == b
        if members.sum() >= min_count:
            out.append({"bin_low": float(b * bin_width), "n": int(members.sum()),
                        "accuracy": float(hit[members].mean())})
    return out


# ---------------------------------------------------------------------------------------------
# the trainer


def _metric_names() -> tuple[str, ...]:
    return (
        "knn_accuracy", "knn_accuracy_clean", "loss", "lr", "norm_mean", "norm_q10", "norm_q50",
        "norm_q90", "norm_test_mean", "norm_heldout_mean", "norm_heldout_ratio",
        "knn_norm_spearman", "epochs_to_target",
        *(f"norm_class{c}" for c in range(MAX_CLASSES_LOGGED)),
    )


class SSLTrainer:
    name: ClassVar[str] = "ssl"
    description: ClassVar[str] = (
        "SimCLR / SimSiam / BYOL with Cut-initialisation and GradScale; embedding norms "
        "(overall, per class, held-out classes), kNN accuracy and kNN accuracy by norm."
    )
    paper: ClassVar[str] = (
        "Draganov et al., On the Importance of Embedding Norms in Self-Supervised Learning, "
        "ICML 2025, arXiv:2502.09252"
    )
    Config: ClassVar[type[SSLConfig]] = SSLConfig
    metrics: ClassVar[tuple[str, ...]] = _metric_names()
    diagnostics: ClassVar[tuple[str, ...]] = ("knn_by_norm", "norm_per_class")
    primary_metric: ClassVar[str] = "knn_accuracy"

    def estimate(self, config: SSLConfig) -> ResourceEstimate:
        return ssl_estimate(config)

    def run(self, config: SSLConfig, seed: int, reporter: Reporter) -> RunResult:
        device = pick_device(config.device)
        if device.type == "cpu":
            deterministic_cpu()
        sources = random_sources(seed)
        splits = prepare_splits(config, sources)
        kept = _in_distribution(splits, config.held_out_classes)
        channels = splits.data.image_shape[0]
        model = SSLModel(config, channels, sources.init).to(device)
        cut_init(model, config.cut)
        target = copy.deepcopy(model) if config.method == "byol" else None
        if target is not None:
            target.requires_grad_(False)
        optimizer = _optimizer(config, model)
        temperature = config.resolved("temperature")
        train_positions = kept["train"]
        steps_per_epoch = max(1, math.ceil(len(train_positions) / config.batch_size))
        total_steps = steps_per_epoch * config.epochs
        step = 0
        epochs_to_target: int | None = None
        last: dict[str, float] = {}
        stopped = False
        for epoch in range(config.epochs):
            model.train()
            total, count = 0.0, 0
            order = train_positions[torch.randperm(len(train_positions),
                                                   generator=sources.data)]
            for start in range(0, len(order), config.batch_size):
                positions = order[start : start + config.batch_size]
                if len(positions) < 2:
                    continue
                x, _ = _raw(splits, "train", positions, device)
                v1 = simclr_augment(x, sources.augment, hflip=splits.data.hflip,
                                    strength=config.view_strength)
                v2 = simclr_augment(x, sources.augment, hflip=splits.data.hflip,
                                    strength=config.view_strength)
                lr = learning_rate(config, step, total_steps, steps_per_epoch)
                for group in optimizer.param_groups:
                    group["lr"] = group.get("fixed_lr") or lr
                loss, _ = ssl_loss(model, target, v1, v2, temperature)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if target is not None:
                    _ema(target, model, config.byol_tau)
                total += float(loss.detach()) * len(positions)
                count += len(positions)
                step += 1
            point = {"loss": total / max(count, 1), "lr": lr}
            if not math.isfinite(point["loss"]):
                last = point
                reporter.log(step, point, epoch=epoch)
                break
            if (epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1:
                point.update(_evaluate_epoch(config, model, splits, kept, sources, device))
                if epochs_to_target is None and point["knn_accuracy"] >= \
                        config.target_knn_accuracy:
                    epochs_to_target = epoch + 1
            last = point
            reporter.log(step, point, epoch=epoch)
            if reporter.should_stop():
                stopped = epoch != config.epochs - 1
                break
        final, diagnostics = _final_evaluation(config, model, splits, kept, device)
        metrics = {**last, **final}
        if epochs_to_target is not None:
            metrics["epochs_to_target"] = float(epochs_to_target)
        diagnostics.update({
            "epochs_to_target": epochs_to_target,
            "resolved": {k: config.resolved(k) for k in METHOD_DEFAULTS[config.method]},
            "n_train": len(train_positions),
            "n_test_in_distribution": len(kept["test"]),
            "n_test_held_out": len(kept["held_out"]),
        })
        return RunResult(metrics=metrics, diagnostics=diagnostics,
                         provenance=provenance(device, seed, config), finished=not stopped)


def _in_distribution(splits: ImageSplits, held_out: int) -> dict[str, torch.Tensor]:
    """Positions within the train and test splits of the kept classes, and of held-out test."""
    k = splits.num_classes
    if held_out >= k:
        raise ValueError(f"held_out_classes ({held_out}) must be below the number of classes "
                         f"({k})")
    limit = k - held_out
    train_labels, test_labels = splits.labels("train"), splits.labels("test")
    return {
        "train": (train_labels < limit).nonzero().flatten(),
        "test": (test_labels < limit).nonzero().flatten(),
        "held_out": (test_labels >= limit).nonzero().flatten(),
    }


def _raw(splits: ImageSplits, split: Split, positions: torch.Tensor,
         device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[0, 1] images without normalisation (the paper's SSL pipeline uses ToTensor only)."""
    return splits.images(split, positions, device=device, normalized=False)


def _optimizer(config: SSLConfig, model: SSLModel) -> torch.optim.Optimizer:
    wd = config.resolved("weight_decay")
    lr = config.resolved("lr")
    encoder = [p for n, p in model.named_parameters() if not n.startswith("predictor.")]
    groups: list[dict[str, Any]] = [{"params": encoder}]
    if model.predictor is not None:  # SimSiam: the predictor keeps a constant lr
        groups.append({"params": list(model.predictor.parameters()),
                       "fixed_lr": lr if config.method == "simsiam" else None})
    if config.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr, weight_decay=wd)
    return torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=wd,
                           nesterov=config.method != "simclr")


@torch.no_grad()
def _ema(target: nn.Module, online: nn.Module, tau: float) -> None:
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.mul_(tau).add_(o, alpha=1 - tau)


@torch.no_grad()
def _embed_all(model: SSLModel, splits: ImageSplits, split: Split, positions: torch.Tensor,
               device: torch.device, augment_generator: torch.Generator | None = None,
               batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    model.eval()
    hs, zs, ys = [], [], []
    for start in range(0, len(positions), batch_size):
        x, y = _raw(splits, split, positions[start : start + batch_size], device)
        if augment_generator is not None:
            x = simclr_augment(x, augment_generator, hflip=splits.data.hflip)
        h, z = model.embed(x)
        hs.append(h)
        zs.append(z)
        ys.append(y)
    return torch.cat(hs), torch.cat(zs), torch.cat(ys)


def _evaluate_epoch(config: SSLConfig, model: SSLModel, splits: ImageSplits,
                    kept: dict[str, torch.Tensor], sources: Any,
                    device: torch.device) -> dict[str, float]:
    """Per-epoch curves: norms of un-augmented train embeddings (quantiles, per class) and kNN
    accuracy with an augmented-image bank (the official monitor, quirk 6)."""
    _, z, y = _embed_all(model, splits, "train", kept["train"], device)
    norms = z.norm(dim=1).double()
    q10, q50, q90 = torch.quantile(norms, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64,
                                                      device=norms.device)).tolist()
    out = {"norm_mean": float(norms.mean()), "norm_q10": q10, "norm_q50": q50, "norm_q90": q90}
    for c in range(min(splits.num_classes - config.held_out_classes, MAX_CLASSES_LOGGED)):
        members = norms[y == c]
        if len(members):
            out[f"norm_class{c}"] = float(members.mean())
    bank_h, _, bank_y = _embed_all(model, splits, "train", kept["train"], device,
                                   augment_generator=sources.augment)
    test_h, _, test_y = _embed_all(model, splits, "test", kept["test"], device)
    out["knn_accuracy"] = knn_accuracy(bank_h, bank_y, test_h, test_y, splits.num_classes,
                                       config.knn_k, config.knn_temperature)
    return out


def _final_evaluation(config: SSLConfig, model: SSLModel, splits: ImageSplits,
                      kept: dict[str, torch.Tensor],
                      device: torch.device) -> tuple[dict[str, float], dict[str, Any]]:
    train_h, train_z, train_y = _embed_all(model, splits, "train", kept["train"], device)
    test_h, test_z, test_y = _embed_all(model, splits, "test", kept["test"], device)
    metrics: dict[str, float] = {
        "knn_accuracy_clean": knn_accuracy(train_h, train_y, test_h, test_y, splits.num_classes,
                                           config.knn_k, config.knn_temperature),
        "norm_test_mean": float(test_z.norm(dim=1).mean()),
    }
    if len(kept["held_out"]):
        _, held_z, _ = _embed_all(model, splits, "test", kept["held_out"], device)
        metrics["norm_heldout_mean"] = float(held_z.norm(dim=1).mean())
        metrics["norm_heldout_ratio"] = metrics["norm_heldout_mean"] / metrics["norm_test_mean"]
    by_norm = knn_accuracy_by_norm(train_z.double().cpu().numpy(), train_y.cpu().numpy())
    if len(by_norm) >= 3:
        rho = scipy_stats.spearmanr([b["bin_low"] for b in by_norm],
                                    [b["accuracy"] for b in by_norm]).statistic
        if math.isfinite(rho):
            metrics["knn_norm_spearman"] = float(rho)
    norms = train_z.norm(dim=1)
    per_class = [float(norms[train_y == c].mean()) if (train_y == c).any() else None
                 for c in range(splits.num_classes - config.held_out_classes)]
    return metrics, {"knn_by_norm": by_norm, "norm_per_class": per_class}


# ---------------------------------------------------------------------------------------------
# resource estimate (pure arithmetic on the config)

# Batch of `_embed_all` and query chunk of `knn_accuracy`.
EMBED_BATCH = 1024
# Float copies of a batch alive while `simclr_augment` makes a view (input, crop, jitter
# candidates and their `where`) and held during a step (the batch and its two views).
VIEW_COPIES = 6 + 3
# Activations of the widest layer alive at once in a forward pass without a graph (a block's
# input, its two convolutions' and norms' outputs).
NO_GRAD_LAYERS = 5
# Rows of queries scikit-learn's kNN compares with the bank at once (its pairwise-distance
# chunks; counted against the whole bank, an upper bound).
SKLEARN_KNN_CHUNK = 256


def conv_output_side(side: int, stride: int) -> int:
    """A 3 x 3 (or 1 x 1) convolution with padding 1 (0) and stride s: ceil(S / s)."""
    return -(-side // stride)


def resnet_parameters(backbone: str, channels: int) -> int:
    """The CIFAR ResNet: 3 x 3 stem conv (9 C w0) and BatchNorm (2 w0); each BasicBlock
    cin -> cout two 3 x 3 convs (9 cin cout + 9 cout^2) and BatchNorms (4 cout), and where it
    changes width or stride a 1 x 1 shortcut conv and BatchNorm (cin cout + 2 cout)."""
    widths, blocks = BACKBONES[backbone]
    total = 9 * channels * widths[0] + 2 * widths[0]
    cin = widths[0]
    for stage, (cout, count) in enumerate(zip(widths, blocks, strict=True)):
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            total += 9 * cin * cout + 9 * cout * cout + 4 * cout
            if stride != 1 or cin != cout:
                total += cin * cout + 2 * cout
            cin = cout
    return total


def resnet_activations(backbone: str, side: int) -> tuple[int, int]:
    """Per sample: floats kept for backward (stem conv, BatchNorm and ReLU outputs, 3 w0 S^2;
    each block's conv, BatchNorm, ReLU, conv, BatchNorm, sum and ReLU outputs, 7 cout s^2,
    and the shortcut's conv and BatchNorm, 2 cout s^2, where it has one) and the largest
    single activation (w0 S^2, the stem's)."""
    widths, blocks = BACKBONES[backbone]
    total = 3 * widths[0] * side * side
    largest = widths[0] * side * side
    cin, s = widths[0], side
    for stage, (cout, count) in enumerate(zip(widths, blocks, strict=True)):
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            s = conv_output_side(s, stride)
            shortcut = stride != 1 or cin != cout
            total += (9 if shortcut else 7) * cout * s * s
            largest = max(largest, cout * s * s)
            cin = cout
    return total, largest


def head_parameters(config: SSLConfig, features: int) -> int:
    """Projector: SimCLR Linear(F -> p), Linear(p -> p); SimSiam/BYOL three Linear layers
    with BatchNorm after each (2 p each). Predictor (SimSiam/BYOL): Linear(p -> q),
    BatchNorm(q), Linear(q -> p)."""
    p, q = config.resolved("proj_dim"), config.pred_hidden
    if config.method == "simclr":
        return linear_parameters(features, p) + linear_parameters(p, p)
    projector = linear_parameters(features, p) + 2 * linear_parameters(p, p) + 3 * 2 * p
    predictor = linear_parameters(p, q) + 2 * q + linear_parameters(q, p)
    return projector + predictor


def head_activation_floats(config: SSLConfig) -> int:
    """Per sample and view: SimCLR projector Linear, ReLU, Linear outputs and the normalised
    embedding (4 p); SimSiam/BYOL projector Linear, BatchNorm (x 3) and ReLU (x 2) outputs
    (8 p), predictor Linear, BatchNorm, ReLU (3 q) and output and its normalisation (2 p)."""
    p, q = config.resolved("proj_dim"), config.pred_hidden
    if config.method == "simclr":
        return 4 * p
    return 10 * p + 3 * q


def ssl_parameters(config: SSLConfig, channels: int) -> int:
    """Backbone, projector and (SimSiam/BYOL) predictor."""
    features = BACKBONES[config.backbone][0][-1]
    return resnet_parameters(config.backbone, channels) + head_parameters(config, features)


def knn_eval_bytes(bank: int, queries: int, k: int, classes: int) -> int:
    """`knn_accuracy`'s working set per chunk of q queries: similarities (q x N), top-k values
    and indices, gathered labels and weights (q x k) and votes (q x C)."""
    q = min(EMBED_BATCH, queries)
    k = min(k, bank)
    return FLOAT32 * q * bank + (2 * FLOAT32 + 2 * INT64) * q * k + FLOAT32 * q * classes


def ssl_logged_points(config: SSLConfig) -> int:
    """Per epoch loss and lr; per evaluated epoch (every eval_every-th and the last:
    ceil(epochs / eval_every)) norm_mean, three norm quantiles, knn_accuracy and norm_class{c}
    of each in-distribution class (at most MAX_CLASSES_LOGGED). An upper bound: a class
    without training images logs no norm, a non-finite loss ends the run."""
    classes = dataset_shape(config).num_classes - config.held_out_classes
    logged_classes = max(0, min(classes, MAX_CLASSES_LOGGED))
    evaluated = -(-config.epochs // config.eval_every)
    return 2 * config.epochs + evaluated * (5 + logged_classes)


def ssl_estimate(config: SSLConfig) -> ResourceEstimate:
    """Memory: the decoded dataset; parameters, gradients, optimiser buffers (SGD momentum 1,
    Adam 2 per parameter) and BYOL's target network; then the largest of a training step and
    an evaluation. A step of B images keeps the batch, its two views and the augmentation's
    copies, both views' backbone and head activations (`resnet_activations`), backward's
    gradient buffers (twice the largest activation) and the loss's B x B matrices. An
    evaluation embeds the training set twice (norms and the kNN bank) and the test set, each
    doubled while its batches are joined, runs a forward pass of EMBED_BATCH images without a
    graph, the kNN chunks and scikit-learn's float64 copies for kNN accuracy by norm."""
    shape = dataset_shape(config)
    splits = split_sizes(config, shape)
    side, channels = shape.side, shape.channels
    n_train, n_test = splits.train, splits.test
    batch = min(config.batch_size, n_train)
    parameters = ssl_parameters(config, channels)
    features = BACKBONES[config.backbone][0][-1]
    dim = config.resolved("proj_dim")
    kept, largest = resnet_activations(config.backbone, side)
    data = Term(dataset_bytes(shape), dataset_fields(config))
    state = Term(training_state_bytes(parameters, config.optimizer)
                 + (FLOAT32 * parameters if config.method == "byol" else 0),
                 ("backbone", "proj_dim", "pred_hidden"))
    act_fields = ("batch_size", "backbone", "image_size")
    image = shape.image_elements
    train = [
        data, state,
        Term(FLOAT32 * VIEW_COPIES * batch * image, ("batch_size", "image_size")),
        Term(FLOAT32 * 2 * batch * (kept + head_activation_floats(config)), act_fields),
        Term(FLOAT32 * 2 * 2 * batch * largest, act_fields),
        Term(FLOAT32 * 5 * batch * batch, ("batch_size",)),
    ]
    eval_batch = min(EMBED_BATCH, max(n_train, n_test))
    evaluation = [
        data, state,
        Term(FLOAT32 * 2 * (2 * n_train + n_test) * (features + dim),
             ("dataset", "train_size", "backbone", "proj_dim")),
        Term(FLOAT32 * eval_batch * (VIEW_COPIES * image + NO_GRAD_LAYERS * largest),
             ("backbone", "image_size")),
        Term(knn_eval_bytes(n_train, n_test, config.knn_k, shape.num_classes),
             ("dataset", "train_size")),
        Term(FLOAT64 * (3 * n_train * dim + SKLEARN_KNN_CHUNK * n_train),
             ("dataset", "train_size", "proj_dim")),
    ]
    memory, fields = peak([decode_phase(config, shape), train, evaluation])
    return ResourceEstimate(memory, fields, ssl_logged_points(config),
                            ("epochs", "eval_every", "dataset", "held_out_classes"))
