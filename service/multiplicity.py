"""Holm-adjusted p-values over whole families of comparisons, whichever page is served.

The families (docs/architecture.md "Statistics"; issue 14, item 2):
- per factor: every comparison of that factor, that is every pair of its levels, pooled and
  within each combination of the other factors (ComparisonPlan.count(factor) of them);
- across all: every comparison of the experiment, every factor's.
Pooled and within comparisons share values, so they are not independent; Holm's step-down
procedure controls the family-wise error rate under any dependence, which is why it is used.

Three p-values are adjusted: f_test_p, brown_forsythe_p and welch_p. Each is a closed form of
per-group summaries (n, mean, variance; for Brown-Forsythe the mean and the sum of squares of
the absolute deviations from the group's median), so a whole family costs one pass over the
runs plus numpy arithmetic over its comparisons, however the comparisons are paged. The
permutation p-value is not adjusted: 9,999 resamples per comparison of a whole family would
cost minutes.

A comparison whose raw p-value is null (fewer than two seeds on a side, zero variance) is not in
the family: Holm's m counts the defined p-values. A family of more than MAX_FAMILY_COMPARISONS
comparisons is not adjusted (null, with the reason in Stats.multiplicity) rather than served
from a bounded part of it, which would be wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from api_schemas import MultiplicityFamily, level_key

# Above this many comparisons a family's adjusted p-values are null (bounded work per page).
MAX_FAMILY_COMPARISONS = 200_000
ADJUSTED = ("f_test_p", "brown_forsythe_p", "welch_p")


@dataclass
class GroupSummaries:
    """Per group of values (a condition, or a level pooled over the other factors): what the
    closed-form tests need, as float arrays of one shape (n = 0 where a group has no value)."""

    n: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    abs_dev_mean: np.ndarray  # mean of |x - median(x)|
    abs_dev_ss: np.ndarray  # sum of (|x - median(x)| - abs_dev_mean)^2

    @classmethod
    def of(cls, groups: Sequence[Sequence[float]], shape: tuple[int, ...]) -> GroupSummaries:
        n = np.zeros(len(groups))
        mean, var, dev_mean, dev_ss = (np.full(len(groups), np.nan) for _ in range(4))
        for i, group in enumerate(groups):
            if not group:
                continue
            x = np.asarray(group, dtype=float)
            n[i], mean[i] = len(x), x.mean()
            deviations = np.abs(x - np.median(x))
            dev_mean[i] = deviations.mean()
            dev_ss[i] = ((deviations - dev_mean[i]) ** 2).sum()
            if len(x) >= 2:
                var[i] = x.var(ddof=1)
        return cls(*(a.reshape(shape) for a in (n, mean, var, dev_mean, dev_ss)))

    def take(self, index: Any) -> GroupSummaries:
        return GroupSummaries(self.n[index], self.mean[index], self.var[index],
                              self.abs_dev_mean[index], self.abs_dev_ss[index])

    def moveaxis(self, axis: int) -> GroupSummaries:
        """The factor's axis first, the other factors flattened in grid order behind it."""
        def move(a: np.ndarray) -> np.ndarray:
            return np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1)
        return GroupSummaries(move(self.n), move(self.mean), move(self.var),
                              move(self.abs_dev_mean), move(self.abs_dev_ss))


def _concat(parts: Sequence[GroupSummaries]) -> GroupSummaries:
    return GroupSummaries(*(np.concatenate([getattr(p, f) for p in parts], axis=1)
                            for f in ("n", "mean", "var", "abs_dev_mean", "abs_dev_ss")))


def f_test_p(a: GroupSummaries, b: GroupSummaries) -> np.ndarray:
    """Two-sided F-test of var_a / var_b, 2 min(cdf, sf), as service.stats.compare; NaN where
    undefined."""
    ok = (a.n >= 2) & (b.n >= 2) & (a.var > 0) & (b.var > 0)
    p = np.full(a.n.shape, np.nan)
    ratio, dfn, dfd = a.var[ok] / b.var[ok], a.n[ok] - 1, b.n[ok] - 1
    tails = np.minimum(stats.f.cdf(ratio, dfn, dfd), stats.f.sf(ratio, dfn, dfd))
    p[ok] = np.minimum(1.0, 2.0 * tails)
    return p


def welch_p(a: GroupSummaries, b: GroupSummaries) -> np.ndarray:
    """Welch's two-sided t-test as scipy.stats.ttest_ind(equal_var=False) computes it (an
    undefined Welch-Satterthwaite degree of freedom, both variances 0, is taken as 1, as scipy
    does); NaN where undefined."""
    ok = (a.n >= 2) & (b.n >= 2)
    p = np.full(a.n.shape, np.nan)
    with np.errstate(all="ignore"):
        va, vb = a.var[ok] / a.n[ok], b.var[ok] / b.n[ok]
        se2 = va + vb
        df = se2**2 / (va**2 / (a.n[ok] - 1) + vb**2 / (b.n[ok] - 1))
        df = np.where(np.isnan(df), 1.0, df)
        t = (a.mean[ok] - b.mean[ok]) / np.sqrt(se2)
        p[ok] = 2.0 * stats.t.sf(np.abs(t), df)
    return p


