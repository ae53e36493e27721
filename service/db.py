"""SQLModel tables, the engine and sessions. The only module that defines what is stored."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, Index, UniqueConstraint, event
from sqlalchemy.engine import Engine, make_url
from sqlmodel import Field, SQLModel, create_engine


def utcnow() -> datetime:
    return datetime.now(UTC)


class Experiment(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str
    trainer: str
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    metric: str
    status: str = Field(default="queued", index=True)
    priority: int = 0
    n_conditions: int
    n_runs: int
    cancel_requested: bool = False
    created_at: datetime = Field(default_factory=utcnow, index=True)
    finished_at: datetime | None = None


class Run(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("experiment_id", "condition_key", "seed", name="uq_run_condition_seed"),
        Index("ix_run_queue", "status", "priority", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    experiment_id: int = Field(foreign_key="experiment.id", index=True)
    condition_key: str
    condition: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    seed: int
    # The full trainer config of this run (base config + condition, defaults filled in).
    config: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    trainer: str
    status: str = "queued"
    priority: int = 0
    attempts: int = 0
    max_retries: int = 2
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    cancel_requested: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    diagnostics: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False)
    )
    warnings: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False)
    )
    provenance: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False)
    )
    error: str | None = None
    node_id: str | None = None
    worker_id: str | None = None
    worker_pid: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class RunAttempt(SQLModel, table=True):
    """One try of a run on a worker: where it ran and how it ended."""

    __table_args__ = (UniqueConstraint("run_id", "attempt", name="uq_attempt"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id", index=True)
    attempt: int
    node_id: str | None = None
    worker_pid: int | None = None
    outcome: str | None = None  # completed, failed, diverged, cancelled, lost, interrupted
    error: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class MetricPoint(SQLModel, table=True):
    __table_args__ = (Index("ix_metric_run_name_step", "run_id", "name", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    step: int
    epoch: int | None = None
    name: str
    value: float | None = None


def make_engine(database_url: str) -> Engine:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        engine = create_engine(
            database_url, connect_args={"check_same_thread": False, "timeout": 30}
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(database_url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def create_tables(engine: Engine) -> None:
    SQLModel.metadata.create_all(engine)
