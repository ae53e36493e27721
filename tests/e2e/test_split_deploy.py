"""The split deployment with real processes: `seedgrid serve --no-dispatch --workers N` and
`seedgrid dispatcher`, started as subprocesses on a fresh database of the test (PostgreSQL, or a
SQLite file), with the dispatch lock deciding which dispatcher acts.

The subprocess dispatchers are Ray drivers of the test session's own local Ray (the
`ray_cluster` fixture): joining it takes ~0.05 s, where a `ray start --head` per module or a
local Ray per dispatcher costs seconds each on this 2-core machine. The lock itself is tested
in-process too: PostgreSQL's advisory lock when its connection drops, SQLite's file lock when
its holder is killed.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import ray

from service.api.server import BackgroundServer, free_port
from service.scheduling.lease import DISPATCH_LOCK_KEY, FileLock, LockLost, PostgresLock
from service.settings import Settings
from tests.conftest import PG_ADMIN_DSN, PostgresDatabases, Service
from tests.seedgrid_process import ROOT, SeedgridProcess

QUICK = {"n_samples": 200, "steps": 400}
# Long enough (a couple of seconds in a Ray worker) to be in flight when a dispatcher stops.
SLOW = {"n_samples": 200, "steps": 20_000}
ACTIVE = re.compile(r"dispatcher (\S+) is active")
STANDBY = re.compile(r"dispatcher (\S+) is standby")


def spec(config: dict[str, Any], seeds: int, name: str = "split") -> dict[str, Any]:
    return {
        "name": name,
        "trainer": "collapse",
        "config": {**config, "r": 0.1},
        "grid": {"stop_gradient": [False, True]},
        "seeds": seeds,
        "metric": "min_l2",
    }


@pytest.fixture
def launch(ray_cluster: None, tmp_path: Path) -> Iterator[Callable[..., SeedgridProcess]]:
    """`launch(name, database_url, *args)`: a seedgrid process on the session's Ray."""
    # The child inherits RAY_AUTH_MODE, which ray.init set when it enabled token authentication.
    ray_address = ray.get_runtime_context().gcs_address
    started: list[SeedgridProcess] = []

    def start(name: str, database_url: str, *args: str, **settings: str) -> SeedgridProcess:
        env = {
            **os.environ,
            "SEEDGRID_DATABASE_URL": database_url,
            "SEEDGRID_RAY_ADDRESS": ray_address,
            "SEEDGRID_METRICS_BATCH_INTERVAL_S": "0.2",
            "SEEDGRID_LOG_LEVEL": "info",
            "SEEDGRID_HOST": "127.0.0.1",
            "SEEDGRID_PORT": str(free_port()),
            **settings,
        }
        process = SeedgridProcess(name, list(args), env, tmp_path)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def api_of(process: SeedgridProcess, database_url: str) -> Service:
    """The conftest Service helpers (submit, wait, runs, sql) on a seedgrid process's API."""
    return Service(process, None, database_url)  # type: ignore[arg-type]


def attempts_by_run(api: Service, experiment_id: int) -> dict[int, list[tuple[int, str]]]:
    rows = api.sql(
        "SELECT a.run_id, a.attempt, a.outcome FROM runattempt a JOIN run r ON r.id = a.run_id "
        "WHERE r.experiment_id = :id ORDER BY a.run_id, a.attempt",
        id=experiment_id,
    )
    found: dict[int, list[tuple[int, str]]] = {}
    for run_id, attempt, outcome in rows:
        found.setdefault(run_id, []).append((attempt, outcome))
    return found


def wait_until_started(api: Service, experiment_id: int, n: int, timeout_s: float = 60) -> None:
    """Until n runs report that a worker started them."""
    deadline = time.monotonic() + timeout_s
    while (
        sum(
            r["started_at"] is not None and r["status"] == "running"
            for r in api.runs(experiment_id)
        )
        < n
    ):
        assert time.monotonic() < deadline, api.runs(experiment_id)
        time.sleep(0.05)


def assert_each_run_completed_once(api: Service, experiment_id: int) -> None:
    runs = api.runs(experiment_id)
    assert runs and all(r["status"] == "completed" for r in runs), runs
    for run_id, attempts in attempts_by_run(api, experiment_id).items():
        assert [outcome for _, outcome in attempts].count("completed") == 1, (run_id, attempts)
    for run in runs:  # one metric curve per run, not one per attempt
        steps = [
            step
            for (step,) in api.sql(
                "SELECT step FROM metricpoint WHERE run_id = :id AND name = 'loss'", id=run["id"]
            )
        ]
        assert steps and len(steps) == len(set(steps)), run["id"]


