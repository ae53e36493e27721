"""Per-condition summaries and variance comparisons, all from scipy.stats (docs/api.md).

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
  (paper 000 asks for both readings of "pooled");
- Holm-adjusted f_test_p, brown_forsythe_p and welch_p, per factor and across all comparisons,
  always over the whole family whatever the page (service.multiplicity);
- per condition of a bounded metric (the trainer's metric_bounds), the mean interval on the
  logit scale: logit(m) +- t_{n-1} sem / (m (1 - m)) with m the mean rescaled to (0, 1), mapped
  back (delta method); it never crosses a bound, where the plain t interval of accuracies near
  1 does;
- per condition of a metric with a declared test set (the trainer's test_set_sizes), the
  binomial noise floor mean_i p_i (1 - p_i) / n_i and its share of the seed variance.

Warnings name every number computed from fewer seeds than it needs; the minimums are the
MIN_SEEDS_* constants below, each with its reason.

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
from service.multiplicity import Families
from service.power import detectable_ratio, f_ratio_interval, seeds_needed
from trainers.base import binomial_noise_floor

N_RESAMPLES = 9999
RESAMPLING_SEED = 0

# Seed minimums behind the warnings. Student's t with 1 degree of freedom puts the bound
# 12.7 standard errors from the mean.
MIN_SEEDS_MEAN_INTERVAL = 3
# With 2 seeds both absolute deviations from the median are equal, so Brown-Forsythe sees no
# spread within a level and its p tends to 0 (a p of 4e-30 from 2 seeds); with 3 one deviation
# is always 0. 5 is the smallest n at which neither degeneracy dominates.
MIN_SEEDS_BROWN_FORSYTHE = 5
# The percentile bootstrap of a variance ratio undercovers with few seeds: its resamples repeat
# the same few values (at 3-4 seeds some have zero variance and the interval is null).
MIN_SEEDS_BOOTSTRAP = 10
# Fewer distinct splits of the seeds into two groups than this and the two-sided permutation p,
# at least 2 / splits, cannot reach 0.05.
MIN_PERMUTATION_SPLITS = 40
# A variance-ratio interval whose high end is more than 10^3 times its low end says little.
MAX_RATIO_INTERVAL_DECADES = 3.0
# The noise floor is worth a warning once it explains this share of the seed variance.
NOISE_FLOOR_WARNING_SHARE = 0.5


def metric_value(metrics: dict[str, Any], name: str) -> float | None:
    """A run's final value of metric `name`, or None when it has none that is a number (JSON
    true and false are not)."""
    value = metrics.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def condition_stats(condition: dict[str, Any], key: str, values: Sequence[float], *,
                    bounds: tuple[float, float] | None = None,
                    test_set_sizes: Sequence[int | None] | None = None) -> ConditionStats:
    """A condition's summary; `bounds` makes its mean interval respect them, `test_set_sizes`
    (one per value, None where a run declares none) gives its binomial noise floor."""
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
        if sem == 0:
            ci: list[float | None] | None = [mean, mean]
        elif bounds is not None:
            ci = bounded_mean_interval(mean, sem, n, bounds)
        else:
            lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=sem)
            ci = [_finite(lo), _finite(hi)]
    else:
        var = std = None  # type: ignore[assignment]
        ci = None
    floor = share = None
    if test_set_sizes is not None and all(s is not None and s > 0 for s in test_set_sizes):
        floor = _finite(np.mean(binomial_noise_floor(x, np.asarray(test_set_sizes, float))))
        share = _finite(floor / var) if floor is not None and var else None
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
        ci95_method=None if ci is None else (
            "t" if bounds is None else f"logit-t within [{bounds[0]:g}, {bounds[1]:g}]"),
        noise_floor_var=floor,
        noise_floor_share=share,
        warnings=_condition_warnings(n, share),
    )


def bounded_mean_interval(mean: float, sem: float, n: int,
                          bounds: tuple[float, float]) -> list[float | None]:
    """The 95% interval of a bounded metric's mean: Student's t on the logit scale of the mean
    rescaled to (0, 1), with the delta method's standard error sem / (m (1 - m)), mapped back;
    strictly inside the bounds. A mean outside them (a metric that broke its declared bounds)
    gets the t interval clipped to them."""
    low, high = bounds
    width = high - low
    m = (mean - low) / width
    t = float(stats.t.ppf(0.975, n - 1))
    if not 0 < m < 1:
        return [max(low, min(high, mean - t * sem)), max(low, min(high, mean + t * sem))]
    centre = math.log(m / (1 - m))
    half = t * (sem / width) / (m * (1 - m))
    return [low + width * _expit(centre - half), low + width * _expit(centre + half)]


def _expit(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def _condition_warnings(n: int, noise_share: float | None) -> list[str]:
    out = []
    if n == 1:
        out.append("one seed: no variance and no ci95 (they need at least 2 seeds)")
    elif 2 <= n < MIN_SEEDS_MEAN_INTERVAL:
        t = float(stats.t.ppf(0.975, n - 1))
        out.append(f"ci95 from {n} seeds: Student's t with {n - 1} degree of freedom puts each "
                   f"end {t:.3g} standard errors from the mean; it needs "
                   f"{MIN_SEEDS_MEAN_INTERVAL} or more seeds to say much")
    if noise_share is not None and noise_share >= NOISE_FLOOR_WARNING_SHARE:
        out.append(f"the binomial test-set noise floor is {noise_share:.0%} of the seed "
                   "variance: much of the seed-to-seed spread is measurement noise of the "
                   "finite test set")
    return out


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
        out["warnings"] = comparison_warnings(out)
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
    out["warnings"] = comparison_warnings(out)
    return out


def comparison_warnings(result: dict[str, Any]) -> list[str]:
    """Each interval or test of `result` (compare's dict) computed from fewer seeds than it
    needs, naming what and why."""
    n_a, n_b = result["n_a"], result["n_b"]
    seeds = f"{n_a} and {n_b} seeds"
    out = []
    if min(n_a, n_b) < 2:
        out.append(f"{seeds}: a variance needs 2 seeds on each side, so no variance test")
        return out
    if result["brown_forsythe_p"] is not None and min(n_a, n_b) < MIN_SEEDS_BROWN_FORSYTHE:
        out.append(f"brown_forsythe_p from {seeds}: it needs {MIN_SEEDS_BROWN_FORSYTHE} per "
                   "level (with 2 the deviations from the median are equal and p tends to 0; "
                   "with 3 one deviation is always 0)")
    boot = result.get("var_ratio_ci95")
    if boot and None not in boot and min(n_a, n_b) < MIN_SEEDS_BOOTSTRAP:
        out.append(f"var_ratio_ci95 (bootstrap) from {seeds}: the percentile bootstrap of a "
                   f"variance ratio needs about {MIN_SEEDS_BOOTSTRAP} per level and undercovers "
                   "below that; read var_ratio_ci95_f")
    for name in ("var_ratio_ci95", "var_ratio_ci95_f"):
        interval = result.get(name)
        if not interval or None in interval:
            continue
        low, high = interval
        decades = math.inf if low <= 0 else math.log10(high / low)
        if decades > MAX_RATIO_INTERVAL_DECADES:
            span = "from 0" if low <= 0 else f"{decades:.1f} orders of magnitude"
            out.append(f"{name} spans {span} ([{low:.3g}, {high:.3g}]) with {seeds}: it says "
                       f"little about the ratio (more than {MAX_RATIO_INTERVAL_DECADES:g} "
                       "orders of magnitude)")
    if result["permutation_p"] is not None:
        splits = math.comb(n_a + n_b, n_a)
        if splits < MIN_PERMUTATION_SPLITS:
            out.append(f"permutation_p from {seeds}: they split only {splits} ways, so it "
                       f"cannot fall below {2 / splits:.2g} and never reaches 0.05")
    if result.get("mean_diff_ci95") and min(n_a, n_b) < MIN_SEEDS_MEAN_INTERVAL:
        out.append(f"mean_diff_ci95 from {seeds}: Welch's interval has about 1 degree of "
                   f"freedom below {MIN_SEEDS_MEAN_INTERVAL} seeds per level and is very wide")
    return out


# One response carries at most this many comparisons; more are paged (limit, offset).
MAX_COMPARISONS_PER_PAGE = 2000


@dataclass(frozen=True)
class Slot:
    """Where one comparison sits: a factor, two of its levels, the other factors' levels held
    fixed (None: pooled over them), and its position among the factor's comparisons."""

    factor: str
    a: Any
    b: Any
    within: dict[str, Any] | None
    index: int


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
                start = first_scope if i == 0 else 0
                for s, within in enumerate(scopes[start:], start):
                    if limit <= 0:
                        return
                    yield Slot(factor, level_a, level_b, within,
                               (first_pair + i) * len(scopes) + s)
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
    bounds: tuple[float, float] | None = None,
    test_set_sizes: Sequence[int | None] | None = None,
) -> Stats:
    """Statistics of one metric; `runs` holds (condition, condition_key, value) per run.

    Every condition's summary, and the comparisons of `factor` (None: of every factor) from
    `offset`, at most `limit` of them (None: all; the caller bounds the work), with p-values
    Holm-adjusted over their whole families. `bounds`: the metric's declared range;
    `test_set_sizes`: per run (aligned with `runs`), its test-set size or None."""
    by_key: dict[str, tuple[dict[str, Any], list[float], list[int | None]]] = {}
    for i, (condition, key, value) in enumerate(runs):
        entry = by_key.setdefault(key, (condition, [], []))
        entry[1].append(value)
        entry[2].append(test_set_sizes[i] if test_set_sizes is not None else None)
    conditions = [condition_stats(c, k, v, bounds=bounds,
                                  test_set_sizes=sizes if test_set_sizes is not None else None)
                  for k, (c, v, sizes) in by_key.items()]

    plan = ComparisonPlan(grid, factor)
    total = plan.total
    limit = total if limit is None else limit
    values = RunValues(grid, runs)
    families = Families(grid, values.by_condition, values.by_level)
    comparisons = [_comparison(slot, values, families) for slot in plan.page(offset, limit)]
    end = offset + len(comparisons)
    omnibus = [omnibus_test(f, grid[f], values) for f in grid
               if (factor is None or f == factor) and len(grid[f]) > 2]
    return Stats(metric=metric, conditions=conditions, comparisons=comparisons, factor=factor,
                 total_comparisons=total, offset=offset,
                 next_offset=end if end < total else None,
                 metric_bounds=list(bounds) if bounds is not None else None,
                 multiplicity=families.families, omnibus=omnibus)


