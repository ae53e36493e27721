"""The images the `ssl` trainer sees: the in-distribution positions, the raw [0, 1] images and
the SimCLR views made from them."""

from __future__ import annotations

import torch

from trainers.data import ImageSplits, Split
from trainers.data.augment import simclr_augment
from trainers.ssl.config import SSLConfig


def in_distribution(splits: ImageSplits, held_out: int) -> dict[str, torch.Tensor]:
    """Positions within the train and test splits of the kept classes, and of held-out test."""
    k = splits.num_classes
    if held_out >= k:
        raise ValueError(f"held_out_classes ({held_out}) must be below the number of classes ({k})")
    limit = k - held_out
    train_labels, test_labels = splits.labels("train"), splits.labels("test")
    return {
        "train": (train_labels < limit).nonzero().flatten(),
        "test": (test_labels < limit).nonzero().flatten(),
        "held_out": (test_labels >= limit).nonzero().flatten(),
    }


def raw_images(
    splits: ImageSplits, split: Split, positions: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """[0, 1] images without normalisation (the paper's SSL pipeline uses ToTensor only)."""
    return splits.images(split, positions, device=device, normalized=False)


def view(
    x: torch.Tensor, generator: torch.Generator, config: SSLConfig, splits: ImageSplits
) -> torch.Tensor:
    """One SimCLR view of a batch at the config's view_strength, flipped where the dataset
    allows it; every random choice drawn from `generator`."""
    return simclr_augment(x, generator, hflip=splits.data.hflip, strength=config.view_strength)
