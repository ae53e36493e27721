"""`cff`: margin clamping in Contrastive Forward-Forward (paper 000, arXiv:2603.00951).

Specification: shared/papers/cff-margin-clamping.md. A ViT is trained layer-locally: every layer
has its own AdamW and its own supervised contrastive loss on its token mean, and its input is
detached from the layer below. The positive-pair margin m_l is either clamped into the cosine,
min(s + m, 1) (CFF's code: saturated pairs get zero gradient), subtracted after the
log-probability (gradient-neutral), or left out. After stage 1 a LayerNorm + Linear head is
trained on the frozen last layer; test accuracy is the head's.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from trainers.base import Reporter, ResourceEstimate, RunResult, RunWarning, provenance
from trainers.data import DataConfig, ImageSplits, Split, load_count, prepare_splits
from trainers.data.sources import NATIVE_SIZE
from trainers.estimates import (
    FLOAT32,
    Term,
    augmented_batch_bytes,
    dataset_bytes,
    dataset_fields,
    dataset_shape,
    decode_phase,
    layer_norm_parameters,
    linear_parameters,
    peak,
    split_sizes,
    training_state_bytes,
    vit_block_activation_floats,
    vit_block_largest_floats,
    vit_block_parameters,
)
from trainers.init import init_linear
from trainers.random_sources import random_sources
from trainers.runtime import deterministic_cpu, pick_device

MAX_DEPTH = 16
# seedgrid's screening threshold for the early layer-0 clamp activation rate (the paper gives
# none; CIFAR-10, where clamping raised the variance 5.9x, had 60.7%).
CAR_WARNING_THRESHOLD = 0.5

MarginMode = Literal["clamp", "subtract", "none"]
Stability = Literal["detach", "direct"]


class CFFConfig(DataConfig):
    # clamp: s' = min(s + m, 1) on positive pairs (CFF); subtract: log p - m on positive pairs
    # (gradient-neutral); none: no margin.
    margin_mode: MarginMode = "clamp"
    # detach: the row max M_i is detached (CFF); direct: not. Equal in exact arithmetic.
    stability: Stability = "detach"
    # Per-layer margins from margin_start (layer 0) to margin_end (last layer); CFF's default is
    # linear 0.4 -> 0.1. margin_end None means margin_start / 4.
    margin_schedule: Literal["linear", "parabolic", "cosine", "exponential"] = "linear"
    margin_start: float = Field(0.4, ge=0.0, le=2.0)
    margin_end: float | None = Field(None, ge=0.0, le=2.0)
    temperature: float = Field(0.15, gt=0.0, le=10.0)
    # ViT: embedding width E, layers L, attention heads, patch side; MLP width mlp_ratio * E.
    width: int = Field(128, ge=4, le=4096)
    depth: int = Field(5, ge=1, le=MAX_DEPTH)
    heads: int = Field(4, ge=1, le=64)
    patch: int = Field(4, ge=1, le=64)
    mlp_ratio: int = Field(2, ge=1, le=16)
    # Stage 1 (layer-local contrastive) and stage 2 (head) epochs; head_epochs 0 leaves the head
    # untrained (for throughput benchmarks only).
    epochs: int = Field(600, ge=1, le=100_000)
    head_epochs: int = Field(50, ge=0, le=100_000)
    # Images per batch; each gives two views, so 2 * batch_size anchors.
    batch_size: int = Field(512, ge=2, le=65_536)
    lr: float = Field(4e-3, gt=0.0, le=10.0)
    head_lr: float = Field(5e-4, gt=0.0, le=10.0)
    weight_decay: float = Field(0.01, ge=0.0, le=10.0)
    # Keep the encoder with the best last-layer validation loss and the head with the best
    # validation cross-entropy (CFF); false keeps the last (needs no validation split).
    select_by_validation: bool = True
    # Model input side; the paper's 32 (digits are upsampled to it). None: the dataset's own.
    image_size: int | None = Field(32, ge=4, le=512)
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> CFFConfig:
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be divisible by heads ({self.heads})")
        side = self.image_size or NATIVE_SIZE[self.dataset]
        if side % self.patch:
            raise ValueError(f"image side {side} must be divisible by patch ({self.patch})")
        if self.select_by_validation and self.val_fraction == 0.0:
            raise ValueError("select_by_validation needs val_fraction > 0")
        return self

    def margins(self) -> list[float]:
        return margin_schedule(self.margin_schedule, self.margin_start, self.margin_end,
                               self.depth)


def margin_schedule(kind: str, start: float, end: float | None, depth: int) -> list[float]:
    """Per-layer margins m_0..m_{L-1} from `start` to `end` (default start / 4).

    linear is CFF's linspace(0.4, 0.1, L). The other shapes are seedgrid's: parabolic
    m0 + (mL - m0) t^2, cosine mL + (m0 - mL)(1 + cos(pi t)) / 2, exponential m0 (mL/m0)^t,
    with t = l / (L - 1).
    """
    end = start / 4 if end is None else end
    if depth == 1:
        return [start]
    t = np.linspace(0.0, 1.0, depth)
    if kind == "linear":
        m = start + (end - start) * t
    elif kind == "parabolic":
        m = start + (end - start) * t**2
    elif kind == "cosine":
        m = end + (start - end) * (1 + np.cos(np.pi * t)) / 2
    elif kind == "exponential":
        m = start * (end / start) ** t if start > 0 and end > 0 else start + (end - start) * t
    else:
        raise ValueError(f"unknown margin schedule {kind!r}")
    return [float(v) for v in m]


# ---------------------------------------------------------------------------------------------
# the loss and its diagnostics (pure functions)


def pair_similarities(
    f1: torch.Tensor, f2: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarities s (2n x 2n, view-1 rows first) and the positive mask P (same label,
    off-diagonal, so the other view of an image is always a positive)."""
    z = F.normalize(torch.cat([f1, f2]), dim=1)
    yy = torch.cat([labels, labels])
    eye = torch.eye(len(z), dtype=torch.bool, device=z.device)
    positives = (yy[:, None] == yy[None, :]) & ~eye
    return z @ z.T, positives


