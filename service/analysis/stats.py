"""Per-condition summaries and variance comparisons (docs/api.md).

For every grid factor and every pair of its levels (a, b), the metric is compared once pooled
over every other factor and once within each combination of the other factors. Each comparison
is measured on within-cell residuals (service.analysis.variance): its primary test is the
randomisation
test of service.analysis.resampling, paired by seed where the conditions share seeds; the F-test,
Brown-Forsythe and Welch are secondary. p-values are Holm-adjusted per factor and across all
comparisons, over the whole family whatever the page (service.analysis.multiplicity). A factor of
more
than two levels also gets an omnibus test.

Per condition: n, mean, variance, the mean's 95% interval (Student's t, or for a bounded metric
the t interval on the logit scale: logit(m) +- t_{n-1} sem / (m (1 - m)) with m the mean rescaled
to (0, 1), mapped back, which never crosses a bound), and for a metric with a declared test set
the binomial test-set error mean_i p_i (1 - p_i) / n_i.

`scale="log"` compares the logarithms of a positive metric: spreads relative to the mean.
Anything undefined (n < 2, zero variance) is null, never an error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from api_schemas import Comparison, ConditionStats, Omnibus, Stats, level_key
from api_schemas.pages import COMPARISONS_PAGE
from service.analysis import variance
from service.analysis.conditions import condition_stats
from service.analysis.multiplicity import ADJUSTED, Families, FamilyPValues
from service.analysis.omnibus import level_omnibus
from service.analysis.resampling import Stratum
from service.analysis.variance import Scope
from service.lru import LruCache, deep_size

# Above this many comparisons in an experiment, only the page's are computed (and the families
# they belong to are not adjusted; Stats.multiplicity says why).
MAX_ANALYSED_COMPARISONS = 20_000
# Comparisons analysed at a time. The randomisation tests of a batch hold N_RESAMPLES crossing
# scales per comparison with their intermediates, about 1 MB each: 20,000 comparisons analysed
# at once held 16.7 GB; batches keep the working set near 128 MB at the same speed.
ANALYSIS_BATCH = 128


# One response carries at most this many comparisons; more are paged (limit, offset).
MAX_COMPARISONS_PER_PAGE = COMPARISONS_PAGE


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

    def __init__(
        self, grid: dict[str, list[Any]], factor: str | None = None, pooled: bool = False
    ) -> None:
        self.grid = grid
        self.factors = [factor] if factor is not None else list(grid)
        # only the pooled comparisons (each pair of levels over every level of the others);
        # their Slot.index stays their place among all of the factor's, Holm's lookup
        self.pooled = pooled

    def scopes(self, factor: str) -> int:
        """How many comparisons each pair of the factor's levels has: pooled, and within
        each combination of the other factors."""
        others = [f for f in self.grid if f != factor]
        return 1 + math.prod(len(self.grid[f]) for f in others) if others else 1

    def count(self, factor: str) -> int:
        return math.comb(len(self.grid[factor]), 2) * (1 if self.pooled else self.scopes(factor))

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
            scopes += (
                [
                    dict(zip(others, combo, strict=True))
                    for combo in itertools.product(*(self.grid[f] for f in others))
                ]
                if others and not self.pooled
                else []
            )
            every = self.scopes(factor)  # a pair's comparisons in the whole family
            first_pair, first_scope = divmod(offset, len(scopes))
            pairs = itertools.islice(itertools.combinations(self.grid[factor], 2), first_pair, None)
            for i, (level_a, level_b) in enumerate(pairs):
                start = first_scope if i == 0 else 0
                for s, within in enumerate(scopes[start:], start):
                    if limit <= 0:
                        return
                    yield Slot(factor, level_a, level_b, within, (first_pair + i) * every + s)
                    limit -= 1
            offset = 0


class RunValues:
    """The metric's values grouped by condition (with each run's seed) and by (factor, level),
    in run order, so that every comparison finds its samples by lookup instead of a scan of
    all runs."""

    def __init__(
        self,
        grid: dict[str, list[Any]],
        runs: Sequence[tuple[dict[str, Any], str, float]],
        seeds: Sequence[int] | None = None,
    ) -> None:
        self.grid = grid
        self.factors = list(grid)
        self.by_condition: dict[tuple, list[float]] = {}
        self.seeds_by_condition: dict[tuple, list[int]] = {}
        self.by_level: dict[tuple[str, str], list[float]] = {}
        # per (factor, level): the conditions holding that level, each with its values
        self.cells: dict[tuple[str, str], list[list[float]]] = {}
        self._arrays: dict[tuple, tuple[np.ndarray, tuple[int, ...] | None]] = {}
        for i, (condition, _, value) in enumerate(runs):
            if any(f not in condition for f in self.factors):
                continue  # not a condition of this grid
            key = tuple(level_key(condition[f]) for f in self.factors)
            cell = self.by_condition.get(key)
            if cell is None:
                cell = self.by_condition[key] = []
                self.seeds_by_condition[key] = []
                for f, level in zip(self.factors, key, strict=True):
                    self.cells.setdefault((f, level), []).append(cell)
            cell.append(value)
            if seeds is not None:
                self.seeds_by_condition[key].append(seeds[i])
            for f, level in zip(self.factors, key, strict=True):
                self.by_level.setdefault((f, level), []).append(value)
        self.has_seeds = seeds is not None

    def values(self, factor: str, level: Any, within: dict[str, Any] | None) -> list[float]:
        if within is None:
            return self.by_level.get((factor, level_key(level)), [])
        fixed = {**within, factor: level}
        return self.by_condition.get(tuple(level_key(fixed[f]) for f in self.factors), [])

    def level_cells(self, factor: str, level: Any) -> list[list[float]]:
        return self.cells.get((factor, level_key(level)), [])

    def cell(self, levels: dict[str, Any]) -> tuple[np.ndarray, tuple[int, ...] | None]:
        """One condition's values and their seeds (None when the runs carry none)."""
        key = tuple(level_key(levels[f]) for f in self.factors)
        found = self._arrays.get(key)
        if found is None:
            seeds = self.seeds_by_condition.get(key, [])
            found = self._arrays[key] = (
                np.asarray(self.by_condition.get(key, []), dtype=float),
                tuple(seeds) if self.has_seeds else None,
            )
        return found

    def scope(self, slot: Slot) -> Scope:
        """The strata of one comparison: the two cells within `slot.within`, or the two cells at
        each combination of the other factors when pooled."""
        others = [f for f in self.factors if f != slot.factor]
        combos = (
            [slot.within]
            if slot.within is not None
            else [
                dict(zip(others, combo, strict=True))
                for combo in itertools.product(*(self.grid[f] for f in others))
            ]
        )
        strata = []
        for within in combos:
            a, a_seeds = self.cell({**within, slot.factor: slot.a})
            b, b_seeds = self.cell({**within, slot.factor: slot.b})
            if len(a) or len(b):
                strata.append(Stratum(a, b, a_seeds, b_seeds))
        return Scope(tuple(strata), pooled=slot.within is None and bool(others))


