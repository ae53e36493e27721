"""Models of seeds in rounds: an adaptive spec, the record of its looks, and seeds added by hand
(docs/architecture.md "Statistics").

An adaptive experiment runs `min_seeds` seeds per condition, then looks at one named comparison
and adds `step` seeds per condition until that comparison's interval excludes its null value
(1 for a variance ratio, 0 for a mean difference) or `max_seeds` is reached. The stopping rule
is a Bonferroni split of alpha over the planned looks: each look uses a two-sided interval at
confidence 1 - alpha / K, K = 1 + ceil((max_seeds - min_seeds) / step). By the union bound the
chance that any look excludes the null value when it holds is at most alpha, provided each
look's interval keeps its level on the data: the variance look inverts the primary
randomisation test (service.analysis.resampling), which does on heavy-tailed and failed-seed
metrics,
where the F interval does not (service.scheduling.adaptive).

Its seeds are the rule's: seeds added by hand would be a look the rule did not count, so an
adaptive experiment refuses them (409), stopped or not.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from api_schemas.base import ResponseModel

# Kept equal to api_schemas' bounds (importing them here would be a cycle).
_MAX_KEY_LENGTH = 100
_MAX_LEVEL_LENGTH = 200
_STORABLE_TEXT = r"^[^\x00]*$"
# The validation context of a spec read back from the database (ExperimentSpec.stored).
STORED = {"stored": True}


def is_stored(info: ValidationInfo) -> bool:
    """Whether a validator runs on a stored spec (its admission checks then pass)."""
    return isinstance(info.context, dict) and bool(info.context.get("stored"))


# Rounds of one adaptive experiment; bounds the planned looks (and the work of each).
MAX_SEEDS_PER_CONDITION = 1000
# The smallest alpha / K a look may use. Its interval is at confidence 1 - alpha / K: below
# about 1e-16 that rounds to 1.0 in floating point (alpha = 5e-324 even makes alpha / K zero),
# and far above that no randomisation test has enough re-assignments to reach it anyway.
MIN_ALPHA_PER_LOOK = 1e-9
_Level = (
    bool
    | int
    | float
    | Annotated[str, Field(max_length=_MAX_LEVEL_LENGTH, pattern=_STORABLE_TEXT)]
    | None
)


def planned_looks(min_seeds: int, step: int, max_seeds: int) -> int:
    """K: the looks of a rule from min_seeds to max_seeds seeds per condition in steps of
    `step` (max_seeds >= min_seeds)."""
    return 1 + math.ceil((max_seeds - min_seeds) / step)


class NamedComparison(BaseModel):
    """One comparison of the experiment's statistics: two levels of a grid factor, pooled over
    the other factors (`within` null) or within one combination of their levels."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    factor: str = Field(..., min_length=1, max_length=_MAX_KEY_LENGTH, pattern=_STORABLE_TEXT)
    a: _Level
    b: _Level
    within: dict[Annotated[str, Field(max_length=_MAX_KEY_LENGTH)], _Level] | None = None


