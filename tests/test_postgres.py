"""The same service on the local PostgreSQL (127.0.0.1:5432, trust auth, database `test`).

Each test gets a database of its own, created and dropped here. PostgreSQL not reachable is a
failure, not a skip: scale mode must keep working.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from service.server import BackgroundServer
from service.settings import Settings
from tests.conftest import Service
from tests.scipy_reference import assert_matches, reference_comparison

ADMIN_DSN = os.environ.get("SEEDGRID_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = f"seedgrid_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_DSN)
    user, host, port = info.get("user", "postgres"), info["host"], info.get("port", 5432)
    yield f"postgresql+psycopg://{user}@{host}:{port}/{name}"
    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_experiment_on_postgresql_end_to_end(ray_cluster: None, pg_url: str, tmp_path) -> None:
    settings = Settings(database_url=pg_url, metrics_batch_interval_s=0.2)
    with BackgroundServer(settings) as server:
        service = Service(server, tmp_path / "unused")
        bad = service.client.post("/experiments", json={"name": "x", "trainer": "collapse",
                                                        "grid": {"r": []}})
        assert bad.status_code == 422
        created = service.submit({
            "name": "pg", "trainer": "collapse",
            "config": {"n_samples": 100, "steps": 200, "r": 0.1},
            "grid": {"stop_gradient": [False, True]}, "seeds": 3, "metric": "min_l2",
        })
        detail = service.wait(created["id"])
        assert detail["status"] == "completed" and detail["counts"]["completed"] == 6
        runs = service.runs(created["id"])
        stats = service.client.get(f"/experiments/{created['id']}/stats").json()
        a = [r["metrics"]["min_l2"] for r in runs if r["condition"]["stop_gradient"] is False]
        b = [r["metrics"]["min_l2"] for r in runs if r["condition"]["stop_gradient"] is True]
        assert_matches(stats["comparisons"][0], reference_comparison(a, b))
        curve = service.client.get(f"/runs/{runs[0]['id']}/metrics",
                                   params={"name": "loss"}).json()
        assert [p["step"] for p in curve] == list(range(201))
        assert service.client.get("/healthz").json()["database"] == "ok"
        service.client.close()