class ScaleError(ValueError):
    """scale="log" asked of a metric with values at or below 0."""


def on_scale(values: Sequence[float], scale: str) -> list[float]:
    """The values as compared: themselves, or their natural logarithms (scale "log")."""
    if scale == "raw":
        return list(values)
    bad = sum(1 for v in values if not v > 0)
    if bad:
        raise ScaleError(f"scale=log needs positive values; {bad} of {len(values)} are 0 or below")
    return [math.log(v) for v in values]


def run_values(
    grid: dict[str, list[Any]],
    runs: Sequence[tuple[dict[str, Any], str, float]],
    seeds: Sequence[int] | None,
    scale: str,
) -> RunValues:
    """The runs' values on `scale` (ScaleError when "log" meets a value at or below 0), grouped
    for the comparisons."""
    scaled = on_scale([value for _, _, value in runs], scale)
    return RunValues(grid, [(c, k, v) for (c, k, _), v in zip(runs, scaled, strict=True)], seeds)


def analyse_slots(
    values: RunValues,
    slots: Sequence[Slot],
    target_ratio: float,
    store: variance.ResultStore | None = None,
) -> list[dict[str, Any]]:
    """variance.analyse of each slot's scope, ANALYSIS_BATCH at a time (bounded memory)."""
    out: list[dict[str, Any]] = []
    for start in range(0, len(slots), ANALYSIS_BATCH):
        batch = slots[start : start + ANALYSIS_BATCH]
        out += variance.analyse(
            [values.scope(slot) for slot in batch], target_ratio=target_ratio, store=store
        )
    return out


