"""Independent scipy computations of the statistics docs/api.md specifies, for the tests."""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats


def _deviations(x: np.ndarray, drop_zero: bool) -> np.ndarray:
    """Squared deviations from the median; for an unpaired odd cell one of its zeros left out,
    and for an unpaired cell of 4 one of its two equal middle deviations."""
    d = (x - np.median(x)) ** 2
    if drop_zero and (len(x) % 2 == 1 or len(x) == 4):
        d = np.delete(d, int(np.argmin(d)))
    return d


def _mode_aligned(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deviations from one centre after shifting b onto a: of the shifts a_i - b_j, the one
    whose pooled values have the smallest median absolute deviation (ties: nearest the
    difference of the medians), the centre their median. Written out, one shift at a time."""
    median_shift = float(np.median(a) - np.median(b))
    best = None
    for x in a:
        for y in b:
            shift = float(x - y)
            pooled = np.r_[a, b + shift]
            centre = float(np.median(pooled))
            mad = float(np.median(np.abs(pooled - centre)))
            key = (mad, abs(shift - median_shift))
            if best is None or key < best[0]:
                best = (key, shift, centre)
    assert best is not None
    _, shift, centre = best
    return (a - centre) ** 2, (b + shift - centre) ** 2


def paired_cell_deviations(x: np.ndarray, smaller: int) -> np.ndarray:
    """A paired cell's squared deviations: up to 15 seeds in the stratum's smaller cell, from
    3/4 of the way from the cell's median to the midpoint of its shortest half (the narrowest
    run of n // 2 + 1 sorted values; equally narrow runs' midpoints averaged); else from the
    median. Written out, one window at a time."""
    if smaller > 15:
        return _deviations(x, False)
    values = sorted(float(v) for v in x)
    h = len(values) // 2 + 1
    windows = [
        (values[i + h - 1] - values[i], (values[i] + values[i + h - 1]) / 2)
        for i in range(len(values) - h + 1)
    ]
    narrowest = min(width for width, _ in windows)
    spread = max(abs(values[0]), abs(values[-1]), 1e-300)
    mids = [mid for width, mid in windows if width <= narrowest + 1e-9 * spread]
    centre = 0.75 * (sum(mids) / len(mids)) + 0.25 * float(np.median(values))
    return (np.asarray(x, dtype=float) - centre) ** 2


def _unpaired_deviations(a: list[float], b: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The unpaired test's deviations of one stratum: mode-aligned from 6 to 15 seeds in the
    smaller cell, else each cell's own median with its structural zero or tie left out."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if 6 <= min(len(x), len(y)) <= 15:
        return _mode_aligned(x, y)
    return _deviations(x, True), _deviations(y, True)


def reference_primary_p(
    strata: list[tuple[list[float], list[float]]], paired: bool, null: float = 1.0
) -> float:
    """The primary test by enumeration: every sign flip of the seeds' pairs (paired) or every
    split of each stratum's deviations (unpaired), with a's deviations divided by `null`; the
    two-sided p as scipy's permutation_test computes it. One stratum goes through scipy's own
    permutation_test (exact); several through itertools."""
    if paired:
        d_a = (
            np.concatenate(
                [paired_cell_deviations(np.asarray(a), min(len(a), len(b))) for a, b in strata]
            )
            / null
        )
        d_b = np.concatenate(
            [paired_cell_deviations(np.asarray(b), min(len(a), len(b))) for a, b in strata]
        )
        result = stats.permutation_test(
            (d_a, d_b),
            lambda x, y: np.log(np.mean(x) / np.mean(y)),
            permutation_type="samples",
            n_resamples=np.inf,
            vectorized=False,
        )
        return float(result.pvalue)
    parts = []
    for a, b in strata:
        d_a, d_b = _unpaired_deviations(a, b)
        parts.append((d_a / null, d_b))
    if len(parts) == 1:
        result = stats.permutation_test(
            parts[0],
            lambda x, y: np.log(np.mean(x) / np.mean(y)),
            permutation_type="independent",
            n_resamples=np.inf,
            vectorized=False,
        )
        return float(result.pvalue)
    splits = []
    for d_a, d_b in parts:
        pool = np.r_[d_a, d_b]
        splits.append(
            [
                (pool[list(c)].sum(), pool.sum() - pool[list(c)].sum())
                for c in itertools.combinations(range(len(pool)), len(d_a))
            ]
        )
    n_a = sum(len(d_a) for d_a, _ in parts)
    n_b = sum(len(d_b) for _, d_b in parts)
    observed = np.log(
        sum(d_a.sum() for d_a, _ in parts) / n_a / (sum(d_b.sum() for _, d_b in parts) / n_b)
    )
    values = np.array(
        [
            np.log(sum(s[0] for s in combo) / n_a / (sum(s[1] for s in combo) / n_b))
            for combo in itertools.product(*splits)
        ]
    )
    gamma = 1e-14 * abs(observed)
    greater = np.mean(values >= observed - gamma)
    less = np.mean(values <= observed + gamma)
    return float(min(1.0, 2 * min(greater, less)))


def reference_comparison(
    a: list[float], b: list[float], seeds: list[int] | None = None
) -> dict[str, float]:
    """One cell a side; `seeds`: the same seeds in the same order on both sides (paired)."""
    return reference_strata([(a, b)], paired=seeds is not None)


def reference_strata(
    strata: list[tuple[list[float], list[float]]], paired: bool
) -> dict[str, float]:
    """A comparison over strata (the two cells at each combination of the other factors), paired
    cells given in seed order: within-cell variances, the F-test on their degrees of freedom,
    Brown-Forsythe on the deviations from the cell medians, Welch on all values, and the primary
    test by enumeration."""
    cells_a = [np.asarray(a, dtype=float) for a, _ in strata]
    cells_b = [np.asarray(b, dtype=float) for _, b in strata]
    dof_a = sum(len(c) - 1 for c in cells_a)
    dof_b = sum(len(c) - 1 for c in cells_b)
    var_a = sum((len(c) - 1) * np.var(c, ddof=1) for c in cells_a) / dof_a
    var_b = sum((len(c) - 1) * np.var(c, ddof=1) for c in cells_b) / dof_b
    ratio = var_a / var_b
    f_cdf = stats.f.cdf(ratio, dof_a, dof_b)
    all_a, all_b = np.concatenate(cells_a), np.concatenate(cells_b)
    dev_a = np.concatenate([np.abs(c - np.median(c)) for c in cells_a])
    dev_b = np.concatenate([np.abs(c - np.median(c)) for c in cells_b])
    out = {
        "var_a": var_a,
        "var_b": var_b,
        "var_ratio": ratio,
        "dof_a": dof_a,
        "dof_b": dof_b,
        "f_test_p": min(1.0, 2 * min(f_cdf, 1 - f_cdf)),
        "brown_forsythe_p": stats.f_oneway(dev_a, dev_b).pvalue,
        "primary_p": reference_primary_p(strata, paired),
        "mean_diff": all_a.mean() - all_b.mean(),
        "welch_p": stats.ttest_ind(all_a, all_b, equal_var=False).pvalue,
    }
    if len(strata) == 1:  # scipy's own Brown-Forsythe
        assert np.isclose(
            out["brown_forsythe_p"], stats.levene(all_a, all_b, center="median").pvalue, rtol=1e-9
        )
    if paired:
        differences = np.mean([a - b for a, b in zip(cells_a, cells_b, strict=True)], axis=0)
        out["mean_p"] = stats.ttest_1samp(differences, 0.0).pvalue
        out["mean_diff"] = differences.mean()
    elif math.prod(math.comb(len(a) + len(b), len(a)) for a, b in strata) <= 5_000:
        out["mean_p"] = reference_mean_p(strata)
    return out


def _welch_statistic(x: np.ndarray, y: np.ndarray) -> float:
    return float(stats.ttest_ind(x, y, equal_var=False).statistic)


def reference_mean_p(strata: list[tuple[list[float], list[float]]]) -> float:
    """The unpaired mean test by enumeration: Welch's t of all runs of each level, over every
    re-assignment of each stratum's runs that keeps its counts; two-sided as scipy's
    permutation_test (which computes it for one stratum)."""
    if len(strata) == 1:
        return float(
            stats.permutation_test(
                strata[0],
                _welch_statistic,
                permutation_type="independent",
                n_resamples=np.inf,
                vectorized=False,
            ).pvalue
        )
    pools = [np.r_[a, b] for a, b in strata]
    splits = [
        list(itertools.combinations(range(len(pool)), len(a)))
        for pool, (a, _) in zip(pools, strata, strict=True)
    ]
    values = []
    for combo in itertools.product(*splits):
        side_a, side_b = [], []
        for pool, chosen in zip(pools, combo, strict=True):
            mask = np.zeros(len(pool), dtype=bool)
            mask[list(chosen)] = True
            side_a.append(pool[mask])
            side_b.append(pool[~mask])
        values.append(_welch_statistic(np.concatenate(side_a), np.concatenate(side_b)))
    observed = _welch_statistic(
        np.concatenate([np.asarray(a) for a, _ in strata]),
        np.concatenate([np.asarray(b) for _, b in strata]),
    )
    t = np.asarray(values)
    gamma = 1e-9 * max(1.0, abs(observed))
    return float(min(1.0, 2 * min(np.mean(t >= observed - gamma), np.mean(t <= observed + gamma))))


def reference_condition(values: list[float]) -> dict[str, float]:
    x = np.asarray(values)
    n = len(x)
    half = stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n)
    return {
        "n": n,
        "mean": x.mean(),
        "std": x.std(ddof=1),
        "var": x.var(ddof=1),
        "min": x.min(),
        "median": np.median(x),
        "max": x.max(),
        "ci95": [x.mean() - half, x.mean() + half],
    }


def _json(value: float) -> float | None:
    # the API serves an undefined value (nan, e.g. a bootstrap with zero-variance resamples) as null
    return None if not np.isfinite(value) else float(value)


def assert_matches(got: dict, expected: dict, rel: float = 1e-9) -> None:
    import pytest

    for key, value in expected.items():
        if isinstance(value, list):
            want = [_json(v) for v in value]
            if None in want:
                assert got[key] in (None, [None, None]), key
            else:
                assert got[key] == pytest.approx(want, rel=rel), key
        else:
            assert got[key] == pytest.approx(float(value), rel=rel), key