# --------------------------------------------------------------------------------------------
# the split deployment, real processes


@pytest.mark.timeout(300)
def test_api_workers_and_two_dispatchers_one_acts_and_the_other_takes_over_after_kill_9(
    launch: Callable[..., SeedgridProcess], pg_databases: PostgresDatabases
) -> None:
    """(a) `serve --no-dispatch --workers 2` + dispatcher processes run an experiment submitted
    over HTTP; (b) of two dispatchers on one database exactly one acts and every run completes
    once; (c) after kill -9 of the active one the standby takes over and re-queues what the
    dead one left running. One test, so that the processes start once (seconds each here)."""
    url = pg_databases.url()
    # a pre-flight's worker may import torch first on this busy machine: a generous wait
    api_process = launch(
        "api", url, "serve", "--no-dispatch", "--workers", "2", SEEDGRID_PREFLIGHT_TIMEOUT_S="50"
    )
    first = launch("dispatcher-1", url, "dispatcher")
    second = launch("dispatcher-2", url, "dispatcher")
    # each of the 2 API workers is a new interpreter importing the app (torch with the trainers'
    # configs: about 4 s of CPU each, 10 s to healthy on a quiet 2-core machine): a wait for the
    # event, with room for a machine busy with other tests
    health = api_process.wait_healthy(timeout_s=150)
    assert health["dispatcher"] == "absent" and health["database"] == "ok"
    api_process.wait_for_log(re.compile(r"(Application startup complete[\s\S]*){2}"))
    workers = set(re.findall(r"Started server process \[(\d+)\]", api_process.log()))
    assert len(workers) == 2, api_process.log()
    api = api_of(api_process, url)
    bad = api.client.post("/experiments", json={**spec(QUICK, 1), "seeds": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "seeds"]
    # the API, with no dispatcher, joined Ray for the pre-flight: files missing on the node
    missing = api.client.post(
        "/experiments",
        json={
            "name": "no-files",
            "trainer": "cff",
            "seeds": 1,
            "config": {
                "dataset": "cifar10",
                "width": 16,
                "depth": 1,
                "epochs": 1,
                "head_epochs": 1,
            },
        },
    )
    assert missing.status_code == 422, missing.text
    assert missing.json()["detail"][0]["loc"] == ["body", "config", "dataset"]

    # Exactly one acts; the other says it is standby and which session holds the lock.
    deadline = time.monotonic() + 60
    while not all(ACTIVE.search(p.log()) or STANDBY.search(p.log()) for p in (first, second)):
        assert time.monotonic() < deadline, (first.log(), second.log())
        time.sleep(0.05)
    active, standby = (first, second) if ACTIVE.search(first.log()) else (second, first)
    active_id = active.wait_for_log(ACTIVE)[1]
    standby_id = standby.wait_for_log(STANDBY)[1]
    assert f"seedgrid-dispatcher {active_id}"[:63] in standby.log()  # its application_name

    # (a), (b): every run completes once, each dispatched by the active dispatcher
    quick = api.submit(spec(QUICK, seeds=2, name="both-alive"))
    assert api.wait(quick["id"], timeout_s=90)["status"] == "completed"
    runs = api.runs(quick["id"])
    assert len(runs) == 4 and all(r["attempts"] == 1 for r in runs)
    assert all(a == [(1, "completed")] for a in attempts_by_run(api, quick["id"]).values())
    for run in runs:
        assert api.client.get(f"/runs/{run['id']}").json()["provenance"]["dispatcher"] == active_id
    assert_each_run_completed_once(api, quick["id"])
    assert not ACTIVE.search(standby.log()) and standby.process.poll() is None

    # (c) kill -9 of the active one mid-experiment
    slow = api.submit(spec(SLOW, seeds=1, name="holder-killed"))
    wait_until_started(api, slow["id"], 1)
    active.process.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    active.process.wait(10)
    # running, or pending (handed to Ray, not started yet): the standby re-queues both, and
    # charges only the started one's attempt (lost); the pending one's is interrupted. Nothing
    # moves these rows between here and the takeover: their dispatcher is dead.
    left_running = {
        run_id: status
        for (run_id, status) in api.sql(
            "SELECT id, status FROM run"
            " WHERE experiment_id = :id AND status IN ('running', 'pending')",
            id=slow["id"],
        )
    }
    assert "running" in left_running.values(), left_running  # the one waited for
    assert standby.wait_for_log(ACTIVE, timeout_s=15)[1] == standby_id
    # docs/deploy.md: within about half a second (the standby's poll). A wall-clock bound, of
    # 10 s: the take-over waits on a wall-clock poll (0.5 s), not on work that could be counted.
    takeover_s = time.monotonic() - killed_at
    assert takeover_s < 10, takeover_s
    assert api.wait(slow["id"], timeout_s=120)["status"] == "completed"
    assert_each_run_completed_once(api, slow["id"])
    for run in api.runs(slow["id"]):
        detail = api.client.get(f"/runs/{run['id']}").json()
        history = [(a["attempt"], a["outcome"]) for a in detail["attempt_history"]]
        if run["id"] in left_running:
            first = "lost" if left_running[run["id"]] == "running" else "interrupted"
            assert run["attempts"] == 2 and history == [(1, first), (2, "completed")], detail
            assert "dispatcher stopped" in detail["attempt_history"][0]["error"]
            assert detail["provenance"]["dispatcher"] == standby_id
        else:
            assert run["attempts"] == 1 and history == [(1, "completed")], detail
    assert f"re-queued {len(left_running)} runs" in standby.log()

    # SIGTERM: the dispatcher exits 0 and releases the lock; the API stops its workers.
    assert standby.terminate() == 0, standby.log()
    assert "Traceback" not in standby.log() and "released the dispatch lock" in standby.log()
    assert api_process.terminate() == 0
    api.client.close()


@pytest.mark.timeout(150)
def test_embedded_serve_and_a_dispatcher_process_share_the_lock_on_sqlite(
    launch: Callable[..., SeedgridProcess], tmp_path: Path
) -> None:
    """(d) `seedgrid serve` (embedded) and `seedgrid dispatcher` on one SQLite file: the
    embedded dispatcher stands by while the other acts, and takes over when it is stopped."""
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    dispatcher = launch("dispatcher", url, "dispatcher")
    dispatcher_id = dispatcher.wait_for_log(ACTIVE)[1]
    serve = launch("serve", url, "serve")
    assert serve.wait_healthy()["dispatcher"] == "standby"
    serve_id = serve.wait_for_log(STANDBY)[1]
    assert f"{dispatcher_id} holds the dispatch lock" in serve.log()

    api = api_of(serve, url)
    created = api.submit(spec(SLOW, seeds=1, name="embedded-and-dispatcher"))
    wait_until_started(api, created["id"], 1)
    # SIGTERM the acting dispatcher: it puts what is in flight back in the queue, uncharged,
    # and the serve process's embedded dispatcher takes over.
    assert dispatcher.terminate() == 0, dispatcher.log()
    interrupted = {
        run_id
        for (run_id,) in api.sql("SELECT run_id FROM runattempt WHERE outcome = 'interrupted'")
    }
    assert interrupted and f"put {len(interrupted)} runs in flight back" in dispatcher.log()
    deadline = time.monotonic() + 10
    while serve.health()["dispatcher"] != "active":
        assert time.monotonic() < deadline, serve.log()
        time.sleep(0.05)
    assert serve.wait_for_log(ACTIVE)[1] == serve_id
    assert api.wait(created["id"], timeout_s=120)["status"] == "completed"
    assert_each_run_completed_once(api, created["id"])
    for run in api.runs(created["id"]):
        detail = api.client.get(f"/runs/{run['id']}").json()
        outcomes = [a["outcome"] for a in detail["attempt_history"]]
        if run["id"] in interrupted:
            assert outcomes == ["interrupted", "completed"], detail
            assert detail["provenance"]["dispatcher"] == serve_id
        else:
            assert outcomes == ["completed"], detail
            assert detail["provenance"]["dispatcher"] == dispatcher_id
    # uvicorn shuts down gracefully, then re-raises SIGTERM: -SIGTERM is its normal exit
    assert serve.terminate() in {0, -signal.SIGTERM}
    assert "Application shutdown complete" in serve.log()
    assert f"dispatcher {serve_id} stopped and released the dispatch lock" in serve.log()
    api.client.close()


def seedgrid(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **env},
    )


