"""Shared fixtures: one real local Ray per test session, real seedgrid services over HTTP on a
real SQLite file, and (`start_backend_service`) the same on SQLite and on the local PostgreSQL."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import ray
from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import Engine

from service.api.server import BackgroundServer
from service.settings import Settings
from tests.fake_datasets import write_cifar

ROOT = Path(__file__).resolve().parent.parent
TOY_TRAINER_MODULE = "tests.e2e.toy_trainer"
# Ray runs its workers at niceness 15 (RAY_worker_niceness), so that a node's own processes stay
# responsive; beside other CPU-bound work (a busy CI machine: two `yes` at niceness 0 on 2
# cores) such a worker gets about 3% of a core, and a grid of 40 s takes half an hour. The
# Rays of a test session (this process's, each `seedgrid serve` and `ray start` it starts:
# they inherit this environment) run their workers at the niceness of everything else, unless
# the environment says otherwise.
os.environ.setdefault("RAY_worker_niceness", "0")
# An admin connection to the local PostgreSQL (trust auth), used to create per-test databases.
PG_ADMIN_DSN = os.environ.get("SEEDGRID_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def data_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The operator's data roots for this session, set before Ray starts so that its workers
    inherit them as a cluster's would: an empty default root ($SEEDGRID_DATA_ROOT) and a root
    named `fake` holding a tiny CIFAR-10 in torchvision's layout (SEEDGRID_DATA_ROOTS)."""
    base = tmp_path_factory.mktemp("data-roots")
    roots = {"default": base / "default", "fake": base / "fake"}
    roots["default"].mkdir()
    write_cifar(roots["fake"])
    saved = {k: os.environ.get(k) for k in ("SEEDGRID_DATA_ROOT", "SEEDGRID_DATA_ROOTS")}
    os.environ["SEEDGRID_DATA_ROOT"] = str(roots["default"])
    os.environ["SEEDGRID_DATA_ROOTS"] = f"fake={roots['fake']}"
    yield roots
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# `ray::<task name>` is a Ray worker's process title while it runs a task (the dispatcher names
# each task `seedgrid-run-<run ids>`), `ray::IDLE` between tasks.
RUN_TITLE_PREFIX = b"ray::seedgrid-run-"
IDLE_TITLE = b"ray::IDLE"
# How long a run may outlive the services that started it (their dispatchers force-cancel what
# they had in flight as they stop), and how much CPU an idle worker may burn in a second.
RUNAWAY_GRACE_S = 20.0
IDLE_CPU_SHARE = 0.5


def _own_workers(title: bytes) -> dict[int, float]:
    """The Ray workers of this test session's local Ray whose title starts with `title`: pid ->
    CPU seconds used so far. Its workers are the children of its raylet, which ray.init started
    as a child of this process (a process session is not enough: two test runs started from
    one shell share it, and each saw the other's busy workers as its own)."""
    me, ticks = os.getpid(), os.sysconf("SC_CLK_TCK")
    processes = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            stat = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        # fields after the command: state, ppid, pgrp, session, ..., utime (12), stime (13)
        processes[int(entry.name)] = (cmdline, stat)
    raylets = {
        pid
        for pid, (cmdline, stat) in processes.items()
        if int(stat[1]) == me and b"raylet" in cmdline.split(b"\0", 1)[0]
    }
    return {
        pid: (int(stat[11]) + int(stat[12])) / ticks
        for pid, (cmdline, stat) in processes.items()
        if cmdline.startswith(title) and stat[0] != "Z" and int(stat[1]) in raylets
    }


