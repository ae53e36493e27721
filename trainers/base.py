"""The trainer interface shared by every trainer and by the worker that runs them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pydantic


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
        return {
            "checks": list(self.checks),
            "epoch": self.epoch,
            "step": self.step,
            "reason": self.reason,
        }


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