def test_serve_and_dispatcher_refuse_bad_options_with_one_line() -> None:
    embedded_workers = seedgrid("serve", "--workers", "2")
    assert embedded_workers.returncode == 2
    assert embedded_workers.stderr.startswith(
        "error: --workers: more than one worker process needs --no-dispatch"
    )
    no_workers = seedgrid("serve", "--no-dispatch", "--workers", "0")
    assert no_workers.returncode == 2 and "--workers" in no_workers.stderr
    unreachable = seedgrid(
        "dispatcher",
        SEEDGRID_DATABASE_URL="postgresql+psycopg://seedgrid:hunter2@127.0.0.1:1/seedgrid",
    )
    assert unreachable.returncode == 2 and unreachable.stderr.count("\n") == 1
    assert unreachable.stderr.startswith(
        "error: cannot connect to the database "
        "postgresql+psycopg://seedgrid:***@127.0.0.1:1/seedgrid"
    )
    for result in (embedded_workers, no_workers, unreachable):
        assert "Traceback" not in result.stderr and "hunter2" not in result.stderr


# --------------------------------------------------------------------------------------------
# the lock itself, in this process


def terminate_backends(database_url: str, identity: str) -> int:
    """Drop the PostgreSQL connection(s) of a lock holder, as a network failure would."""
    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND application_name = %s",
            (database, f"seedgrid-dispatcher {identity}"[:63]),
        ).fetchall()
    return len(rows)