def process_cpu_s(pid: int) -> float | None:
    """The CPU seconds (user + system, every thread) process `pid` has used so far; None once it
    has ended. Unlike wall time, it does not grow while the process waits for a core, so that a
    bound on it holds on a machine busy with other work."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if stat[0] == "Z":
        return None
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def assert_no_runaway_runs() -> None:
    """No Ray worker of this session still runs a seedgrid task once the services that started
    it have stopped: a run that outlives its cancel would take a CPU from every test after it
    (once seen: 97% of a CPU for 24 minutes). Such workers are killed before the failure."""
    deadline = time.monotonic() + RUNAWAY_GRACE_S
    while (left := _own_workers(RUN_TITLE_PREFIX)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(
            f"Ray workers still running seedgrid tasks {RUNAWAY_GRACE_S:g} s after "
            f"their services stopped (killed now): pids {sorted(left)}",
            pytrace=False,
        )


def assert_no_busy_idle_workers(seconds: int = 10) -> None:
    """No Ray worker that Ray counts as idle burns CPU (a trainer thread left behind by a
    cancelled task, in a worker Ray would hand the next task to). Busy means busy in each of
    `seconds` one-second samples (the check ends at the first sample where none is): a
    trainer left behind never stops, while a worker Ray has just started in place of a
    force-cancelled one is titled idle through its own start-up, seconds on a loaded machine
    (seen twice at the end of a session whose last service stopped with a run in flight)."""
    busy: dict[int, list[float]] = {}  # pid -> CPU seconds in each sample so far
    before = _own_workers(IDLE_TITLE)
    for sample in range(seconds):
        time.sleep(1.0)
        after = _own_workers(IDLE_TITLE)
        used = {pid: after[pid] - before[pid] for pid in after.keys() & before.keys()}
        busy = {
            pid: [*busy.get(pid, []), cpu]
            for pid, cpu in used.items()
            if cpu > IDLE_CPU_SHARE and (sample == 0 or pid in busy)
        }
        if not busy:
            return
        before = after
    assert not busy, f"idle Ray workers busy (CPU seconds in each second): {busy}"


@pytest.fixture(scope="session")
def ray_cluster(data_roots: dict[str, Path]) -> Iterator[None]:
    # The workers, as an operator's would, load a trainer seedgrid does not ship (the toy of
    # tests/e2e/test_toy_trainer.py); this process registers it only in that test.
    workers_env = {
        "SEEDGRID_TRAINER_MODULES": TOY_TRAINER_MODULE,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": workers_env},
    )
    yield
    try:
        assert_no_busy_idle_workers()
    finally:
        ray.shutdown()


class Service:
    """A running seedgrid (API + dispatcher) on a real database, reached through HTTP."""

    def __init__(
        self, server: BackgroundServer, db_path: Path | None, database_url: str | None = None
    ) -> None:
        self.server = server
        self.db_path = db_path  # the SQLite file; None on PostgreSQL
        self.database_url = database_url or f"sqlite:///{db_path}"
        self.client = httpx.Client(base_url=server.url, timeout=60)
        self._engine: Engine | None = None

    def sql(self, statement: str, **params: Any) -> list[Any]:
        """Run SQL on the service's database behind its back (committed); the rows it returns."""
        if self._engine is None:
            self._engine = create_engine(self.database_url, poolclass=pool.NullPool)
        with self._engine.begin() as connection:
            result = connection.execute(text(statement), params)
            return list(result) if result.returns_rows else []

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        if self._engine is not None:
            self._engine.dispose()

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/experiments", json=spec)
        assert response.status_code == 201, response.text
        return response.json()

    def wait(self, experiment_id: int, timeout_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            detail = self.client.get(f"/experiments/{experiment_id}").json()
            c = detail["counts"]
            if c["queued"] == c["pending"] == c["running"] == 0:
                return detail
            time.sleep(0.1)
        raise AssertionError(f"experiment {experiment_id} did not end in {timeout_s} s: {detail}")

    def runs(self, experiment_id: int) -> list[dict[str, Any]]:
        response = self.client.get(f"/experiments/{experiment_id}/runs")
        assert response.status_code == 200
        return response.json()


class PostgresDatabases:
    """Fresh databases on the local PostgreSQL, one per name, all dropped by `drop_all`.

    While it lives it holds the PostgreSQL server's test lock shared (a file lock, over every
    test process of this machine: xdist's workers and a second test run), and `exclusive=True`
    holds it alone: test_pg_restart restarts the server, which must not cut another test's
    connections (with two xdist workers a test of the other worker's lost its dispatcher's
    lock connection to 'the database system is shutting down')."""

    def __init__(self, *, exclusive: bool = False) -> None:
        info = psycopg.conninfo.conninfo_to_dict(PG_ADMIN_DSN)
        host, port = info["host"], info.get("port", 5432)
        self.server = f"{info.get('user', 'postgres')}@{host}:{port}"
        self.created: dict[str, str] = {}
        lock = Path(tempfile.gettempdir()) / f"seedgrid-tests-postgresql-{host}-{port}.lock"
        self._server_lock = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        # blocks while another test holds it the other way (a restart lasts a few seconds)
        fcntl.flock(self._server_lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)

    def _admin(self) -> psycopg.Connection:
        try:
            return psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            reason = str(exc).strip().splitlines()[0]
        pytest.fail(
            f"PostgreSQL is not reachable at {PG_ADMIN_DSN} (set SEEDGRID_TEST_PG_DSN): {reason}",
            pytrace=False,
        )

    def url(self, name: str = "seedgrid") -> str:
        """The SQLAlchemy URL of this test's database `name`, created empty on first use."""
        if name not in self.created:
            database = f"seedgrid_test_{uuid.uuid4().hex[:12]}"
            with self._admin() as admin:
                admin.execute(f'CREATE DATABASE "{database}"')
            self.created[name] = database
        return f"postgresql+psycopg://{self.server}/{self.created[name]}"

    def drop_all(self) -> None:
        try:
            if self.created:
                with self._admin() as admin:
                    for database in self.created.values():
                        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            os.close(self._server_lock)  # and with it the server's test lock


@pytest.fixture
def pg_databases() -> Iterator[PostgresDatabases]:
    databases = PostgresDatabases()
    yield databases
    databases.drop_all()


def _service_starter(
    database_url: Callable[[str], str], sqlite_dir: Path | None
) -> tuple[Callable[..., Service], list[Service]]:
    started: list[Service] = []

    def start(db_name: str = "seedgrid.db", **overrides: Any) -> Service:
        url = database_url(db_name)
        settings = Settings(database_url=url, metrics_batch_interval_s=0.2, **overrides)
        db_path = sqlite_dir / db_name if sqlite_dir is not None else None
        service = Service(BackgroundServer(settings).start(), db_path, url)
        started.append(service)
        return service

    return start, started


@pytest.fixture
def start_service(ray_cluster: None, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """`start(db_name="seedgrid.db", **settings)`: a service on a SQLite file of this test."""
    start, started = _service_starter(lambda name: f"sqlite:///{tmp_path / name}", tmp_path)
    yield start
    for service in started:
        service.close()
    if started:
        assert_no_runaway_runs()


@pytest.fixture
def service(start_service: Callable[..., Service]) -> Service:
    return start_service()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def start_backend_service(
    backend: str, ray_cluster: None, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Service]]:
    """Like `start_service`, once on a SQLite file and once on a fresh PostgreSQL database of
    this test (the same `db_name` twice reaches the same database, as a restart would)."""
    if backend == "sqlite":
        start, started = _service_starter(lambda name: f"sqlite:///{tmp_path / name}", tmp_path)
    else:
        databases: PostgresDatabases = request.getfixturevalue("pg_databases")
        start, started = _service_starter(databases.url, None)
    yield start
    for service in started:
        service.close()
    if started:
        assert_no_runaway_runs()


@pytest.fixture
def backend_service(start_backend_service: Callable[..., Service]) -> Service:
    return start_backend_service()
