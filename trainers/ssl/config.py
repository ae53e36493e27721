"""The `ssl` trainer's config: the official defaults per method (spec section 3)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from trainers.data import AUGMENT_STRENGTH, DEVICE, IMAGE_SIZE, VAL_FRACTION, DataConfig
from trainers.precision import PRECISION, Precision

Method = Literal["simclr", "simsiam", "byol"]

# The official configs (spec section 3); None in a Config means "the method's default".
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "simclr": {"lr": 0.6, "weight_decay": 1e-6, "temperature": 0.5, "proj_dim": 128},
    "simsiam": {"lr": 0.2, "weight_decay": 5e-4, "temperature": 1.0, "proj_dim": 2048},
    "byol": {"lr": 0.2, "weight_decay": 5e-4, "temperature": 1.0, "proj_dim": 2048},
}


class SSLConfig(DataConfig):
    method: Method = Field(
        "simclr",
        description=(
            "simclr: decoupled NT-Xent between the two views' projections; simsiam: symmetric "
            "negative cosine of each view's prediction against the other's stop-gradient "
            "projection; byol: the same against an EMA target network's projection (byol_tau). "
            "Sets the defaults of lr, weight_decay, temperature and proj_dim"
        ),
    )
    cut: float = Field(
        1.0,
        ge=1.0,
        le=1000.0,
        description=(
            "Cut-initialisation: every parameter divided by cut at the start (1 = off; paper: 3)"
        ),
    )
    grad_scale_power: float = Field(
        0.0,
        ge=-4.0,
        le=4.0,
        description=(
            "GradScale power p: the embedding's gradient is multiplied by ||z||^p (0 = off; "
            "paper: 1)"
        ),
    )
    weight_decay: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=("None: the method's default (SimCLR 1e-6, SimSiam/BYOL 5e-4)"),
    )
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd",
        description=(
            "sgd: momentum 0.9, Nesterov for SimSiam and BYOL (the official configs); adam: "
            "torch's Adam with the same lr and weight_decay"
        ),
    )
    lr: float | None = Field(
        None,
        gt=0.0,
        le=100.0,
        description=(
            "Peak learning rate; None: the method's default (SimCLR 0.6, SimSiam/BYOL 0.2)"
        ),
    )
    lr_schedule: Literal["nominal", "squared"] = Field(
        "nominal",
        description=(
            "nominal: warm-up to lr, cosine to lr * 1e-3 (the intended schedule); squared: peak "
            "lr^2 and floor lr * 1e-3, the schedule the official code runs by accident (quirk 1)"
        ),
    )
    warmup_epochs: int = Field(
        10,
        ge=0,
        le=100_000,
        description=("Epochs of linear warm-up to the peak lr before the cosine decay (0: none)"),
    )
    temperature: float | None = Field(
        None, gt=0.0, le=100.0, description=("None: SimCLR 0.5, SimSiam/BYOL 1.0")
    )
    epochs: int = Field(
        512, ge=1, le=100_000, description=("Training epochs; the lr schedule spans them all")
    )
    batch_size: int = Field(
        512, ge=2, le=65_536, description=("Images per step, two views of each")
    )
    backbone: Literal["resnet_small", "resnet18"] = Field(
        "resnet18",
        description=(
            "resnet18: the paper's CIFAR ResNet-18 (3x3 stem, no max-pool, zero-init residuals); "
            "resnet_small: the same design with widths 16/32/64, one block per stage, for CPUs"
        ),
    )
    proj_dim: int | None = Field(
        None, ge=2, le=16_384, description=("Projector width (None: SimCLR 128, SimSiam/BYOL 2048)")
    )
    pred_hidden: int = Field(512, ge=2, le=16_384, description="SimSiam/BYOL predictor hidden")
    byol_tau: float = Field(
        0.99,
        ge=0.0,
        lt=1.0,
        description=(
            "BYOL: after every step the target network becomes tau * target + (1 - tau) * online "
            "(ignored by SimCLR and SimSiam)"
        ),
    )
    view_strength: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description=(
            "SimCLR view augmentation strength (0.5: the paper's jitter 0.4/0.4/0.4/0.1), for the "
            "training views and the per-epoch kNN bank alike"
        ),
    )
    held_out_classes: int = Field(
        0,
        ge=0,
        le=1000,
        description=(
            "The last held_out_classes classes are removed from training: their test images are "
            "the out-of-distribution set for the norm comparison"
        ),
    )
    knn_k: int = Field(200, ge=1, le=10_000, description="kNN monitor on backbone features: k")
    knn_temperature: float = Field(
        0.1, gt=0.0, le=10.0, description=("kNN monitor: similarity temperature")
    )
    eval_every: int = Field(1, ge=1, le=100_000, description=("kNN monitor: how often (epochs)"))
    target_knn_accuracy: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description=("Epochs to reach this kNN accuracy are reported (null if never reached)"),
    )
    # SSL uses its own views, not the shared crop pipeline; no validation split by default.
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0, description=VAL_FRACTION)
    augment_strength: float = Field(0.0, ge=0.0, le=1.0, description=AUGMENT_STRENGTH)
    image_size: int | None = Field(32, ge=4, le=512, description=IMAGE_SIZE)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=DEVICE)
    precision: Precision = Field(
        "fp32",
        description=(
            PRECISION + ". bf16 also keeps the ResNet's activations channels-last on a GPU"
        ),
    )

    def resolved(self, name: str) -> Any:
        """The value of `name` (one of METHOD_DEFAULTS' fields) a run uses: the field, else the
        method's default."""
        value = getattr(self, name)
        return METHOD_DEFAULTS[self.method][name] if value is None else value

    def resolved_fields(self) -> dict[str, Any]:
        return {
            **super().resolved_fields(),
            **{name: self.resolved(name) for name in METHOD_DEFAULTS[self.method]},
        }
