"""The trainer interface shared by every trainer and by the worker that runs them."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import pydantic

from trainers.reports import CrossRunReport


@runtime_checkable
class Reporter(Protocol):
    """Where a trainer sends its metric curves while it runs."""

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None: ...

    def should_stop(self) -> bool:
        """True once the run was cancelled or diverged: the trainer returns what it has."""
        ...


class NullReporter:
    """Keeps nothing; for running a trainer outside seedgrid."""

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None:
        return None

    def should_stop(self) -> bool:
        return False


class MemoryReporter:
    """Keeps every logged point in memory; for notebooks and tests."""

    def __init__(self) -> None:
        self.points: list[tuple[int, int | None, str, float]] = []

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None:
        self.points.extend((step, epoch, name, float(v)) for name, v in metrics.items())

    def should_stop(self) -> bool:
        return False

    def curve(self, name: str) -> list[tuple[int, float]]:
        return [(s, v) for s, _, n, v in self.points if n == name]


def binomial_noise_floor(accuracy: Any, n_test: Any) -> Any:
    """p (1 - p) / n: the variance of an accuracy measured on n test examples that comes from
    the test set alone (each example a Bernoulli trial). The one formula for a trainer's own
    noise-floor metric and for /stats' per-condition noise floor (floats or numpy arrays)."""
    return accuracy * (1 - accuracy) / n_test


@dataclass
class RunWarning:
    """A diagnostic that crossed its threshold."""

    diagnostic: str
    value: float
    threshold: float
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "diagnostic": self.diagnostic,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
        }


@dataclass(frozen=True)
class ResourceEstimate:
    """What one run of a config needs, estimated from the config alone before it is queued."""

    # Peak memory of one run in bytes (host or device): parameters, gradients, optimiser
    # state, activations kept for backward, the dataset and other per-run tensors.
    memory_bytes: int
    # The config fields that drive memory_bytes, most important first (named in a refusal).
    memory_fields: tuple[str, ...]
    # Metric points the run logs: one per metric name per logged step, all epochs/steps.
    # An upper bound where the count depends on the run (early stop, convergence).
    logged_points: int
    points_fields: tuple[str, ...]


@dataclass(frozen=True)
class PreflightProblem:
    """Something that would make every run of a config fail before it trains (its dataset's
    files missing, a device the machine lacks), found without loading or training anything:
    the config field it comes from, and what is missing where."""

    field: str
    message: str


@dataclass(frozen=True)
class CheckStop:
    """A run ended early because checks it was asked to stop on fired (RunContext.checks_fired)."""

    checks: tuple[str, ...]  # the fired checks among those asked for, in the trainer's order
    epoch: int | None  # the epoch at whose end it stopped (None: the trainer has no epochs)
    step: int  # optimisation steps taken
    reason: str  # what fired, with its value and threshold

    def as_dict(self) -> dict[str, Any]:
        return {"checks": list(self.checks), "epoch": self.epoch, "step": self.step,
                "reason": self.reason}


@dataclass
class RunResult:
    """What a trainer returns: final metrics, diagnostics summary, warnings and provenance."""

    metrics: dict[str, float]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[RunWarning] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    # False when the trainer stopped early because the reporter asked it to.
    finished: bool = True
    # True when the trainer's divergence metric turned non-finite: `metrics` are then the last
    # finite point's, and `diverged_at_step` the step of the first non-finite one (None when
    # only the final value was non-finite).
    diverged: bool = False
    diverged_at_step: int | None = None
    # Set when the run stopped early on a check its spec asked to stop on (never together with
    # `diverged`): its metrics and diagnostics are those of the epoch it stopped at, and the
    # diagnostics carry the stop under "stop".
    stop: CheckStop | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "metrics": {k: finite_or_none(v) for k, v in self.metrics.items()},
            # JSON has no inf/nan (PostgreSQL's json type refuses them): they are stored as null
            "diagnostics": json_finite(self.diagnostics),
            "warnings": [json_finite(w.as_dict()) for w in self.warnings],
            "provenance": self.provenance,
            "finished": self.finished,
        }


