"""The `cff` trainer: layer-local contrastive training of the encoder (stage 1), the linear head
on the frozen encoder (stage 2) and the test evaluation.

Every stage-1 step and every head step checks the run's stop; so does every batch of the
validation and test passes. Validation draws its augmented views from the run's `evaluate`
source, so that selecting checkpoints by validation never changes what the run trains.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
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
        name: (0.0, 1.0) for name in ("test_accuracy", "test_top5_accuracy",
                                      "head_val_accuracy", "car_layer0_early")}

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
        decoded_before = load_count()
        splits = prepare_splits(config, run.sources)
        dataset_cached = load_count() == decoded_before
        channels, side, _ = splits.data.image_shape
        layers = build_layers(config, channels, side, run.sources.init).to(run.device)
        head = build_head(config.width, splits.num_classes, run.sources.init).to(run.device)
        run.track(layers, head)
        stage1 = _Stage1(config, splits, layers, run)
        stage1.train()
        head_stats = _train_head(config, splits, layers, head, run, stage1.step)
        evaluation = evaluate(layers, head, splits, config.patch, run.device, run.should_stop)
        metrics = {**stage1.summary(), **head_stats, **(evaluation or {})}
        diagnostics: dict[str, Any] = {
            "margins": config.margins(),
            "final_grad_norms": stage1.final("grad_norm"),
            "final_car": stage1.final("car"),
            "car_layer0_early": stage1.early_car(),
            "early_window_steps": stage1.early_steps,
            "expected_positives_per_anchor": expected_positives_per_anchor(
                min(config.batch_size, len(splits.train)), splits.num_classes
            ),
            "best_epoch": stage1.best_epoch,
            "n_train": len(splits.train),
            "n_val": len(splits.val),
            "n_test": len(splits.test),
            # True when this worker process had already decoded the dataset for an earlier run
            "dataset_cached": dataset_cached,
            # wall-clock figures live here, not in metrics, so metrics stay reproducible
            "stage1_train_time_s": stage1.train_time_s,
            "stage1_images": stage1.images_seen,
            "stage1_images_per_s": (stage1.images_seen / stage1.train_time_s
                                    if stage1.train_time_s > 0 else None),
        }
        warnings = []
        early = diagnostics["car_layer0_early"]
        if config.margin_mode == "clamp" and early is not None and early > CAR_WARNING_THRESHOLD:
            warnings.append(RunWarning(
                diagnostic="car_layer0_early",
                value=early,
                threshold=CAR_WARNING_THRESHOLD,
                message="clamping saturates most layer-0 positive pairs early in training, "
                        "which truncates layer-0 gradients (paper: CAR 60.7% on CIFAR-10, where "
                        "clamping raised the seed-to-seed variance 5.9x); compare with "
                        "margin_mode=subtract",
            ))
        return TrainOutput(metrics=metrics, diagnostics=diagnostics, warnings=warnings)


class _Stage1:
    """Layer-local contrastive training with per-layer diagnostics."""

    def __init__(
        self, config: CFFConfig, splits: ImageSplits, layers: nn.ModuleList, run: RunContext
    ) -> None:
        self.config = config
        self.splits = splits
        self.layers = layers
        self.run = run
        self.margins = config.margins()
        self.optimizers = [
            torch.optim.AdamW(layer.parameters(), lr=config.lr, weight_decay=config.weight_decay)
            for layer in layers
        ]
        batches_per_epoch = sum(1 for _ in range(0, len(splits.train), config.batch_size))
        self.early_steps = max(1, math.ceil(0.1 * config.epochs * batches_per_epoch))
        self.step = 0
        self.history: list[dict[str, list[float]]] = []
        self.early_car_values: list[torch.Tensor] = []
        self.best_val = math.inf
        self.best_epoch: int | None = None
        self.best_state: dict[str, torch.Tensor] | None = None
        self.train_time_s = 0.0
        self.images_seen = 0
        self.last: dict[str, float] = {}

    def train(self) -> None:
        """The stage-1 epochs, until the last, a stop or the first non-finite layer loss; then
        the layers with the best last-layer validation loss, under select_by_validation."""
        for epoch in range(self.config.epochs):
            started = time.perf_counter()
            epoch_stats = self._epoch()
            self.train_time_s += time.perf_counter() - started
            if self.run.stopped:  # a part of an epoch is not logged as an epoch
                break
            record = {k: v.tolist() for k, v in epoch_stats.items() if k != "positives"}
            self.history.append(record)
            point = {f"{name}_layer{i}": value for name, values in record.items()
                     for i, value in enumerate(values)}
            point["loss"] = float(sum(record["loss"]))  # the summed layer objectives
            point["positives_per_anchor"] = float(epoch_stats["positives"])
            if self.config.select_by_validation:
                val = self._validate()
                if val is None:
                    break
                point.update({f"val_loss_layer{i}": v for i, v in enumerate(val)})
                if val[-1] < self.best_val:
                    self.best_val, self.best_epoch = val[-1], epoch
                    self.best_state = copy.deepcopy(self.layers.state_dict())
            self.last = point
            if self.run.log(self.step, point, epoch=epoch):
                break
        if self.best_state is not None:
            self.layers.load_state_dict(self.best_state)

    def _epoch(self) -> dict[str, torch.Tensor]:
        """One pass over the training split, ended early by a stop: per-layer means of the
        loss, CAR and gradient norm, and the mean positives per anchor."""
        config, splits = self.config, self.splits
        depth = len(self.layers)
        device = self.run.device
        sums = {k: torch.zeros(depth, device=device) for k in ("loss", "car", "grad_norm")}
        positives = torch.zeros((), device=device)
        batches = 0
        self.layers.train()
        for positions in splits.train_batches(config.batch_size, self.run.sources.data):
            h, y = self._two_views("train", positions, self.run.sources.augment)
            n = len(y)
            for index, (layer, optimizer) in enumerate(zip(self.layers, self.optimizers,
                                                           strict=True)):
                h = layer(h.detach())
                features = h.mean(dim=1)
                s, pos = pair_similarities(features[:n], features[n:], y)
                loss = supcon_margin_loss_from_similarities(
                    s, pos, self.margins[index], temperature=config.temperature,
                    margin_mode=config.margin_mode, stability=config.stability,
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
                    if self.step < self.early_steps:
                        self.early_car_values.append(car)
                optimizer.step()
            self.step += 1
            batches += 1
            self.images_seen += n
            if self.run.should_stop():
                break
        out = {k: v / max(batches, 1) for k, v in sums.items()}
        out["positives"] = positives / max(batches, 1)
        return out

    def _two_views(
        self, split: Split, positions: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, ...]:
        """Two independently augmented views of the same images, patchified and stacked
        (view-1 rows first), and their labels."""
        device = self.run.device
        x1, y = self.splits.images(split, positions, augment_generator=generator, device=device)
        x2, _ = self.splits.images(split, positions, augment_generator=generator, device=device)
        return patchify(torch.cat([x1, x2]), self.config.patch), y

    @torch.no_grad()
    def _validate(self) -> list[float] | None:
        """Per-layer loss on the augmented validation split (the checkpoint criterion); None
        when the run stops first."""
        config, splits = self.config, self.splits
        self.layers.eval()
        totals = np.zeros(len(self.layers))
        count = 0
        for start in range(0, len(splits.val), config.batch_size):
            if self.run.should_stop():
                return None
            positions = torch.arange(start, min(start + config.batch_size, len(splits.val)))
            if len(positions) < 2:
                continue
            h, y = self._two_views("val", positions, self.run.sources.evaluate)
            n = len(y)
            for index, layer in enumerate(self.layers):
                h = layer(h)
                f = h.mean(dim=1)
                totals[index] += len(y) * float(supcon_margin_loss(
                    f[:n], f[n:], y, self.margins[index], temperature=config.temperature,
                    margin_mode=config.margin_mode, stability=config.stability,
                ))
            count += len(y)
        return (totals / max(count, 1)).tolist()

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


def _train_head(
    config: CFFConfig,
    splits: ImageSplits,
    layers: nn.ModuleList,
    head: nn.Module,
    run: RunContext,
    step: int,
) -> dict[str, float]:
    """Stage 2: cross-entropy on the frozen last layer's features of the first augmented view;
    keep the head with the best validation cross-entropy (augmented validation split). Returns
    the kept epoch's statistics (none when the run stopped before an epoch ended)."""
    layers.eval()
    for p in layers.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.head_lr,
                                  weight_decay=config.weight_decay)
    best = (math.inf, None, {})
    stats: dict[str, float] = {}
    for epoch in range(config.head_epochs):
        if run.should_stop():
            break
        head.train()
        total, count = 0.0, 0
        for positions in splits.train_batches(config.batch_size, run.sources.data):
            x, y = splits.images("train", positions, augment_generator=run.sources.augment,
                                 device=run.device)
            with torch.no_grad():
                features = encode(layers, x, config.patch)
            loss = F.cross_entropy(head(features), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(y)
            count += len(y)
            step += 1
            if run.should_stop():
                break
        if run.stopped:  # a part of an epoch is not logged as an epoch
            break
        stats = {"head_loss": total / max(count, 1)}
        if config.select_by_validation:
            validation = _head_validation(config, splits, layers, head, run)
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
) -> tuple[float, float] | None:
    """Cross-entropy and accuracy of the head on the augmented validation split; None when the
    run stops first."""
    head.eval()
    total, correct, count = 0.0, 0, 0
    for start in range(0, len(splits.val), config.batch_size):
        if run.should_stop():
            return None
        positions = torch.arange(start, min(start + config.batch_size, len(splits.val)))
        x, y = splits.images("val", positions, augment_generator=run.sources.evaluate,
                             device=run.device)
        logits = head(encode(layers, x, config.patch))
        total += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        count += len(y)
    return total / max(count, 1), correct / max(count, 1)