def omnibus_test(factor: str, levels: Sequence[Any], values: RunValues) -> Omnibus:
    """Brown-Forsythe over every level of `factor`, each level pooled over the other factors."""
    groups = [values.values(factor, level, None) for level in levels]
    p = None
    if all(len(g) >= 2 for g in groups) and any(np.ptp(g) > 0 for g in groups):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            p = _finite(stats.levene(*groups, center="median").pvalue)
    n = [len(g) for g in groups]
    warned = [] if p is None or min(n) >= MIN_SEEDS_BROWN_FORSYTHE else [
        f"brown_forsythe_p with {min(n)} seeds in some level: it needs "
        f"{MIN_SEEDS_BROWN_FORSYTHE} per level (with 2 the deviations from the median are equal "
        "and p tends to 0; with 3 one deviation is always 0)"]
    return Omnibus(factor=factor, levels=list(levels), n=n, brown_forsythe_p=p,
                   warnings=warned)


def _comparison(slot: Slot, values: RunValues, families: Families) -> Comparison:
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
    result.update(families.for_comparison(slot.factor, slot.index))
    return Comparison(factor=slot.factor, a=slot.a, b=slot.b, within=slot.within, **result)


def within_cell_variance(cells: Sequence[Sequence[float]]) -> float | None:
    """sum_k (n_k - 1) s_k^2 / sum_k (n_k - 1) over cells with at least two values."""
    usable = [np.asarray(c, dtype=float) for c in cells if len(c) >= 2]
    dof = sum(len(c) - 1 for c in usable)
    if dof == 0:
        return None
    return _finite(sum((len(c) - 1) * np.var(c, ddof=1) for c in usable) / dof)
