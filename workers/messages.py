"""The messages a run's Ray task streams to the dispatcher: `Started` when seeds of the task
begin training (all of them at once for a task of one and for a batched trainer's task; each
in turn for a trainer that runs its seeds one after another), `MetricBatch`es while the trainer
runs, one `Result` per seed. A seed's `Started` comes before its points and its `Result`.
`workers.run_task` streams the messages ready together as one `Bundle`.
`Started`, `MetricBatch` and `Result` name their seed by its index in the task's seeds (0 in a
task of one). Both sides
import this module: it is the whole contract between them. A pre-flight task
(workers.preflight) returns one `PreflightReport` to the service."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from api_schemas import RunStatus, storable_json

# One logged value: (step, epoch or None, metric name, value or None for a non-finite one).
Point = tuple[int, int | None, str, float | None]


@dataclass(frozen=True, slots=True)
class Started:
    """The worker began training these seeds of its task: where they run."""

    pid: int
    node_id: str | None
    worker_id: str | None
    hostname: str
    # the seeds' places in the task's seeds; None: every seed of the task
    indices: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class MetricBatch:
    """Points the trainer logged since the previous batch."""

    points: list[Point]
    index: int = 0  # the seed's place in the task's seeds


@dataclass(frozen=True, slots=True)
class Result:
    """How the run ended: completed, stopped (a check the spec asked to stop on fired: the
    diagnostics' "stop" says which, at which epoch), diverged (metrics are the last finite
    point's) or failed (the trainer raised; `error` says what in one line, `traceback` where:
    api_schemas.tracebacks)."""

    status: RunStatus
    metrics: dict[str, Any]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    index: int = 0  # the seed's place in the task's seeds
    traceback: str | None = None

    def storable(self) -> Result:
        """This result with every string storable (no NUL, no lone surrogate): whatever a
        trainer put in it, its own text must not make it unstorable."""
        return replace(
            self,
            metrics=storable_json(self.metrics, max_length=None),
            diagnostics=storable_json(self.diagnostics, max_length=None),
            warnings=storable_json(self.warnings, max_length=None),
            provenance=storable_json(self.provenance, max_length=None),
            error=storable_json(self.error, max_length=None),
            traceback=storable_json(self.traceback, max_length=None),
        )


WorkerMessage = Started | MetricBatch | Result


@dataclass(frozen=True, slots=True)
class Bundle:
    """Messages a task had ready together (a seed's last points and its Result, say), streamed
    as one object: each streamed object costs the task and the dispatcher a Ray object and a
    read, more than the messages of a small run themselves (benchmarks/dispatch.py). In the
    order they were made."""

    messages: tuple[WorkerMessage, ...]


# What `workers.run_task` streams.
StreamedMessage = WorkerMessage | Bundle


def unbundled(message: StreamedMessage) -> tuple[WorkerMessage, ...]:
    """The messages one streamed object carries, in order."""
    return message.messages if isinstance(message, Bundle) else (message,)


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """What a pre-flight task found on its node: for each config it was given, in order, the
    (config field, message) of every problem that would fail its runs there."""

    node_id: str | None
    hostname: str
    problems: list[list[tuple[str, str]]]