class AdaptiveSpec(BaseModel):
    """Seeds in rounds until `comparison`'s interval excludes its null value."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "comparison": {"factor": "stop_gradient", "a": False, "b": True},
                    "target": "var_ratio",
                    "min_seeds": 4,
                    "step": 2,
                    "max_seeds": 12,
                    "alpha": 0.05,
                }
            ]
        },
    )

    comparison: NamedComparison
    # var_ratio: the interval of var_a / var_b that inverts the primary variance test (a
    # sign-flip test on the seeds both levels ran, else a permutation test within cells, of
    # squared deviations from each cell's median; no normality assumed) must exclude 1;
    # mean_diff: the paired t interval of mean_a - mean_b (per-seed differences, when both
    # levels ran the same seeds), else Welch's, must exclude 0.
    target: Literal["var_ratio", "mean_diff"] = "var_ratio"
    min_seeds: int = Field(4, ge=2, le=MAX_SEEDS_PER_CONDITION)
    step: int = Field(2, ge=1, le=MAX_SEEDS_PER_CONDITION)
    max_seeds: int = Field(12, ge=2, le=MAX_SEEDS_PER_CONDITION)
    alpha: float = Field(0.05, gt=0, lt=0.5)

    @field_validator("alpha")
    @classmethod
    def _alpha_per_look(cls, alpha: float, info: ValidationInfo) -> float:
        """alpha / K must be a level a look can use (the rounds' fields come before alpha)."""
        min_seeds, step, max_seeds = (info.data.get(f) for f in ("min_seeds", "step", "max_seeds"))
        if (
            not (
                isinstance(min_seeds, int) and isinstance(step, int) and isinstance(max_seeds, int)
            )
            or max_seeds < min_seeds
        ):
            return alpha  # refused on its own field, or by _rounds
        looks = planned_looks(min_seeds, step, max_seeds)
        if alpha / looks < MIN_ALPHA_PER_LOOK and not is_stored(info):
            raise ValueError(
                f"alpha {alpha:g} over the {looks} planned looks is "
                f"{alpha / looks:.3g} per look, below {MIN_ALPHA_PER_LOOK:g}: no "
                "look could use it (its confidence 1 - alpha/K would round to 1)"
            )
        return alpha

    @model_validator(mode="after")
    def _rounds(self) -> AdaptiveSpec:
        if self.max_seeds < self.min_seeds:
            raise ValueError(f"max_seeds ({self.max_seeds}) is below min_seeds ({self.min_seeds})")
        return self

    @property
    def planned_looks(self) -> int:
        return planned_looks(self.min_seeds, self.step, self.max_seeds)

    @property
    def alpha_per_look(self) -> float:
        return self.alpha / self.planned_looks

    @property
    def null_value(self) -> float:
        """What the interval must exclude: no difference."""
        return 1.0 if self.target == "var_ratio" else 0.0

    def seeds_at_look(self, look: int) -> int:
        """Seeds per condition at look 1, 2, ... (the last is max_seeds)."""
        return min(self.max_seeds, self.min_seeds + (look - 1) * self.step)


class AdaptiveLook(ResponseModel):
    look: int
    seeds_per_condition: int
    n_a: int
    n_b: int
    # var_a / var_b (within-cell variances) or mean_a - mean_b; null when undefined (fewer
    # than 2 values, a zero variance), and then the look cannot stop the experiment.
    estimate: float | None
    # At `confidence`; an end the test cannot bound is null (var_ratio: [0, null] when too
    # few re-assignments exist to exclude any ratio at that confidence).
    interval: list[float | None] | None
    confidence: float
    excludes_null: bool
    # The interval's test: the primary variance test's name (paired sign-flip or stratified
    # permutation, service.analysis.resampling), "paired t" or "Welch t"; null with no interval.
    test: str | None = None
    # Why the interval is null or cannot exclude anything, or why seeds that could pair did
    # not.
    note: str | None = None


class AdaptiveState(ResponseModel):
    """An adaptive experiment's record: its rule, every look, and why it stopped."""

    rule: str
    planned_looks: int
    alpha_per_look: float
    looks: list[AdaptiveLook] = []
    # Null while the experiment goes on.
    stop_reason: str | None = None
    significant: bool | None = None
    # The round the last look asked for ([first seed, last seed + 1) per condition) while it
    # waits for room in the queue (SEEDGRID_MAX_QUEUED_RUNS), and why it waits; null once it
    # is queued.
    next_round: list[int] | None = None
    waiting: str | None = None
    # Set when the rule stopped because a look failed (the error); its runs are kept.
    error: str | None = None

    @classmethod
    def start(cls, rule: AdaptiveSpec) -> AdaptiveState:
        named = rule.comparison
        where = (
            f"within {named.within}"
            if named.within is not None
            else "pooled over the other factors"
        )
        interval = (
            "interval inverting the primary variance test"
            if rule.target == "var_ratio"
            else "paired t (else Welch) interval"
        )
        return cls(
            rule=(
                f"{rule.target} of {named.factor} {named.a!r} vs {named.b!r} ({where}): "
                f"seeds {rule.min_seeds} to {rule.max_seeds} per condition in steps of "
                f"{rule.step}; stop when the {interval} excludes {rule.null_value:g}, each of "
                f"the {rule.planned_looks} planned looks at confidence 1 - {rule.alpha:g}/"
                f"{rule.planned_looks} (Bonferroni)"
            ),
            planned_looks=rule.planned_looks,
            alpha_per_look=rule.alpha_per_look,
        )


class AddSeeds(BaseModel):
    """POST /experiments/{id}/seeds: more seeds for every condition of an experiment. An int n
    adds the n seeds after the highest one it has; a list names them (none it has already)."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"seeds": 3}]}
    )

    seeds: int | list[Annotated[int, Field(ge=0, le=2**31 - 1)]]

    @model_validator(mode="after")
    def _sizes(self) -> AddSeeds:
        if isinstance(self.seeds, int):
            if not 1 <= self.seeds <= MAX_SEEDS_PER_CONDITION:
                raise ValueError(f"seeds must be between 1 and {MAX_SEEDS_PER_CONDITION}")
        elif not 1 <= len(self.seeds) <= MAX_SEEDS_PER_CONDITION:
            raise ValueError(f"seeds must list between 1 and {MAX_SEEDS_PER_CONDITION} seeds")
        elif len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must not repeat a seed")
        return self


class SeedsAdded(ResponseModel):
    experiment_id: int
    seeds: list[int]
    runs_added: int
    n_runs: int
