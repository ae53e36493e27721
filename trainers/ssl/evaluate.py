"""The `ssl` diagnostics: embedding norms, the kNN monitor and kNN accuracy by norm (spec
section 4), per evaluated epoch and at the end. Evaluation never changes training: its only
randomness (the kNN bank's views) comes from the run's `evaluate` source, and it puts the
model in eval mode, where BatchNorm's running statistics stay as they are."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trainers.data import ImageSplits, Split
from trainers.ssl.config import SSLConfig
from trainers.ssl.data import raw_images, view
from trainers.ssl.model import SSLModel

# Images per forward pass of `embed_all`, and queries per chunk of `knn_accuracy`.
EMBED_BATCH = 1024
# Per-class norm curves are logged for the first this many classes.
MAX_CLASSES_LOGGED = 100


class EvaluationStopped(Exception):
    """The run was cancelled in the middle of an evaluation: its result is not needed."""


@torch.no_grad()
def knn_accuracy(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    num_classes: int,
    k: int = 200,
    temperature: float = 0.1,
) -> float:
    """Weighted kNN top-1 (the paper's monitor): cosine similarity on L2-normalised features,
    the k most similar bank items vote with weight exp(sim / temperature)."""
    bank = F.normalize(bank, dim=1)
    queries = F.normalize(queries, dim=1)
    k = min(k, len(bank))
    correct = 0
    for start in range(0, len(queries), EMBED_BATCH):
        sim = queries[start : start + EMBED_BATCH] @ bank.T
        weights, index = sim.topk(k, dim=1)
        votes = torch.zeros(len(sim), num_classes, device=sim.device, dtype=sim.dtype)
        votes.scatter_add_(1, bank_labels[index], (weights / temperature).exp())
        correct += int((votes.argmax(1) == query_labels[start : start + EMBED_BATCH]).sum())
    return correct / max(len(queries), 1)


def knn_accuracy_by_norm(
    embeddings: np.ndarray,
    labels: np.ndarray,
    min_count: int = 10,
    bin_width: float = 0.05,
    k: int = 10,
) -> list[dict[str, float]]:
    """The paper's "kNN accuracy vs norm": min-max normalise the norms to [0, 1], bin them in
    steps of 0.05; per bin the accuracy of a k = 10 kNN (sklearn) fit on the L2-normalised
    embeddings and evaluated on the same samples; bins with fewer than min_count dropped."""
    from sklearn.neighbors import KNeighborsClassifier

    norms = np.linalg.norm(embeddings, axis=1)
    span = norms.max() - norms.min()
    scaled = (norms - norms.min()) / span if span > 0 else np.zeros_like(norms)
    unit = embeddings / np.maximum(norms[:, None], 1e-12)
    knn = KNeighborsClassifier(n_neighbors=min(k, len(unit))).fit(unit, labels)
    hit = knn.predict(unit) == labels
    bins = np.minimum((scaled / bin_width).astype(int), int(round(1 / bin_width)) - 1)
    out = []
    for b in np.unique(bins):
        members = bins == b
        if members.sum() >= min_count:
            out.append(
                {
                    "bin_low": float(b * bin_width),
                    "n": int(members.sum()),
                    "accuracy": float(hit[members].mean()),
                }
            )
    return out


@torch.no_grad()
def embed_all(
    model: SSLModel,
    splits: ImageSplits,
    split: Split,
    positions: torch.Tensor,
    device: torch.device,
    should_stop: Callable[[], bool],
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backbone features, projector outputs and labels of the images at `positions`, each
    passed through `augment` first when given; raises EvaluationStopped when the run is told
    to stop between two batches."""
    model.eval()
    hs, zs, ys = [], [], []
    for start in range(0, len(positions), EMBED_BATCH):
        if should_stop():
            raise EvaluationStopped
        x, y = raw_images(splits, split, positions[start : start + EMBED_BATCH], device)
        if augment is not None:
            x = augment(x)
        h, z = model.embed(x)
        hs.append(h)
        zs.append(z)
        ys.append(y)
    return torch.cat(hs), torch.cat(zs), torch.cat(ys)


def evaluate_epoch(
    config: SSLConfig,
    model: SSLModel,
    splits: ImageSplits,
    kept: dict[str, torch.Tensor],
    device: torch.device,
    generator: torch.Generator,
    should_stop: Callable[[], bool],
) -> dict[str, float]:
    """Per-epoch curves: norms of un-augmented train embeddings (quantiles, per class) and kNN
    accuracy with an augmented-image bank (the official monitor, quirk 6), whose views are
    drawn from `generator` (the run's `evaluate` source)."""
    _, z, y = embed_all(model, splits, "train", kept["train"], device, should_stop)
    norms = z.norm(dim=1).double()
    q10, q50, q90 = torch.quantile(
        norms, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64, device=norms.device)
    ).tolist()
    out = {"norm_mean": float(norms.mean()), "norm_q10": q10, "norm_q50": q50, "norm_q90": q90}
    logged = min(splits.num_classes - config.held_out_classes, MAX_CLASSES_LOGGED)
    for c, mean in enumerate(class_means(norms, y, logged)):
        if mean is not None:
            out[f"norm_class{c}"] = mean
    # The bank's views are the training views, view_strength included, so the monitor sees
    # the images the way the model is trained to (the official bank crops and flips only;
    # seedgrid keeps one view pipeline). They come from `generator`, never from `augment`.
    bank_view = partial(view, generator=generator, config=config, splits=splits)
    bank_h, _, bank_y = embed_all(
        model, splits, "train", kept["train"], device, should_stop, augment=bank_view
    )
    test_h, _, test_y = embed_all(model, splits, "test", kept["test"], device, should_stop)
    out["knn_accuracy"] = knn_accuracy(
        bank_h, bank_y, test_h, test_y, splits.num_classes, config.knn_k, config.knn_temperature
    )
    return out


