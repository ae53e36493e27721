"""Pydantic models of seedgrid's REST contract (v1, see DESIGN.md).

This package imports nothing of seedgrid's: the service, the workers, the command line and
any client can share it.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "Comparison",
    "ConditionStats",
    "ExperimentCounts",
    "ExperimentCreated",
    "ExperimentDetail",
    "ExperimentSpec",
    "ExperimentStatus",
    "ExperimentSummary",
    "Health",
    "MetricPoint",
    "Omnibus",
    "Resources",
    "RunDetail",
    "RunOut",
    "RunStatus",
    "RunStop",
    "Stats",
    "TrainerInfo",
    "json_problems",
    "level_key",
    "storable_json",
    "storable_text",
    "text_problem",
]

GridValue = bool | int | float | str | None

# Bounds on a spec, so that a hostile one is a 422 naming the field rather than a load.
MAX_GRID_AXES = 32
MAX_GRID_LEVELS = 1000  # per axis; SEEDGRID_MAX_RUNS_PER_EXPERIMENT bounds the product
MAX_KEY_LENGTH = 100  # a grid axis (config field) or metric name
MAX_LEVEL_LENGTH = 200  # a string grid level
MAX_SEEDS = 1_000_000
MAX_SEED = 2**31 - 1  # seeds are stored in a 32-bit integer column

MAX_TEXT_LENGTH = 1000  # any other string in a spec, at any depth of `config`
MAX_STORED_TEXT_LENGTH = 10_000  # error messages and other text a worker sends back

# No NUL (PostgreSQL text refuses it); a pattern also makes pydantic refuse lone surrogates,
# which Python's JSON parser lets through and no database can encode.
STORABLE_TEXT = r"^[^\x00]*$"
GridKey = Annotated[str, Field(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)]
GridLevel = (bool | int | float
             | Annotated[str, Field(max_length=MAX_LEVEL_LENGTH, pattern=STORABLE_TEXT)] | None)


class RunStatus(StrEnum):
    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    diverged = "diverged"
    cancelled = "cancelled"
    # Ended early, as its spec's stop_on_checks asked, by a trainer check that fired: its
    # verdict, diagnostics and last metrics are stored; see RunOut.stop.
    stopped = "stopped"


class ExperimentStatus(StrEnum):
    queued = "queued"
    running = "running"
    # every run completed or was stopped by a check its spec asked to stop on (both are the
    # outcomes the spec asked for; failed, diverged and cancelled runs are not)
    completed = "completed"
    partial = "partial"  # every run ended, some failed, diverged or were cancelled
    cancelled = "cancelled"


class Resources(BaseModel):
    """Ray resources one run asks for; fractions share a device between runs."""

    model_config = ConfigDict(extra="forbid")

    # Above 0: a task asking for no CPU is not counted against Ray's CPU limit at all.
    num_cpus: float = Field(1.0, gt=0, le=1024)
    num_gpus: float = Field(0.0, ge=0, le=64)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_problem(text: str, max_length: int = MAX_TEXT_LENGTH) -> str | None:
    """Why `text` cannot be stored as it is (None when it can): the one rule for every string
    of a spec. PostgreSQL's text refuses NUL; no database encodes a lone surrogate, which
    Python's JSON parser lets through."""
    if len(text) > max_length:
        return f"is {len(text)} characters long, more than {max_length}"
    if "\x00" in text:
        return "contains NUL (U+0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate (U+{ord(text[exc.start]):04X})"
    return None


def storable_text(text: str, max_length: int | None = MAX_STORED_TEXT_LENGTH) -> str:
    """`text` made storable: NUL and lone surrogates become U+FFFD, and it is cut to
    `max_length` characters (None: not cut). For text a worker or a database sends back."""
    text = _UNSTORABLE.sub("\ufffd", text)
    if max_length is None or len(text) <= max_length:
        return text
    return text[: max_length - 1] + "\u2026"


def storable_json(value: Any, max_length: int | None = MAX_STORED_TEXT_LENGTH) -> Any:
    """A JSON value with every string (keys included) made storable, at any depth; strings are
    cut to `max_length` unless it is None."""
    if isinstance(value, str):
        return storable_text(value, max_length)
    if isinstance(value, dict):
        return {storable_text(str(k), max_length): storable_json(v, max_length)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(v, max_length) for v in value]
    return value


def json_problems(value: Any, path: str) -> list[str]:
    """Every string (keys included) and number at any depth of a JSON value that cannot be
    stored, as `path: why`."""
    problems: list[str] = []
    pending: list[tuple[str, Any]] = [(path, value)]
    while pending:  # iterative: the nesting may be as deep as the JSON parser allows
        where, item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            problems.append(f"{where} is {item}: numbers must be finite")
        elif isinstance(item, str):
            problem = text_problem(item)
            if problem:
                problems.append(f"{where} {problem}")
        elif isinstance(item, dict):
            for key, child in item.items():
                problem = text_problem(key, MAX_KEY_LENGTH)
                if problem:
                    problems.append(f"a key of {where} {problem}")
                    key = storable_text(key, 40)
                pending.append((f"{where}.{key}", child))
        elif isinstance(item, list):
            pending += [(f"{where}[{i}]", v) for i, v in enumerate(item)]
    return sorted(problems)