class Trainer(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    paper: ClassVar[str]
    Config: ClassVar[type[pydantic.BaseModel]]
    metrics: ClassVar[tuple[str, ...]]
    diagnostics: ClassVar[tuple[str, ...]]
    primary_metric: ClassVar[str]
    # Reports over the runs of a whole experiment, served at /experiments/{id}/reports/{name}.
    reports: ClassVar[tuple[CrossRunReport[Any], ...]]

    # A logged or final value of this metric that is not finite ends the run as diverged
    # (None: the trainer has no such metric).
    divergence_metric: ClassVar[str | None]
    # Metrics with a known range (low, high), say (0, 1) for an accuracy.
    metric_bounds: ClassVar[dict[str, tuple[float, float]]]

    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]:
        """{accuracy-like metric: test examples it averages} for one run, from its stored
        diagnostics (the binomial noise floor of /stats)."""
        ...
    # The checks a run can be asked to stop on (an experiment spec's stop_on_checks).
    stop_checks: ClassVar[tuple[str, ...]]
    # Seed-batched tasks: the seeds one task runs when a spec's resources.seeds_per_task is
    # left out, the most it may ask for, and whether the seeds run as one batched computation
    # (else one after another in the task's process).
    seeds_per_task_default: ClassVar[int]
    max_seeds_per_task: ClassVar[int]
    batched: ClassVar[bool]

    def run(self, config: Any, seed: int, reporter: Reporter, *,
            threads: int | None = None, source_seeds: dict[str, int] | None = None,
            stop_on_checks: Collection[str] = ()) -> RunResult:
        """One run of `config` with `seed`: metric curves go to `reporter`, which can stop it;
        `threads` sets torch's thread count (the run's CPUs); `source_seeds` pins random
        sources to other seeds; the run ends early when one of
        `stop_on_checks` (a subset of `stop_checks`) fires. trainers.runtime.TrainerBase
        implements it for every trainer."""
        ...

    def run_seeds(self, config: Any, seeds: Sequence[int], reporters: Sequence[Reporter], *,
                  threads: int | None = None,
                  source_seeds: Sequence[dict[str, int] | None] | None = None,
                  stop_on_checks: Collection[str] = (),
                  on_done: Callable[[int, RunResult | Exception], None] | None = None,
                  on_start: Callable[[int], None] | None = None,
                  ) -> list[RunResult | Exception]:
        """K seeds of `config` in one task, one reporter each: a result (or the exception that
        ended that seed alone) per seed, in order; `on_start` hears of each seed's index as it
        begins training, `on_done` as it ends."""
        ...

    def estimate(self, config: Any) -> ResourceEstimate:
        """Peak memory and logged points of one run, by arithmetic on the config alone (no
        model, no data, no allocation): cheap enough to call for every grid condition."""
        ...

    def resolve_config(self, config: Any) -> Any:
        """`config` with every field whose default is null set to the value a run of it uses
        (collapse's `steps`: 4000 or 20000): the config `run` and `run_seeds` train with, and
        the one the service shows as the run's. trainers.runtime.TrainerBase implements it
        from the config's `resolved_fields`."""
        ...

    def preflight_inputs(self, config: Any) -> dict[str, Any]:
        """The config values `preflight` reads where a machine could refuse them (a device, a
        dataset's files): configs with equal inputs are checked once, and a config with none
        needs no check on the cluster."""
        ...

    def preflight(self, config: Any) -> list[PreflightProblem]:
        """What would make every run of `config` on this machine fail before it trains: cheap
        looks (does the file exist, is there a GPU), nothing loaded, trained or unpickled. The
        service runs it on a node of the cluster before it queues an experiment's runs."""
        ...


class TrainerConfig(pydantic.BaseModel):
    """Base of every trainer config: unknown fields and coercions (say "1" for 1) are errors."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)

    def resolved_fields(self) -> dict[str, Any]:
        """The fields whose default is null, each with the value a run of this config uses,
        worked out from the other fields by the same accessors the training code reads (one
        home for each default). None here; a config with such fields extends it. A field whose
        null is itself the value (`train_size`: the whole split) is not one of them."""
        return {}


def finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_finite(value: Any) -> Any:
    """`value` with every non-finite float, at any depth, replaced by None."""
    if isinstance(value, dict):
        return {k: json_finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_finite(v) for v in value]
    return finite_or_none(value)
