"""Where images come from: torchvision's on-disk datasets, scikit-learn's digits, synthetic data.

Every source returns an `ImageData`: uint8 images N x C x H x W at the model's resolution, int64
labels, and the per-channel normalisation. Sources are cached per process (`load_images`), so the
runs a Ray worker process executes one after another read and decode a dataset once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from api_schemas import environment
from trainers.data.catalogue import (
    CATALOGUE,
    CROP_PADDING_FRACTION,
    DATASETS,
    NATIVE_SIZE,
    TORCHVISION_DATASETS,
)

DEFAULT_DATA_ROOT = Path("~/.cache/seedgrid/data").expanduser()


class DatasetUnavailable(RuntimeError):
    """A dataset's files are missing, unreadable or not in the expected layout."""


@dataclass(frozen=True)
class ImageData:
    """A dataset at the model's resolution, shared read-only by the runs of one process."""

    name: str
    train_x: torch.Tensor  # uint8, N x C x H x W
    train_y: torch.Tensor  # int64, N
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]  # per channel, on [0, 1] pixel values
    std: tuple[float, ...]
    # Horizontal flips preserve the label (not for digits or house numbers).
    hflip: bool
    # The reference crop padding as a fraction of the image side (CFF: 12/32 on CIFAR-10).
    crop_padding_fraction: float
    # Copies of the four tensors on other devices, made by `on`, kept as long as this object.
    _copies: dict[str, tuple[torch.Tensor, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _copies_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]

    def on(self, device: torch.device | str) -> tuple[torch.Tensor, ...]:
        """(train_x, train_y, test_x, test_y) on `device`: the tensors themselves on the CPU,
        elsewhere a copy made once per device and process, so that batches are gathered where
        the model runs instead of copied there each step. The copy lives as long as the dataset
        stays in the process's cache (it does not count towards the cache's byte bound)."""
        device = torch.device(device)
        tensors = (self.train_x, self.train_y, self.test_x, self.test_y)
        if device.type == "cpu":
            return tensors
        if device.index is None and device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        with self._copies_lock:
            if str(device) not in self._copies:
                self._copies[str(device)] = tuple(t.to(device) for t in tensors)
            return self._copies[str(device)]


def data_root(name: str | None = None) -> Path:
    """The directory a run reads datasets from: the operator's root called `name`
    (SEEDGRID_DATA_ROOTS), or with no name $SEEDGRID_DATA_ROOT, else ~/.cache/seedgrid/data."""
    if name is None:
        return environment.default_data_root() or DEFAULT_DATA_ROOT
    roots = environment.data_roots()
    if name not in roots:
        known = ", ".join(sorted(roots)) or "none"
        raise DatasetUnavailable(
            f"data root {name!r} is not configured on this worker (named roots here: {known}); "
            "the operator names roots in SEEDGRID_DATA_ROOTS on the service and every worker"
        )
    return roots[name]


def downloads_allowed() -> bool:
    """Whether the operator lets runs download dataset files (SEEDGRID_ALLOW_DOWNLOAD), read as
    the service's settings read it (pydantic's booleans: 1/0, true/false, yes/no, on/off, y/n,
    t/f), so that a spec the service accepts for downloading is downloaded by the workers."""
    try:
        return environment.flag(environment.ALLOW_DOWNLOAD)
    except environment.BadVariable as exc:
        raise DatasetUnavailable(
            f"{exc.name} on this worker: expected {exc.expected}, got {exc.value!r}"
        ) from None


# ---------------------------------------------------------------------------------------------
# torchvision datasets


def _torchvision_class(name: str) -> type:
    """The torchvision dataset class, with md5 checks relaxed to presence checks.

    torchvision verifies the md5 of the official archives' files; seedgrid checks that each file
    exists and then that what it decodes has the right shapes and labels, so a corrupt file still
    fails before training, while re-packed or subsetted files (and the tests' tiny files) load.
    """
    from torchvision import datasets

    if name in ("cifar10", "cifar100"):
        base = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100

        class _Cifar(base):  # type: ignore[valid-type, misc]
            def _check_integrity(self) -> bool:
                folder = Path(self.root) / self.base_folder
                return all((folder / f).is_file() for f, _ in self.train_list + self.test_list)

            def _load_meta(self) -> None:  # class names are not needed
                self.classes: list[str] = []
                self.class_to_idx: dict[str, int] = {}

        return _Cifar
    if name == "svhn":

        class _SVHN(datasets.SVHN):
            def _check_integrity(self) -> bool:
                return (Path(self.root) / self.filename).is_file()

        return _SVHN
    return datasets.FashionMNIST if name == "fashion_mnist" else datasets.MNIST


def missing_files(name: str, root: Path) -> list[str]:
    """The files of torchvision dataset `name` that are not under `root` (paths relative to
    it), found by looking, not reading: what a run of it would fail on before training."""
    return [f for f in CATALOGUE[name].files if not (root / f).is_file()]


def operator_name(root: Path) -> str | None:
    """The name the operator gives a data root: "the default data root" ($SEEDGRID_DATA_ROOT,
    else ~/.cache/seedgrid/data) or "data root 'NAME'" (SEEDGRID_DATA_ROOTS); None for another
    directory (one a caller passed itself)."""
    if root == data_root(None):
        return "the default data root"
    try:
        roots = environment.data_roots()
    except ValueError:  # the service refuses such settings at start; a worker may still have them
        roots = {}
    return next((f"data root {name!r}" for name, path in roots.items() if path == root), None)


def dataset_not_found(name: str, root: Path, missing: list[str]) -> DatasetUnavailable:
    """The error naming what is missing under `root`, where it goes and how to get it. An
    operator's root is named by its name and the files relative to it: the message reaches
    clients (a pre-flight's 422, a run's error), and the operator's directories are not theirs
    to know."""
    spec = CATALOGUE[name]
    named = operator_name(root)
    files = missing if named else [str(root / m) for m in missing]
    shown = ", ".join(files[:3]) + (" ..." if len(files) > 3 else "")
    return DatasetUnavailable(
        f"dataset {name!r} not found under {named or root} (missing {shown}). Put torchvision's "
        f"layout there ({spec.folder_hint if named else root / spec.folder_hint}); get the files "
        f"from {spec.url}. The operator sets the data root ($SEEDGRID_DATA_ROOT, or a named root "
        f"in SEEDGRID_DATA_ROOTS that config.data_root selects; default ~/.cache/seedgrid/data); "
        f"'download: true' works only where the operator allows it (SEEDGRID_ALLOW_DOWNLOAD) and "
        f"the worker has internet access."
    )


def _load_torchvision(name: str, root: Path, download: bool) -> tuple[np.ndarray, ...]:
    spec = CATALOGUE[name]
    missing = missing_files(name, root)
    if missing and not download:
        raise dataset_not_found(name, root, missing)
    cls = _torchvision_class(name)
    arrays = []
    for train in (True, False):
        kwargs = {"split": "train" if train else "test"} if name == "svhn" else {"train": train}
        try:
            ds = cls(str(root), download=download, **kwargs)
        except DatasetUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoding failure means a bad file
            if download and missing:
                raise DatasetUnavailable(
                    f"dataset {name!r}: download into {root} failed ({exc}); without network "
                    f"access put the files there by hand ({spec.url})"
                ) from exc
            raise DatasetUnavailable(
                f"dataset {name!r} under {root} is corrupt or not in torchvision's layout: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        x, y = _as_arrays(name, ds)
        arrays += [x, y]
    return tuple(arrays)


def _as_arrays(name: str, ds: object) -> tuple[np.ndarray, np.ndarray]:
    """N x C x H x W uint8 images and int64 labels from a torchvision dataset object."""
    if name in ("cifar10", "cifar100"):
        x = np.asarray(ds.data).transpose(0, 3, 1, 2)  # type: ignore[attr-defined]
        y = np.asarray(ds.targets)  # type: ignore[attr-defined]
    elif name == "svhn":
        x = np.asarray(ds.data)  # type: ignore[attr-defined]
        y = np.asarray(ds.labels)  # type: ignore[attr-defined]
    else:
        x = np.asarray(ds.data)[:, None]  # type: ignore[attr-defined]
        y = np.asarray(ds.targets)  # type: ignore[attr-defined]
    return x, y.astype(np.int64)


def _check_arrays(name: str, root: Path, x: np.ndarray, y: np.ndarray, split: str) -> None:
    spec = CATALOGUE[name]
    channels, side, classes = spec.channels, spec.native_size, spec.num_classes
    assert classes is not None  # a dataset read from files has a fixed number of classes
    problem = None
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (channels, side, side):
        problem = (
            f"images of shape {x.shape[1:]} and dtype {x.dtype}, expected "
            f"{(channels, side, side)} uint8"
        )
    elif len(x) != len(y) or len(x) == 0:
        problem = f"{len(x)} images but {len(y)} labels"
    elif y.min() < 0 or y.max() >= classes:
        problem = f"labels outside 0..{classes - 1}"
    if problem:
        raise DatasetUnavailable(f"dataset {name!r} under {root}: {split} split has {problem}")


# ---------------------------------------------------------------------------------------------
# embedded datasets


def _load_digits() -> tuple[np.ndarray, ...]:
    """scikit-learn's bundled 8x8 digits (1,797 images); a fixed 20% stratified test split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    y = bunch.target.astype(np.int64)
    # Fixed across seeds (generator seeded 0): every run of a study sees the same test set.
    order = np.random.default_rng(0).permutation(len(y))
    test = np.zeros(len(y), dtype=bool)
    for c in range(10):
        members = order[y[order] == c]
        test[members[: len(members) // 5]] = True
    return x[~test], y[~test], x[test], y[test]


def synthetic_images(
    num_classes: int, train_per_class: int, test_per_class: int, difficulty: float, seed: int
) -> tuple[np.ndarray, ...]:
    """Class-structured 3 x 16 x 16 images; `difficulty` in [0, 1] scales within-class noise.

    Each class has a smooth random prototype (4 x 4 Gaussian noise, bilinearly upsampled); a
    sample is its prototype plus smooth noise of scale 0.2 + 3 * difficulty, shifted by up to
    2 pixels, squashed to [0, 255] with a sigmoid. At difficulty 0 classes are trivially
    separable (nearest class mean: 100% with 5 classes); at 1 that accuracy falls to ~47%.
    """
    g = torch.Generator().manual_seed(seed)
    side = NATIVE_SIZE["synthetic"]

    def smooth(n: int) -> torch.Tensor:
        coarse = torch.randn(n, 3, 4, 4, generator=g)
        return F.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)

    prototypes = smooth(num_classes)
    noise_scale = 0.2 + 3.0 * difficulty

    def draw(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = torch.arange(num_classes).repeat_interleave(per_class)
        x = prototypes[y] + noise_scale * smooth(len(y))
        shifts = torch.randint(-2, 3, (len(y), 2), generator=g)
        x = torch.stack(
            [
                torch.roll(img, (int(a), int(b)), (1, 2))
                for img, (a, b) in zip(x, shifts, strict=True)
            ]
        )
        pixels = torch.round(torch.sigmoid(x) * 255).to(torch.uint8)
        return pixels.numpy(), y.numpy().astype(np.int64)

    return (*draw(train_per_class), *draw(test_per_class))


# ---------------------------------------------------------------------------------------------
# resolution and caching


def _to_size(x: np.ndarray, size: int, name: str) -> torch.Tensor:
    """uint8 images at `size` x `size`: zero-pad 28 -> 32 (as CFF does for FMNIST), else resize."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    side = t.shape[-1]
    if side == size:
        return t
    if name in ("mnist", "fashion_mnist") and size > side and (size - side) % 2 == 0:
        p = (size - side) // 2
        return F.pad(t, (p, p, p, p))
    resized = F.interpolate(
        t.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=size < side
    )
    return resized.round().clamp(0, 255).to(torch.uint8)


def _channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    values = x.double().div(255).transpose(0, 1).reshape(x.shape[1], -1)
    std = values.std(dim=1).clamp(min=1e-3)
    return tuple(float(v) for v in values.mean(dim=1)), tuple(float(v) for v in std)


# Decoded datasets kept per process, least recently used first; bounded so that a stream of
# different resolutions or synthetic sizes cannot grow a worker without limit.
DEFAULT_CACHE_BYTES = 8 * 2**30
MAX_CACHED_DATASETS = 8
_cache: OrderedDict[tuple, ImageData] = OrderedDict()
_cache_lock = threading.Lock()
_loads = {"count": 0}


def cache_limit_bytes() -> int:
    """The cache's bound in bytes: SEEDGRID_DATASET_CACHE_GB on the worker, else 8 GiB."""
    try:
        gigabytes = environment.non_negative(environment.DATASET_CACHE_GB)
    except environment.BadVariable as exc:
        raise DatasetUnavailable(
            f"{exc.name}={exc.value!r} on this worker is not a number of GB >= 0"
        ) from None
    return DEFAULT_CACHE_BYTES if gigabytes is None else int(gigabytes * 2**30)


def dataset_bytes(data: ImageData) -> int:
    return sum(
        t.numel() * t.element_size() for t in (data.train_x, data.train_y, data.test_x, data.test_y)
    )


def load_images(
    name: str,
    *,
    image_size: int | None = None,
    rgb: bool = True,
    root: str | Path | None = None,
    download: bool = False,
    synthetic: tuple[int, int, int, float, int] = (10, 200, 50, 0.5, 0),
) -> ImageData:
    """A dataset at `image_size` (None: native), cached per process (a bounded LRU).

    `root` is the directory the operator's configuration resolved (None: $SEEDGRID_DATA_ROOT,
    else ~/.cache/seedgrid/data); specs never choose it (`data_root` resolves a root's name).
    `rgb` repeats grayscale images to 3 channels so that one architecture serves every dataset.
    `synthetic` is (classes, train per class, test per class, difficulty, dataset seed).
    Raises DatasetUnavailable, naming the dataset and the expected path, when files are missing
    or corrupt.
    """
    if name not in DATASETS:
        raise DatasetUnavailable(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
    resolved = None
    if name in TORCHVISION_DATASETS:
        resolved = Path(root).expanduser() if root is not None else data_root(None)
    size = image_size or NATIVE_SIZE[name]
    key = (name, str(resolved), size, rgb, synthetic if name == "synthetic" else None)
    limit = cache_limit_bytes()
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        data = _build(name, resolved, size, rgb, download, synthetic)
        _loads["count"] += 1
        _cache[key] = data
        total = sum(dataset_bytes(d) for d in _cache.values())
        while _cache and (total > limit or len(_cache) > MAX_CACHED_DATASETS):
            total -= dataset_bytes(_cache.popitem(last=False)[1])
        return data


def cached_datasets() -> int:
    """How many decoded datasets this process holds now."""
    return len(_cache)


def load_count() -> int:
    """How many datasets this process has decoded (a cache hit does not count)."""
    return _loads["count"]


def _build(
    name: str,
    root: Path | None,
    size: int,
    rgb: bool,
    download: bool,
    synthetic: tuple[int, int, int, float, int],
) -> ImageData:
    loaders: dict[str, Callable[[], tuple[np.ndarray, ...]]] = {
        "digits": _load_digits,
        "synthetic": lambda: synthetic_images(*synthetic),
    }
    entry = CATALOGUE[name]
    if name in loaders:
        train_x, train_y, test_x, test_y = loaders[name]()
    else:
        assert root is not None
        train_x, train_y, test_x, test_y = _load_torchvision(name, root, download)
        _check_arrays(name, root, train_x, train_y, "train")
        _check_arrays(name, root, test_x, test_y, "test")
    num_classes = synthetic[0] if entry.num_classes is None else entry.num_classes
    tx, sx = _to_size(train_x, size, name), _to_size(test_x, size, name)
    if rgb and tx.shape[1] == 1:
        tx, sx = tx.expand(-1, 3, -1, -1).contiguous(), sx.expand(-1, 3, -1, -1).contiguous()
    if entry.mean is not None and entry.std is not None:
        mean, std = entry.mean, entry.std
    else:
        mean, std = _channel_stats(tx)
    return ImageData(
        name=name,
        train_x=tx,
        train_y=torch.from_numpy(train_y),
        test_x=sx,
        test_y=torch.from_numpy(test_y),
        num_classes=num_classes,
        mean=mean,
        std=std,
        hflip=entry.hflip,
        crop_padding_fraction=CROP_PADDING_FRACTION[name],
    )
