"""The `cff` trainer: layer-local contrastive training of the encoder (stage 1), the linear head
on the frozen encoder (stage 2) and the test evaluation.

Every stage-1 step and every head step checks the run's stop; so does every batch of the
validation and test passes. Validation draws its augmented views from the run's `evaluate`
source, so that selecting checkpoints by validation never changes what the run trains.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from trainers.base import ResourceEstimate, RunWarning, binomial_noise_floor
from trainers.cff.config import MAX_DEPTH, CFFConfig
from trainers.cff.estimate import EVAL_BATCH, cff_estimate
from trainers.cff.model import build_head, build_layers, encode, patchify
from trainers.data import ImageSplits, Split, load_count, prepare_splits
from trainers.losses.supcon_margin import (
    clamp_activation_rate,
    expected_positives_per_anchor,
    pair_similarities,
    supcon_margin_loss,
    supcon_margin_loss_from_similarities,
)
from trainers.precision import PrecisionScope, precision_scope
from trainers.runtime import RunContext, TrainerBase, TrainOutput

# seedgrid's screening threshold for the early layer-0 clamp activation rate (the paper gives
# none; CIFAR-10, where clamping raised the variance 5.9x, had 60.7%).
CAR_WARNING_THRESHOLD = 0.5


def _metric_names() -> tuple[str, ...]:
    per_layer = ("car_layer", "grad_norm_layer", "loss_layer", "val_loss_layer")
    return (
        "test_accuracy",
        "test_top5_accuracy",
        "loss",
        "test_accuracy_noise_floor",
        "car_layer0_early",
        "positives_per_anchor",
        "head_loss",
        "head_val_loss",
        "head_val_accuracy",
        *(f"{p}{i}" for p in per_layer for i in range(MAX_DEPTH)),
    )


class CFFTrainer(TrainerBase):
    name: ClassVar[str] = "cff"
    description: ClassVar[str] = (
        "Contrastive Forward-Forward ViT, layer-local supervised contrastive loss with a "
        "positive-pair margin that is clamped, subtracted or absent; clamp activation rates and "
        "per-layer gradient norms; linear-head test accuracy."
    )
    paper: ClassVar[str] = (
        "Steier, When Does Margin Clamping Affect Training Variance? arXiv:2603.00951 (2026)"
    )
    Config: ClassVar[type[CFFConfig]] = CFFConfig
    metrics: ClassVar[tuple[str, ...]] = _metric_names()
    diagnostics: ClassVar[tuple[str, ...]] = ("final_grad_norms", "car_layer0_early", "margins")
    primary_metric: ClassVar[str] = "test_accuracy"
    # Stage 1's summed layer objectives: non-finite as soon as one layer's loss is.
    divergence_metric: ClassVar[str] = "loss"
    metric_bounds: ClassVar[dict[str, tuple[float, float]]] = {
        name: (0.0, 1.0)
        for name in ("test_accuracy", "test_top5_accuracy", "head_val_accuracy", "car_layer0_early")
    }
    # The seeds of a task train as one stacked computation (trainers.cff.batched).
    batched: ClassVar[bool] = True

    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]:
        """Both test accuracies average the un-augmented test split (`n_test` of the run)."""
        n_test = diagnostics.get("n_test")
        if not isinstance(n_test, int) or n_test < 1:
            return {}
        return {"test_accuracy": n_test, "test_top5_accuracy": n_test}

    def estimate(self, config: CFFConfig) -> ResourceEstimate:
        return cff_estimate(config)

    def train(self, config: CFFConfig, run: RunContext) -> TrainOutput:
        """Load the data (failing before any training if it is missing), then stages 1 and 2
        and the test evaluation."""
        splits, layers, head, dataset_cached = set_up_run(config, run)
        with precision_scope(config.precision, run.device) as precision:
            stage1 = _Stage1(config, splits, layers, run, precision)
            stage1.train()
            head_stats = _train_head(
                config, splits, layers, head, run, stage1.record.step, precision
            )
            evaluation = evaluate(
                layers, head, splits, config.patch, run.device, run.should_stop, precision=precision
            )
        return run_output(config, splits, stage1.record, head_stats, evaluation, dataset_cached)

    def train_seeds(self, config: CFFConfig, runs: list[RunContext]) -> list[TrainOutput]:
        """The seeds of a task as one computation: stacked models under torch.func.vmap
        (trainers.cff.batched)."""
        from trainers.cff.batched import train_seeds  # it builds on this module

        return train_seeds(self, config, runs)


def set_up_run(
    config: CFFConfig, run: RunContext
) -> tuple[ImageSplits, nn.ModuleList, nn.Sequential, bool]:
    """A run's splits (from its `data` source), its layers and head (from its `init` source, in
    that order) on its device and tracked, and whether the dataset was already decoded."""
    decoded_before = load_count()
    splits = prepare_splits(config, run.sources)
    dataset_cached = load_count() == decoded_before
    channels, side, _ = splits.data.image_shape
    layers = build_layers(config, channels, side, run.sources.init).to(run.device)
    head = build_head(config.width, splits.num_classes, run.sources.init).to(run.device)
    run.track(layers, head)
    return splits, layers, head, dataset_cached


def run_output(
    config: CFFConfig,
    splits: ImageSplits,
    record: Stage1Record,
    head_stats: dict[str, float],
    evaluation: dict[str, float] | None,
    dataset_cached: bool,
) -> TrainOutput:
    """A run's metrics, diagnostics and warnings from what its stages kept."""
    metrics = {**record.summary(), **head_stats, **(evaluation or {})}
    diagnostics: dict[str, Any] = {
        "margins": config.margins(),
        "final_grad_norms": record.final("grad_norm"),
        "final_car": record.final("car"),
        "car_layer0_early": record.early_car(),
        "early_window_steps": record.early_steps,
        "expected_positives_per_anchor": expected_positives_per_anchor(
            min(config.batch_size, len(splits.train)), splits.num_classes
        ),
        "best_epoch": record.best_epoch,
        "n_train": len(splits.train),
        "n_val": len(splits.val),
        "n_test": len(splits.test),
        # True when this worker process had already decoded the dataset for an earlier run
        "dataset_cached": dataset_cached,
        # wall-clock figures live here, not in metrics, so metrics stay reproducible
        "stage1_train_time_s": record.train_time_s,
        "stage1_images": record.images_seen,
        "stage1_images_per_s": (
            record.images_seen / record.train_time_s if record.train_time_s > 0 else None
        ),
    }
    warnings = []
    early = diagnostics["car_layer0_early"]
    if config.margin_mode == "clamp" and early is not None and early > CAR_WARNING_THRESHOLD:
        warnings.append(
            RunWarning(
                diagnostic="car_layer0_early",
                value=early,
                threshold=CAR_WARNING_THRESHOLD,
                message="clamping saturates most layer-0 positive pairs early in training, "
                "which truncates layer-0 gradients (paper: CAR 60.7% on CIFAR-10, where "
                "clamping raised the seed-to-seed variance 5.9x); compare with "
                "margin_mode=subtract",
            )
        )
    return TrainOutput(metrics=metrics, diagnostics=diagnostics, warnings=warnings)


