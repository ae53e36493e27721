"""The omnibus test of a factor of more than two levels (service.analysis.stats.omnibus_test):
permutations of the levels' values within blocks, bounded work, cached by the cells' data.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence

import numpy as np

from service.analysis import resampling
from service.analysis.variance import MAX_RESULT_BYTES, RESULT_CACHE_SIZE, finite, one_way_anova
from service.lru import LruCache, deep_size

# Omnibus: permutations of the levels' values within blocks; bounded work.
OMNIBUS_RESAMPLES = 1999
MAX_OMNIBUS_ENTRIES = 40_000_000  # resamples x values x levels


OmnibusResult = tuple[float | None, float | None, str | None, str | None]
_omnibus_results: LruCache[OmnibusResult] = LruCache(
    max_items=RESULT_CACHE_SIZE // 100, max_bytes=MAX_RESULT_BYTES // 16, size=deep_size
)


def level_omnibus(
    cells_by_combo: Sequence[Sequence[tuple[np.ndarray, tuple[int, ...] | None]]], levels: int
) -> OmnibusResult:
    """_omnibus, cached by the cells' data (a poll recomputes it only when a cell changed)."""
    h = hashlib.blake2b(repr((levels, len(cells_by_combo))).encode(), digest_size=20)
    for row in cells_by_combo:
        for values, seeds in row:
            h.update(np.asarray(values, dtype=np.float64).tobytes())
            h.update(repr(seeds).encode() + b"|")
    key = h.digest()
    result = _omnibus_results.get(key)
    if result is None:
        result = _omnibus(cells_by_combo, levels)
        _omnibus_results.put(key, result)
    return result


def _omnibus(
    cells_by_combo: Sequence[Sequence[tuple[np.ndarray, tuple[int, ...] | None]]], levels: int
) -> OmnibusResult:
    """(primary p, Brown-Forsythe p, the primary test's name, why null) of "every level of the
    factor has one variance", from its cells at each combination of the other factors (each
    row: one (values, seeds) per level, in level order).

    The primary test permutes squared deviations from the cell medians within blocks: a block
    is a combination of the other factors (unpaired), or one seed of it when every level there
    ran the same seeds (paired); the statistic is sum_k N_k (log m_k - log m)^2 with m_k level
    k's mean squared deviation and m the overall one."""
    rows = [row for row in cells_by_combo if all(len(v) >= 2 for v, _ in row)]
    if not rows:
        return None, None, None, "no combination of the other factors has 2 seeds in every level"
    dev_abs = [
        np.concatenate([np.abs(row[k][0] - np.median(row[k][0])) for row in rows])
        for k in range(levels)
    ]
    bf = one_way_anova(dev_abs)
    paired = all(
        row[0][1] is not None
        and all(
            sorted(seeds or ()) == sorted(row[0][1] or ())
            and len(set(seeds or ())) == len(seeds or ())
            for _, seeds in row
        )
        for row in rows
    )
    rng = np.random.default_rng(resampling.RESAMPLING_SEED)
    resampled = np.zeros((OMNIBUS_RESAMPLES, levels))  # each level's sum of deviations
    observed = np.zeros(levels)
    counts = np.zeros(levels)
    if paired:
        # one block per (combination, seed): its `levels` values shuffled among the levels
        deviations = np.concatenate(
            [
                np.stack(
                    [(v[np.argsort(seeds)] - np.median(v)) ** 2 for v, seeds in row],  # type: ignore[arg-type]
                    axis=1,
                )
                for row in rows
            ]
        )
        n_values = deviations.size
        if OMNIBUS_RESAMPLES * n_values > MAX_OMNIBUS_ENTRIES:
            return None, bf, None, _too_many(n_values, levels)
        resampled = _shuffled_level_sums(deviations, rng)
        observed = deviations.sum(axis=0)
        counts[:] = len(deviations)
    else:
        n_values = sum(len(v) for row in rows for v, _ in row)
        if OMNIBUS_RESAMPLES * n_values * levels > MAX_OMNIBUS_ENTRIES:
            return None, bf, None, _too_many(n_values, levels)
        for row in rows:  # one block per combination of the other factors
            parts = [resampling.drop_structural_zero((v - np.median(v)) ** 2) for v, _ in row]
            values = np.concatenate(parts)
            labels = np.concatenate([np.full(len(p), k) for k, p in enumerate(parts)])
            shuffled = rng.permuted(
                np.broadcast_to(labels, (OMNIBUS_RESAMPLES, len(labels))), axis=1
            )
            # each resample's sum per level in one pass (a mask per level cost `levels` passes)
            slot = shuffled + levels * np.arange(OMNIBUS_RESAMPLES)[:, None]
            resampled += np.bincount(
                slot.ravel(),
                weights=np.broadcast_to(values, shuffled.shape).ravel(),
                minlength=OMNIBUS_RESAMPLES * levels,
            ).reshape(OMNIBUS_RESAMPLES, levels)
            for k in range(levels):
                observed[k] += parts[k].sum()
                counts[k] += len(parts[k])
    name = (
        "paired permutation test (levels shuffled within each seed) of squared deviations "
        "from the cell median"
        if paired
        else "stratified permutation test of squared deviations from the cell median"
    )
    if observed.sum() <= 0:
        return None, bf, name, "no level varies"

    def spread(sums: np.ndarray) -> np.ndarray:
        """sum_k N_k (log m_k - log m)^2, m the N-weighted mean of the log m_k."""
        with np.errstate(all="ignore"):
            logs = np.log(sums / counts)
            centre = (counts * logs).sum(axis=-1, keepdims=True) / counts.sum()
            value = (counts * (logs - centre) ** 2).sum(axis=-1)
        return np.where(np.isnan(value), np.inf, value)

    statistic = float(spread(observed))
    p = (1 + int(np.sum(spread(resampled) >= statistic * (1 - 1e-9)))) / (OMNIBUS_RESAMPLES + 1)
    return finite(p), bf, name, None


def _shuffled_level_sums(deviations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per resample, each level's sum of `deviations` (blocks x levels) after shuffling every
    block's values among the levels: a permutation drawn by index from the table of all of
    them when there are few levels (cheaper than sorting random keys)."""
    blocks, levels = deviations.shape
    if math.factorial(levels) <= 720:
        table = np.array(list(itertools.permutations(range(levels))))
        order = table[rng.integers(0, len(table), size=(OMNIBUS_RESAMPLES, blocks))]
    else:
        order = np.argsort(rng.random((OMNIBUS_RESAMPLES, blocks, levels)), axis=2)
    return np.take_along_axis(deviations[None], order, axis=2).sum(axis=1)


def _too_many(n_values: int, levels: int) -> str:
    return (
        f"{n_values:,} values in {levels} levels: more than the omnibus permutation test "
        "does within bounded work"
    )
