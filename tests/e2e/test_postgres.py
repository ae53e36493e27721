"""Scale mode on the local PostgreSQL (127.0.0.1:5432, trust auth): API replicas and the
dispatcher started together on one database of this test, created and dropped by the
`pg_databases` fixture. PostgreSQL not reachable is a failure, not a skip.

The API and storage tests of tests/e2e/test_api.py also run on PostgreSQL (`start_backend_service`).
"""

from __future__ import annotations

import threading

from service.api.server import BackgroundServer
from service.settings import Settings
from service.storage.db import head_revision
from tests.conftest import PostgresDatabases, Service
from tests.scipy_reference import assert_matches, reference_comparison


def test_api_replicas_and_the_dispatcher_share_one_database(
    ray_cluster: None, pg_databases: PostgresDatabases
) -> None:
    url = pg_databases.url()
    settings = Settings(database_url=url, metrics_batch_interval_s=0.2)
    servers = [BackgroundServer(settings, dispatch=i == 0) for i in range(3)]
    # All three start at once, so their start-up migrations of the new database overlap.
    starts = [threading.Thread(target=server.start) for server in servers]
    for start in starts:
        start.start()
    for start in starts:
        start.join(60)
    services = [Service(server, None, url) for server in servers]
    try:
        assert all(server.server.started for server in servers)
        dispatcher, replica_a, replica_b = services
        bad = replica_a.client.post(
            "/experiments", json={"name": "x", "trainer": "collapse", "grid": {"r": []}}
        )
        assert bad.status_code == 422
        created = replica_a.submit(
            {
                "name": "pg",
                "trainer": "collapse",
                "config": {"n_samples": 100, "steps": 200, "r": 0.1},
                "grid": {"stop_gradient": [False, True]},
                "seeds": 3,
                "metric": "min_l2",
            }
        )
        detail = replica_b.wait(created["id"])
        assert detail["status"] == "completed" and detail["counts"]["completed"] == 6
        runs = replica_b.runs(created["id"])
        assert runs == dispatcher.runs(created["id"])
        stats = replica_a.client.get(f"/experiments/{created['id']}/stats").json()
        a = [r["metrics"]["min_l2"] for r in runs if r["condition"]["stop_gradient"] is False]
        b = [r["metrics"]["min_l2"] for r in runs if r["condition"]["stop_gradient"] is True]
        assert_matches(stats["comparisons"][0], reference_comparison(a, b))
        curve = replica_b.client.get(
            f"/runs/{runs[0]['id']}/metrics", params={"name": "loss"}
        ).json()
        assert [p["step"] for p in curve] == list(range(201))
        for service in services:
            assert service.client.get("/healthz").json()["database"] == "ok"
        assert dispatcher.sql("SELECT version_num FROM alembic_version") == [(head_revision(),)]
    finally:
        for service in services:
            service.close()