def early_window_steps(config: CFFConfig, n_train: int) -> int:
    """The steps of the first 10% of stage 1, over which car_layer0_early averages."""
    batches_per_epoch = sum(1 for _ in range(0, n_train, config.batch_size))
    return max(1, math.ceil(0.1 * config.epochs * batches_per_epoch))


@dataclass
class Stage1Record:
    """What stage 1 keeps of one run: the per-epoch history, the early layer-0 CARs, the
    checkpoint with the best last-layer validation loss, the last logged point and the time."""

    early_steps: int
    step: int = 0
    history: list[dict[str, list[float]]] = field(default_factory=list)
    early_car_values: list[torch.Tensor] = field(default_factory=list)
    best_val: float = math.inf
    best_epoch: int | None = None
    best_state: dict[str, torch.Tensor] | None = None
    train_time_s: float = 0.0
    images_seen: int = 0
    last: dict[str, float] = field(default_factory=dict)

    def epoch_point(
        self, means: dict[str, torch.Tensor], positives: torch.Tensor
    ) -> dict[str, float]:
        """Keep one epoch's per-layer means (loss, car, grad_norm: one value per layer) in the
        history and return the point to log, validation losses not yet included."""
        record = {k: v.tolist() for k, v in means.items()}
        self.history.append(record)
        point = {
            f"{name}_layer{i}": value
            for name, values in record.items()
            for i, value in enumerate(values)
        }
        point["loss"] = float(sum(record["loss"]))  # the summed layer objectives
        point["positives_per_anchor"] = float(positives)
        return point

    def validated(
        self,
        epoch: int,
        point: dict[str, float],
        val: list[float],
        state: Callable[[], dict[str, torch.Tensor]],
    ) -> None:
        """Add the epoch's validation losses to its point; keep `state()` (a copy of the
        layers) when the last layer's is the best so far."""
        point.update({f"val_loss_layer{i}": v for i, v in enumerate(val)})
        if val[-1] < self.best_val:
            self.best_val, self.best_epoch = val[-1], epoch
            self.best_state = state()

    def final(self, name: str) -> list[float] | None:
        return self.history[-1][name] if self.history else None

    def early_car(self) -> float | None:
        if not self.early_car_values:
            return None
        return float(torch.stack(self.early_car_values).mean())

    def summary(self) -> dict[str, float]:
        out = dict(self.last)
        early = self.early_car()
        if early is not None:
            out["car_layer0_early"] = early
        return out


