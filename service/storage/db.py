"""SQLModel tables, the engine, and the schema migrations that bring a database up to them.
The only module that defines what is stored."""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    JSON,
    Column,
    Index,
    Text,
    UniqueConstraint,
    event,
    false,
    inspect,
    pool,
    text,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.types import TypeDecorator
from sqlmodel import AutoString, Field, SQLModel, col, create_engine

from api_schemas import AttemptOutcome, ExperimentSpec, ExperimentStatus, RunStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


class StatusColumn(TypeDecorator[StrEnum]):
    """A status enum stored as its string value: the tables, the store and the API all see the
    enum, and the column stays the plain VARCHAR earlier versions wrote."""

    impl = AutoString
    cache_ok = True

    def __init__(self, enum: type[StrEnum]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: Any, dialect: Any) -> StrEnum | None:
        return None if value is None else self.enum(value)


def status_column(
    enum: type[StrEnum], *, default: StrEnum | None, index: bool = False, nullable: bool = False
) -> Any:
    return Field(
        default=default, sa_column=Column(StatusColumn(enum), index=index, nullable=nullable)
    )


def run_count_column() -> Any:
    # server default 0: the migration that added the columns gave existing rows a value
    return Field(default=0, sa_column_kwargs={"server_default": "0"})


# Ids are never reused: on SQLite a table's rowid is otherwise max(id) + 1, so deleting the newest
# experiment (or run) would hand its id to the next one, and every bookmark, export and cache
# keyed by the id would silently point at other data. PostgreSQL's sequences never go back.
NEVER_REUSE_IDS = {"sqlite_autoincrement": True}


class Experiment(SQLModel, table=True):
    __table_args__ = NEVER_REUSE_IDS

    id: int | None = Field(default=None, primary_key=True)
    name: str
    trainer: str
    # The spec as submitted (ExperimentSpec.model_dump); read it as `stored_spec`, not by key.
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    metric: str
    status: ExperimentStatus = status_column(
        ExperimentStatus, default=ExperimentStatus.queued, index=True
    )
    priority: int = 0
    n_conditions: int
    n_runs: int
    cancel_requested: bool = False
    created_at: datetime = Field(default_factory=utcnow, index=True)
    finished_at: datetime | None = None
    # Its runs per status, kept by the runs store with every change of a run's status, so that
    # the experiment's status and counts cost one row, not a count over all of its runs.
    runs_queued: int = run_count_column()
    runs_running: int = run_count_column()
    runs_completed: int = run_count_column()
    runs_failed: int = run_count_column()
    runs_diverged: int = run_count_column()
    runs_cancelled: int = run_count_column()
    runs_stopped: int = run_count_column()
    # An adaptive experiment's record (api_schemas.AdaptiveState: its looks, why it stopped);
    # null for a plain one. `deciding` holds while it has not stopped: with no run queued,
    # pending or running it is then `running` (its next look is due), not ended.
    adaptive: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    deciding: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    # Its runs handed to Ray that no worker has started; last, where migration 0007 added it.
    runs_pending: int = run_count_column()
    # Deleted: every read treats it as gone, while service.scheduling.purge removes its rows in
    # short
    # batches (a delete in one transaction held SQLite's write lock for as long as it took).
    deleted: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    # Why its first runs all failed and it stopped (service.scheduling.run_store's failure
    # stop), or null; migration 0009 added it, read before from its cancelled runs' errors.
    stop_message: str | None = None
    # The researcher's tags (a JSON list of api_schemas.labels tags) and note: set from the
    # spec at submission, changed by PATCH; migration 0011 added them.
    tags: list[str] = Field(
        default_factory=list,
        sa_column=Column(JSON, nullable=False, server_default=text("'[]'")),
    )
    note: str | None = None
    # What `GET /experiments?q=` searches: search_text(...) of the name, note, tags and
    # trainer, kept by the events below on every write through the ORM; migration 0012.
    search_text: str = Field(default="", sa_column_kwargs={"server_default": ""})
    # Its trainer's metrics, diagnostics and metric bounds as submission found them
    # (service.specs.StoredCatalogue), read when that trainer's code is not loaded; null for
    # imported results and for experiments stored before migration 0013.
    catalogue: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # The names of the metric curves its runs logged, sorted, kept as their points are stored
    # (run_moves.record_points); null for experiments stored before migration 0014, whose
    # names are read from their points (experiments.views.curve_metrics).
    curve_names: list[str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))

    @property
    def stored_spec(self) -> ExperimentSpec:
        """The spec as the model it was submitted as (ExperimentSpec.stored, built from the
        stored JSON): the one form every reader of a stored spec uses, fields typed and
        defaulted, never read by key."""
        return ExperimentSpec.stored(self.spec)