def supcon_margin_loss_from_similarities(
    s: torch.Tensor,
    positives: torch.Tensor,
    margin: float,
    *,
    temperature: float,
    margin_mode: MarginMode,
    stability: Stability = "detach",
) -> torch.Tensor:
    """CFF's supervised contrastive loss with a positive-pair margin (spec section 2.2).

        s'_ij = min(s_ij + m, 1) for j in P(i) under clamp, else s_ij
        a_ij = s'_ij / tau,  M_i = max_j a_ij (diagonal included; detached under `detach`)
        log p_ij = (a_ij - M_i) - log sum_{k != i} exp(a_ik - M_i)
        log p_ij -= m for j in P(i) under subtract
        L = mean_i [ -(1/|P(i)|) sum_{j in P(i)} log p_ij ]

    Subtraction adds exactly m to the loss and nothing to its gradient; clamping zeroes the
    gradient of every saturated positive pair (s_ij + m > 1).
    """
    eye = torch.eye(len(s), dtype=torch.bool, device=s.device)
    if margin_mode == "clamp":
        s = torch.where(positives, (s + margin).clamp(max=1.0), s)
    a = s / temperature
    row_max = a.max(dim=1, keepdim=True).values
    if stability == "detach":
        row_max = row_max.detach()
    logits = a - row_max
    log_p = logits - torch.log((logits.exp() * ~eye).sum(dim=1, keepdim=True))
    if margin_mode == "subtract":
        log_p = torch.where(positives, log_p - margin, log_p)
    per_anchor = -(log_p * positives).sum(dim=1) / positives.sum(dim=1).clamp(min=1)
    return per_anchor.mean()


def supcon_margin_loss(
    f1: torch.Tensor,
    f2: torch.Tensor,
    labels: torch.Tensor,
    margin: float,
    *,
    temperature: float,
    margin_mode: MarginMode,
    stability: Stability = "detach",
) -> torch.Tensor:
    """The loss of one layer from the features of two views (n x E each) and labels (n)."""
    s, positives = pair_similarities(f1, f2, labels)
    return supcon_margin_loss_from_similarities(
        s, positives, margin, temperature=temperature, margin_mode=margin_mode,
        stability=stability,
    )