def brown_forsythe_p(a: GroupSummaries, b: GroupSummaries) -> np.ndarray:
    """Brown-Forsythe (scipy.stats.levene, center="median") of two groups: the one-way ANOVA
    of the absolute deviations from each group's median, F(1, N - 2); NaN where undefined."""
    ok = (a.n >= 2) & (b.n >= 2)
    p = np.full(a.n.shape, np.nan)
    with np.errstate(all="ignore"):
        na, nb = a.n[ok], b.n[ok]
        total = na + nb
        overall = (na * a.abs_dev_mean[ok] + nb * b.abs_dev_mean[ok]) / total
        between = (na * (a.abs_dev_mean[ok] - overall) ** 2
                   + nb * (b.abs_dev_mean[ok] - overall) ** 2)
        within = a.abs_dev_ss[ok] + b.abs_dev_ss[ok]
        statistic = (total - 2) * between / within
        p[ok] = stats.f.sf(statistic, 1, total - 2)
    return p


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values of the defined (finite) entries of `p`; NaN stays NaN. Holm's
    step-down: the i-th smallest of m p-values (from 0) times m - i, the running maximum of
    those in sorted order, clipped at 1. (statsmodels' multipletests gives the same values,
    the tests check, but runs a full garbage collection on every call: 0.3 s each in a process
    that holds torch, most of a cold /stats.)"""
    adjusted = np.full(p.shape, np.nan)
    defined = np.flatnonzero(np.isfinite(p))
    if defined.size:
        raw = p[defined]
        order = np.argsort(raw, kind="stable")
        scaled = (raw.size - np.arange(raw.size)) * raw[order]
        adjusted[defined[order]] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted


class Families:
    """The raw and Holm-adjusted p-values of every comparison of an experiment, per factor in
    ComparisonPlan's order, and the families' descriptions."""

    def __init__(self, grid: dict[str, list[Any]],
                 by_condition: dict[tuple, list[float]],
                 by_level: dict[tuple[str, str], list[float]]) -> None:
        self.factors = list(grid)
        counts = {f: math.comb(len(grid[f]), 2) * _scopes(grid, f) for f in self.factors}
        total = sum(counts.values())
        shape = tuple(len(grid[f]) for f in self.factors)
        raw: dict[str, dict[str, np.ndarray]] = {}
        feasible = [f for f in self.factors if counts[f] <= MAX_FAMILY_COMPARISONS]
        if feasible:
            keys = [[level_key(v) for v in grid[f]] for f in self.factors]
            conditions = GroupSummaries.of(
                [by_condition.get(combo, []) for combo in _product(keys)], shape)
            for f in feasible:
                axis = self.factors.index(f)
                levels = GroupSummaries.of([by_level.get((f, k), []) for k in keys[axis]],
                                           (len(keys[axis]), 1))
                raw[f] = _factor_p_values(levels, conditions.moveaxis(axis),
                                          pooled_only=len(self.factors) == 1)
        self.adjusted: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self.families: list[MultiplicityFamily] = []
        for f in self.factors:
            self._family(("factor", f), f, counts[f], {f: raw[f]} if f in raw else None)
        self._family(("all", ""), None, total, raw if total <= MAX_FAMILY_COMPARISONS else None)

    def _family(self, name: tuple[str, str], factor: str | None, size: int,
                members: dict[str, dict[str, np.ndarray]] | None) -> None:
        if members is None:
            self.families.append(MultiplicityFamily(
                factor=factor, comparisons=size, tested={}, null_reason=(
                    f"{size:,} comparisons, more than the {MAX_FAMILY_COMPARISONS:,} adjusted "
                    "within bounded work: the Holm-adjusted p-values are null")))
            return
        tested = {}
        for test in ADJUSTED:
            parts = [members[f][test] for f in self.factors if f in members]
            # an experiment without a grid has no comparisons: an empty family
            joined = np.concatenate(parts) if parts else np.empty(0)
            tested[test] = int(np.isfinite(joined).sum())
            adjusted = holm(joined)
            start = 0
            for f in self.factors:
                if f in members:
                    end = start + len(members[f][test])
                    self.adjusted.setdefault((name[0], f), {})[test] = adjusted[start:end]
                    start = end
        self.families.append(MultiplicityFamily(factor=factor, comparisons=size, tested=tested,
                                                null_reason=None))

    def for_comparison(self, factor: str, index: int) -> dict[str, float | None]:
        """The adjusted p-values of the `index`-th comparison of `factor` (ComparisonPlan's
        order), as Comparison's *_holm_factor and *_holm_all fields."""
        out: dict[str, float | None] = {}
        for family, suffix in (("factor", "holm_factor"), ("all", "holm_all")):
            values = self.adjusted.get((family, factor))
            for test in ADJUSTED:
                value = float(values[test][index]) if values is not None else math.nan
                out[f"{test}_{suffix}"] = value if math.isfinite(value) else None
        return out


def _scopes(grid: dict[str, list[Any]], factor: str) -> int:
    others = [f for f in grid if f != factor]
    return 1 + math.prod(len(grid[f]) for f in others) if others else 1


def _product(keys: list[list[str]]) -> list[tuple[str, ...]]:
    combos: list[tuple[str, ...]] = [()]
    for levels in keys:
        combos = [c + (k,) for c in combos for k in levels]
    return combos


def _factor_p_values(levels: GroupSummaries, cells: GroupSummaries,
                     pooled_only: bool) -> dict[str, np.ndarray]:
    """The p-values of every comparison of one factor, flattened in ComparisonPlan's order:
    pairs of levels in grid order, for each the pooled comparison, then one within each
    combination of the other factors."""
    first, second = np.triu_indices(levels.n.shape[0], 1)
    scoped = levels if pooled_only else _concat([levels, cells])
    a, b = scoped.take(first), scoped.take(second)
    return {name: test(a, b).ravel() for name, test in
            (("f_test_p", f_test_p), ("brown_forsythe_p", brown_forsythe_p),
             ("welch_p", welch_p))}