def search_text(name: str, note: str | None, tags: list[str], trainer: str) -> str:
    """An experiment's searchable text: its name, note, tag values and trainer, case-folded by
    Python (the same on every database; SQLite's lower() folds only ASCII), one per line, so
    that a search matches within one of them and never the tags' JSON punctuation."""
    return "\n".join([name, note or "", *tags, trainer]).casefold()


@event.listens_for(Experiment, "before_insert")
@event.listens_for(Experiment, "before_update")
def _keep_search_text(_mapper: Any, _connection: Any, experiment: Experiment) -> None:
    experiment.search_text = search_text(
        experiment.name, experiment.note, list(experiment.tags or []), experiment.trainer
    )


class Run(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("experiment_id", "condition_key", "seed", name="uq_run_condition_seed"),
        Index("ix_run_queue", "status", "priority", "id"),
        NEVER_REUSE_IDS,
    )

    id: int | None = Field(default=None, primary_key=True)
    experiment_id: int = Field(foreign_key="experiment.id", index=True)
    condition_key: str
    condition: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    seed: int
    # The run's config is the experiment's base config (stored once, in its spec) with this
    # condition: a run row does not repeat it.
    trainer: str
    status: RunStatus = status_column(RunStatus, default=RunStatus.queued)
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
    provenance: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    error: str | None = None
    node_id: str | None = None
    worker_id: str | None = None
    worker_pid: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # A failed run's full traceback (api_schemas.tracebacks), beside its one-line `error`
    # (last: migration 0010 added it).
    traceback: str | None = None


# The claim order (priority first, then oldest) read straight off an index, with no sort of
# every queued run.
Index("ix_run_claim", col(Run.status), col(Run.priority).desc(), col(Run.id))