def test_postgres_lock_is_exclusive_and_dies_with_its_connection(
    pg_databases: PostgresDatabases,
) -> None:
    url = pg_databases.url()
    first = PostgresLock(url, "host-a:1:aaaaaa", ["collapse"])
    second = PostgresLock(url, "host-b:2:bbbbbb", ["collapse"])
    try:
        assert first.try_acquire() and not second.try_acquire()
        first.check()
        holder = second.holder()
        assert holder is not None and "seedgrid-dispatcher host-a:1:aaaaaa" in holder
        with pytest.raises(LockLost):
            second.check()
        assert terminate_backends(url, first.identity) == 1
        with pytest.raises(LockLost, match="connection failed"):
            first.check()
        assert not first.held
        assert second.try_acquire() and not first.try_acquire()
        second.release()
        assert first.try_acquire()
    finally:
        first.close()
        second.close()


HOLD_FILE_LOCK = """
import sys, time
from pathlib import Path
from service.scheduling.lease import FileLock
assert FileLock(Path(sys.argv[1]), "child:1:cccccc", ["collapse"]).try_acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_sqlite_file_lock_is_exclusive_and_dies_with_its_process(tmp_path: Path) -> None:
    database = tmp_path / "seedgrid.db"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_FILE_LOCK, str(database)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        ours = FileLock(database, "here:1:dddddd", ["collapse"])
        again = FileLock(database, "here:1:eeeeee", ["collapse"])
        assert not ours.try_acquire() and ours.holder() == "child:1:cccccc"
        child.kill()  # kill -9: the kernel releases the flock
        child.wait(10)
        assert ours.try_acquire() and not again.try_acquire()  # also within one process
        ours.check()
        ours.release()
        assert again.try_acquire()
        again.path.unlink()  # a deleted lock file no longer excludes anyone: the holder stops
        with pytest.raises(LockLost, match="deleted or replaced"):
            again.check()
    finally:
        child.kill()
        child.wait(10)


def waits_for_dispatch_lock(backend_pid: int) -> bool:
    """Whether this PostgreSQL backend is queued for the dispatch lock and not granted it."""
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        (waiting,) = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND pid = %s AND classid = %s AND objid = %s AND objsubid = 1",
            (backend_pid, DISPATCH_LOCK_KEY >> 32, DISPATCH_LOCK_KEY & 0xFFFF_FFFF),
        ).fetchone()
    return bool(waiting)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_holder_whose_lock_connection_drops_stops_at_once_and_settles_on_return(
    ray_cluster: None, pg_databases: PostgresDatabases, caplog: pytest.LogCaptureFixture
) -> None:
    """The PostgreSQL lock lives on the holder's connection. (1) It drops and nobody else takes
    the lock: the holder takes it back and keeps its runs in flight (no attempt lost). (2) It
    drops while another session waits for the lock: the holder writes nothing while the other
    holds it and cancels its copies; when the lock comes back it re-queues those runs (the
    other holder could have), and every run still completes once."""
    caplog.set_level(logging.INFO, logger="seedgrid")
    url = pg_databases.url()
    settings = Settings(database_url=url, metrics_batch_interval_s=0.2)
    with BackgroundServer(settings) as server:
        service = Service(server, None, url)
        dispatcher = server.dispatcher
        created = service.submit(spec({**SLOW, "steps": 40_000}, seeds=1, name="lock-drop"))
        wait_until_started(service, created["id"], 2)

        # (1) a blip: the lock connection drops, nobody else is waiting
        assert terminate_backends(url, dispatcher.identity) == 1
        wait_for(lambda: "lost the dispatch lock" in caplog.text, "the holder to notice")
        wait_for(lambda: dispatcher.state == "active", "the holder to take the lock back")
        assert dispatcher.in_flight, "the runs ended before the test could drop the lock"
        assert service.sql("SELECT count(*) FROM runattempt WHERE outcome = 'lost'") == [(0,)]
        still_running = {
            run_id
            for (run_id,) in service.sql(
                "SELECT id FROM run WHERE status = 'running' AND attempts = 1"
            )
        }
        assert set(dispatcher.in_flight) <= still_running

        # (2) another session is queued for the lock and gets it when the connection drops
        rival = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
        rival_pid = rival.info.backend_pid
        waiting = threading.Thread(
            target=rival.execute, args=("SELECT pg_advisory_lock(%s)", (DISPATCH_LOCK_KEY,))
        )
        waiting.start()
        wait_for(lambda: waits_for_dispatch_lock(rival_pid), "the rival to queue behind the holder")
        assert terminate_backends(url, dispatcher.identity) == 1
        waiting.join(10)
        assert not waiting.is_alive()
        wait_for(
            lambda: dispatcher.state == "standby" and not dispatcher.in_flight,
            "the holder to stand by and cancel its copies",
        )
        assert service.client.get("/healthz").json()["dispatcher"] == "standby"
        # a started run's attempt is charged (lost), a pending one's is not (interrupted)
        left_running = dict(
            service.sql("SELECT id, status FROM run WHERE status IN ('running', 'pending')")
        )
        assert "running" in left_running.values(), left_running
        tables = ("run", "runattempt", "metricpoint")
        snapshot = [service.sql(f"SELECT * FROM {table} ORDER BY id") for table in tables]
        time.sleep(1.0)  # nothing may be written while the rival holds the lock
        assert [service.sql(f"SELECT * FROM {table} ORDER BY id") for table in tables] == snapshot
        rival.close()  # the rival goes without re-queuing anything; the old holder does it
        assert service.wait(created["id"], timeout_s=90)["status"] == "completed"
        assert dispatcher.state == "active"
        assert_each_run_completed_once(service, created["id"])
        for run_id, attempts in attempts_by_run(service, created["id"]).items():
            first = "lost" if left_running.get(run_id) == "running" else "interrupted"
            retried = [(1, first), (2, "completed")]
            assert attempts == (retried if run_id in left_running else [(1, "completed")]), run_id
        service.client.close()


@pytest.mark.timeout(90)
def test_a_batch_the_database_refuses_fails_its_run_instead_of_stalling_the_queue(
    ray_cluster: None, pg_databases: PostgresDatabases
) -> None:
    url = pg_databases.url()
    with BackgroundServer(Settings(database_url=url, metrics_batch_interval_s=0.2)) as server:
        service = Service(server, None, url)
        service.sql(
            "CREATE FUNCTION refuse_points() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'metric points refused by the test'; END $$"
        )
        service.sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON metricpoint "
            "FOR EACH STATEMENT EXECUTE FUNCTION refuse_points()"
        )
        refused = service.submit({**spec(QUICK, seeds=1), "grid": {}, "max_retries": 0})
        assert service.wait(refused["id"], timeout_s=60)["status"] == "failed"
        (run,) = service.runs(refused["id"])
        assert run["status"] == "failed" and run["attempts"] == 1
        assert "its results could not be stored" in run["error"]
        assert "metric points refused by the test" in run["error"]
        service.sql("DROP TRIGGER refuse ON metricpoint")
        fine = service.submit(spec(QUICK, seeds=1))
        assert service.wait(fine["id"], timeout_s=60)["status"] == "completed"
        service.client.close()
