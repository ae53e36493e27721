"""The answer of GET /planning/seeds (and `seedgrid plan`): the seeds per level at which the
primary test (service.analysis.primary_power) and the F-test (service.analysis.power) detect a
variance ratio, or the ratio a number of seeds detects."""

from __future__ import annotations

import math

from api_schemas import SeedPlan
from service.analysis.power import (
    DEFAULT_ALPHA,
    DEFAULT_POWER,
    MAX_SEEDS_PER_LEVEL,
    detectable_ratio,
    seeds_needed,
)
from service.analysis.primary_power import (
    MAX_SIMULATED_SEEDS,
    SIMULATIONS,
    check_pairing,
    prepare_is_paired,
    primary_detectable_ratio,
    primary_seeds_needed,
)
from service.analysis.resampling import paired_test_name, unpaired_test_name


def _method(seeds: int, *, paired: bool, correlation: float) -> str:
    """The test that runs on `seeds` seeds per level, and how its power was found."""
    paired_test = prepare_is_paired(seeds, seeds, paired, correlation)
    test = paired_test_name(seeds) if paired_test else unpaired_test_name(seeds)
    if paired and not paired_test:
        test += " (too few shared seeds to sign-flip)"
    model = (
        f"normal seeds whose values correlate {correlation:g} between the levels"
        if correlation
        else "normal seeds"
    )
    source = (
        "a normal approximation above 40 seeds per level"
        if seeds > MAX_SIMULATED_SEEDS
        else f"simulated on {SIMULATIONS:,} datasets"
    )
    return (
        f"{test}, the primary test, two-sided at level alpha with the same seeds per level; "
        f"power on {model}, {source}"
    )


def seed_plan(
    *,
    ratio: float | None,
    seeds: int | None,
    alpha: float = DEFAULT_ALPHA,
    power: float = DEFAULT_POWER,
    paired: bool = True,
    correlation: float = 0.0,
) -> SeedPlan:
    """The planning answer for the primary test: seeds per level for `ratio`, or the ratio
    `seeds` detect; with the F-test's answer beside it (what normality would promise)."""
    check_pairing(paired, correlation)
    planned: float | None
    f_test_ratio: float | None
    if ratio is not None:
        needed = primary_seeds_needed(
            ratio, paired=paired, correlation=correlation, alpha=alpha, power=power
        )
        planned, f_test_ratio = ratio, ratio
        f_test_seeds = seeds_needed(ratio, alpha, power)
        note = (
            None
            if needed is not None
            else (
                "no study detects a ratio of 1"
                if ratio == 1
                else f"more than {MAX_SEEDS_PER_LEVEL:,} seeds per level"
            )
        )
        method_seeds = needed if needed is not None else MAX_SEEDS_PER_LEVEL
    else:
        assert seeds is not None
        needed, f_test_seeds, method_seeds = seeds, seeds, seeds
        detectable = primary_detectable_ratio(
            seeds, seeds, paired=paired, correlation=correlation, alpha=alpha, power=power
        )
        f_detectable = detectable_ratio(seeds, seeds, alpha, power)
        planned = detectable if math.isfinite(detectable) else None
        f_test_ratio = f_detectable if math.isfinite(f_detectable) else None
        note = None if planned is not None else "no ratio below 1e12 reaches that power"
    return SeedPlan(
        method=_method(method_seeds, paired=paired, correlation=correlation),
        alpha=alpha,
        power=power,
        paired=paired,
        correlation=correlation if paired else None,
        ratio=planned,
        seeds_per_level=needed,
        note=note,
        f_test_ratio=f_test_ratio,
        f_test_seeds_per_level=f_test_seeds,
    )
