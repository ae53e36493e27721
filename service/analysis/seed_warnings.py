"""What a spec's seeds per condition let the primary test say, told at submission: a test with
too few re-assignments cannot give a p-value at or below alpha whatever the data (3 seeds a
side: 6 splits, p >= 1/3), and Holm multiplies the smallest p of a family by its size. The
counts are the test's own (service.analysis.resampling.prepare on the layout the runs will
have: shared seeds, paired from 6), so the warning says what /stats will answer."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from api_schemas import ExperimentSpec
from service.analysis import resampling
from service.analysis.stats import ComparisonPlan
from service.specs import stats_grid

ALPHA = 0.05
# The largest seed count looked at for "N seeds per condition would": past it, say nothing.
MAX_SEEDS_LOOKED_AT = 64


@lru_cache(maxsize=256)
def smallest_p(seeds: int, strata: int = 1) -> float:
    """The smallest two-sided p the primary test can give a comparison whose two levels hold
    `strata` cells of `seeds` shared seeds each (1.0 when it has no test)."""
    if seeds < 2:
        return 1.0
    rng = np.random.default_rng(0)
    ids = tuple(range(seeds))
    prep = resampling.prepare(
        [
            resampling.Stratum(rng.normal(size=seeds), rng.normal(size=seeds), ids, ids)
            for _ in range(strata)
        ]
    )
    if prep is None:
        return 1.0
    return min(1.0, 2 / resampling.distinct_assignments(prep.layout))


def seeds_reaching(alpha: float, strata: int = 1, start: int = 2) -> int | None:
    """The fewest seeds per condition, from `start`, whose comparisons of `strata` cells can
    reach `alpha`."""
    return next(
        (n for n in range(start, MAX_SEEDS_LOOKED_AT + 1) if smallest_p(n, strata) <= alpha),
        None,
    )


def submission_warnings(spec: ExperimentSpec, alpha: float = ALPHA) -> list[str]:
    """What the seeds per condition cannot do, in words; [] when every comparison can reach
    `alpha` (and for an adaptive experiment, whose rule decides its seeds)."""
    grid: dict[str, list[Any]] = stats_grid(spec)
    if spec.adaptive is not None or not any(len(levels) > 1 for levels in grid.values()):
        return []
    seeds = len(spec.seed_list())
    warnings = []
    within = smallest_p(seeds)
    if within > alpha:
        needed = seeds_reaching(alpha)
        pooled_can = [
            f
            for f in grid
            if len(grid) > 1
            and len(grid[f]) > 1
            and smallest_p(seeds, math.prod(len(grid[g]) for g in grid if g != f)) <= alpha
        ]
        reach = (
            f"comparisons pooled over the other factors can (of {', '.join(pooled_can)})"
            if pooled_can
            else "no comparison of this grid can"
        )
        warnings.append(
            f"{seeds} seeds per condition: a comparison within one cell cannot reach p <= "
            f"{alpha:g} whatever the runs give (its smallest possible p is {within:.3g}); "
            f"{reach}" + (f"; {needed} seeds per condition would" if needed is not None else "")
        )
    plan = ComparisonPlan(grid)
    for f in grid:
        levels = len(grid[f])
        if levels < 2 or len(grid) < 2 or within > alpha:
            continue
        family = plan.count(f)
        # Holm ranks the family's p-values; a within-cell comparison can at best come after
        # every pooled one, where Holm multiplies its p by the comparisons left
        left = family - math.comb(levels, 2)
        if left * within > alpha:
            needed = seeds_reaching(alpha / left, start=seeds + 1)
            warnings.append(
                f"factor {f}: after Holm over its {family} comparisons none of its {left} "
                f"within-cell comparisons can reach p <= {alpha:g} (each gives p >= "
                f"{within:.3g} at {seeds} seeds, and Holm multiplies it by {left} or more); "
                "its pooled comparisons can"
                + (f"; {needed} seeds per condition would" if needed is not None else "")
            )
    return warnings