class ExperimentSpec(BaseModel):
    """What a user submits: a trainer, a base config, a grid of conditions and seeds."""

    # No Infinity or NaN (Python's JSON parser accepts them; a JSON column does not).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"examples": [{
        "name": "collapse-sg", "trainer": "collapse", "config": {"n_samples": 64, "steps": 50},
        "grid": {"stop_gradient": [False, True]}, "seeds": 2, "metric": "min_l2",
    }]})

    name: str = Field(..., min_length=1, max_length=200, pattern=STORABLE_TEXT)
    trainer: str = Field(..., min_length=1, max_length=64, pattern=STORABLE_TEXT)
    # Base values for the trainer's config model; omitted fields take the trainer's defaults.
    config: dict[str, Any] = Field(default_factory=dict)
    # Config field -> levels; the cartesian product of the levels gives the conditions.
    grid: dict[GridKey, Annotated[list[GridLevel], Field(max_length=MAX_GRID_LEVELS)]] = Field(
        default_factory=dict, max_length=MAX_GRID_AXES
    )
    # n means seeds 0..n-1; a list gives the seeds explicitly.
    seeds: int | list[int] = 3
    # Primary final metric for statistics; None takes the trainer's primary metric.
    metric: str | None = Field(None, max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)
    resources: Resources = Field(default_factory=Resources)
    max_retries: int = Field(2, ge=0, le=20)
    # Higher runs first.
    priority: int = Field(0, ge=-1000, le=1000)
    # Checks of the trainer (GET /trainers: stop_checks) on which a run ends early: at the end
    # of the first epoch at which one of them fires, the run stops with status `stopped`, its
    # verdict and last metrics stored, and frees its worker. Empty: runs train to the end.
    stop_on_checks: list[Annotated[str, Field(max_length=MAX_KEY_LENGTH,
                                              pattern=STORABLE_TEXT)]] = Field(
        default_factory=list, max_length=MAX_GRID_AXES)

    @field_validator("config")
    @classmethod
    def _storable_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        problems = json_problems(config, "config")
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                               if len(problems) > 5 else "")
            raise ValueError(shown)
        return config

    @field_validator("grid")
    @classmethod
    def _grid_levels(cls, grid: dict[str, list[GridValue]]) -> dict[str, list[GridValue]]:
        for field, levels in grid.items():
            if len(levels) == 0:
                raise ValueError(f"grid field {field!r} has an empty list of levels")
            if len({level_key(v) for v in levels}) != len(levels):
                raise ValueError(f"grid field {field!r} repeats a level: {levels}")
        return grid

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: int | list[int]) -> int | list[int]:
        if isinstance(seeds, int):
            if seeds < 1:
                raise ValueError("seeds must be at least 1")
            if seeds > MAX_SEEDS:
                raise ValueError(f"seeds must be at most {MAX_SEEDS}")
        else:
            if len(seeds) == 0:
                raise ValueError("seeds must list at least one seed")
            if len(seeds) > MAX_SEEDS:
                raise ValueError(f"seeds must list at most {MAX_SEEDS} seeds")
            if any(s > MAX_SEED for s in seeds):
                raise ValueError(f"seeds must be at most {MAX_SEED}")
            if len(set(seeds)) != len(seeds):
                raise ValueError("seeds must not repeat a seed")
            if any(s < 0 for s in seeds):
                raise ValueError("seeds must be non-negative")
        return seeds

    @field_validator("stop_on_checks")
    @classmethod
    def _distinct_checks(cls, checks: list[str]) -> list[str]:
        repeated = sorted({c for c in checks if checks.count(c) > 1})
        if repeated:
            raise ValueError(f"stop_on_checks repeats {', '.join(map(repr, repeated))}")
        return checks

    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


def level_key(value: GridValue) -> str:
    """A grid level as a key that tells apart levels Python finds equal (True == 1 == 1.0):
    grid levels of different JSON types are different levels."""
    return f"{type(value).__name__}:{value!r}"


class ExperimentCreated(BaseModel):
    id: int
    name: str
    status: ExperimentStatus
    n_conditions: int
    n_runs: int
    created_at: datetime


class ExperimentCounts(BaseModel):
    queued: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    diverged: int = 0
    cancelled: int = 0
    stopped: int = 0


class ExperimentSummary(BaseModel):
    id: int
    name: str
    trainer: str
    status: ExperimentStatus
    counts: ExperimentCounts
    n_runs: int
    created_at: datetime
    finished_at: datetime | None


class ExperimentDetail(ExperimentSummary):
    spec: ExperimentSpec
    n_conditions: int


class RunStop(BaseModel):
    """Why a `stopped` run ended early: the checks (among its spec's stop_on_checks) that
    fired at the epoch it stopped at."""

    checks: list[str]
    # The epoch whose end the run stopped at (0: the audit of the initialisation), and the
    # optimisation steps it had taken.
    epoch: int | None
    step: int
    reason: str


