"""What the runs store (service.scheduling.run_store) takes and gives about runs and their
attempts: plain records, no database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api_schemas import RunStatus


@dataclass(frozen=True)
class QueuedRun:
    """A queued run the store may claim: what deciding its task needs."""

    id: int
    experiment_id: int
    trainer: str
    condition: dict[str, Any]
    seed: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class ClaimedRun:
    """A queued run the store just made `pending`, with what its task needs."""

    id: int
    experiment_id: int
    attempt: int
    trainer: str
    condition: dict[str, Any]
    seed: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class AttemptKey:
    """Which attempt of which run an operation is about: a message from an older attempt (a
    run lost and re-queued meanwhile) must change nothing."""

    run_id: int
    experiment_id: int
    attempt: int


@dataclass(frozen=True)
class StartedAttempt:
    """A worker reported starting an attempt, and where."""

    key: AttemptKey
    node_id: str | None
    worker_id: str | None
    pid: int | None


@dataclass(frozen=True)
class FinishedAttempt:
    """An attempt's result: how the run ended and what it reported."""

    key: AttemptKey
    status: RunStatus
    metrics: dict[str, Any]
    diagnostics: dict[str, Any]
    warnings: list[dict[str, Any]]
    provenance: dict[str, Any]
    error: str | None
    traceback: str | None = None  # a failed run's (api_schemas.tracebacks)