class _Stage1:
    """Layer-local contrastive training with per-layer diagnostics."""

    def __init__(
        self,
        config: CFFConfig,
        splits: ImageSplits,
        layers: nn.ModuleList,
        run: RunContext,
        precision: PrecisionScope,
    ) -> None:
        self.config = config
        self.splits = splits
        self.layers = layers
        self.run = run
        self.precision = precision
        self.margins = config.margins()
        self.optimizers = [
            torch.optim.AdamW(layer.parameters(), lr=config.lr, weight_decay=config.weight_decay)
            for layer in layers
        ]
        self.record = Stage1Record(early_window_steps(config, len(splits.train)))

    def train(self) -> None:
        """The stage-1 epochs, until the last, a stop or the first non-finite layer loss; then
        the layers with the best last-layer validation loss, under select_by_validation."""
        record = self.record
        for epoch in range(self.config.epochs):
            started = time.perf_counter()
            epoch_stats = self._epoch()
            record.train_time_s += time.perf_counter() - started
            if self.run.stopped:  # a part of an epoch is not logged as an epoch
                break
            positives = epoch_stats.pop("positives")
            point = record.epoch_point(epoch_stats, positives)
            if self.config.select_by_validation:
                val = self._validate()
                if val is None:
                    break
                record.validated(epoch, point, val, lambda: copy.deepcopy(self.layers.state_dict()))
            record.last = point
            if self.run.log(record.step, point, epoch=epoch):
                break
        if record.best_state is not None:
            self.layers.load_state_dict(record.best_state)

    def _epoch(self) -> dict[str, torch.Tensor]:
        """One pass over the training split, ended early by a stop: per-layer means of the
        loss, CAR and gradient norm, and the mean positives per anchor."""
        config, splits, record = self.config, self.splits, self.record
        depth = len(self.layers)
        device = self.run.device
        sums = {k: torch.zeros(depth, device=device) for k in ("loss", "car", "grad_norm")}
        positives = torch.zeros((), device=device)
        batches = 0
        self.layers.train()
        for positions in splits.train_batches(config.batch_size, self.run.sources.data):
            h, y = two_views(
                splits, "train", positions, self.run.sources.augment, config.patch, device
            )
            n = len(y)
            for index, (layer, optimizer) in enumerate(
                zip(self.layers, self.optimizers, strict=True)
            ):
                with self.precision.autocast():
                    h = layer(h.detach())
                # the cosines, clamp, CAR and loss in full float32 under every precision
                with self.precision.float32():
                    features = h.float().mean(dim=1)
                    s, pos = pair_similarities(features[:n], features[n:], y)
                    loss = supcon_margin_loss_from_similarities(
                        s,
                        pos,
                        self.margins[index],
                        temperature=config.temperature,
                        margin_mode=config.margin_mode,
                        stability=config.stability,
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grads = [p.grad for p in layer.parameters() if p.grad is not None]
                car = clamp_activation_rate(s, pos, self.margins[index])
                sums["loss"][index] += loss.detach()
                sums["car"][index] += car
                sums["grad_norm"][index] += torch.nn.utils.get_total_norm(grads)
                if index == 0:
                    positives += pos.sum() / len(pos)
                    if record.step < record.early_steps:
                        record.early_car_values.append(car)
                optimizer.step()
            record.step += 1
            batches += 1
            record.images_seen += n
            if self.run.should_stop():
                break
        out = {k: v / max(batches, 1) for k, v in sums.items()}
        out["positives"] = positives / max(batches, 1)
        return out

    @torch.no_grad()
    def _validate(self) -> list[float] | None:
        """Per-layer loss on the augmented validation split (the checkpoint criterion); None
        when the run stops first."""
        config, splits = self.config, self.splits
        self.layers.eval()
        # float64 sums on the device: the same sums as in Python floats, read once at the end
        totals = torch.zeros(len(self.layers), dtype=torch.float64, device=self.run.device)
        count = 0
        for start in range(0, len(splits.val), config.batch_size):
            if self.run.should_stop():
                return None
            positions = torch.arange(start, min(start + config.batch_size, len(splits.val)))
            if len(positions) < 2:
                continue
            h, y = two_views(
                splits, "val", positions, self.run.sources.evaluate, config.patch, self.run.device
            )
            n = len(y)
            for index, layer in enumerate(self.layers):
                with self.precision.autocast():
                    h = layer(h)
                with self.precision.float32():
                    f = h.float().mean(dim=1)
                    totals[index] += (
                        len(y)
                        * supcon_margin_loss(
                            f[:n],
                            f[n:],
                            y,
                            self.margins[index],
                            temperature=config.temperature,
                            margin_mode=config.margin_mode,
                            stability=config.stability,
                        ).double()
                    )
            count += len(y)
        return (totals / max(count, 1)).tolist()


def two_views(
    splits: ImageSplits,
    split: Split,
    positions: torch.Tensor,
    generator: torch.Generator,
    patch: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independently augmented views of the same images, patchified and stacked (view-1
    rows first), and their labels."""
    x1, y = splits.images(split, positions, augment_generator=generator, device=device)
    x2, _ = splits.images(split, positions, augment_generator=generator, device=device)
    return patchify(torch.cat([x1, x2]), patch), y


def _train_head(
    config: CFFConfig,
    splits: ImageSplits,
    layers: nn.ModuleList,
    head: nn.Module,
    run: RunContext,
    step: int,
    precision: PrecisionScope,
) -> dict[str, float]:
    """Stage 2: cross-entropy on the frozen last layer's features of the first augmented view;
    keep the head with the best validation cross-entropy (augmented validation split). Returns
    the kept epoch's statistics (none when the run stopped before an epoch ended)."""
    layers.eval()
    for p in layers.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(
        head.parameters(), lr=config.head_lr, weight_decay=config.weight_decay
    )
    best: tuple[float, dict[str, torch.Tensor] | None, dict[str, float]] = (math.inf, None, {})
    stats: dict[str, float] = {}
    for epoch in range(config.head_epochs):
        if run.should_stop():
            break
        head.train()
        # float64 on the device: the same sum as in Python floats, read once per epoch
        total = torch.zeros((), dtype=torch.float64, device=run.device)
        count = 0
        for positions in splits.train_batches(config.batch_size, run.sources.data):
            x, y = splits.images(
                "train", positions, augment_generator=run.sources.augment, device=run.device
            )
            with torch.no_grad(), precision.autocast():
                features = encode(layers, x, config.patch)
            with precision.autocast():
                logits = head(features)
            loss = F.cross_entropy(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach().double() * len(y)
            count += len(y)
            step += 1
            if run.should_stop():
                break
        if run.stopped:  # a part of an epoch is not logged as an epoch
            break
        stats = {"head_loss": float(total) / max(count, 1)}
        if config.select_by_validation:
            validation = _head_validation(config, splits, layers, head, run, precision)
            if validation is None:
                break
            val_loss, val_acc = validation
            stats.update(head_val_loss=val_loss, head_val_accuracy=val_acc)
            if val_loss < best[0]:
                best = (val_loss, copy.deepcopy(head.state_dict()), dict(stats))
        if run.log(step, stats, epoch=config.epochs + epoch):
            break
    if best[1] is not None:
        head.load_state_dict(best[1])
        stats = best[2]
    return stats


@torch.no_grad()
def _head_validation(
    config: CFFConfig,
    splits: ImageSplits,
    layers: nn.ModuleList,
    head: nn.Module,
    run: RunContext,
    precision: PrecisionScope,
) -> tuple[float, float] | None:
    """Cross-entropy and accuracy of the head on the augmented validation split; None when the
    run stops first."""
    head.eval()
    total = torch.zeros((), dtype=torch.float64, device=run.device)
    correct = torch.zeros((), dtype=torch.int64, device=run.device)
    count = 0
    for start in range(0, len(splits.val), config.batch_size):
        if run.should_stop():
            return None
        positions = torch.arange(start, min(start + config.batch_size, len(splits.val)))
        x, y = splits.images(
            "val", positions, augment_generator=run.sources.evaluate, device=run.device
        )
        with precision.autocast():
            logits = head(encode(layers, x, config.patch)).float()
        total += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(1) == y).sum()
        count += len(y)
    return float(total) / max(count, 1), int(correct) / max(count, 1)


@torch.no_grad()
def evaluate(
    layers: nn.ModuleList,
    head: nn.Module,
    splits: ImageSplits,
    patch: int,
    device: torch.device,
    should_stop: Callable[[], bool],
    batch_size: int = EVAL_BATCH,
    precision: PrecisionScope | None = None,
) -> dict[str, float] | None:
    """Top-1 (and top-5 with 20 or more classes) accuracy of the head on the un-augmented test
    set, and the binomial noise floor p(1 - p)/n_test of the top-1 accuracy; None when
    `should_stop` answers True before the last batch (a stopped run reports no test metrics).
    The forward passes run under `precision`'s autocast (none when None)."""
    layers.eval()
    head.eval()
    autocast = precision.autocast if precision is not None else contextlib.nullcontext
    top1 = torch.zeros((), dtype=torch.int64, device=device)
    top5 = torch.zeros((), dtype=torch.int64, device=device)
    n = len(splits.test)
    for start in range(0, n, batch_size):
        if should_stop():
            return None
        positions = torch.arange(start, min(start + batch_size, n))
        x, y = splits.images("test", positions, device=device)
        with autocast():
            logits = head(encode(layers, x, patch)).float()
        top1 += (logits.argmax(1) == y).sum()
        if splits.num_classes >= 20:
            top5 += (logits.topk(5, dim=1).indices == y[:, None]).any(1).sum()
    accuracy = int(top1) / n
    out = {
        "test_accuracy": accuracy,
        "test_accuracy_noise_floor": binomial_noise_floor(accuracy, n),
    }
    if splits.num_classes >= 20:
        out["test_top5_accuracy"] = int(top5) / n
    return out
