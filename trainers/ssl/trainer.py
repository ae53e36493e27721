"""The `ssl` trainer: the method's loss on two views, the optimiser and its schedule, BYOL's
EMA target, and the training loop that evaluates every eval_every epochs."""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from trainers.base import ResourceEstimate
from trainers.data import ImageSplits, prepare_splits
from trainers.losses.byol import byol_loss
from trainers.losses.nt_xent import decoupled_nt_xent
from trainers.losses.simsiam import symmetric_attractive_loss
from trainers.precision import PrecisionScope, precision_scope
from trainers.runtime import RunContext, TrainerBase, TrainOutput
from trainers.ssl.config import METHOD_DEFAULTS, SSLConfig
from trainers.ssl.data import in_distribution, raw_images, view
from trainers.ssl.estimate import ssl_estimate
from trainers.ssl.evaluate import (
    MAX_CLASSES_LOGGED,
    EvaluationStopped,
    evaluate_epoch,
    final_evaluation,
)
from trainers.ssl.model import SSLModel, cut_init, grad_scale


def ssl_loss(
    model: SSLModel,
    target: SSLModel | None,
    v1: torch.Tensor,
    v2: torch.Tensor,
    temperature: float,
    precision: PrecisionScope | None = None,
) -> torch.Tensor:
    """The method's loss on two views, with GradScale on the un-normalised embeddings (SimCLR:
    both projector outputs; SimSiam/BYOL: the predictor outputs). Under a `precision` scope the
    networks run under its autocast, GradScale, the normalisation and the loss in float32."""
    forward = precision.autocast if precision is not None else contextlib.nullcontext
    exact = precision.float32 if precision is not None else contextlib.nullcontext
    with forward():
        _, z1 = model.embed(v1)
        _, z2 = model.embed(v2)
    if model.method == "simclr":
        with exact():
            a = F.normalize(grad_scale(z1.float(), model.power), dim=1)
            b = F.normalize(grad_scale(z2.float(), model.power), dim=1)
            return decoupled_nt_xent(a, b, temperature)
    assert model.predictor is not None
    with forward():
        q1, q2 = model.predictor(z1), model.predictor(z2)
    with exact():
        p1 = grad_scale(q1.float(), model.power)
        p2 = grad_scale(q2.float(), model.power)
        if target is None:
            return symmetric_attractive_loss(p1, p2, z1.float(), z2.float(), temperature)
    with torch.no_grad(), forward():  # BYOL: the targets come from the EMA network
        _, target_z1 = target.embed(v1)
        _, target_z2 = target.embed(v2)
    with exact():
        return byol_loss(p1, p2, target_z1.float(), target_z2.float(), temperature)


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


def build_optimizer(config: SSLConfig, model: SSLModel) -> torch.optim.Optimizer:
    wd = config.resolved("weight_decay")
    lr = config.resolved("lr")
    encoder = [p for n, p in model.named_parameters() if not n.startswith("predictor.")]
    groups: list[dict[str, Any]] = [{"params": encoder}]
    if model.predictor is not None:  # SimSiam: the predictor keeps a constant lr
        groups.append(
            {
                "params": list(model.predictor.parameters()),
                "fixed_lr": lr if config.method == "simsiam" else None,
            }
        )
    if config.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr, weight_decay=wd)
    return torch.optim.SGD(
        groups, lr=lr, momentum=0.9, weight_decay=wd, nesterov=config.method != "simclr"
    )


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.mul_(tau).add_(o, alpha=1 - tau)


