"""Pydantic models of seedgrid's REST contract (v1, see docs/api.md).

This package imports nothing of seedgrid's: the service, the workers, the command line and
any client can share it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from typing_extensions import TypeAliasType

from api_schemas.adaptive import (
    STORED,
    AdaptiveLook,
    AdaptiveSpec,
    AdaptiveState,
    AddSeeds,
    NamedComparison,
    SeedsAdded,
    is_stored,
)
from api_schemas.base import ResponseModel
from api_schemas.imports import (
    IMPORTED_TRAINER,
    ExperimentImport,
    ImportedResults,
    ImportedRun,
    ImportSource,
)
from api_schemas.labels import ExperimentLabels, Note, Tags

__all__ = [
    "STORED",
    "AdaptiveLook",
    "AnalysisSpec",
    "AdaptiveSpec",
    "AdaptiveState",
    "AddSeeds",
    "AttemptOut",
    "AttemptOutcome",
    "Comparison",
    "ConditionParams",
    "ConditionStats",
    "DatabaseState",
    "DiagnosticWarning",
    "DispatcherState",
    "ErrorDetail",
    "ExperimentComparison",
    "ExperimentCounts",
    "ExperimentCreated",
    "ExperimentDetail",
    "ExperimentImport",
    "ExperimentImported",
    "ExperimentLabels",
    "ExperimentSpec",
    "ExperimentStatus",
    "ExperimentSummary",
    "ExportFormat",
    "ExportWhat",
    "Health",
    "HealthStatus",
    "IMPORTED_TRAINER",
    "ImportSource",
    "ImportedResults",
    "ImportedRun",
    "JsonObject",
    "JsonValue",
    "ConfigDifference",
    "MetricPoint",
    "NamedComparison",
    "MultiplicityFamily",
    "Omnibus",
    "ParamsTable",
    "RayState",
    "RANDOM_SOURCES",
    "Resources",
    "RunCurves",
    "RunDetail",
    "RunOut",
    "RunStatus",
    "RunValue",
    "SeedsAdded",
    "ServingDispatcher",
    "SideBySide",
    "SOURCE_FACTOR",
    "SOURCE_LEVELS",
    "SourceDecomposition",
    "SourceVariance",
    "RunStop",
    "Stats",
    "TrainerInfo",
    "first_line",
    "json_problems",
    "level_key",
    "storable_json",
    "storable_text",
    "text_problem",
]

GridValue = bool | int | float | str | None

JsonScalar = str | int | float | bool | None
# A JSON object at any depth (a run's diagnostics, provenance, config). Named, so that its
# schema refers to itself: an OpenAPI generator types every nested object as one model. Arrays
# are typed two deep and hold any JSON below that: a generator cannot type an array that
# contains itself (openapi-python-client refuses a recursive union, and `list[Any]` in a union
# makes its code fail mypy --strict).
JsonObject = TypeAliasType("JsonObject", "dict[str, JsonValue]")
JsonValue = (
    JsonObject | list[JsonObject | list[JsonObject | JsonScalar | Any] | JsonScalar] | JsonScalar
)

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
GridLevel = (
    bool
    | int
    | float
    | Annotated[str, Field(max_length=MAX_LEVEL_LENGTH, pattern=STORABLE_TEXT)]
    | None
)

# The named random sources a run's seed drives (docs/architecture.md); the trainers'
# generators (trainers.random_sources) are made for exactly these.
RANDOM_SOURCES = ("init", "data", "augment", "evaluate")
RandomSource = Literal["init", "data", "augment", "evaluate"]
PinnedSeed = Annotated[int, Field(strict=True, ge=0, le=MAX_SEED)]
# The reserved grid factor of a source decomposition (`decompose_sources`) and its levels:
# which source varies with the seed while the others are pinned; `all` varies every source,
# `none` pins every source (what remains is hardware nondeterminism).
SOURCE_FACTOR = "varying_source"
SOURCE_LEVELS = ("init", "data", "augment", "all", "none")


class RunStatus(StrEnum):
    queued = "queued"
    # Handed to Ray, waiting for a worker: its attempt is claimed (and charged), but no worker
    # has started it yet (Ray queues tasks beyond the cluster's free CPUs and GPUs).
    pending = "pending"
    running = "running"  # a worker reported starting it
    completed = "completed"
    failed = "failed"
    diverged = "diverged"
    cancelled = "cancelled"
    # Ended early, as its spec's stop_on_checks asked, by a trainer check that fired: its
    # verdict, diagnostics and last metrics are stored; see RunOut.stop.
    stopped = "stopped"

    @classmethod
    def ended(cls) -> frozenset[RunStatus]:
        """The statuses a run never leaves once it is in one of them."""
        return _RUN_ENDED

    @classmethod
    def active(cls) -> frozenset[RunStatus]:
        """A run not ended yet: waiting in the queue, handed to Ray, started by a worker."""
        return _RUN_ACTIVE

    @property
    def is_ended(self) -> bool:
        return self in _RUN_ENDED

    @classmethod
    def succeeded(cls) -> frozenset[RunStatus]:
        """The ends a spec asks for: completed, or stopped by a check it named (both carry the
        run's result)."""
        return _RUN_SUCCEEDED

    @classmethod
    def went_wrong(cls) -> tuple[RunStatus, ...]:
        """The ends that say the training went wrong, in the enum's order: failed, diverged (a
        cancel was asked for; a stop is a result)."""
        return _RUN_WENT_WRONG

    @classmethod
    def moves(cls) -> Mapping[RunStatus, frozenset[RunStatus]]:
        """The runs store's state machine (service.scheduling.run_store): per status, the
        statuses a run in it may move to. A queued run is claimed (pending), fails (no node can
        hold it) or is cancelled; a pending or running one starts (pending only), ends with
        its result, is cancelled, fails, or goes back to the queue (lost and retried, or its
        dispatcher stopped); an ended run moves no more."""
        return _RUN_MOVES

    def may_move_to(self, new: RunStatus) -> bool:
        return new in _RUN_MOVES[self]


class AttemptOutcome(StrEnum):
    """How one attempt of a run ended."""

    completed = "completed"
    failed = "failed"
    diverged = "diverged"
    cancelled = "cancelled"
    stopped = "stopped"  # a check the spec asked to stop on fired: the run's result is stored
    lost = "lost"  # its worker or node died: charged to the run's max_retries
    interrupted = "interrupted"  # its dispatcher stopped first: not charged


class ExperimentStatus(StrEnum):
    queued = "queued"
    running = "running"
    # every run completed or was stopped by a check its spec asked to stop on (both are the
    # outcomes the spec asked for; failed, diverged and cancelled runs are not)
    completed = "completed"
    partial = "partial"  # every run ended, some failed, diverged or were cancelled
    # every run ended and none completed or was stopped by a check: nothing to compare (a
    # missing dataset, a device the cluster lacks); the runs' errors say why
    failed = "failed"
    # cancel asked for while runs of it still train (the dispatcher is stopping them): still
    # active; `cancelled` once none is pending or running (it said so while one still ran)
    cancelling = "cancelling"
    cancelled = "cancelled"

    @classmethod
    def ended(cls) -> frozenset[ExperimentStatus]:
        """The statuses of an experiment none of whose runs is queued, pending or running."""
        return _EXPERIMENT_ENDED

    @classmethod
    def active(cls) -> frozenset[ExperimentStatus]:
        return _EXPERIMENT_ACTIVE

    @property
    def is_ended(self) -> bool:
        return self in _EXPERIMENT_ENDED


_RUN_ACTIVE = frozenset({RunStatus.queued, RunStatus.pending, RunStatus.running})
_RUN_ENDED = frozenset(RunStatus) - _RUN_ACTIVE
_RUN_SUCCEEDED = frozenset({RunStatus.completed, RunStatus.stopped})
_RUN_WENT_WRONG = (RunStatus.failed, RunStatus.diverged)
# What a worker's result can end a run as: every end but a cancel.
_RUN_RESULTS = _RUN_ENDED - {RunStatus.cancelled}
_RUN_MOVES: Mapping[RunStatus, frozenset[RunStatus]] = MappingProxyType(
    {
        RunStatus.queued: frozenset({RunStatus.pending, RunStatus.failed, RunStatus.cancelled}),
        RunStatus.pending: _RUN_RESULTS
        | {RunStatus.running, RunStatus.cancelled, RunStatus.queued},
        RunStatus.running: _RUN_RESULTS | {RunStatus.cancelled, RunStatus.queued},
        **{status: frozenset() for status in _RUN_ENDED},
    }
)
_EXPERIMENT_ACTIVE = frozenset(
    {ExperimentStatus.queued, ExperimentStatus.running, ExperimentStatus.cancelling}
)
_EXPERIMENT_ENDED = frozenset(ExperimentStatus) - _EXPERIMENT_ACTIVE


class ExportFormat(StrEnum):
    """The file format of GET /experiments/{id}/export."""

    csv = "csv"
    parquet = "parquet"


class ExportWhat(StrEnum):
    """What GET /experiments/{id}/export writes: a row per run (condition, seed, status, final
    metrics), or the metric curves as a long table (a row per logged point)."""

    runs = "runs"
    curves = "curves"


# Ray counts resources in units of 1/10,000 and refuses a non-zero quantity below one unit
# (ray._common.ray_option_utils): refused at submission, not after the runs were claimed.
RAY_RESOURCE_UNIT = 0.0001
# The fewest CPUs one task may ask for: Ray places up to 1 / num_cpus tasks on one CPU, each
# with a torch thread of its own, so a node is oversubscribed at most this factor's inverse
# (4 tasks per CPU). 0.0001 was accepted: 8 such runs made another experiment's run 23x slower.
MIN_NUM_CPUS = 0.25


class Resources(BaseModel):
    """Ray resources one run asks for; fractions share a device between runs."""

    # strict: "1" or true is not a number of CPUs (no silent coercion of a spec's values)
    model_config = ConfigDict(extra="forbid", strict=True)

    # At least MIN_NUM_CPUS (checked below, not for stored specs): a task asking for no CPU
    # is not counted against Ray's CPU limit at all, one asking for a sliver shares a CPU
    # with thousands.
    num_cpus: float = Field(
        1.0,
        gt=0,
        le=1024,
        description=(
            "CPUs of one task (a run, or the seeds of a seed-batched task); the trainer's torch "
            f"thread count. At least {MIN_NUM_CPUS:g}: at most {1 / MIN_NUM_CPUS:g} tasks share "
            "one CPU"
        ),
    )
    num_gpus: float = Field(
        0.0,
        ge=0,
        le=64,
        description=(
            "GPUs of one task; a fraction shares a device between tasks (they then time-slice "
            "it: seeds_per_task is the faster way to fill a GPU)"
        ),
    )
    seeds_per_task: int | None = Field(
        None,
        ge=1,
        le=64,
        description=(
            "Seeds of one condition that one task runs together (a seed-batched task): as one "
            "batched computation for a trainer that batches seeds, else one after another with "
            "the data loaded once. Each seed stays its own run (status, attempts, curves, result) "
            "and its result does not depend on which seeds shared its task. None: the trainer's "
            "default (GET /trainers); at most the trainer's max_seeds_per_task"
        ),
    )

    @field_validator("num_cpus", "num_gpus")
    @classmethod
    def _ray_quantity(cls, value: float, info: ValidationInfo) -> float:
        if is_stored(info):
            return value  # as an older version accepted it
        if 0 < value < RAY_RESOURCE_UNIT:
            raise ValueError(
                f"{value:g} is below Ray's smallest resource unit, "
                f"{RAY_RESOURCE_UNIT:g}: Ray would refuse the task"
            )
        if info.field_name == "num_cpus" and value < MIN_NUM_CPUS:
            raise ValueError(
                f"{value:g} CPUs is below the floor of {MIN_NUM_CPUS:g}: Ray would place "
                f"{1 / value:,.0f} such tasks on one CPU, slowing every run there; at most "
                f"{1 / MIN_NUM_CPUS:g} tasks share a CPU"
            )
        return value


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


def first_line(text: str | None) -> str:
    """The first line of a stored error (a traceback's first line names the exception)."""
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "(no error message)"


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
        return {
            storable_text(str(k), max_length): storable_json(v, max_length)
            for k, v in value.items()
        }
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


def key_pattern_as_property_names(schema: dict[str, Any]) -> None:
    """A dict's JSON schema with its key pattern under propertyNames and its value schema under
    additionalProperties. pydantic writes a dict whose keys have a pattern as patternProperties,
    which says nothing of the keys that do not match it and which OpenAPI generators ignore (a
    generated client then types the values as Any)."""
    ((pattern, values),) = schema.pop("patternProperties").items()
    schema["additionalProperties"] = values
    schema["propertyNames"] = {**schema.get("propertyNames", {}), "pattern": pattern}


class AnalysisSpec(BaseModel):
    """How /stats reads the experiment by default (a query can override the scale)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    # raw: variances of the values; log: of their logarithms (spreads relative to the mean,
    # about the squared coefficient of variation), for positive metrics whose levels' means
    # differ by orders of magnitude.
    scale: Literal["raw", "log"] = Field(
        "raw",
        description=(
            "raw: compare variances of the metric; log: of its logarithm (relative spreads, for "
            "positive metrics whose means differ by orders of magnitude)"
        ),
    )
    # The variance ratio worth detecting: each comparison says how many seeds per level the
    # primary test needs to detect it (power 0.8 at alpha 0.05).
    target_ratio: float = Field(
        2.0,
        gt=1,
        le=1e6,
        description=(
            "The variance ratio worth detecting; each comparison reports the seeds per level the "
            "primary test needs for it"
        ),
    )


class ExperimentSpec(BaseModel):
    """What a user submits: a trainer, a base config, a grid of conditions and seeds."""

    # No Infinity or NaN (Python's JSON parser accepts them; a JSON column does not). Strict:
    # no value is coerced (`seeds: true` or `2.0` is an error, not 1 or 2 seeds).
    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "name": "collapse-sg",
                    "trainer": "collapse",
                    "config": {"n_samples": 64, "steps": 50},
                    "grid": {"stop_gradient": [False, True]},
                    "seeds": 2,
                    "metric": "min_l2",
                }
            ]
        },
    )

    name: str = Field(..., min_length=1, max_length=200, pattern=STORABLE_TEXT)
    trainer: str = Field(..., min_length=1, max_length=64, pattern=STORABLE_TEXT)
    # Base values for the trainer's config model; omitted fields take the trainer's defaults.
    config: dict[str, Any] = Field(default_factory=dict)
    # Config field -> levels; the cartesian product of the levels gives the conditions.
    grid: dict[GridKey, Annotated[list[GridLevel], Field(max_length=MAX_GRID_LEVELS)]] = Field(
        default_factory=dict,
        max_length=MAX_GRID_AXES,
        json_schema_extra=key_pattern_as_property_names,
    )
    # n means seeds 0..n-1; a list gives the seeds explicitly.
    seeds: int | list[int] = 3
    # Primary final metric for statistics; None takes the trainer's primary metric.
    metric: str | None = Field(None, max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)
    resources: Resources = Field(default_factory=Resources)
    max_retries: int = Field(2, ge=0, le=20)
    # When this many runs of the experiment have ended and every one of them failed (none
    # completed, stopped, diverged or was cancelled), its queued runs are cancelled and it ends
    # `failed` with a message: a spec that cannot run does not fail its whole grid. 0: never.
    stop_after_failures: int = Field(
        3,
        ge=0,
        le=MAX_SEEDS,
        description=(
            "Stop the experiment once its first this many ended runs all failed (its queued runs "
            "are cancelled, those not yet started too); 0: never"
        ),
    )
    # Higher runs first.
    priority: int = Field(0, ge=-1000, le=1000)
    # Seeds in rounds until a named comparison is settled (api_schemas.adaptive); the first
    # round is adaptive.min_seeds seeds, so `seeds` is left out.
    adaptive: AdaptiveSpec | None = None
    # Random source -> the seed it takes in every run, whatever the run's seed ({"data": 0}:
    # every run sees the data order of seed 0; the other sources still follow the run's seed).
    seed_sources: dict[RandomSource, PinnedSeed] = Field(default_factory=dict)
    # Run every condition once per level of the reserved factor `varying_source` (init, data,
    # augment: only that source follows the seed; all; none), the pinned sources taking the
    # first seed, and serve each source's variance in /stats (`source_decomposition`).
    decompose_sources: bool = False
    # Checks of the trainer (GET /trainers: stop_checks) on which a run ends early: at the end
    # of the first epoch at which one of them fires, the run stops with status `stopped`, its
    # verdict and last metrics stored, and frees its worker. Empty: runs train to the end.
    stop_on_checks: list[
        Annotated[str, Field(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)]
    ] = Field(default_factory=list, max_length=MAX_GRID_AXES)
    # How /stats reads the results: the scale and the ratio worth detecting.
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    # What the researcher writes on it to find it again (api_schemas.labels); PATCH
    # /experiments/{id} changes them later.
    tags: Tags = Field(default_factory=list, description="short labels to filter by")
    note: Note = Field(None, description="free text")
    # Set by POST /experiments/import only (trainer `imported`): the imported metrics.
    imported: ImportedResults | None = Field(
        None, description="imported results' metrics (set by POST /experiments/import only)"
    )

    @field_validator("config")
    @classmethod
    def _storable_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        problems = json_problems(config, "config")
        if problems:
            shown = "; ".join(problems[:5]) + (
                f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
            )
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

    @model_validator(mode="after")
    def _adaptive_seeds(self) -> ExperimentSpec:
        """An adaptive spec's first round is adaptive.min_seeds seeds: `seeds` is that number
        (as stored and served), and any other value is refused."""
        if self.adaptive is None:
            return self
        first = self.adaptive.min_seeds
        if "seeds" in self.model_fields_set and self.seeds != first:
            raise ValueError(
                f"seeds: an adaptive spec's first round is adaptive.min_seeds "
                f"({first}) seeds per condition, seeds 0 to {first - 1}; leave "
                f"seeds out (or set it to {first})"
            )
        self.seeds = first
        return self

    @field_validator("stop_on_checks")
    @classmethod
    def _distinct_checks(cls, checks: list[str]) -> list[str]:
        repeated = sorted({c for c in checks if checks.count(c) > 1})
        if repeated:
            raise ValueError(f"stop_on_checks repeats {', '.join(map(repr, repeated))}")
        return checks

    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    @classmethod
    def stored(cls, spec: Any) -> ExperimentSpec:
        """A spec as stored by an earlier submission: the checks that only admit new work
        (Ray's resource unit, alpha per look) are not applied again, so that an experiment
        accepted by an older version stays readable."""
        return cls.model_validate(spec, context=STORED)


def level_key(value: GridValue) -> str:
    """A grid level as a key that tells apart levels Python finds equal (True == 1 == 1.0):
    grid levels of different JSON types are different levels."""
    return f"{type(value).__name__}:{value!r}"


class ExperimentCreated(ResponseModel):
    id: int
    name: str
    status: ExperimentStatus
    n_conditions: int
    n_runs: int
    created_at: datetime
    # What the seeds per condition cannot let the primary test say, whatever the runs give (a
    # comparison within one cell at 3 seeds cannot reach p <= 0.05), with the seeds that
    # would: the experiment is queued all the same.
    seed_warnings: list[str] = []


class ExperimentImported(ResponseModel):
    """The experiment an import created or grew (POST /experiments/import)."""

    id: int
    name: str
    trainer: str
    status: ExperimentStatus
    n_conditions: int
    n_runs: int
    runs_added: int
    # the seeds of the runs added, each once, ascending
    seeds: list[int]
    source: ImportSource
    factors: list[str]
    metrics: list[str]
    metric: str
    # Columns read as neither seed, factor nor metric (W&B's and MLflow's bookkeeping: Name,
    # State, run_id, start_time, tags.*, summary._runtime ...).
    ignored_columns: list[str]


class ExperimentCounts(ResponseModel):
    queued: int = 0
    pending: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    diverged: int = 0
    cancelled: int = 0
    stopped: int = 0

    @property
    def active(self) -> int:
        """The runs not ended: queued, pending or running."""
        return self.queued + self.pending + self.running

    @property
    def ended(self) -> int:
        """The runs ended, however (RunStatus.ended())."""
        return sum(getattr(self, status.value) for status in RunStatus.ended())

    @property
    def succeeded(self) -> int:
        """The runs that ended as their spec asked (RunStatus.succeeded())."""
        return sum(getattr(self, status.value) for status in RunStatus.succeeded())

    @property
    def went_wrong(self) -> int:
        """The runs that failed or diverged (RunStatus.went_wrong())."""
        return sum(getattr(self, status.value) for status in RunStatus.went_wrong())


class ExperimentSummary(ResponseModel):
    id: int
    name: str
    trainer: str
    status: ExperimentStatus
    counts: ExperimentCounts
    n_runs: int
    created_at: datetime
    finished_at: datetime | None
    tags: list[str]
    note: str | None


class ExperimentDetail(ExperimentSummary):
    spec: ExperimentSpec
    n_conditions: int
    # An adaptive experiment's looks and why it stopped (null for a plain experiment).
    adaptive: AdaptiveState | None = None
    # Why the experiment ended before all its runs had run (its first runs all failed: spec's
    # stop_after_failures), with the error; null otherwise.
    message: str | None = None
    # Where a queued experiment (none of its runs started) waits: 1 = the next to start, among
    # the queued experiments in the dispatcher's claim order (priority, then oldest run); null
    # when the experiment is not queued.
    queue_position: int | None = None
    # Set while its queued runs wait because no dispatcher has loaded its trainer: says so and
    # what to start (a dispatcher with --trainers FILE).
    waiting_for: str | None = None
    # The metric names that have points (curves), read from one started run per condition
    # (a completed one where there is one), sorted; empty before any run logged a point.
    curve_metrics: list[str] = []
    # As in ExperimentCreated: what its seeds per condition cannot let the test say.
    seed_warnings: list[str] = []


class RunStop(ResponseModel):
    """Why a `stopped` run ended early: the checks (among its spec's stop_on_checks) that
    fired at the epoch it stopped at."""

    checks: list[str]
    # The epoch whose end the run stopped at (0: the audit of the initialisation), and the
    # optimisation steps it had taken.
    epoch: int | None
    step: int
    reason: str


class DiagnosticWarning(ResponseModel):
    """A diagnostic of a run that crossed its threshold (the trainer's RunWarning)."""

    diagnostic: str
    # null when the diagnostic was not finite (JSON has no Infinity)
    value: float | None
    threshold: float | None
    message: str


class RunOut(ResponseModel):
    id: int
    experiment_id: int
    condition: dict[str, GridValue]
    condition_key: str
    seed: int
    status: RunStatus
    attempts: int
    # The final metrics: null for one that was not finite (JSON has no NaN or Infinity) or not
    # a number.
    metrics: dict[str, float | None]
    # The trainer's summary of the run (GET /trainers lists each trainer's), as nested JSON.
    diagnostics: dict[str, JsonValue]
    warnings: list[DiagnosticWarning]
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    # Set when the status is `stopped`: the check that ended the run, the epoch, the reason.
    stop: RunStop | None = None


class AttemptOut(ResponseModel):
    """One try of a run on a worker: where it ran and how it ended (null while it runs)."""

    attempt: int
    node_id: str | None
    worker_pid: int | None
    outcome: AttemptOutcome | None
    error: str | None
    # The full traceback of an attempt that failed because the trainer raised, else null.
    traceback: str | None = None
    started_at: datetime
    finished_at: datetime | None


class RunDetail(RunOut):
    # When the trainer raised: the full traceback (Python's format, at most 20,000 characters,
    # its middle cut when longer) and its innermost frame of the trainer's own code
    # ("file:line, in function"); null otherwise.
    traceback: str | None = None
    failed_at: str | None = None
    config: dict[str, JsonValue]
    # seedgrid and torch versions, device, Ray node, worker pid, run time.
    provenance: dict[str, JsonValue]
    attempt_history: list[AttemptOut]


class MetricPoint(ResponseModel):
    step: int
    epoch: int | None
    name: str
    value: float | None


class RunCurves(ResponseModel):
    """One metric's curve of each of several runs of an experiment, in one answer."""

    name: str
    # run id (as text, a JSON key) -> its points as [step, value] in step order (then in the
    # order they were stored), at most CURVE_POINTS of them; value null: not finite
    curves: dict[str, list[tuple[int, float | None]]]
    # the runs whose curve was cut at CURVE_POINTS points
    truncated: list[int] = []


class RunValue(ResponseModel):
    """One run's value of the metric, with the run and seed it came from."""

    run_id: int
    seed: int
    value: float


class ConditionStats(ResponseModel):
    condition: dict[str, GridValue]
    condition_key: str
    n: int
    mean: float | None
    std: float | None
    var: float | None
    min: float | None
    median: float | None
    max: float | None
    # The 95% interval of the mean: Student's t, or for a bounded metric (Stats.metric_bounds)
    # the t interval on the logit scale of the mean (delta method), which never crosses a
    # bound; ci95_method names which.
    ci95: list[float | None] | None
    values: list[float]
    # The same values, in the same order, each with its run id and seed.
    runs: list[RunValue] = []
    ci95_method: str | None = None
    # Accuracy-like metrics whose trainer declares the test-set size n: the binomial noise
    # floor, the mean over the condition's runs of p_i (1 - p_i) / n_i, and the share of the
    # observed seed variance it accounts for (above 1: less seed variance than test-set noise);
    # null where the metric has no declared test set.
    noise_floor_var: float | None = None
    noise_floor_share: float | None = None
    # What in these numbers is computed from fewer seeds than it needs, each naming why.
    warnings: list[str] = []


class ConditionParams(ResponseModel):
    """One row of the params table: a condition's resolved config beside its summary of the
    metric, as GET /experiments/{id}/stats serves it."""

    condition: dict[str, GridValue]
    condition_key: str
    # every config field with the value its runs train with (the trainer's defaults filled in)
    config: dict[str, JsonValue]
    n: int
    mean: float | None
    std: float | None


class ParamsTable(ResponseModel):
    """GET /experiments/{id}/params: every condition's config side by side."""

    metric: str
    # every config field, those that vary across the conditions first
    fields: list[str]
    # the fields whose value differs between two conditions
    varying: list[str]
    conditions: list[ConditionParams]


class ConfigDifference(ResponseModel):
    """A config field two compared sides run with different values: two experiments' base
    configs (GET /compare), or the two levels of a comparison beside its factor (a confound:
    Comparison.confounds)."""

    field: str
    # Each side's value as JSON text (8, "cifar10", [64, 64], null): a config value may be any
    # JSON its trainer's config model takes; for a pooled comparison whose cells differ, each
    # side's distinct values joined by " | ".
    a: str
    b: str


class Comparison(ResponseModel):
    """Two levels of one factor compared, within one cell of the other factors or pooled over
    them (docs/api.md "Variance comparisons"). Every spread below is a within-cell spread:
    each value minus its cell's mean (or median, for the primary test), so differences between
    the cells' means never count as seed variance."""

    factor: str
    a: GridValue
    b: GridValue
    # None: pooled over every other factor; else the levels of the other factors held fixed.
    within: dict[str, GridValue] | None
    n_a: int
    n_b: int
    # Within-cell variances sum_k (n_k - 1) s_k^2 / sum_k (n_k - 1) over the cells of each
    # level (one cell within a cell: the sample variance), their degrees of freedom
    # sum_k (n_k - 1), and var_a / var_b.
    var_a: float | None
    var_b: float | None
    dof_a: int | None = None
    dof_b: int | None = None
    var_ratio: float | None
    # "raw", or "log": the values were log-transformed first (?scale=log), so the variances
    # are of log values, about the squared coefficients of variation.
    scale: str = "raw"
    # The primary test of var_a / var_b = 1, the one the CLI, the dashboard, the adaptive rule
    # and the planner use: a randomisation test that keeps its size on heavy-tailed, bounded and
    # failed-seed data (measured: docs/api.md). primary_test names it (paired sign-flip or
    # stratified permutation of squared deviations from the cell medians). primary_p is raw;
    # the _holm_ ones are adjusted over the families of Stats.multiplicity.
    primary_test: str | None = None
    primary_p: float | None = None
    primary_p_holm_factor: float | None = None
    primary_p_holm_all: float | None = None
    # The 95% interval of var_a / var_b that inverts the primary test (the ratios it does not
    # reject at 0.05); [0, null] when too few re-assignments exist to reject any ratio.
    primary_ci95: list[float | None] | None = None
    # Re-assignments behind primary_p (the observed one included) and whether they were all
    # enumerated (exact) or drawn at random.
    primary_resamples: int | None = None
    primary_exact: bool | None = None
    # "paired" when both levels ran the same seeds in every cell (seed s of a and of b draw the
    # same random streams, common random numbers): the variance test swaps values within a seed
    # and the mean test is a paired t-test. Else "unpaired", with pairing_note saying why.
    pairing: str = "unpaired"
    paired_seeds: int | None = None
    # Pearson correlation of the two levels' values seed by seed (within cells): how much the
    # shared seeds tie them.
    seed_correlation: float | None = None
    pairing_note: str | None = None
    # Secondary tests on the same within-cell residuals. The F-test assumes normal values (it
    # rejects 6-10 times too often on lognormal or failed-seed data); Brown-Forsythe (one-way
    # ANOVA of the absolute deviations from each cell's median) has little power below 5
    # seeds per level.
    f_test_p: float | None
    var_ratio_ci95_f: list[float | None] | None = None
    brown_forsythe_p: float | None
    # Pooled comparisons only: the variance of all runs of each level, cell means included, and
    # its ratio (descriptive: an interaction in the means inflates it; see warnings).
    marginal_var_a: float | None = None
    marginal_var_b: float | None = None
    marginal_var_ratio: float | None = None
    # mean_a - mean_b and its test: paired, the mean of each seed's difference (averaged over
    # the cells; seeds run in one level only left out, the same seeds as mean_diff_ci95) with
    # "paired t"; unpaired, over all runs of each level with "studentised permutation test
    # (Welch's t)" (Welch's statistic, its null from re-assignments of runs within strata).
    mean_diff: float | None
    mean_test: str | None = None
    mean_p: float | None = None
    mean_p_holm_factor: float | None = None
    mean_p_holm_all: float | None = None
    mean_diff_ci95: list[float | None] | None = None
    # Why mean_p is null when the seeds are paired: every seed's difference is the same.
    mean_p_null_reason: str | None = None
    # Welch's unpaired t-test, whatever the pairing; null with welch_p_null_reason when both
    # levels have zero variance.
    welch_p: float | None
    welch_p_null_reason: str | None = None
    # Power of the primary test (normal, uncorrelated seeds, alpha 0.05, power 0.8; paired
    # when the comparison is): the smallest var_a / var_b > 1 these seeds detect, and the
    # seeds per level that would detect target_ratio (the spec's analysis.target_ratio,
    # default 2). Not from the observed ratio: power computed from an observed effect says
    # nothing the p-value does not. Seeds that correlate need fewer (/planning/seeds).
    detectable_ratio: float | None = None
    target_ratio: float | None = None
    seeds_for_target_ratio: int | None = None
    # Holm-adjusted secondary p-values (as primary_p_holm_*).
    f_test_p_holm_factor: float | None = None
    f_test_p_holm_all: float | None = None
    brown_forsythe_p_holm_factor: float | None = None
    brown_forsythe_p_holm_all: float | None = None
    welch_p_holm_factor: float | None = None
    welch_p_holm_all: float | None = None
    # Config fields other than the compared factor whose resolved values (defaults filled in,
    # as the runs train) differ between the two levels where the other factors are held
    # equal: the comparison measures their change too (a confound). Empty: only the factor
    # differs.
    confounds: list[ConfigDifference] = []
    # Every interval or test here computed from fewer seeds than it needs, and every reading
    # the numbers invite that they do not support, each naming what and why.
    warnings: list[str] = []


class MultiplicityFamily(ResponseModel):
    """One family of comparisons whose p-values are Holm-adjusted together."""

    # The factor whose comparisons form the family; None: every comparison of the experiment.
    factor: str | None
    comparisons: int
    # Per adjusted p-value (primary_p, f_test_p, brown_forsythe_p, welch_p, mean_p): how many
    # of the family's comparisons have one, Holm's m.
    tested: dict[str, int]
    # Why the family's adjusted p-values are null (too many comparisons to adjust).
    null_reason: str | None = None


class Omnibus(ResponseModel):
    """One test over every level of a factor with more than two levels, on within-cell
    residuals (pooled over the other factors' cells): do the levels' variances differ at all?
    primary_p: a permutation test within the cells of the other factors of the spread of the
    levels' log mean squared deviations from their cell medians; brown_forsythe_p: the one-way
    ANOVA of the absolute deviations from each cell's median, level by level. Null with fewer
    than two values in some level or none varying."""

    factor: str
    levels: list[GridValue]
    n: list[int]
    primary_test: str | None = None
    primary_p: float | None = None
    brown_forsythe_p: float | None
    warnings: list[str] = []


class SourceVariance(ResponseModel):
    """The seed variance of one level of `varying_source` (a source, `all` or `none`) in one
    condition of the other factors."""

    source: str
    n: int
    var: float | None
    # 95% interval of the variance under normality: (n - 1) s^2 divided by the chi-square
    # quantiles 0.975 and 0.025 with n - 1 degrees of freedom; [0, 0] for a zero variance.
    var_ci95: list[float | None] | None


class SourceDecomposition(ResponseModel):
    """Where one condition's seed variance comes from (a spec with decompose_sources)."""

    # The levels of the other grid factors ({} when varying_source is the only factor).
    within: dict[str, GridValue]
    # One per level of varying_source: init, data, augment, all, none.
    sources: list[SourceVariance]
    # var(init) + var(data) + var(augment), and how far it is from var(all): the gap holds
    # interactions between the sources and the evaluate source's noise (pinned except in all).
    sum_var: float | None
    all_var: float | None
    sum_minus_all: float | None
    sum_over_all: float | None


class Stats(ResponseModel):
    metric: str
    # The completed runs these statistics come from; they are recomputed (and stored again)
    # only when another run of the experiment completes.
    n_completed: int = 0
    computed_at: datetime | None = None
    conditions: list[ConditionStats]
    # One page of the comparisons: those of `factor` (None: of every factor, in grid order),
    # from `offset`; `next_offset` asks for the next page (None: this is the last one).
    factor: str | None = None
    # True: the page holds only the pooled comparisons (?pooled=true), and total_comparisons
    # and the offsets count those; their Holm p-values are over the whole families still.
    pooled: bool = False
    total_comparisons: int = 0
    offset: int = 0
    next_offset: int | None = None
    comparisons: list[Comparison]
    # The metric's bounds as its trainer declares them (say [0, 1] for an accuracy); null:
    # unbounded. Condition intervals then stay within them.
    metric_bounds: list[float] | None = None
    # The families the *_holm_* p-values are adjusted over: one per factor, then all.
    multiplicity: list[MultiplicityFamily] = []
    # Per factor with more than two levels (those of `factor` when one is asked for).
    omnibus: list[Omnibus] = []
    # Experiments with decompose_sources: per condition of the other factors, each source's
    # variance with its interval; null for other experiments.
    source_decomposition: list[SourceDecomposition] | None = None
    # "raw", or "log" (the values' logarithms: spreads relative to the mean; ?scale=).
    scale: str = "raw"
    # An adaptive experiment still adding seeds: every p-value and interval here is an interim
    # look, not adjusted for the looks its rule takes (interim_note says so); the rule's own
    # decision is in the experiment's adaptive state.
    interim: bool = False
    interim_note: str | None = None


class SeedPlan(ResponseModel):
    """GET /planning/seeds: how many seeds a variance comparison needs, before submission, for
    the primary test (the one /stats reports) on normal seeds. Given a ratio, the seeds per
    level that detect it; given seeds per level, the smallest ratio they detect (and its
    inverse, 1 / ratio, equally)."""

    # The test planned for (paired sign-flip or stratified permutation) and how its power was
    # found.
    method: str
    alpha: float
    power: float
    # Whether the two levels share seeds (common random numbers), and the correlation assumed
    # between a seed's values in the two levels (null when unpaired).
    paired: bool
    correlation: float | None
    ratio: float | None
    seeds_per_level: int | None
    # Why seeds_per_level or ratio is null (say a ratio too close to 1 for any study).
    note: str | None = None
    # The same question answered by the F-test, which assumes normal seed-to-seed values and
    # pairs nothing: its seeds per level for `ratio` (given a ratio), or the ratio
    # `seeds_per_level` seeds detect (given seeds).
    f_test_ratio: float | None = None
    f_test_seeds_per_level: int | None = None


class TrainerInfo(ResponseModel):
    name: str
    description: str
    paper: str
    # The JSON schema of the trainer's config model.
    config_schema: dict[str, JsonValue]
    metrics: list[str]
    diagnostics: list[str]
    primary_metric: str
    # The cross-run reports the trainer declares, each at /experiments/{id}/reports/{name}.
    reports: list[str]
    # The checks a spec can name in stop_on_checks (none: the trainer cannot stop on a check).
    stop_checks: list[str] = []
    # Seed-batched tasks (resources.seeds_per_task): the default, the most a spec may ask for,
    # and whether the seeds of a task run as one batched computation (else one after another).
    seeds_per_task_default: int = 1
    max_seeds_per_task: int = 1
    batched: bool = False


class HealthStatus(StrEnum):
    ok = "ok"
    # the database did not answer, or the dispatcher stopped or its latest pass failed
    degraded = "degraded"


class DatabaseState(StrEnum):
    ok = "ok"
    error = "error"  # Health.database_error names the exception


class RayState(StrEnum):
    ok = "ok"
    not_connected = "not connected"  # this process has not joined Ray (an API without dispatcher)
    dispatcher_stopped = "dispatcher stopped"


class DispatcherState(StrEnum):
    active = "active"  # holds the dispatch locks of some of its trainers and dispatches
    standby = "standby"  # holds none: waits for the locks other dispatchers hold
    stopped = "stopped"
    absent = "absent"  # an API started with --no-dispatch


class ServingDispatcher(ResponseModel):
    """A dispatcher, in this process or another, and the trainers whose runs it dispatches."""

    # host:pid:nonce, as its log and its runs' provenance name it
    identity: str
    trainers: list[str]


class Health(ResponseModel):
    status: HealthStatus
    database: DatabaseState
    # The exception's class name when the database did not answer.
    database_error: str | None = None
    ray: RayState
    cluster_resources: dict[str, float]
    version: str
    # This process's dispatcher.
    dispatcher: DispatcherState
    # Its passes that failed since it started (the database or Ray did not answer; each is
    # retried a second later), and the error of the latest pass while it fails (status is then
    # degraded: no run is claimed or collected until a pass succeeds).
    dispatcher_step_errors: int = 0
    dispatcher_error: str | None = None
    # Every dispatcher of this database, in any process, with the trainers it dispatches (a
    # trainer's runs have at most one; those of the trainers this process has loaded or that
    # have runs queued or in flight are listed). Where the service has a token, this and the
    # next are shown only to a request that sends it (/healthz itself is open to probes).
    dispatchers: list[ServingDispatcher] = []
    # Queued runs per trainer that no dispatcher has loaded: they wait for one started with
    # the trainer's code (--trainers FILE). Both lists are empty when the runs table cannot be
    # read (the dispatcher's error then says why).
    queued_without_dispatcher: dict[str, int] = {}


class ErrorDetail(ResponseModel):
    """The body of every error but a 422: what went wrong, in one sentence."""

    detail: str


class SideBySide(ResponseModel):
    """One condition two experiments both ran (the same values of the fields either grids
    over in its resolved run config, whatever grid keys each gave it): each one's summary and
    the tests between them, as a Comparison whose factor is "experiment" and whose levels are
    the two ids."""

    # The condition as experiment a names it, and as b does (the same when both grid it alike).
    condition: dict[str, GridValue]
    condition_key: str
    condition_b: dict[str, GridValue] = {}
    condition_key_b: str = ""
    a: ConditionStats
    b: ConditionStats
    comparison: Comparison


class ExperimentComparison(ResponseModel):
    """GET /compare?a=&b=: the conditions two experiments of one trainer and metric share, side
    by side with the tests of /stats; the conditions only one of them ran are listed by key."""

    a: int
    b: int
    trainer: str
    metric: str
    # One page of the shared conditions (in the order a's runs completed them): from `offset`;
    # `next_offset` asks for the next page (None: this is the last one).
    total_conditions: int
    offset: int = 0
    next_offset: int | None = None
    conditions: list[SideBySide]
    # Condition keys that only one experiment has completed runs of.
    only_in_a: list[str]
    only_in_b: list[str]
    # The base-config fields neither experiment grids over whose values (defaults filled in)
    # differ between them.
    config_differences: list[ConfigDifference] = []
    # The scale the comparisons' variances and means are tested on: "raw" (the metric) or
    # "log" (its logarithm: relative spreads); by default the experiments' analysis.scale when
    # both specs name the same one, else raw. The conditions' own summaries stay raw.
    scale: str = "raw"
    # Why the scale is what it is, when the specs disagree (null otherwise).
    scale_note: str | None = None
