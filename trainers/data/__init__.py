"""The dataset layer shared by every trainer: sources, seeded splits, imbalance, augmentation.

    config = SomeTrainer.Config(dataset="digits", image_size=16, augment_strength=0.5)
    splits = prepare_splits(config, random_sources(seed))
    for idx in splits.train_batches(batch_size=128, generator=sources.data):
        x, y = splits.images("train", idx, augment_generator=sources.augment)

A trainer's Config inherits `DataConfig` to get the dataset fields. The decoded dataset is cached
per process; splits are index tensors drawn from the run's `data` generator; augmentation draws
from its `augment` generator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from api_schemas import MAX_SEED
from api_schemas.data_roots import ROOT_NAME
from trainers.base import PreflightProblem, TrainerConfig
from trainers.data.augment import AugmentPlan, Draws, apply, augment, draw, normalize
from trainers.data.catalogue import (
    CROP_PADDING_FRACTION,
    DATASETS,
    NATIVE_SIZE,
    TORCHVISION_DATASETS,
)
from trainers.data.sources import (
    DatasetUnavailable,
    ImageData,
    data_root,
    dataset_not_found,
    downloads_allowed,
    load_count,
    load_images,
    missing_files,
)
from trainers.random_sources import RandomSources

DatasetName = Literal[
    "digits", "synthetic", "cifar10", "cifar100", "svhn", "fashion_mnist", "mnist"
]
Split = Literal["train", "val", "test"]


# The largest train_size or test_size: more images than any dataset here has (the numbers reach
# torch and numpy as sizes, so a config gives them in bounds, not as any integer).
MAX_SPLIT_SIZE = 10_000_000

# Descriptions of the fields a trainer's Config may redeclare with its own default.
IMAGE_SIZE = (
    "Side of the model's input in pixels; None: the dataset's own (digits 8, "
    "synthetic 16, MNIST-like 28, CIFAR/SVHN 32). 28 -> 32 zero-pads; other changes "
    "resize bilinearly"
)
VAL_FRACTION = "Seeded fraction of the training set held out for validation"
AUGMENT_STRENGTH = (
    "0 = none, 0.5 = the reference crop + flip pipeline, 1 = RandAugment(3, 14) + 1.5x padding"
)
DEVICE = (
    "auto: the GPU Ray assigned to the run's worker if there is one, else the CPU; cuda "
    "fails the run when the worker sees no GPU"
)


class DataConfig(TrainerConfig):
    """Dataset fields shared by every trainer's Config."""

    dataset: DatasetName = Field(
        "digits",
        description=(
            "digits (scikit-learn's bundled 8x8) and synthetic need no files; the others read "
            "torchvision's on-disk layout under the operator's data root"
        ),
    )
    data_root: str | None = Field(
        None,
        description=(
            "The name of one of the operator's data roots (SEEDGRID_DATA_ROOTS), never a path; "
            "None: the default root, $SEEDGRID_DATA_ROOT (else ~/.cache/seedgrid/data)"
        ),
    )
    download: bool = Field(
        False,
        description=(
            "Let torchvision download missing files into the data root (the operator must allow "
            "it with SEEDGRID_ALLOW_DOWNLOAD, and the worker needs internet access)"
        ),
    )
    image_size: int | None = Field(None, ge=4, le=512, description=IMAGE_SIZE)
    rgb: bool = Field(
        True,
        description=(
            "Repeat grayscale images to 3 channels so one architecture serves every dataset"
        ),
    )
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=VAL_FRACTION)
    imbalance_ratio: float = Field(
        1.0,
        ge=1.0,
        le=10_000.0,
        description=(
            "Exponential class imbalance n_max / n_min over class index (1 = balanced; test stays "
            "balanced): class c keeps the first floor(n_c * ratio^(-c/(K-1))) of its training "
            "images"
        ),
    )
    train_size: int | None = Field(
        None,
        ge=2,
        le=MAX_SPLIT_SIZE,
        description=(
            "Seeded subsample of the training set after the split and imbalance (None: all of it)"
        ),
    )
    test_size: int | None = Field(
        None,
        ge=1,
        le=MAX_SPLIT_SIZE,
        description=(
            "The first test_size images of a fixed permutation of the test set (the same for all "
            "seeds)"
        ),
    )
    augment_strength: float = Field(0.5, ge=0.0, le=1.0, description=AUGMENT_STRENGTH)
    crop_padding: int | None = Field(
        None,
        ge=0,
        le=256,
        description=(
            "Reference crop padding in pixels at strength 0.5; None: the dataset's (CIFAR-10 12/32)"
        ),
    )
    synthetic_classes: int = Field(10, ge=2, le=1000, description="synthetic dataset: classes")
    synthetic_train_per_class: int = Field(
        200, ge=2, le=100_000, description=("synthetic dataset: training images per class")
    )
    synthetic_test_per_class: int = Field(
        50, ge=1, le=100_000, description=("synthetic dataset: test images per class")
    )
    synthetic_difficulty: float = Field(
        0.5, ge=0.0, le=1.0, description=("synthetic dataset: difficulty in [0, 1]")
    )
    synthetic_seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description=(
            "synthetic dataset: generator seed (fixed across runs, so every seed sees the same "
            "dataset)"
        ),
    )

    @field_validator("data_root")
    @classmethod
    def _a_root_name(cls, value: str | None) -> str | None:
        if value is not None and not ROOT_NAME.fullmatch(value):
            raise ValueError(
                "data_root names one of the operator's data roots (SEEDGRID_DATA_ROOTS), not a "
                "path: a spec never chooses the directories a worker reads (the CIFAR format is "
                "a pickle, and unpickling runs code)"
            )
        return value

    @property
    def resolved_image_size(self) -> int:
        """The model's input side: `image_size`, else the dataset's own."""
        return self.image_size or NATIVE_SIZE[self.dataset]

    @property
    def resolved_crop_padding(self) -> int:
        """The reference crop padding (at strength 0.5): `crop_padding`, else the dataset's
        fraction of the image side."""
        if self.crop_padding is not None:
            return self.crop_padding
        return round(CROP_PADDING_FRACTION[self.dataset] * self.resolved_image_size)

    def resolved_fields(self) -> dict[str, Any]:
        # data_root, train_size and test_size stay null: null is their value (the operator's
        # default root, the whole split), not a number worked out from the config
        return {
            **super().resolved_fields(),
            "image_size": self.resolved_image_size,
            "crop_padding": self.resolved_crop_padding,
        }


