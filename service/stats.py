"""Per-condition summaries and variance comparisons, all from scipy.stats (DESIGN.md).

For every grid factor and every pair of its levels (a, b), values of the metric are compared
once pooled over every other factor and once within each combination of the other factors:

- var_ratio = var_a / var_b with sample variances (ddof = 1);
- f_test_p: two-sided F-test, 2 min(F.cdf, F.sf) with (n_a - 1, n_b - 1) degrees of freedom;
- brown_forsythe_p: scipy.stats.levene(center="median");
- permutation_p: scipy.stats.permutation_test on log(var_a / var_b), two-sided;
- var_ratio_ci95: scipy.stats.bootstrap percentile interval of the ratio (BCa is undefined for
  the 3-5 seeds typical here, so the percentile method is used);
- mean_diff = mean_a - mean_b and welch_p from ttest_ind(equal_var=False);
- pooled comparisons also give the within-cell pooled variance of each level,
  sum_k (n_k - 1) s_k^2 / sum_k (n_k - 1) over the cells of the other factors, and its ratio
  (paper 000 asks for both readings of "pooled").

Resampling tests use a fixed seed (RESAMPLING_SEED) so that the same stored results always give
the same p-values. Anything undefined (n < 2, zero variance) is null, never an error.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from api_schemas import Comparison, ConditionStats, Stats

N_RESAMPLES = 9999
RESAMPLING_SEED = 0


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def condition_stats(condition: dict[str, Any], key: str, values: Sequence[float]) -> ConditionStats:
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return ConditionStats(
            condition=condition,
            condition_key=key,
            n=0,
            mean=None,
            std=None,
            var=None,
            min=None,
            median=None,
            max=None,
            ci95=None,
            values=[],
        )
    mean = float(x.mean())
    if n >= 2:
        var = float(x.var(ddof=1))
        std = math.sqrt(var)
        sem = std / math.sqrt(n)
        if sem > 0:
            lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=sem)
            ci: list[float | None] | None = [_finite(lo), _finite(hi)]
        else:
            ci = [mean, mean]
    else:
        var = std = None  # type: ignore[assignment]
        ci = None
    return ConditionStats(
        condition=condition,
        condition_key=key,
        n=n,
        mean=mean,
        std=_finite(std),
        var=_finite(var),
        min=float(x.min()),
        median=float(np.median(x)),
        max=float(x.max()),
        ci95=ci,
        values=[float(v) for v in x],
    )


def _log_var_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.log(np.var(a, ddof=1, axis=axis) / np.var(b, ddof=1, axis=axis))


def _var_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.var(a, ddof=1, axis=axis) / np.var(b, ddof=1, axis=axis)


def compare(a_values: Sequence[float], b_values: Sequence[float]) -> dict[str, Any]:
    """The variance and mean tests of two samples; nulls where a test is undefined."""
    a = np.asarray(a_values, dtype=float)
    b = np.asarray(b_values, dtype=float)
    out: dict[str, Any] = {
        "n_a": len(a),
        "n_b": len(b),
        "var_a": None,
        "var_b": None,
        "var_ratio": None,
        "var_ratio_ci95": None,
        "f_test_p": None,
        "brown_forsythe_p": None,
        "permutation_p": None,
        "mean_diff": None,
        "welch_p": None,
    }
    if len(a) and len(b):
        out["mean_diff"] = _finite(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return out
    var_a, var_b = float(a.var(ddof=1)), float(b.var(ddof=1))
    out["var_a"], out["var_b"] = var_a, var_b
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out["welch_p"] = _finite(stats.ttest_ind(a, b, equal_var=False).pvalue)
        out["brown_forsythe_p"] = _finite(stats.levene(a, b, center="median").pvalue)
        if var_a > 0 and var_b > 0:
            ratio = var_a / var_b
            out["var_ratio"] = ratio
            dist = stats.f(len(a) - 1, len(b) - 1)
            out["f_test_p"] = min(1.0, 2.0 * min(float(dist.cdf(ratio)), float(dist.sf(ratio))))
            perm = stats.permutation_test(
                (a, b),
                _log_var_ratio,
                permutation_type="independent",
                vectorized=True,
                n_resamples=N_RESAMPLES,
                alternative="two-sided",
                random_state=RESAMPLING_SEED,
            )
            out["permutation_p"] = _finite(perm.pvalue)
            boot = stats.bootstrap(
                (a, b),
                _var_ratio,
                vectorized=True,
                paired=False,
                n_resamples=N_RESAMPLES,
                confidence_level=0.95,
                method="percentile",
                random_state=RESAMPLING_SEED,
            )
            ci = boot.confidence_interval
            out["var_ratio_ci95"] = [_finite(ci.low), _finite(ci.high)]
    return out


def experiment_stats(
    *, metric: str, grid: dict[str, list[Any]], runs: Sequence[tuple[dict[str, Any], str, float]]
) -> Stats:
    """Statistics of one metric; `runs` holds (condition, condition_key, value) per run."""
    by_key: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for condition, key, value in runs:
        by_key.setdefault(key, (condition, []))[1].append(value)
    conditions = [condition_stats(c, k, v) for k, (c, v) in by_key.items()]

    comparisons: list[Comparison] = []
    factors = list(grid)
    for factor in factors:
        others = [f for f in factors if f != factor]
        for level_a, level_b in itertools.combinations(grid[factor], 2):
            scopes: list[dict[str, Any] | None] = [None]
            scopes += (
                [
                    dict(zip(others, combo, strict=True))
                    for combo in itertools.product(*(grid[f] for f in others))
                ]
                if others
                else []
            )
            for within in scopes:
                fixed = within or {}
                result = compare(_values(runs, {**fixed, factor: level_a}),
                                 _values(runs, {**fixed, factor: level_b}))
                if within is None and others:
                    cells = scopes[1:]
                    var_a = within_cell_variance(
                        [_values(runs, {**c, factor: level_a}) for c in cells])
                    var_b = within_cell_variance(
                        [_values(runs, {**c, factor: level_b}) for c in cells])
                    result.update(
                        within_cell_var_a=var_a,
                        within_cell_var_b=var_b,
                        within_cell_var_ratio=_finite(var_a / var_b)
                        if var_a is not None and var_b else None,
                    )
                comparisons.append(
                    Comparison(factor=factor, a=level_a, b=level_b, within=within, **result)
                )
    return Stats(metric=metric, conditions=conditions, comparisons=comparisons)


def within_cell_variance(cells: Sequence[Sequence[float]]) -> float | None:
    """sum_k (n_k - 1) s_k^2 / sum_k (n_k - 1) over cells with at least two values."""
    usable = [np.asarray(c, dtype=float) for c in cells if len(c) >= 2]
    dof = sum(len(c) - 1 for c in usable)
    if dof == 0:
        return None
    return _finite(sum((len(c) - 1) * np.var(c, ddof=1) for c in usable) / dof)


def _values(
    runs: Sequence[tuple[dict[str, Any], str, float]], wanted: dict[str, Any]
) -> list[float]:
    return [v for cond, _, v in runs if all(_same(cond.get(f), lv) for f, lv in wanted.items())]


def _same(x: Any, y: Any) -> bool:
    # True == 1 in Python; grid levels of different JSON types are different levels.
    return type(x) is type(y) and x == y