def clamp_activation_rate(s: torch.Tensor, positives: torch.Tensor, margin: float) -> torch.Tensor:
    """CAR: the share of positive pairs with s_ij + m > 1, on raw cosines before any clamp."""
    saturated = (s.detach() + margin > 1.0) & positives
    return saturated.sum().to(s.dtype) / positives.sum().clamp(min=1).to(s.dtype)


def expected_positives_per_anchor(batch_size: int, num_classes: int) -> float:
    """2(1 + (n - 1)/K) - 1 positives per anchor among the 2n - 1 others, balanced classes."""
    return 2 * (1 + (batch_size - 1) / num_classes) - 1


# ---------------------------------------------------------------------------------------------
# the model


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """B x C x H x W -> B x T x (C p p), patches row-major, channel-major inside a patch."""
    return F.unfold(x, kernel_size=patch, stride=patch).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with nn.MultiheadAttention's parameterisation and init."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, e))


class Block(nn.Module):
    """Pre-LN encoder block: r = x + MHA(LN1(x)); out = r + fc2(GELU(fc1(LN2(r))))."""

    def __init__(self, width: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp_ratio * width)
        self.fc2 = nn.Linear(mlp_ratio * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = x + self.attn(self.ln1(x))
        return r + self.fc2(F.gelu(self.fc1(self.ln2(r))))


class Embedding(nn.Module):
    """Layer 0's input stage: Linear(C p^2 -> E), ReLU, + learnable positional embedding."""

    def __init__(self, patch_dim: int, tokens: int, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(patch_dim, width)
        self.position = nn.Parameter(torch.zeros(1, tokens, width))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return F.relu(self.proj(patches)) + self.position


class CFFLayer(nn.Module):
    """One layer-local unit: layer 0 is embedding + block, later layers a block."""

    def __init__(self, block: Block, embedding: Embedding | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        return self.block(x)


def build_layers(
    config: CFFConfig, channels: int, side: int, generator: torch.Generator
) -> nn.ModuleList:
    """The L layers, initialised from the run's `init` generator as PyTorch would by default
    (nn.Linear: kaiming-uniform(a=sqrt 5) weights, uniform(+-1/sqrt fan_in) biases; attention
    in-projection xavier-uniform with zero biases, as nn.MultiheadAttention; positions N(0, 1))."""
    tokens = (side // config.patch) ** 2
    layers = nn.ModuleList()
    for index in range(config.depth):
        embedding = (
            Embedding(channels * config.patch**2, tokens, config.width) if index == 0 else None
        )
        layers.append(CFFLayer(Block(config.width, config.heads, config.mlp_ratio), embedding))
    for module in layers.modules():
        if isinstance(module, nn.Linear):
            init_linear(module, generator)
        elif isinstance(module, Attention):
            nn.init.xavier_uniform_(module.qkv.weight, generator=generator)
            nn.init.zeros_(module.qkv.bias)
            nn.init.zeros_(module.out.bias)
        elif isinstance(module, Embedding):
            nn.init.normal_(module.position, generator=generator)
    return layers


def build_head(width: int, num_classes: int, generator: torch.Generator) -> nn.Sequential:
    head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, num_classes))
    init_linear(head[1], generator)
    return head


def encode(layers: nn.ModuleList, x: torch.Tensor, patch: int) -> torch.Tensor:
    """The last layer's token mean, the head's input."""
    h = patchify(x, patch)
    for layer in layers:
        h = layer(h)
    return h.mean(dim=1)


# ---------------------------------------------------------------------------------------------
# the trainer


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


@dataclass
class CFFOutcome:
    """The trained encoder layers and head, with the run's result."""

    layers: nn.ModuleList
    head: nn.Module
    result: RunResult


class _Stopped(Exception):
    """The reporter asked the run to stop."""


class CFFTrainer:
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

    def run(self, config: CFFConfig, seed: int, reporter: Reporter) -> RunResult:
        return fit(config, seed, reporter).result

    def estimate(self, config: CFFConfig) -> ResourceEstimate:
        return cff_estimate(config)


def fit(config: CFFConfig, seed: int, reporter: Reporter) -> CFFOutcome:
    """Load the data (failing before any training if it is missing), then stages 1 and 2."""
    device = pick_device(config.device)
    if device.type == "cpu":
        deterministic_cpu()
    sources = random_sources(seed)
    decoded_before = load_count()
    splits = prepare_splits(config, sources)
    dataset_cached = load_count() == decoded_before
    channels, side, _ = splits.data.image_shape
    layers = build_layers(config, channels, side, sources.init).to(device)
    head = build_head(config.width, splits.num_classes, sources.init).to(device)
    stage1 = _Stage1(config, splits, layers, sources, device, reporter)
    stopped = False
    try:
        stage1.train()
        head_stats = _train_head(config, splits, layers, head, sources, device, reporter,
                                 stage1.step)
    except _Stopped:
        stopped = True
        head_stats = {}
    evaluation = evaluate(layers, head, splits, config.patch, device)
    metrics = {**stage1.summary(), **head_stats, **evaluation}
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
            message="clamping saturates most layer-0 positive pairs early in training, which "
                    "truncates layer-0 gradients (paper: CAR 60.7% on CIFAR-10, where clamping "
                    "raised the seed-to-seed variance 5.9x); compare with margin_mode=subtract",
        ))
    result = RunResult(
        metrics=metrics,
        diagnostics=diagnostics,
        warnings=warnings,
        provenance=provenance(device, seed, config),
        finished=not stopped,
    )
    return CFFOutcome(layers=layers, head=head, result=result)