def family_p_values(
    *,
    grid: dict[str, list[Any]],
    runs: Sequence[tuple[dict[str, Any], str, float]],
    seeds: Sequence[int] | None = None,
    scale: str = "raw",
    target_ratio: float = 2.0,
    store: variance.ResultStore | None = None,
    values: RunValues | None = None,
) -> FamilyPValues:
    """What every page of an experiment's statistics shares: the raw p-values Holm adjusts
    (service.analysis.multiplicity.ADJUSTED) of every comparison of each factor whose family fits
    MAX_ANALYSED_COMPARISONS (taken in grid order), in ComparisonPlan's order. A page needs
    them all whatever comparisons it shows, so service.analysis.stats_store computes them once per
    experiment, metric, scale and completed runs, and stores them (the arguments are
    experiment_stats'; `store`: variance.analyse's; `values`: run_values() of the same runs,
    when the caller has them)."""
    if values is None:
        values = run_values(grid, runs, seeds, scale)
    everything = ComparisonPlan(grid)
    raw: FamilyPValues = {}
    budget = MAX_ANALYSED_COMPARISONS
    for f in grid:
        count = everything.count(f)
        if count > budget:
            continue
        budget -= count
        columns: dict[str, list[float]] = {test: [] for test in ADJUSTED}
        slots = list(ComparisonPlan(grid, f).page(0, count))
        for start in range(0, count, ANALYSIS_BATCH):  # each batch's p-values kept, no more
            batch = slots[start : start + ANALYSIS_BATCH]
            for result in variance.analyse(
                [values.scope(slot) for slot in batch], target_ratio=target_ratio, store=store
            ):
                for test in ADJUSTED:
                    value = result.get(test)
                    columns[test].append(math.nan if value is None else float(value))
        raw[f] = {test: np.asarray(column, dtype=float) for test, column in columns.items()}
    return raw


# Each condition's summary, kept by its values (a run that completes changes one condition's;
# the others' bounded intervals were a tenth of a poll's computation at 1,000 runs).
_conditions: LruCache[ConditionStats] = LruCache(
    max_items=4096, max_bytes=32 * 2**20, size=lambda kept: deep_size(kept.__dict__)
)


def kept_condition_stats(
    condition: dict[str, Any],
    key: str,
    values: Sequence[float],
    *,
    bounds: tuple[float, float] | None,
    test_set_sizes: Sequence[int | None] | None,
) -> ConditionStats:
    """condition_stats, computed once for the same condition, values, bounds and sizes; each
    call gets its own copy (the callers add runs and warnings to it)."""
    memo = (
        key,
        tuple(values),
        bounds,
        None if test_set_sizes is None else tuple(test_set_sizes),
    )
    kept = _conditions.get(memo)
    if kept is None:
        kept = condition_stats(condition, key, values, bounds=bounds, test_set_sizes=test_set_sizes)
        _conditions.put(memo, kept)
    return kept.model_copy(deep=True)