def download_refused(config: DataConfig) -> str | None:
    """Why this worker refuses the config's `download: true` (None: it asks for no download,
    or the operator allows them here)."""
    if not config.download or downloads_allowed():
        return None
    return (
        f"dataset {config.dataset!r}: the config asks for 'download: true', but downloads "
        "are off on this worker (the operator allows them with SEEDGRID_ALLOW_DOWNLOAD=true)"
        "; without them the operator puts the files under the data root"
    )


def dataset_problems(config: DataConfig) -> list[PreflightProblem]:
    """What would make `load_for(config)` fail for want of files on this machine, found by
    looking, not reading: a refused download, a data root this machine does not name, files
    missing under the root. The same checks and messages as the load itself; nothing is
    opened (the CIFAR format is a pickle) and the root is only ever the operator's."""
    if (refused := download_refused(config)) is not None:
        return [PreflightProblem("download", refused)]
    if config.dataset not in TORCHVISION_DATASETS:
        return []
    try:
        root = data_root(config.data_root)
    except DatasetUnavailable as exc:
        return [PreflightProblem("data_root", str(exc))]
    missing = [] if config.download else missing_files(config.dataset, root)
    if missing:
        return [PreflightProblem("dataset", str(dataset_not_found(config.dataset, root, missing)))]
    return []


def load_for(config: DataConfig) -> ImageData:
    """The dataset a config names, at its resolution (cached per process), from the
    operator's root the config selects; a download only where the operator allows it."""
    if (refused := download_refused(config)) is not None:
        raise DatasetUnavailable(refused)
    needs_files = config.dataset in TORCHVISION_DATASETS
    return load_images(
        config.dataset,
        image_size=config.resolved_image_size,
        rgb=config.rgb,
        root=data_root(config.data_root) if needs_files else None,
        download=config.download,
        synthetic=(
            config.synthetic_classes,
            config.synthetic_train_per_class,
            config.synthetic_test_per_class,
            config.synthetic_difficulty,
            config.synthetic_seed,
        ),
    )


def imbalanced_subset(labels: np.ndarray, num_classes: int, ratio: float) -> np.ndarray:
    """Positions kept under the exponential profile: class c keeps its first
    floor(n_c * ratio^(-c/(K-1))) members (at least one), in the given order."""
    keep = []
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        share = ratio ** (-c / (num_classes - 1)) if num_classes > 1 else 1.0
        keep.append(members[: max(1, int(np.floor(len(members) * share + 1e-9)))])
    return np.sort(np.concatenate(keep))