class _Stage1:
    """Layer-local contrastive training with per-layer diagnostics."""

    def __init__(
        self,
        config: CFFConfig,
        splits: ImageSplits,
        layers: nn.ModuleList,
        sources: Any,
        device: torch.device,
        reporter: Reporter,
    ) -> None:
        self.config = config
        self.splits = splits
        self.layers = layers
        self.sources = sources
        self.device = device
        self.reporter = reporter
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
        for epoch in range(self.config.epochs):
            started = time.perf_counter()
            epoch_stats = self._epoch()
            self.train_time_s += time.perf_counter() - started
            record = {k: v.tolist() for k, v in epoch_stats.items() if k != "positives"}
            self.history.append(record)
            point = {f"{name}_layer{i}": value for name, values in record.items()
                     for i, value in enumerate(values)}
            point["loss"] = float(sum(record["loss"]))  # the summed layer objectives
            point["positives_per_anchor"] = float(epoch_stats["positives"])
            if self.config.select_by_validation:
                val = self._validate()
                point.update({f"val_loss_layer{i}": v for i, v in enumerate(val)})
                if val[-1] < self.best_val:
                    self.best_val, self.best_epoch = val[-1], epoch
                    self.best_state = copy.deepcopy(self.layers.state_dict())
            self.last = point
            self.reporter.log(self.step, point, epoch=epoch)
            if not all(math.isfinite(v) for v in record["loss"]):
                break
            if self.reporter.should_stop():
                raise _Stopped
        if self.best_state is not None:
            self.layers.load_state_dict(self.best_state)

    def _epoch(self) -> dict[str, torch.Tensor]:
        config, splits = self.config, self.splits
        depth = len(self.layers)
        sums = {k: torch.zeros(depth, device=self.device) for k in ("loss", "car", "grad_norm")}
        positives = torch.zeros((), device=self.device)
        batches = 0
        self.layers.train()
        for positions in splits.train_batches(config.batch_size, self.sources.data):
            h, y = self._two_views("train", positions)
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
            if self.reporter.should_stop():
                raise _Stopped
        out = {k: v / max(batches, 1) for k, v in sums.items()}
        out["positives"] = positives / max(batches, 1)
        return out

    def _two_views(self, split: Split, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Two independently augmented views of the same images, patchified and stacked
        (view-1 rows first), and their labels."""
        x1, y = self.splits.images(split, positions, augment_generator=self.sources.augment,
                                   device=self.device)
        x2, _ = self.splits.images(split, positions, augment_generator=self.sources.augment,
                                   device=self.device)
        return patchify(torch.cat([x1, x2]), self.config.patch), y

    @torch.no_grad()
    def _validate(self) -> list[float]:
        """Per-layer loss on the augmented validation split (the checkpoint criterion)."""
        config, splits = self.config, self.splits
        self.layers.eval()
        totals = np.zeros(len(self.layers))
        count = 0
        for start in range(0, len(splits.val), config.batch_size):
            positions = torch.arange(start, min(start + config.batch_size, len(splits.val)))
            if len(positions) < 2:
                continue
            h, y = self._two_views("val", positions)
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
    sources: Any,
    device: torch.device,
    reporter: Reporter,
    step: int,
) -> dict[str, float]:
    """Stage 2: cross-entropy on the frozen last layer's features of the first augmented view;
    keep the head with the best validation cross-entropy (augmented validation split)."""
    layers.eval()
    for p in layers.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.head_lr,
                                  weight_decay=config.weight_decay)
    best = (math.inf, None, {})
    stats: dict[str, float] = {}
    for epoch in range(config.head_epochs):
        head.train()
        total, count = 0.0, 0
        for positions in splits.train_batches(config.batch_size, sources.data):
            x, y = splits.images("train", positions, augment_generator=sources.augment,
                                 device=device)
            with torch.no_grad():
                features = encode(layers, x, config.patch)
            loss = F.cross_entropy(head(features), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(y)
            count += len(y)
            step += 1
        stats = {"head_loss": total / max(count, 1)}
        if config.select_by_validation:
            val_loss, val_acc = _head_validation(config, splits, layers, head, sources, device)
            stats.update(head_val_loss=val_loss, head_val_accuracy=val_acc)
            if val_loss < best[0]:
                best = (val_loss, copy.deepcopy(head.state_dict()), dict(stats))
        reporter.log(step, stats, epoch=config.epochs + epoch)
        if reporter.should_stop():
            raise _Stopped
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
    sources: Any,
    device: torch.device,
) -> tuple[float, float]:
    head.eval()
    total, correct, count = 0.0, 0, 0
    for start in range(0, len(splits.val), config.batch_size):
        positions = torch.arange(start, min(start + config.batch_size, len(splits.val)))
        x, y = splits.images("val", positions, augment_generator=sources.augment, device=device)
        logits = head(encode(layers, x, config.patch))
        total += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        count += len(y)
    return total / max(count, 1), correct / max(count, 1)


@torch.no_grad()
def evaluate(
    layers: nn.ModuleList, head: nn.Module, splits: ImageSplits, patch: int,
    device: torch.device, batch_size: int = 1024,
) -> dict[str, float]:
    """Top-1 (and top-5 with 20 or more classes) accuracy of the head on the un-augmented test
    set, and the binomial noise floor p(1 - p)/n_test of the top-1 accuracy."""
    layers.eval()
    head.eval()
    top1 = top5 = 0
    n = len(splits.test)
    for start in range(0, n, batch_size):
        positions = torch.arange(start, min(start + batch_size, n))
        x, y = splits.images("test", positions, device=device)
        logits = head(encode(layers, x, patch))
        top1 += int((logits.argmax(1) == y).sum())
        if splits.num_classes >= 20:
            top5 += int((logits.topk(5, dim=1).indices == y[:, None]).any(1).sum())
    accuracy = top1 / n
    out = {"test_accuracy": accuracy, "test_accuracy_noise_floor": accuracy * (1 - accuracy) / n}
    if splits.num_classes >= 20:
        out["test_top5_accuracy"] = top5 / n
    return out


# ---------------------------------------------------------------------------------------------
# resource estimate (pure arithmetic on the config)

# Evaluation batch of `evaluate`.
EVAL_BATCH = 1024
# Bytes per anchor pair of the similarity matrices one layer's loss keeps for backward: about
# 13 float32 A x A matrices (s, s + m, the clamp, a, logits, exp, masked exp, log p, the
# positive terms and backward's gradients) and 5 boolean masks (eye, positives, their
# complements and products).
SIMILARITY_BYTES_PER_PAIR = 13 * FLOAT32 + 5


def cff_parameters(config: CFFConfig, channels: int, side: int, num_classes: int) -> int:
    """Encoder and head: layer 0's embedding Linear(C p^2 -> E) and positions (T E), L blocks
    (`vit_block_parameters`), the head LayerNorm(E) + Linear(E -> K)."""
    tokens = (side // config.patch) ** 2
    embedding = linear_parameters(channels * config.patch**2, config.width) + tokens * config.width
    blocks = config.depth * vit_block_parameters(config.width, config.mlp_ratio)
    head = layer_norm_parameters(config.width) + linear_parameters(config.width, num_classes)
    return embedding + blocks + head


def cff_logged_points(config: CFFConfig) -> int:
    """Per stage-1 epoch: loss, car and grad_norm of each of the L layers, the summed loss and
    positives_per_anchor (3 L + 2), and val_loss of each layer with select_by_validation; per
    head epoch head_loss (+ head_val_loss and head_val_accuracy with select_by_validation).
    Exact unless the loss turns non-finite (stage 1 then stops early)."""
    select = config.select_by_validation
    per_epoch = 3 * config.depth + 2 + (config.depth if select else 0)
    per_head_epoch = 1 + (2 if select else 0)
    return config.epochs * per_epoch + config.head_epochs * per_head_epoch


def cff_estimate(config: CFFConfig) -> ResourceEstimate:
    """Memory: the decoded dataset; parameters, gradients, AdamW's two moments and the best
    encoder's copy; then the larger of a stage-1 step and the test evaluation. A stage-1 step
    of A = 2 B anchors (two views of B images) holds the augmented views, one layer's
    activations (layers train one at a time on detached inputs; layer 0 adds the patches and
    its embedding), backward's gradient buffers and the A x A similarity matrices of its loss.
    Validation and the head stage run the same batches without a graph, so they stay below."""
    shape = dataset_shape(config)
    splits = split_sizes(config, shape)
    side, e, t = shape.side, config.width, (shape.side // config.patch) ** 2
    batch = min(config.batch_size, splits.train)
    anchors = 2 * batch
    parameters = cff_parameters(config, shape.channels, side, shape.num_classes)
    block = vit_block_activation_floats(t, e, config.heads, config.mlp_ratio)
    layer0_extra = t * (shape.channels * config.patch**2 + 3 * e)
    model_fields = ("width", "depth", "mlp_ratio")
    act_fields = ("batch_size", "image_size", "patch", "heads", "width")
    data = Term(dataset_bytes(shape), dataset_fields(config))
    state = Term(training_state_bytes(parameters, "adamw")
                 + (FLOAT32 * parameters if config.select_by_validation else 0), model_fields)
    largest = vit_block_largest_floats(t, e, config.heads, config.mlp_ratio)
    train = [
        data, state,
        Term(augmented_batch_bytes(config, shape, anchors), ("batch_size", "image_size")),
        Term(FLOAT32 * anchors * (block + t * e + layer0_extra), act_fields),
        Term(FLOAT32 * 2 * anchors * largest, act_fields),
        Term(SIMILARITY_BYTES_PER_PAIR * anchors**2, ("batch_size",)),
    ]
    eval_batch = min(EVAL_BATCH, splits.test)
    evaluation = [
        data, state,
        Term(FLOAT32 * 3 * eval_batch * shape.image_elements, ("image_size",)),
        Term(FLOAT32 * eval_batch * (block + t * e + layer0_extra),
             ("image_size", "patch", "heads", "width")),
    ]
    memory, fields = peak([decode_phase(config, shape), train, evaluation])
    return ResourceEstimate(memory, fields, cff_logged_points(config),
                            ("epochs", "depth", "head_epochs", "select_by_validation"))