@torch.no_grad()
def evaluate(
    layers: nn.ModuleList, head: nn.Module, splits: ImageSplits, patch: int,
    device: torch.device, should_stop: Callable[[], bool], batch_size: int = EVAL_BATCH,
) -> dict[str, float] | None:
    """Top-1 (and top-5 with 20 or more classes) accuracy of the head on the un-augmented test
    set, and the binomial noise floor p(1 - p)/n_test of the top-1 accuracy; None when
    `should_stop` answers True before the last batch (a stopped run reports no test metrics)."""
    layers.eval()
    head.eval()
    top1 = top5 = 0
    n = len(splits.test)
    for start in range(0, n, batch_size):
        if should_stop():
            return None
        positions = torch.arange(start, min(start + batch_size, n))
        x, y = splits.images("test", positions, device=device)
        logits = head(encode(layers, x, patch))
        top1 += int((logits.argmax(1) == y).sum())
        if splits.num_classes >= 20:
            top5 += int((logits.topk(5, dim=1).indices == y[:, None]).any(1).sum())
    accuracy = top1 / n
    out = {"test_accuracy": accuracy,
           "test_accuracy_noise_floor": binomial_noise_floor(accuracy, n)}
    if splits.num_classes >= 20:
        out["test_top5_accuracy"] = top5 / n
    return out
