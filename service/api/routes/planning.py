"""/planning/seeds: the seeds a variance comparison needs, answered before submission."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api_schemas import SeedPlan
from service.analysis.planning import seed_plan
from service.analysis.power import DEFAULT_ALPHA, DEFAULT_POWER
from service.errors import SpecError

router = APIRouter(prefix="/planning", tags=["planning"])


@router.get(
    "/seeds",
    response_model=SeedPlan,
    operation_id="plan_seeds",
    summary="How many seeds a variance comparison needs",
    description="Before submission, for the primary test that /stats reports (a paired "
    "sign-flip or stratified permutation test of squared deviations from the cell "
    "median, or from a mode-aligned centre for 6-15 unpaired seeds, two-sided at `alpha`), "
    "its power simulated on normal seeds: "
    "given a variance ratio, the seeds per level that detect it with "
    "`power`; given seeds per level, the smallest ratio they detect. Give "
    "exactly one of the two. The F-test's answer comes beside it.",
)
def plan_seeds(
    ratio: Annotated[
        float | None,
        Query(
            ge=1e-12,
            le=1e12,
            description=(
                "the variance ratio var_a / var_b to detect, 1e-12 to 1e12 (a ratio and its "
                "inverse need the same seeds): answers the seeds per level"
            ),
        ),
    ] = None,
    seeds: Annotated[
        int | None,
        Query(
            ge=2,
            le=100_000,
            description=("seeds per level: answers the smallest ratio they detect"),
        ),
    ] = None,
    alpha: Annotated[float, Query(gt=0, lt=1)] = DEFAULT_ALPHA,
    power: Annotated[float, Query(gt=0, lt=1)] = DEFAULT_POWER,
    paired: Annotated[
        bool,
        Query(
            description=(
                "whether the two levels run the same seeds (seedgrid's default: seed s draws the "
                "same init, data and augment streams in every condition), so the paired sign-flip "
                "test "
                "runs; false plans for independent seeds and the unpaired permutation test"
            )
        ),
    ] = True,
    correlation: Annotated[
        float,
        Query(
            ge=0,
            le=0.99,
            description=(
                "with paired seeds, the correlation expected between a seed's values in the two "
                "levels (0: none, the cautious choice; common random numbers often give 0.5-0.9, "
                "and the higher it is the fewer seeds the paired test needs)"
            ),
        ),
    ] = 0.0,
) -> SeedPlan:
    if (ratio is None) == (seeds is None):
        raise SpecError.query(
            "ratio",
            "give exactly one of ratio (to get the seeds per level) "
            "and seeds (to get the detectable ratio)",
        )
    if power <= alpha:
        raise SpecError.query(
            "power",
            f"power {power:g} must be above alpha {alpha:g}: a test "
            "of level alpha rejects that often when the variances "
            "are equal",
        )
    if correlation and not paired:
        raise SpecError.query(
            "correlation",
            f"correlation {correlation:g} needs paired=true: "
            "the values of independent seeds do not correlate",
        )
    return seed_plan(
        ratio=ratio, seeds=seeds, alpha=alpha, power=power, paired=paired, correlation=correlation
    )
