"""The `cff` run's configuration and its per-layer margin schedule."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from trainers.data import DEVICE, DataConfig
from trainers.losses.supcon_margin import MarginMode, Stability
from trainers.precision import PRECISION, Precision

MAX_DEPTH = 16


class CFFConfig(DataConfig):
    margin_mode: MarginMode = Field(
        "clamp",
        description=(
            "clamp: s' = min(s + m, 1) on positive pairs (CFF); subtract: log p - m on positive "
            "pairs (gradient-neutral); none: no margin"
        ),
    )
    stability: Stability = Field(
        "detach",
        description=(
            "detach: the row max M_i is detached (CFF); direct: not. Equal in exact arithmetic"
        ),
    )
    margin_schedule: Literal["linear", "parabolic", "cosine", "exponential"] = Field(
        "linear",
        description="Per-layer margins from margin_start (layer 0) to margin_end "
        "(last layer); CFF's default is linear 0.4 -> 0.1",
    )
    margin_start: float = Field(0.4, ge=0.0, le=2.0, description="The margin of layer 0")
    margin_end: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description=("The margin of the last layer; None means margin_start / 4"),
    )
    temperature: float = Field(
        0.15,
        gt=0.0,
        le=10.0,
        description=(
            "tau of every layer's contrastive loss: the logits are the (margined) cosine "
            "similarities divided by tau"
        ),
    )
    width: int = Field(128, ge=4, le=4096, description="ViT: embedding width E")
    depth: int = Field(5, ge=1, le=MAX_DEPTH, description="ViT: layers L")
    heads: int = Field(4, ge=1, le=64, description="ViT: attention heads")
    patch: int = Field(4, ge=1, le=64, description="ViT: patch side")
    mlp_ratio: int = Field(2, ge=1, le=16, description="ViT: MLP width mlp_ratio * E")
    epochs: int = Field(
        600, ge=1, le=100_000, description=("Stage 1 (layer-local contrastive) epochs")
    )
    head_epochs: int = Field(
        50,
        ge=0,
        le=100_000,
        description=(
            "Stage 2 (head) epochs; 0 leaves the head untrained (for throughput benchmarks only)"
        ),
    )
    batch_size: int = Field(
        512,
        ge=2,
        le=65_536,
        description=("Images per batch; each gives two views, so 2 * batch_size anchors"),
    )
    lr: float = Field(
        4e-3,
        gt=0.0,
        le=10.0,
        description=("Stage 1: learning rate of each layer's own AdamW, constant (no schedule)"),
    )
    head_lr: float = Field(
        5e-4, gt=0.0, le=10.0, description=("Stage 2: learning rate of the head's AdamW, constant")
    )
    weight_decay: float = Field(
        0.01,
        ge=0.0,
        le=10.0,
        description=(
            "AdamW's decoupled weight decay, for the layers (stage 1) and the head (stage 2)"
        ),
    )
    select_by_validation: bool = Field(
        True,
        description=(
            "Keep the encoder with the best last-layer validation loss and the head with the best "
            "validation cross-entropy (CFF); false keeps the last (needs no validation split)"
        ),
    )
    image_size: int | None = Field(
        32,
        ge=4,
        le=512,
        description=(
            "Model input side; the paper's 32 (digits are upsampled to it). None: the dataset's own"
        ),
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=DEVICE)
    precision: Precision = Field("fp32", description=PRECISION)

    @model_validator(mode="after")
    def _check(self) -> CFFConfig:
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be divisible by heads ({self.heads})")
        side = self.resolved_image_size
        if side % self.patch:
            raise ValueError(f"image side {side} must be divisible by patch ({self.patch})")
        if self.select_by_validation and self.val_fraction == 0.0:
            raise ValueError("select_by_validation needs val_fraction > 0")
        return self

    @property
    def resolved_margin_end(self) -> float:
        """The last layer's margin: `margin_end`, else margin_start / 4 (CFF's 0.4 -> 0.1)."""
        return self.margin_start / 4 if self.margin_end is None else self.margin_end

    def resolved_fields(self) -> dict[str, Any]:
        return {**super().resolved_fields(), "margin_end": self.resolved_margin_end}

    def margins(self) -> list[float]:
        return margin_schedule(
            self.margin_schedule, self.margin_start, self.resolved_margin_end, self.depth
        )


def margin_schedule(kind: str, start: float, end: float, depth: int) -> list[float]:
    """Per-layer margins m_0..m_{L-1} from `start` to `end`.

    linear is CFF's linspace(0.4, 0.1, L). The other shapes are seedgrid's: parabolic
    m0 + (mL - m0) t^2, cosine mL + (m0 - mL)(1 + cos(pi t)) / 2, exponential m0 (mL/m0)^t,
    with t = l / (L - 1).
    """
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
