"""Per-condition summaries and variance comparisons, all from scipy.stats (DESIGN.md).

For every grid factor and every pair of its levels (a, b), values of the metric are compared
once pooled over every other factor and once within each combination of the other factors:

- var_ratio = var_a / var_b with sample variances (ddof = 1);
- f_test_p: two-sided F-test, 2 min(F.cdf, F.sf) with (n_a - 1, n_b - 1) degrees of freedom;
- brown_forsythe_p: scipy.stats.levene(center="median");
- permutation_p: scipy.stats.permutation_test on log(var_a / var_b), two-sided;
- var_ratio_ci95: scipy.stats.bootstrap percentile interval of the ratio (BCa is undefined for
  the 3-5 seeds typical here, so the percentile method is used);
- var_ratio_ci95_f: the exact interval under normality, ratio / F quantiles (service.power);
- mean_diff = mean_a - mean_b, welch_p and mean_diff_ci95 from ttest_ind(equal_var=False);
- detectable_ratio and seeds_needed: the F-test's power at alpha 0.05, power 0.8;
- per factor with more than two levels, an omnibus Brown-Forsythe test over all its levels
  (scipy.stats.levene(*levels, center="median"), each level pooled over the other factors);
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from api_schemas import Comparison, ConditionStats, Omnibus, Stats, level_key
from service.power import detectable_ratio, f_ratio_interval, seeds_needed

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
        "detectable_ratio": _finite(detectable_ratio(len(a), len(b))),
    }
    if len(a) and len(b):
        out["mean_diff"] = _finite(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return out
    var_a, var_b = float(a.var(ddof=1)), float(b.var(ddof=1))
    out["var_a"], out["var_b"] = var_a, var_b
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        welch = stats.ttest_ind(a, b, equal_var=False)
        out["welch_p"] = _finite(welch.pvalue)
        if var_a > 0 or var_b > 0:
            low, high = welch.confidence_interval(0.95)
            out["mean_diff_ci95"] = [_finite(low), _finite(high)]
        out["brown_forsythe_p"] = _finite(stats.levene(a, b, center="median").pvalue)
        if var_a > 0 and var_b > 0:
            ratio = var_a / var_b
            out["var_ratio"] = ratio
            dist = stats.f(len(a) - 1, len(b) - 1)
            out["f_test_p"] = min(1.0, 2.0 * min(float(dist.cdf(ratio)), float(dist.sf(ratio))))
            out["var_ratio_ci95_f"] = [_finite(v) for v in f_ratio_interval(ratio, len(a),
                                                                              len(b))]
            out["seeds_needed"] = seeds_needed(ratio)
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
            if None in out["var_ratio_ci95"]:
                out["var_ratio_ci95_null_reason"] = (
                    "a bootstrap resample drew one seed value over and over (zero variance): "
                    "too few seeds for the bootstrap; see var_ratio_ci95_f")
    return out


# One response carries at most this many comparisons; more are paged (limit, offset).
MAX_COMPARISONS_PER_PAGE = 2000


@dataclass(frozen=True)
class Slot:
    """Where one comparison sits: a factor, two of its levels, and the other factors' levels
    held fixed (None: pooled over them)."""

    factor: str
    a: Any
    b: Any
    within: dict[str, Any] | None


class ComparisonPlan:
    """The comparisons of a grid in their fixed order (factor by factor in grid order, pairs
    of levels in grid order, pooled first, then within each combination of the other factors),
    counted and paged without enumerating the ones before the page."""

    def __init__(self, grid: dict[str, list[Any]], factor: str | None = None) -> None:
        self.grid = grid
        self.factors = [factor] if factor is not None else list(grid)

    def scopes(self, factor: str) -> int:
        others = [f for f in self.grid if f != factor]
        return 1 + math.prod(len(self.grid[f]) for f in others) if others else 1

    def count(self, factor: str) -> int:
        return math.comb(len(self.grid[factor]), 2) * self.scopes(factor)

    @property
    def total(self) -> int:
        return sum(self.count(f) for f in self.factors)

    def page(self, offset: int, limit: int) -> Iterator[Slot]:
        for factor in self.factors:
            if limit <= 0:
                return
            n = self.count(factor)
            if offset >= n:
                offset -= n
                continue
            others = [f for f in self.grid if f != factor]
            scopes: list[dict[str, Any] | None] = [None]
            scopes += [dict(zip(others, combo, strict=True))
                       for combo in itertools.product(*(self.grid[f] for f in others))
                       ] if others else []
            first_pair, first_scope = divmod(offset, len(scopes))
            pairs = itertools.islice(itertools.combinations(self.grid[factor], 2), first_pair,
                                     None)
            for i, (level_a, level_b) in enumerate(pairs):
                for within in scopes[first_scope if i == 0 else 0:]:
                    if limit <= 0:
                        return
                    yield Slot(factor, level_a, level_b, within)
                    limit -= 1
            offset = 0


class RunValues:
    """The metric's values grouped by condition and by (factor, level), in run order, so that
    every comparison finds its samples by lookup instead of a scan of all runs."""

    def __init__(self, grid: dict[str, list[Any]],
                 runs: Sequence[tuple[dict[str, Any], str, float]]) -> None:
        self.factors = list(grid)
        self.by_condition: dict[tuple, list[float]] = {}
        self.by_level: dict[tuple[str, str], list[float]] = {}
        # per (factor, level): the conditions holding that level, each with its values
        self.cells: dict[tuple[str, str], list[list[float]]] = {}
        for condition, _, value in runs:
            if any(f not in condition for f in self.factors):
                continue  # not a condition of this grid
            key = tuple(level_key(condition[f]) for f in self.factors)
            cell = self.by_condition.get(key)
            if cell is None:
                cell = self.by_condition[key] = []
                for f, level in zip(self.factors, key, strict=True):
                    self.cells.setdefault((f, level), []).append(cell)
            cell.append(value)
            for f, level in zip(self.factors, key, strict=True):
                self.by_level.setdefault((f, level), []).append(value)

    def values(self, factor: str, level: Any, within: dict[str, Any] | None) -> list[float]:
        if within is None:
            return self.by_level.get((factor, level_key(level)), [])
        fixed = {**within, factor: level}
        return self.by_condition.get(tuple(level_key(fixed[f]) for f in self.factors), [])

    def level_cells(self, factor: str, level: Any) -> list[list[float]]:
        return self.cells.get((factor, level_key(level)), [])


def experiment_stats(
    *, metric: str, grid: dict[str, list[Any]], runs: Sequence[tuple[dict[str, Any], str, float]],
    factor: str | None = None, offset: int = 0, limit: int | None = None,
) -> Stats:
    """Statistics of one metric; `runs` holds (condition, condition_key, value) per run.

    Every condition's summary, and the comparisons of `factor` (None: of every factor) from
    `offset`, at most `limit` of them (None: all; the caller bounds the work)."""
    by_key: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for condition, key, value in runs:
        by_key.setdefault(key, (condition, []))[1].append(value)
    conditions = [condition_stats(c, k, v) for k, (c, v) in by_key.items()]

    plan = ComparisonPlan(grid, factor)
    total = plan.total
    limit = total if limit is None else limit
    values = RunValues(grid, runs)
    comparisons = [_comparison(slot, values) for slot in plan.page(offset, limit)]
    end = offset + len(comparisons)
    omnibus = [omnibus_test(f, grid[f], values) for f in grid
               if (factor is None or f == factor) and len(grid[f]) > 2]
    return Stats(metric=metric, conditions=conditions, comparisons=comparisons, factor=factor,
                 total_comparisons=total, offset=offset,
                 next_offset=end if end < total else None, omnibus=omnibus)


def omnibus_test(factor: str, levels: Sequence[Any], values: RunValues) -> Omnibus:
    """Brown-Forsythe over every level of `factor`, each level pooled over the other factors."""
    groups = [values.values(factor, level, None) for level in levels]
    p = None
    if all(len(g) >= 2 for g in groups) and any(np.ptp(g) > 0 for g in groups):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            p = _finite(stats.levene(*groups, center="median").pvalue)
    return Omnibus(factor=factor, levels=list(levels), n=[len(g) for g in groups],
                   brown_forsythe_p=p)


def _comparison(slot: Slot, values: RunValues) -> Comparison:
    result = compare(values.values(slot.factor, slot.a, slot.within),
                     values.values(slot.factor, slot.b, slot.within))
    if slot.within is None and len(values.factors) > 1:
        var_a = within_cell_variance(values.level_cells(slot.factor, slot.a))
        var_b = within_cell_variance(values.level_cells(slot.factor, slot.b))
        result.update(
            within_cell_var_a=var_a,
            within_cell_var_b=var_b,
            within_cell_var_ratio=_finite(var_a / var_b) if var_a is not None and var_b else None,
        )
    return Comparison(factor=slot.factor, a=slot.a, b=slot.b, within=slot.within, **result)


def within_cell_variance(cells: Sequence[Sequence[float]]) -> float | None:
    """sum_k (n_k - 1) s_k^2 / sum_k (n_k - 1) over cells with at least two values."""
    usable = [np.asarray(c, dtype=float) for c in cells if len(c) >= 2]
    dof = sum(len(c) - 1 for c in usable)
    if dof == 0:
        return None
    return _finite(sum((len(c) - 1) * np.var(c, ddof=1) for c in usable) / dof)
