"""Every dataset a run can read, and what is known of it before it is loaded: its images, its
classes, its augmentation and normalisation, and for the torchvision datasets the files on disk.
The loader (trainers/data/sources.py) and the memory estimates (trainers/estimates.py) both read
it here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dataset:
    """One dataset. `num_classes` and `splits` (train, test images) are None for `synthetic`,
    whose config sets them; `files` (relative to a data root, in torchvision's layout) is empty
    for the datasets that need none (bundled or generated). `mean`/`std`: published
    normalisation constants; None means channel statistics of the training images."""

    name: str
    native_size: int
    channels: int
    num_classes: int | None
    splits: tuple[int, int] | None
    hflip: bool
    crop_padding_fraction: float
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    files: tuple[str, ...] = ()
    folder_hint: str = ""
    url: str = ""


def _idx_files(folder: str) -> tuple[str, ...]:
    return tuple(
        f"{folder}/{f}"
        for f in (
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        )
    )


CATALOGUE: dict[str, Dataset] = {
    d.name: d
    for d in (
        # scikit-learn's bundled 8x8 digits: a fixed 20% stratified test split of 1,797
        Dataset("digits", 8, 1, 10, (1_442, 355), hflip=False, crop_padding_fraction=1 / 8),
        Dataset("synthetic", 16, 3, None, None, hflip=False, crop_padding_fraction=1 / 8),
        # CFF's CIFAR-10 padding (paper spec section 3, mirrored quirk)
        Dataset(
            "cifar10",
            32,
            3,
            10,
            (50_000, 10_000),
            hflip=True,
            crop_padding_fraction=12 / 32,
            mean=(0.4914, 0.4822, 0.4465),
            std=(0.2023, 0.1994, 0.2010),  # CFF's constants, not the true std (0.247, ...)
            files=(
                *(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)),
                "cifar-10-batches-py/test_batch",
            ),
            folder_hint="cifar-10-batches-py",
            url="https://www.cs.toronto.edu/~kriz/cifar.html",
        ),
        Dataset(
            "cifar100",
            32,
            3,
            100,
            (50_000, 10_000),
            hflip=True,
            crop_padding_fraction=4 / 32,
            mean=(0.5071, 0.4865, 0.4409),
            std=(0.2673, 0.2564, 0.2762),
            files=("cifar-100-python/train", "cifar-100-python/test"),
            folder_hint="cifar-100-python",
            url="https://www.cs.toronto.edu/~kriz/cifar.html",
        ),
        Dataset(
            "svhn",
            32,
            3,
            10,
            (73_257, 26_032),
            hflip=False,
            crop_padding_fraction=4 / 32,
            files=("train_32x32.mat", "test_32x32.mat"),
            folder_hint=".",
            url="http://ufldl.stanford.edu/housenumbers/ (format 2: train_32x32.mat, "
            "test_32x32.mat)",
        ),
        Dataset(
            "fashion_mnist",
            28,
            1,
            10,
            (60_000, 10_000),
            hflip=True,
            crop_padding_fraction=4 / 32,
            files=_idx_files("FashionMNIST/raw"),
            folder_hint="FashionMNIST/raw",
            url="https://github.com/zalandoresearch/fashion-mnist (gunzip the four files)",
        ),
        Dataset(
            "mnist",
            28,
            1,
            10,
            (60_000, 10_000),
            hflip=False,
            crop_padding_fraction=4 / 32,
            files=_idx_files("MNIST/raw"),
            folder_hint="MNIST/raw",
            url="https://yann.lecun.com/exdb/mnist/ (gunzip the four files)",
        ),
    )
}

DATASETS = tuple(CATALOGUE)
# The datasets read from files under a data root (torchvision's classes, its on-disk layout).
TORCHVISION_DATASETS = tuple(name for name, d in CATALOGUE.items() if d.files)
NATIVE_SIZE = {name: d.native_size for name, d in CATALOGUE.items()}
# Each dataset's reference crop padding as a fraction of the image side (DataConfig's
# `crop_padding` when it is left null).
CROP_PADDING_FRACTION = {name: d.crop_padding_fraction for name, d in CATALOGUE.items()}