class RunOut(BaseModel):
    id: int
    experiment_id: int
    condition: dict[str, GridValue]
    condition_key: str
    seed: int
    status: RunStatus
    attempts: int
    metrics: dict[str, Any]
    diagnostics: dict[str, Any]
    warnings: list[dict[str, Any]]
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    # Set when the status is `stopped`: the check that ended the run, the epoch, the reason.
    stop: RunStop | None = None


class RunDetail(RunOut):
    config: dict[str, Any]
    # seedgrid and torch versions, device, Ray node, worker pid, run time.
    provenance: dict[str, Any]
    attempt_history: list[dict[str, Any]]


class MetricPoint(BaseModel):
    step: int
    epoch: int | None
    name: str
    value: float | None


class ConditionStats(BaseModel):
    condition: dict[str, GridValue]
    condition_key: str
    n: int
    mean: float | None
    std: float | None
    var: float | None
    min: float | None
    median: float | None
    max: float | None
    ci95: list[float | None] | None
    values: list[float]


class Comparison(BaseModel):
    factor: str
    a: GridValue
    b: GridValue
    # None: pooled over every other factor; else the levels of the other factors held fixed.
    within: dict[str, GridValue] | None
    n_a: int
    n_b: int
    var_a: float | None
    var_b: float | None
    var_ratio: float | None
    # The ratio's 95% interval by bootstrap (percentile method); null at small n when a
    # resample has zero variance, with the reason in var_ratio_ci95_null_reason.
    var_ratio_ci95: list[float | None] | None
    var_ratio_ci95_null_reason: str | None = None
    # The ratio's exact 95% interval under normality, from the F distribution: finite whenever
    # both variances are positive.
    var_ratio_ci95_f: list[float | None] | None = None
    f_test_p: float | None
    brown_forsythe_p: float | None
    permutation_p: float | None
    mean_diff: float | None
    # Welch's 95% interval of mean_a - mean_b.
    mean_diff_ci95: list[float | None] | None = None
    welch_p: float | None
    # Power (two-sided F-test, alpha 0.05, power 0.8): the smallest var_a / var_b > 1 these
    # n_a, n_b seeds detect, and the seeds per level that would detect the observed ratio
    # (null when it is 1 or would need more than 100,000).
    detectable_ratio: float | None = None
    seeds_needed: int | None = None
    # Pooled comparisons only: the within-cell pooled variance sum (n_k - 1) s_k^2 / sum (n_k - 1)
    # over the cells of the other factors, and its ratio (the var_ratio above is the plain
    # variance of all runs of a level); null within a cell or with no other factor.
    within_cell_var_a: float | None = None
    within_cell_var_b: float | None = None
    within_cell_var_ratio: float | None = None


class Omnibus(BaseModel):
    """One test over every level of a factor with more than two levels (pooled over the other
    factors): do the levels' variances differ at all? Brown-Forsythe, scipy.stats.levene with
    center="median"; null with fewer than two values in some level or none varying."""

    factor: str
    levels: list[GridValue]
    n: list[int]
    brown_forsythe_p: float | None


class Stats(BaseModel):
    metric: str
    # The completed runs these statistics come from; they are recomputed (and stored again)
    # only when another run of the experiment completes.
    n_completed: int = 0
    computed_at: datetime | None = None
    conditions: list[ConditionStats]
    # One page of the comparisons: those of `factor` (None: of every factor, in grid order),
    # from `offset`; `next_offset` asks for the next page (None: this is the last one).
    factor: str | None = None
    total_comparisons: int = 0
    offset: int = 0
    next_offset: int | None = None
    comparisons: list[Comparison]
    # Per factor with more than two levels (those of `factor` when one is asked for).
    omnibus: list[Omnibus] = []


class SeedPlan(BaseModel):
    """GET /planning/seeds: how many seeds a variance comparison needs, before submission.
    Given a ratio, the seeds per level that detect it; given seeds per level, the smallest
    ratio they detect (and its inverse, 1 / ratio, equally)."""

    method: str
    alpha: float
    power: float
    ratio: float | None
    seeds_per_level: int | None
    # Why seeds_per_level or ratio is null (say a ratio too close to 1 for any study).
    note: str | None = None


class TrainerInfo(BaseModel):
    name: str
    description: str
    paper: str
    config_schema: dict[str, Any]
    metrics: list[str]
    diagnostics: list[str]
    primary_metric: str
    # The cross-run reports the trainer declares, each at /experiments/{id}/reports/{name}.
    reports: list[str]
    # The checks a spec can name in stop_on_checks (none: the trainer cannot stop on a check).
    stop_checks: list[str] = []


class Health(BaseModel):
    status: str
    database: str
    ray: str
    cluster_resources: dict[str, float]
    version: str
    # This process's dispatcher: active (holds the dispatch lock), standby (waits for it),
    # stopped, or absent (an API started with --no-dispatch).
    dispatcher: str
