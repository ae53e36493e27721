"""Arithmetic shared by the trainers' resource estimates (`Trainer.estimate`).

An estimate is pure arithmetic on a config (no model, no dataset, no allocation), so that the
service can call it for every condition of a grid before anything is queued. A trainer lists the
phases of its run (decoding the dataset, a training step, an evaluation pass), each as the groups
of tensors alive at that phase's peak (`Term`: bytes and the config fields that size them), and
reports the largest phase (`peak`). The formulas count the tensors the code allocates, rounded
up where the exact figure depends on the data or on a kernel's choice (attention maps are counted
even where a fused kernel would not keep them, class imbalance is ignored), so an estimate is an
upper bound of the true peak within a small factor; tests/trainers/test_estimates.py measures it
on CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainers.data import DataConfig
from trainers.data.augment import AugmentPlan
from trainers.data.catalogue import CATALOGUE

FLOAT32 = 4
FLOAT64 = 8
INT64 = 8

# A term below this share of its phase's total names no config field in a refusal.
MINOR_SHARE = 0.05
# Allocations besides the counted tensors (Python objects, kernels' scratch space): under 1 MiB
# for the smallest runs of every trainer on CPU, with a margin.
RUN_OVERHEAD_BYTES = 16 * 2**20


@dataclass(frozen=True)
class Term:
    """One group of tensors alive together: its bytes and the config fields that size it."""

    nbytes: float
    fields: tuple[str, ...]


def peak(phases: Iterable[Sequence[Term]]) -> tuple[int, tuple[str, ...]]:
    """The largest phase's total bytes plus RUN_OVERHEAD_BYTES, and the fields of its terms,
    those of the largest term first; terms under MINOR_SHARE of the total name no field."""
    totals = [(sum(t.nbytes for t in phase), phase) for phase in phases]
    total, phase = max(totals, key=lambda pair: pair[0])
    fields: list[str] = []
    for term in sorted(phase, key=lambda t: t.nbytes, reverse=True):
        if term.nbytes >= MINOR_SHARE * total:
            fields.extend(f for f in term.fields if f not in fields)
    return math.ceil(total) + RUN_OVERHEAD_BYTES, tuple(fields)


# ---------------------------------------------------------------------------------------------
# parameters and optimisers


def optimizer_state_per_parameter(optimizer: str) -> int:
    """Buffers an optimiser keeps per parameter: Adam and AdamW two moments (exp_avg,
    exp_avg_sq), SGD with momentum one."""
    return 2 if optimizer in ("adam", "adamw") else 1


def training_state_bytes(parameters: int, optimizer: str) -> int:
    """float32 parameters, their gradients and the optimiser's buffers:
    4 (2 + s) bytes per parameter, s from `optimizer_state_per_parameter`."""
    return FLOAT32 * parameters * (2 + optimizer_state_per_parameter(optimizer))


def layer_norm_parameters(width: int) -> int:
    """LayerNorm(d): weight and bias, 2 d."""
    return 2 * width


def linear_parameters(fan_in: int, fan_out: int) -> int:
    """Linear(n -> m) with bias: n m + m."""
    return fan_in * fan_out + fan_out


def vit_block_parameters(width: int, mlp_ratio: int) -> int:
    """cff's pre-LN Block (also ViT-Mini's branch), d = width, r = mlp_ratio: two LayerNorms
    (4 d), qkv (3 d^2 + 3 d), out projection (d^2 + d), fc1 (r d^2 + r d), fc2 (r d^2 + d):
    (4 + 2 r) d^2 + (9 + r) d."""
    d, r = width, mlp_ratio
    return (4 + 2 * r) * d * d + (9 + r) * d


def vit_block_activation_floats(tokens: int, width: int, heads: int, mlp_ratio: int) -> int:
    """Floats one sample leaves for backward in a pre-LN transformer block, T tokens, width d,
    h heads, MLP width r d: LN1, qkv (3), attention output, its head merge, out projection,
    residual, LN2, fc2 and block output (10 T d), fc1 and GELU (2 r T d), and the attention
    scores and softmax (2 h T^2; kept by the math kernel, not by fused ones)."""
    t, d = tokens, width
    return (10 + 2 * mlp_ratio) * t * d + 2 * heads * t * t


def vit_block_largest_floats(tokens: int, width: int, heads: int, mlp_ratio: int) -> int:
    """The largest single activation of a transformer block per sample (attention map h T^2,
    MLP hidden r T d or qkv 3 T d): the size of the gradient buffers backward holds at once."""
    return max(heads * tokens * tokens, mlp_ratio * tokens * width, 3 * tokens * width)


# ---------------------------------------------------------------------------------------------
# datasets

# The largest reference crop padding of any dataset, as a fraction of the side (CIFAR-10's
# 12/32): an upper bound of the padding of the shared crop pipeline.
MAX_CROP_PADDING_FRACTION = max(d.crop_padding_fraction for d in CATALOGUE.values())


@dataclass(frozen=True)
class DatasetShape:
    """A dataset as a config decodes it: images per split, channels and side after `rgb` and
    `image_size`, and its native channels and side."""

    n_train: int
    n_test: int
    channels: int
    side: int
    native_channels: int
    native_side: int
    num_classes: int

    @property
    def image_elements(self) -> int:
        return self.channels * self.side * self.side


def dataset_shape(config: DataConfig) -> DatasetShape:
    entry = CATALOGUE[config.dataset]
    if entry.splits is None or entry.num_classes is None:  # synthetic: its config says
        k = config.synthetic_classes
        n_train, n_test = k * config.synthetic_train_per_class, k * config.synthetic_test_per_class
        classes = k
    else:
        (n_train, n_test), classes = entry.splits, entry.num_classes
    channels = 3 if config.rgb and entry.channels == 1 else entry.channels
    side = config.resolved_image_size
    return DatasetShape(n_train, n_test, channels, side, entry.channels, entry.native_size, classes)


def dataset_fields(config: DataConfig) -> tuple[str, ...]:
    """The config fields that size the decoded dataset."""
    if config.dataset == "synthetic":
        return (
            "synthetic_train_per_class",
            "synthetic_classes",
            "synthetic_test_per_class",
            "image_size",
        )
    return ("dataset", "image_size")


def dataset_bytes(shape: DatasetShape) -> int:
    """The decoded dataset kept for the run: uint8 images of both splits at the model's
    resolution, (N_train + N_test) C S^2 bytes, and int64 labels."""
    n = shape.n_train + shape.n_test
    return n * shape.image_elements + INT64 * n


def dataset_decode_bytes(config: DataConfig, shape: DatasetShape) -> int:
    """Transient bytes of decoding, besides the final images (sources.py `_build`): the native
    uint8 arrays twice (decoded and made contiguous); resizing a split to another side makes
    float32 copies of it (the native input, then interpolate, round and clamp at the target
    size: 4 (C0 S0^2 + 3 C0 S^2) bytes per image); datasets without published normalisation
    compute channel statistics on two float64 copies of the training images (16 C S^2 bytes
    per image). Decoding happens before any model exists, so this is a phase of its own."""
    n = shape.n_train + shape.n_test
    native = shape.native_channels * shape.native_side**2
    raw = 2 * n * native
    resize = 0
    if shape.side != shape.native_side:
        per_image = native + 3 * shape.native_channels * shape.side**2
        resize = FLOAT32 * shape.n_train * per_image
    stats = 0
    if CATALOGUE[config.dataset].mean is None:  # channel statistics computed at load
        stats = 2 * FLOAT64 * shape.n_train * shape.image_elements
    return raw + max(resize, stats)


def decode_phase(config: DataConfig, shape: DatasetShape) -> list[Term]:
    fields = dataset_fields(config)
    return [Term(dataset_bytes(shape), fields), Term(dataset_decode_bytes(config, shape), fields)]


@dataclass(frozen=True)
class Splits:
    """Images per split of one run: at most these many (imbalance only removes more)."""

    train: int
    val: int
    test: int


def split_sizes(config: DataConfig, shape: DatasetShape) -> Splits:
    """The validation fraction of the training images, the rest for training (at most
    train_size), and the first test_size test images."""
    n_val = round(config.val_fraction * shape.n_train)
    n_train = shape.n_train - n_val
    if config.train_size is not None:
        n_train = min(n_train, config.train_size)
    n_test = shape.n_test if config.test_size is None else min(config.test_size, shape.n_test)
    return Splits(n_train, n_val, n_test)


# Float copies of a batch alive at once in the shared pipeline: the float batch, its padded
# copy, the crop (or a RandAugment op's output) and the flip or normalisation output.
AUGMENT_COPIES = 4


def augmented_batch_bytes(config: DataConfig, shape: DatasetShape, batch: int) -> int:
    """float32 bytes of one batch through `ImageSplits.images` with augmentation:
    AUGMENT_COPIES copies at the padded side S + 2 p (p: the crop padding, bounded by
    MAX_CROP_PADDING_FRACTION of the side, 1.5 x above strength 0.5)."""
    plan = AugmentPlan.from_strength(
        config.augment_strength,
        image_side=shape.side,
        padding_fraction=MAX_CROP_PADDING_FRACTION,
        hflip=True,
        crop_padding=config.crop_padding,
    )
    padded = shape.side + 2 * plan.crop_padding
    return FLOAT32 * AUGMENT_COPIES * batch * shape.channels * padded * padded