def final_evaluation(
    config: SSLConfig,
    model: SSLModel,
    splits: ImageSplits,
    kept: dict[str, torch.Tensor],
    device: torch.device,
    should_stop: Callable[[], bool],
) -> tuple[dict[str, float], dict[str, Any]]:
    """kNN accuracy with an un-augmented bank, test and held-out norms, kNN accuracy by norm
    and the per-class norms of the trained model."""
    train_h, train_z, train_y = embed_all(
        model, splits, "train", kept["train"], device, should_stop
    )
    test_h, test_z, test_y = embed_all(model, splits, "test", kept["test"], device, should_stop)
    metrics: dict[str, float] = {
        "knn_accuracy_clean": knn_accuracy(
            train_h,
            train_y,
            test_h,
            test_y,
            splits.num_classes,
            config.knn_k,
            config.knn_temperature,
        ),
        "norm_test_mean": float(test_z.norm(dim=1).mean()),
    }
    if len(kept["held_out"]):
        _, held_z, _ = embed_all(model, splits, "test", kept["held_out"], device, should_stop)
        metrics["norm_heldout_mean"] = float(held_z.norm(dim=1).mean())
        metrics["norm_heldout_ratio"] = metrics["norm_heldout_mean"] / metrics["norm_test_mean"]
    by_norm = knn_accuracy_by_norm(train_z.double().cpu().numpy(), train_y.cpu().numpy())
    if len(by_norm) >= 3:
        # scipy.stats on first use: importing it costs a Ray worker about 1 s of CPU at start
        from scipy import stats as scipy_stats

        rho = scipy_stats.spearmanr(
            [b["bin_low"] for b in by_norm], [b["accuracy"] for b in by_norm]
        ).statistic
        if math.isfinite(rho):
            metrics["knn_norm_spearman"] = float(rho)
    per_class = class_means(
        train_z.norm(dim=1), train_y, splits.num_classes - config.held_out_classes
    )
    return metrics, {"knn_by_norm": by_norm, "norm_per_class": per_class}


def class_means(values: torch.Tensor, labels: torch.Tensor, classes: int) -> list[float | None]:
    """The mean of `values` over each class's members for classes 0 .. classes-1 (None for a
    class with none; labels at or past `classes` are left out), summed in float64 on the
    values' device and read back at once: one host read, not two per class."""
    inside = labels < classes
    picked = torch.where(inside, labels, 0)
    weight = inside.to(torch.float64)
    sums = torch.zeros(classes, dtype=torch.float64, device=values.device)
    sums.index_add_(0, picked, values.double() * weight)
    counts = torch.zeros(classes, dtype=torch.float64, device=values.device)
    counts.index_add_(0, picked, weight)
    means = torch.where(counts > 0, sums / counts.clamp(min=1.0), math.nan)
    return [None if math.isnan(m) else m for m in means.tolist()]
