"""Holm-adjusted p-values over whole families of comparisons, whichever page is served.

The families (docs/api.md "Multiplicity"):
- per factor: every comparison of that factor, that is every pair of its levels, pooled and
  within each combination of the other factors (ComparisonPlan.count(factor) of them);
- across all: every comparison of the experiment, every factor's.
Pooled and within comparisons share values, so they are not independent; Holm's step-down
procedure controls the family-wise error rate under any dependence, which is why it is used.

Five p-values are adjusted: primary_p, f_test_p, brown_forsythe_p, welch_p and mean_p, from
every comparison of the experiment (service.analysis.stats.family_p_values computes them all,
whatever
the page, and service.analysis.stats_store stores them for the experiment's other pages). A
comparison whose raw p-value is null (fewer than two seeds on a side, zero variance) is not in
the family: Holm's m counts the defined p-values. An experiment of more comparisons than
service.analysis.stats analyses in bounded work is not adjusted (null, with the reason in
Stats.multiplicity) rather than served from a part of its family, which would be wrong.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from api_schemas import MultiplicityFamily

ADJUSTED = ("primary_p", "f_test_p", "brown_forsythe_p", "welch_p", "mean_p")


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


# The shared part of an experiment's statistics (service.analysis.stats.family_p_values): per factor
# analysed whole, per ADJUSTED test, the raw p-value of each of its comparisons in
# ComparisonPlan's order (NaN where it is null).
FamilyPValues = dict[str, dict[str, np.ndarray]]


class Families:
    """The Holm-adjusted p-values of every comparison of an experiment, per factor in
    ComparisonPlan's order, and the families' descriptions. `raw` holds every comparison's raw
    p-values per factor; a factor missing from it was too large to analyse whole (`limit`)."""

    def __init__(self, grid: dict[str, list[Any]], raw: FamilyPValues, limit: int) -> None:
        self.factors = list(grid)
        counts = {f: math.comb(len(grid[f]), 2) * _scopes(grid, f) for f in self.factors}
        total = sum(counts.values())
        self.adjusted: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self.families: list[MultiplicityFamily] = []
        for f in self.factors:
            self._family("factor", f, counts[f], {f: raw[f]} if f in raw else None, limit)
        self._family("all", None, total, raw if len(raw) == len(self.factors) else None, limit)

    def _family(
        self,
        kind: str,
        factor: str | None,
        size: int,
        members: dict[str, dict[str, np.ndarray]] | None,
        limit: int,
    ) -> None:
        if members is None:
            self.families.append(
                MultiplicityFamily(
                    factor=factor,
                    comparisons=size,
                    tested={},
                    null_reason=(
                        f"{size:,} comparisons, more than the {limit:,} analysed within bounded "
                        "work (only the page's are computed): the Holm-adjusted p-values are "
                        "null"
                    ),
                )
            )
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
                    self.adjusted.setdefault((kind, f), {})[test] = adjusted[start:end]
                    start = end
        self.families.append(
            MultiplicityFamily(factor=factor, comparisons=size, tested=tested, null_reason=None)
        )

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
