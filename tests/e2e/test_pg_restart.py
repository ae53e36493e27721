"""PostgreSQL restarted mid-experiment: the service reconnects and no result is lost or
duplicated (issue 6's fourth fault test). It restarts the machine's local PostgreSQL cluster
(a few seconds); the tests after it open fresh connections."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from service.api.server import BackgroundServer
from service.settings import Settings
from tests.conftest import PostgresDatabases, Service

STEPS = 30_000  # a few seconds per run, so runs are in flight across the restart
LOG_EVERY = 500


def _restart_postgresql() -> float:
    """Restart the local cluster (Debian's pg_ctlcluster); returns the seconds it was down."""
    tool = shutil.which("pg_ctlcluster")
    if tool is None:
        pytest.fail(
            "pg_ctlcluster not found: this test restarts the local PostgreSQL", pytrace=False
        )
    clusters = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout.split()
    version, name = clusters[0], clusters[1]
    started = time.monotonic()
    subprocess.run([tool, version, name, "restart"], check=True, timeout=120)
    return time.monotonic() - started


def _poll(client: httpx.Client, path: str) -> Any:
    """GET that tolerates the seconds in which the database is away (5xx or a reset)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            response = client.get(path)
            if response.status_code == 200:
                return response.json()
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not answer 200 within 60 s of the restart")
        time.sleep(0.2)


@pytest.fixture
def pg_databases_alone() -> Iterator[PostgresDatabases]:
    """The test's databases, with the server's test lock held alone: every other test that
    uses the local PostgreSQL (another xdist worker's, another test run's) waits for the restart
    to be over, and this test for them to end (tests/conftest.py's PostgresDatabases)."""
    databases = PostgresDatabases(exclusive=True)
    yield databases
    databases.drop_all()


# the wait for the server's test lock included: a module of the other worker can hold it shared
# for a few minutes (test_schemathesis)
@pytest.mark.timeout(600)
def test_postgresql_restart_mid_experiment_loses_and_duplicates_nothing(
    ray_cluster: None, pg_databases_alone: PostgresDatabases
) -> None:
    pg_databases = pg_databases_alone
    url = pg_databases.url()
    settings = Settings(database_url=url, metrics_batch_interval_s=0.2)
    service = Service(BackgroundServer(settings).start(), None, url)
    try:
        created = service.submit(
            {
                "name": "pg-restart",
                "trainer": "collapse",
                "config": {"n_samples": 200, "steps": STEPS, "log_every": LOG_EVERY},
                "grid": {"stop_gradient": [False, True]},
                "seeds": 3,
                "max_retries": 3,
            }
        )
        experiment = created["id"]
        # wait until runs are in flight and have streamed metric points
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = service.runs(experiment)
            running = [r for r in runs if r["status"] == "running" and r["started_at"]]
            if (
                running
                and service.client.get(
                    f"/runs/{running[0]['id']}/metrics", params={"name": "loss"}
                ).json()
            ):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no run started streaming within 60 s")

        restart_began = datetime.now(UTC)
        down_s = _restart_postgresql()

        deadline = time.monotonic() + 240
        while True:
            detail = _poll(service.client, f"/experiments/{experiment}")
            counts = detail["counts"]
            if counts["queued"] == counts["pending"] == counts["running"] == 0:
                break
            assert time.monotonic() < deadline, f"experiment did not end: {detail}"
            time.sleep(0.3)

        assert detail["status"] == "completed" and counts["completed"] == 6, (down_s, detail)
        runs = _poll(service.client, f"/experiments/{experiment}/runs")
        assert sorted((r["condition_key"], r["seed"]) for r in runs) == sorted(
            (f"stop_gradient={sg}", s) for sg in ("false", "true") for s in range(3)
        )
        # the restart really happened mid-experiment: runs ended after it began
        ended_after = [r for r in runs if datetime.fromisoformat(r["finished_at"]) > restart_began]
        assert ended_after, (down_s, [r["finished_at"] for r in runs])
        for run in runs:
            history = _poll(service.client, f"/runs/{run['id']}")["attempt_history"]
            statuses = [a["outcome"] for a in history]
            # completed exactly once, as the last attempt; anything before it is a recorded loss
            assert statuses[-1] == "completed" and statuses.count("completed") == 1, history
            assert [a["attempt"] for a in history] == list(range(1, len(history) + 1))
            # the stored curve is the completed attempt's, whole and without duplicates
            curve = _poll(service.client, f"/runs/{run['id']}/metrics?name=loss")
            steps = [p["step"] for p in curve]
            assert steps == list(range(0, STEPS + 1, LOG_EVERY)), (run["id"], statuses, steps[:5])
    finally:
        service.close()