def experiment_stats(
    *,
    metric: str,
    grid: dict[str, list[Any]],
    runs: Sequence[tuple[dict[str, Any], str, float]],
    seeds: Sequence[int] | None = None,
    factor: str | None = None,
    offset: int = 0,
    limit: int | None = None,
    pooled: bool = False,
    bounds: tuple[float, float] | None = None,
    test_set_sizes: Sequence[int | None] | None = None,
    scale: str = "raw",
    target_ratio: float = 2.0,
    family_p: FamilyPValues | None = None,
    store: variance.ResultStore | None = None,
    values: RunValues | None = None,
) -> Stats:
    """Statistics of one metric; `runs` holds (condition, condition_key, value) per run and
    `seeds` (aligned with it) each run's seed, which pairs the conditions that share seeds.

    Every condition's summary, and the comparisons of `factor` (None: of every factor; with
    `pooled`, only its pooled ones) from `offset`, at most `limit` of them (None: all; the
    caller bounds the work), with p-values
    Holm-adjusted over their whole families. `bounds`: the metric's declared range;
    `test_set_sizes`: per run (aligned with `runs`), its test-set size or None; `scale`: "raw"
    or "log" (ScaleError when a value is not positive); `target_ratio`: the variance ratio
    each comparison plans seeds for; `family_p`: family_p_values() of the same arguments, when
    the caller has them stored (else they are computed here); `store`: where comparisons
    this process does not hold may be stored (variance.analyse); `values`: run_values() of the
    same runs, when the caller has them (built once for the families and the page)."""
    by_key: dict[str, tuple[dict[str, Any], list[float], list[int | None]]] = {}
    for i, (condition, key, value) in enumerate(runs):
        entry = by_key.setdefault(key, (condition, [], []))
        entry[1].append(value)
        entry[2].append(test_set_sizes[i] if test_set_sizes is not None else None)
    conditions = [
        kept_condition_stats(
            c, k, v, bounds=bounds, test_set_sizes=sizes if test_set_sizes is not None else None
        )
        for k, (c, v, sizes) in by_key.items()
    ]

    if values is None:
        values = run_values(grid, runs, seeds, scale)
    if family_p is None:
        family_p = family_p_values(
            grid=grid,
            runs=runs,
            seeds=seeds,
            scale=scale,
            target_ratio=target_ratio,
            store=store,
            values=values,
        )
    plan = ComparisonPlan(grid, factor, pooled)
    total = plan.total
    limit = total if limit is None else limit
    page = list(plan.page(offset, limit))
    # The page's own comparisons only (a family's were computed with it, and variance keeps
    # them cached by their data).
    results = analyse_slots(values, page, target_ratio, store)
    families = Families(grid, family_p, limit=MAX_ANALYSED_COMPARISONS)
    comparisons = [
        Comparison(
            factor=slot.factor,
            a=slot.a,
            b=slot.b,
            within=slot.within,
            scale=scale,
            **result,
            **families.for_comparison(slot.factor, slot.index),
        )
        for slot, result in zip(page, results, strict=True)
    ]
    end = offset + len(comparisons)
    omnibus = [
        omnibus_test(f, grid[f], values)
        for f in grid
        if (factor is None or f == factor) and len(grid[f]) > 2
    ]
    return Stats(
        metric=metric,
        conditions=conditions,
        comparisons=comparisons,
        factor=factor,
        pooled=pooled,
        total_comparisons=total,
        offset=offset,
        next_offset=end if end < total else None,
        metric_bounds=list(bounds) if bounds is not None else None,
        multiplicity=families.families,
        omnibus=omnibus,
        scale=scale,
    )


def omnibus_test(factor: str, levels: Sequence[Any], values: RunValues) -> Omnibus:
    """Do the variances of every level of `factor` differ at all, within the cells of the
    other factors (service.analysis.omnibus)."""
    others = [f for f in values.factors if f != factor]
    rows = [
        [values.cell({**dict(zip(others, combo, strict=True)), factor: level}) for level in levels]
        for combo in itertools.product(*(values.grid[f] for f in others))
    ]
    primary, bf, name, why = level_omnibus(rows, len(levels))
    n = [len(values.values(factor, level, None)) for level in levels]
    warned = [] if why is None else [f"primary_p is null: {why}"]
    smallest = min((len(v) for row in rows for v, _ in row if len(v)), default=0)
    if bf is not None and smallest < variance.MIN_SEEDS_BROWN_FORSYTHE:
        warned.append(
            f"brown_forsythe_p with {smallest} seeds in some cell: it needs "
            f"{variance.MIN_SEEDS_BROWN_FORSYTHE} per cell (with 2 the deviations "
            "from the median are equal; with 3 one is always 0) and has little power "
            "below that"
        )
    return Omnibus(
        factor=factor,
        levels=list(levels),
        n=n,
        primary_test=name,
        primary_p=primary,
        brown_forsythe_p=bf,
        warnings=warned,
    )


def compare(
    a_values: Sequence[float],
    b_values: Sequence[float],
    a_seeds: Sequence[int] | None = None,
    b_seeds: Sequence[int] | None = None,
    *,
    target_ratio: float = 2.0,
) -> dict[str, Any]:
    """The comparison of two samples (one cell each), paired by seed when both carry the same
    seeds: the fields of api_schemas.Comparison but factor, levels and Holm."""
    stratum = Stratum(
        np.asarray(a_values, dtype=float),
        np.asarray(b_values, dtype=float),
        tuple(a_seeds) if a_seeds is not None else None,
        tuple(b_seeds) if b_seeds is not None else None,
    )
    return variance.analyse([Scope((stratum,), pooled=False)], target_ratio=target_ratio)[0]
