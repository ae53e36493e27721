"""Tiny datasets written in torchvision's on-disk layouts, for testing the real loaders.

Each writer returns the arrays it wrote (N x C x H x W uint8 images, int64 labels per split) so
a test can check that the loader decodes exactly them.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import scipy.io

Arrays = dict[str, tuple[np.ndarray, np.ndarray]]


def _images(rng: np.random.Generator, n: int, channels: int, side: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, channels, side, side), dtype=np.uint8)


def write_cifar(
    root: Path,
    *,
    classes: int = 10,
    per_batch: int = 6,
    seed: int = 0,
    test_per_batch: int | None = None,
) -> Arrays:
    """cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} or
    cifar-100-python/{train,test,meta}: pickled dicts with 'data' rows of 3072 bytes
    (channel-major 3 x 32 x 32) and 'labels' / 'fine_labels'. Each file holds `per_batch`
    images, the test file `test_per_batch` when given (the real CIFAR-100 has 50,000 training
    and 10,000 test images)."""
    rng = np.random.default_rng(seed)
    ten = classes == 10
    folder = root / ("cifar-10-batches-py" if ten else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "train": [f"data_batch_{i}" for i in range(1, 6)] if ten else ["train"],
        "test": ["test_batch" if ten else "test"],
    }
    label_key = "labels" if ten else "fine_labels"
    out: Arrays = {}
    for split, names in files.items():
        xs, ys = [], []
        size = test_per_batch if split == "test" and test_per_batch is not None else per_batch
        for name in names:
            x = _images(rng, size, 3, 32)
            y = rng.integers(0, classes, size=size)
            entry = {
                "data": x.reshape(size, -1),
                label_key: [int(v) for v in y],
                "batch_label": name,
            }
            if not ten:
                entry["coarse_labels"] = [int(v) // 5 for v in y]
            with open(folder / name, "wb") as f:
                pickle.dump(entry, f)
            xs.append(x)
            ys.append(y)
        out[split] = (np.concatenate(xs), np.concatenate(ys).astype(np.int64))
    meta_name, meta_key = ("batches.meta", "label_names") if ten else ("meta", "fine_label_names")
    with open(folder / meta_name, "wb") as f:
        pickle.dump({meta_key: [f"class{i}" for i in range(classes)]}, f)
    return out


def write_svhn(root: Path, *, n: int = 12, seed: int = 0) -> Arrays:
    """{train,test}_32x32.mat: X of shape 32 x 32 x 3 x N (H, W, C, N), y of shape N x 1 with
    labels 1..10, where 10 stands for digit 0."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    out: Arrays = {}
    for split in ("train", "test"):
        x = _images(rng, n, 3, 32)
        digits = rng.integers(0, 10, size=n)
        digits[0] = 0  # exercise the 10 -> 0 mapping
        stored = np.where(digits == 0, 10, digits).astype(np.uint8)[:, None]
        scipy.io.savemat(
            root / f"{split}_32x32.mat",
            {"X": np.ascontiguousarray(x.transpose(2, 3, 1, 0)), "y": stored},
        )
        out[split] = (x, digits.astype(np.int64))
    return out


def write_idx(root: Path, folder: str, *, n: int = 10, seed: int = 0) -> Arrays:
    """<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte, big-endian IDX files
    (magic 2051 for images, 2049 for labels), as MNIST and Fashion-MNIST ship them."""
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    out: Arrays = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = _images(rng, n, 1, 28)
        y = rng.integers(0, 10, size=n).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + x.tobytes()
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + y.tobytes())
        out[split] = (x, y.astype(np.int64))
    return out