class RunAttempt(SQLModel, table=True):
    """One try of a run on a worker: where it ran and how it ended."""

    __table_args__ = (UniqueConstraint("run_id", "attempt", name="uq_attempt"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id", index=True)
    attempt: int
    node_id: str | None = None
    worker_pid: int | None = None
    outcome: AttemptOutcome | None = status_column(AttemptOutcome, default=None, nullable=True)
    error: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    traceback: str | None = None  # migration 0010


class RunMetric(SQLModel, table=True):
    """One logged value of one run (the API's model of it is api_schemas.MetricPoint)."""

    __tablename__ = "metricpoint"
    __table_args__ = (
        Index("ix_metric_run_name_step", "run_id", "name", "step"),
        # a run's whole curve in step order, paged, without a sort
        Index("ix_metric_run_step", "run_id", "step", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    step: int
    epoch: int | None = None
    name: str
    value: float | None = None


class StatsCache(SQLModel, table=True):
    """The variance statistics served for one page of one metric of an experiment, as the JSON
    the API returns: computed once from the completed runs and recomputed only when their
    number changes, so that every API replica serves the same stored result."""

    __tablename__ = "statscache"
    __table_args__ = (UniqueConstraint("experiment_id", "metric", "page", name="uq_stats_page"),)

    id: int | None = Field(default=None, primary_key=True)
    experiment_id: int = Field(foreign_key="experiment.id", index=True)
    metric: str
    # which comparisons: "<factor or empty>|<offset>|<limit>"
    page: str
    n_completed: int
    payload: str = Field(sa_column=Column(Text, nullable=False))
    computed_at: datetime = Field(default_factory=utcnow)


class ComparisonResult(SQLModel, table=True):
    """One comparison's computed fields (service.analysis.variance.analyse's result, as JSON),
    keyed by the digest of its data within its experiment: a /stats computation after a
    restart, or on another replica, reads the comparisons whose cells did not change instead of
    computing them again, so one more completed run costs only its own comparisons
    (service.analysis.stats_store.StoredResults; pruned to the comparisons in use)."""

    __tablename__ = "comparisonresult"

    experiment_id: int = Field(foreign_key="experiment.id", primary_key=True)
    # "<results format>:<digest hex>"
    digest: str = Field(primary_key=True)
    payload: str = Field(sa_column=Column(Text, nullable=False))


class CompareCache(SQLModel, table=True):
    """One page of GET /compare of experiments a and b, as the JSON the API returns: stored
    like the statistics (StatsCache) and computed again only when the number of completed runs
    of either experiment changed."""

    __tablename__ = "comparecache"
    __table_args__ = (UniqueConstraint("a_id", "b_id", "metric", "page", name="uq_compare_page"),)

    id: int | None = Field(default=None, primary_key=True)
    a_id: int = Field(foreign_key="experiment.id")
    # (the unique constraint indexes a_id; b's index finds the pages to remove with b)
    b_id: int = Field(foreign_key="experiment.id", index=True)
    metric: str
    # which conditions: "<format>|<offset>|<limit>"
    page: str
    n_completed_a: int
    n_completed_b: int
    payload: str = Field(sa_column=Column(Text, nullable=False))
    computed_at: datetime = Field(default_factory=utcnow)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    _enable_wal(cursor)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _enable_wal(cursor: Any, wait_s: float = 60.0) -> None:
    """Switch to WAL, retrying while another process holds the lock: converting a new database
    takes an exclusive lock for which SQLite does not call its busy handler, so processes that
    start together on a new file (replicas, the migration at start-up) would otherwise fail
    with "database is locked"."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# How long a statement of the dispatcher waits for a SQLite lock another connection holds (its
# busy timeout) before it fails; the dispatcher retries what failed.
SQLITE_BUSY_TIMEOUT_S = 30


def make_engine(database_url: str, *, lock_wait_s: float | None = None) -> Engine:
    """The engine of `database_url`. `lock_wait_s` bounds how long a statement waits for a lock
    another connection holds, and for a free connection of the pool, before it fails with
    OperationalError (or the pool's TimeoutError): SQLite's busy timeout, PostgreSQL's
    lock_timeout. None: SQLITE_BUSY_TIMEOUT_S on SQLite, no limit on PostgreSQL (a
    dispatcher's writes wait their turn); the API sets a few seconds (service.api.app)."""
    url = make_url(database_url)
    bounded: dict[str, Any] = {} if lock_wait_s is None else {"pool_timeout": lock_wait_s}
    if url.get_backend_name() == "sqlite":
        busy_timeout_s = SQLITE_BUSY_TIMEOUT_S if lock_wait_s is None else lock_wait_s
        engine = create_engine(
            database_url,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_s},
            **bounded,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args: dict[str, Any] = {}
    if lock_wait_s is not None:
        connect_args = {
            "options": f"-c lock_timeout={math.ceil(lock_wait_s * 1000)}",
            "connect_timeout": CONNECT_TIMEOUT_S,
        }
    return create_engine(
        database_url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        connect_args=connect_args,
        **bounded,
    )


MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# The revision that reproduces the schema seedgrid 0.1.0 made with create_all.
INITIAL_REVISION = "0001"
INITIAL_TABLES = frozenset({"experiment", "run", "runattempt", "metricpoint"})
# Any fixed 64-bit number: the PostgreSQL advisory lock every seedgrid process takes to migrate.
MIGRATION_LOCK_KEY = 0x5EED_6121_D000_0001
# How long a process waits for another one's migration (SQLite busy timeout) or to connect.
MIGRATION_WAIT_S = 600
CONNECT_TIMEOUT_S = 10
# alembic.context and alembic.op are process-wide proxies: one migration at a time per process.
_alembic_lock = threading.Lock()


class DatabaseError(Exception):
    """The database cannot be reached or migrated; the message is one line naming the URL."""


def database_trouble(exc: BaseException) -> bool:
    """Whether a failed statement looks like the database's state (a dropped connection, a
    lock held too long) rather than the data's: retried, never blamed on one experiment."""
    return isinstance(exc, OperationalError | InterfaceError) or bool(
        getattr(exc, "connection_invalidated", False)
    )


@dataclass(frozen=True)
class SchemaUpgrade:
    before: str | None  # revision found; None for a database with no alembic_version table
    after: str
    stamped: bool  # the tables predate migrations and were stamped at INITIAL_REVISION


def masked_url(database_url: str) -> str:
    return make_url(database_url).render_as_string(hide_password=True)


def head_revision() -> str:
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


def upgrade_database(database_url: str) -> SchemaUpgrade:
    """Run every migration the database lacks (`alembic upgrade head`), holding a lock.

    One transaction does it all: PostgreSQL takes an advisory lock first, SQLite opens it with
    BEGIN IMMEDIATE (its database-wide write lock). A process starting alongside waits, then finds
    the schema at head. Both have transactional DDL, so a failed upgrade leaves nothing behind.
    Tables made by create_all before seedgrid had migrations are stamped at INITIAL_REVISION.
    Raises DatabaseError, whose message is one line naming the URL (password masked).
    """
    with _alembic_lock, _migration_connection(database_url, doing="migrate") as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        before = _current_revision(connection)
        stamped = before is None and _predates_migrations(connection, database_url)
        config = _alembic_config(connection)
        # (each check reads every row that refers to another: only when there is work)
        checked = connection.dialect.name == "sqlite" and before != head_revision()
        broken_before = _broken_references(connection) if checked else set()
        if stamped:
            command.stamp(config, INITIAL_REVISION)
        command.upgrade(config, "head")
        after = _current_revision(connection)
        if checked:
            _check_references(connection, database_url, broken_before)
    assert after is not None
    return SchemaUpgrade(before=before, after=after, stamped=stamped)


def database_revision(database_url: str) -> str | None:
    """The revision the database is at; None when it has no alembic_version table."""
    with _migration_connection(database_url, doing="read the revision of") as connection:
        return _current_revision(connection)


@contextmanager
def _migration_connection(database_url: str, *, doing: str) -> Iterator[Connection]:
    """A connection in one transaction, committed on success, on a throw-away engine whose
    SQLite transactions are real (BEGIN IMMEDIATE) rather than pysqlite's implicit ones."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        engine = create_engine(
            url, poolclass=pool.NullPool, connect_args={"timeout": MIGRATION_WAIT_S}
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "connect", _sqlite_manual_transactions)
        event.listen(engine, "connect", _sqlite_foreign_keys_off)
        event.listen(engine, "begin", _sqlite_begin_immediate)
    else:
        engine = create_engine(
            url, poolclass=pool.NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}
        )
    try:
        try:
            connection = engine.connect()
        except DBAPIError as exc:
            raise DatabaseError(
                f"cannot connect to the database {masked_url(database_url)}: {_reason(exc)}"
            ) from None
        try:
            with connection, connection.begin():
                yield connection
        except DBAPIError as exc:
            raise DatabaseError(
                f"cannot {doing} the database {masked_url(database_url)}: {_reason(exc)}"
            ) from None
    finally:
        engine.dispose()


def _sqlite_manual_transactions(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite would otherwise run DDL outside any transaction and BEGIN only before DML.
    dbapi_connection.isolation_level = None


def _sqlite_begin_immediate(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _sqlite_foreign_keys_off(dbapi_connection: Any, _record: Any) -> None:
    # SQLite's own procedure for a schema change (sqlite.org/lang_altertable.html): a table
    # rebuilt under a new name and renamed back cannot be dropped while foreign keys are
    # enforced and other tables' rows refer to it; they are checked once before the commit.
    dbapi_connection.execute("PRAGMA foreign_keys=OFF")


def _broken_references(connection: Connection) -> set[tuple[Any, ...]]:
    return {tuple(row) for row in connection.exec_driver_sql("PRAGMA foreign_key_check")}


def _check_references(
    connection: Connection, database_url: str, before: set[tuple[Any, ...]]
) -> None:
    """Refuse (roll back) an upgrade that left rows referring to rows that do not exist; what
    was broken before it (a database no seedgrid made) is not its doing."""
    broken = sorted(_broken_references(connection) - before, key=repr)
    if broken:
        table, rowid, parent, _ = broken[0]
        raise DatabaseError(
            f"cannot migrate the database {masked_url(database_url)}: the upgrade left "
            f"{len(broken)} rows referring to rows that do not exist (the first: {table} row "
            f"{rowid}, in {parent}); nothing was changed"
        )


def _alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _predates_migrations(connection: Connection, database_url: str) -> bool:
    """Whether the database holds seedgrid's tables from before migrations (no alembic_version).

    All of them: stamp. None: a new database, migrate from scratch. Some: refuse to guess.
    """
    present = INITIAL_TABLES & set(inspect(connection).get_table_names())
    if present and present != INITIAL_TABLES:
        raise DatabaseError(
            f"the database {masked_url(database_url)} has seedgrid tables "
            f"{', '.join(sorted(present))} but not {', '.join(sorted(INITIAL_TABLES - present))}"
            " and no alembic_version table: not a database seedgrid made; refusing to migrate it"
        )
    return bool(present)


def _reason(exc: DBAPIError) -> str:
    """The driver's message, first line only (psycopg adds hints on further lines)."""
    return str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc).__name__