@dataclass
class ImageSplits:
    """Index views of a cached dataset for one run, and how to turn them into batches."""

    data: ImageData
    train: torch.Tensor  # indices into data.train_x
    val: torch.Tensor  # indices into data.train_x, disjoint from train
    test: torch.Tensor  # indices into data.test_x
    plan: AugmentPlan

    @property
    def num_classes(self) -> int:
        return self.data.num_classes

    def labels(self, split: Split) -> torch.Tensor:
        source = self.data.test_y if split == "test" else self.data.train_y
        return source[getattr(self, split)]

    def train_batches(
        self, batch_size: int, generator: torch.Generator, *, drop_last: bool = False
    ) -> Iterator[torch.Tensor]:
        """Positions within `train` for one epoch, shuffled by `generator` (the data source)."""
        order = torch.randperm(len(self.train), generator=generator)
        stop = len(order) - len(order) % batch_size if drop_last else len(order)
        for start in range(0, stop, batch_size):
            chunk = order[start : start + batch_size]
            if len(chunk) >= 2:  # a contrastive batch needs two images
                yield chunk

    def images(
        self,
        split: Split,
        positions: torch.Tensor | None = None,
        *,
        augment_generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        normalized: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Images and labels at `positions` of a split (all when None), normalised per channel
        unless `normalized` is false (then on [0, 1]); augmented with the split's plan when
        `augment_generator` is given."""
        index = getattr(self, split)
        if positions is not None:
            index = index[positions]
        # gathered from the dataset's copy on `device`, so only the indices travel each batch
        train_x, train_y, test_x, test_y = self.data.on(device)
        source_x, source_y = (test_x, test_y) if split == "test" else (train_x, train_y)
        index = index.to(source_x.device, non_blocking=True)
        x = source_x[index].to(dtype=dtype).div_(255.0)
        if augment_generator is not None:
            x = augment(x, self.plan, augment_generator)
        if normalized:
            x = normalize(x, self.data.mean, self.data.std)
        return x, source_y[index]


def stacked_images(
    seeds: Sequence[ImageSplits],
    split: Split,
    positions: Sequence[torch.Tensor],
    generators: Sequence[torch.Generator] | None = None,
    *,
    views: int = 1,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K seeds' batches as one: seed k's images at `positions[k]` of its split, `views` times
    (each view augmented from `generators[k]`, view after view, as `views` calls of its
    `images` draw them), normalised: K x (views * n) x C x H x W, and the labels, K x n.

    One gather, one augmentation and one normalisation for every seed (the random choices are
    drawn per seed on the host, then applied to all images at once): bit-identical to each
    seed's `images` calls, at a few ops a batch instead of a few per seed and view. Seeds whose
    splits read different datasets or plans are gathered one by one; the batches must be of
    one size."""
    first = seeds[0]
    sizes = {len(p) for p in positions}
    if len(sizes) != 1:
        raise ValueError(f"stacked_images: the seeds' batches differ in size ({sorted(sizes)})")
    if any(s.data is not first.data or s.plan != first.plan for s in seeds):
        picks: list[torch.Generator | None] = (
            list(generators) if generators is not None else [None] * len(seeds)
        )
        parts = [
            _views_of(s, split, p, g, views, device, dtype)
            for s, p, g in zip(seeds, positions, picks, strict=True)
        ]
        return torch.stack([x for x, _ in parts]), torch.stack([y for _, y in parts])
    k, n = len(seeds), sizes.pop()
    index = torch.stack([getattr(s, split)[p] for s, p in zip(seeds, positions, strict=True)])
    train_x, train_y, test_x, test_y = first.data.on(device)
    source_x, source_y = (test_x, test_y) if split == "test" else (train_x, train_y)
    index = index.to(source_x.device, non_blocking=True)
    gathered = index[:, None, :].expand(k, views, n).flatten()
    x = source_x[gathered].to(dtype=dtype).div_(255.0)
    if generators is not None and first.plan.active:
        draws = [draw(first.plan, n, g) for g in generators for _ in range(views)]
        x = apply(x, first.plan, Draws.concat(draws))
    x = normalize(x, first.data.mean, first.data.std)
    return x.unflatten(0, (k, views * n)), source_y[index]


def _views_of(
    splits: ImageSplits,
    split: Split,
    positions: torch.Tensor,
    generator: torch.Generator | None,
    views: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    batches = [
        splits.images(split, positions, augment_generator=generator, device=device, dtype=dtype)
        for _ in range(views)
    ]
    return torch.cat([x for x, _ in batches]), batches[0][1]


def prepare_splits(config: DataConfig, sources: RandomSources) -> ImageSplits:
    """Load (or reuse) the dataset and draw this run's splits from its `data` generator."""
    data = load_for(config)
    n = len(data.train_y)
    order = torch.randperm(n, generator=sources.data).numpy()
    n_val = int(round(config.val_fraction * n))
    val = np.sort(order[:n_val])
    train = np.sort(order[n_val:])
    if config.imbalance_ratio > 1.0:
        train = train[
            imbalanced_subset(data.train_y.numpy()[train], data.num_classes, config.imbalance_ratio)
        ]
    if config.train_size is not None and config.train_size < len(train):
        pick = torch.randperm(len(train), generator=sources.data)[: config.train_size].numpy()
        train = np.sort(train[pick])
    test = np.arange(len(data.test_y))
    if config.test_size is not None and config.test_size < len(test):
        test = np.sort(np.random.default_rng(0).permutation(len(test))[: config.test_size])
    plan = AugmentPlan.from_strength(
        config.augment_strength,
        image_side=data.image_shape[-1],
        padding_fraction=data.crop_padding_fraction,
        hflip=data.hflip,
        crop_padding=config.resolved_crop_padding,
    )
    return ImageSplits(
        data=data,
        train=torch.from_numpy(train),
        val=torch.from_numpy(val),
        test=torch.from_numpy(test),
        plan=plan,
    )


__all__ = [
    "DATASETS",
    "TORCHVISION_DATASETS",
    "AugmentPlan",
    "DataConfig",
    "DatasetName",
    "DatasetUnavailable",
    "ImageData",
    "ImageSplits",
    "Split",
    "augment",
    "dataset_problems",
    "imbalanced_subset",
    "load_count",
    "load_for",
    "load_images",
    "normalize",
    "prepare_splits",
    "stacked_images",
]