class SSLTrainer(TrainerBase):
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
    metrics: ClassVar[tuple[str, ...]] = (
        "knn_accuracy",
        "knn_accuracy_clean",
        "loss",
        "lr",
        "norm_mean",
        "norm_q10",
        "norm_q50",
        "norm_q90",
        "norm_test_mean",
        "norm_heldout_mean",
        "norm_heldout_ratio",
        "knn_norm_spearman",
        "epochs_to_target",
        *(f"norm_class{c}" for c in range(MAX_CLASSES_LOGGED)),
    )
    diagnostics: ClassVar[tuple[str, ...]] = ("knn_by_norm", "norm_per_class")
    primary_metric: ClassVar[str] = "knn_accuracy"
    # The epoch's mean training loss, logged every epoch.
    divergence_metric: ClassVar[str] = "loss"
    metric_bounds: ClassVar[dict[str, tuple[float, float]]] = {
        "knn_accuracy": (0.0, 1.0),
        "knn_accuracy_clean": (0.0, 1.0),
        "knn_norm_spearman": (-1.0, 1.0),
    }

    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]:
        """Both kNN accuracies classify the in-distribution test images
        (`n_test_in_distribution` of the run: held-out classes excluded)."""
        n_test = diagnostics.get("n_test_in_distribution")
        if not isinstance(n_test, int) or n_test < 1:
            return {}
        return {"knn_accuracy": n_test, "knn_accuracy_clean": n_test}

    def estimate(self, config: SSLConfig) -> ResourceEstimate:
        return ssl_estimate(config)

    def train(self, config: SSLConfig, run: RunContext) -> TrainOutput:
        sources, device = run.sources, run.device
        splits = prepare_splits(config, sources)
        kept = in_distribution(splits, config.held_out_classes)
        model = SSLModel(config, splits.data.image_shape[0], sources.init).to(device)
        # bf16 on a GPU: the convolutions' fast kernels want channels-last activations
        channels_last = config.precision == "bf16" and device.type == "cuda"
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        cut_init(model, config.cut)
        run.track(model)
        target = copy.deepcopy(model) if config.method == "byol" else None
        if target is not None:
            target.requires_grad_(False)
            run.track(target)
        with precision_scope(config.precision, device) as precision:
            return self._train(config, run, splits, kept, model, target, precision, channels_last)

    def _train(
        self,
        config: SSLConfig,
        run: RunContext,
        splits: ImageSplits,
        kept: dict[str, torch.Tensor],
        model: SSLModel,
        target: SSLModel | None,
        precision: PrecisionScope,
        channels_last: bool,
    ) -> TrainOutput:
        sources, device = run.sources, run.device
        optimizer = build_optimizer(config, model)
        temperature = config.resolved("temperature")
        train_positions = kept["train"]
        steps_per_epoch = max(1, math.ceil(len(train_positions) / config.batch_size))
        total_steps = steps_per_epoch * config.epochs
        step = 0
        epochs_to_target: int | None = None
        last: dict[str, float] = {}
        for epoch in range(config.epochs):
            model.train()
            # the epoch's loss sum stays on the device (float64, as a Python float would add
            # the float32 losses): read once per epoch, not once per step
            total = torch.zeros((), dtype=torch.float64, device=device)
            count = 0
            order = train_positions[torch.randperm(len(train_positions), generator=sources.data)]
            for start in range(0, len(order), config.batch_size):
                positions = order[start : start + config.batch_size]
                if len(positions) < 2:
                    continue
                x, _ = raw_images(splits, "train", positions, device)
                v1 = view(x, sources.augment, config, splits)
                v2 = view(x, sources.augment, config, splits)
                if channels_last:
                    v1 = v1.contiguous(memory_format=torch.channels_last)
                    v2 = v2.contiguous(memory_format=torch.channels_last)
                lr = learning_rate(config, step, total_steps, steps_per_epoch)
                for group in optimizer.param_groups:
                    group["lr"] = group.get("fixed_lr") or lr
                loss = ssl_loss(model, target, v1, v2, temperature, precision)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if target is not None:
                    ema_update(target, model, config.byol_tau)
                total += loss.detach().double() * len(positions)
                count += len(positions)
                step += 1
                if run.should_stop():
                    break
            if run.stopped:
                break
            point = {"loss": float(total) / max(count, 1), "lr": lr}
            evaluated = (epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1
            # A diverged epoch is logged without evaluation: its embeddings are not finite.
            if evaluated and math.isfinite(point["loss"]):
                try:
                    point.update(
                        evaluate_epoch(
                            config, model, splits, kept, device, sources.evaluate, run.should_stop
                        )
                    )
                except EvaluationStopped:
                    break
                if epochs_to_target is None and point["knn_accuracy"] >= config.target_knn_accuracy:
                    epochs_to_target = epoch + 1
            last = point
            if run.log(step, point, epoch=epoch):
                break
        metrics = dict(last)
        diagnostics: dict[str, Any] = {
            "epochs_to_target": epochs_to_target,
            "resolved": {k: config.resolved(k) for k in METHOD_DEFAULTS[config.method]},
            "n_train": len(train_positions),
            "n_test_in_distribution": len(kept["test"]),
            "n_test_held_out": len(kept["held_out"]),
        }
        # A stopped run returns what it has: a cancelled one is discarded, a diverged one keeps
        # its last finite point.
        if not run.stopped:
            with contextlib.suppress(EvaluationStopped):
                final, final_diagnostics = final_evaluation(
                    config, model, splits, kept, device, run.should_stop
                )
                metrics.update(final)
                diagnostics.update(final_diagnostics)
        if epochs_to_target is not None:
            metrics["epochs_to_target"] = float(epochs_to_target)
        return TrainOutput(metrics=metrics, diagnostics=diagnostics)
