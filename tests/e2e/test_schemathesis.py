"""Property-based API testing: schemathesis generates boundary, negative and fuzzed inputs for
every operation of seedgrid's OpenAPI schema and sends them to a running service (real uvicorn
on loopback, real Ray, the bearer token on), once on a real SQLite file and once on a fresh
database of the local PostgreSQL. No input may get a 5xx.

The schema is built from the app at import, so that pytest lists one test per operation, and
`test_the_live_schema_is_the_one_tested` checks that the running service serves exactly it.
(schemathesis.pytest.from_fixture, which would load it from the live service instead, fails on
pytest >= 9.2: it sets `Function._nodeid`, which pytest no longer has.)

Bounded for CI (about 15 s): deterministic generation, at most 100 fuzzed examples per
operation, no shrinking. With 100 it finds, for instance, the SQLite integer overflow of an
unbounded path id; with 12 it did not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from service.api.app import create_app
from service.api.server import BackgroundServer
from service.settings import Settings
from tests.conftest import PostgresDatabases, Service

TOKEN = "schemathesis-token-0123456789"
SETTINGS = {"api_token": TOKEN, "max_runs_per_experiment": 8, "metrics_batch_interval_s": 0.2}

OPENAPI = create_app(Settings(database_url="sqlite://", **SETTINGS), dispatch=False).openapi()
schema = schemathesis.openapi.from_dict(
    OPENAPI,
    config=schemathesis.Config.from_dict(
        {
            "seed": 20240601,
            "auth": {"openapi": {"bearerAuth": {"bearer": TOKEN}}},
            "generation": {
                "mode": "all",
                "max-examples": 100,
                "deterministic": True,
                "no-shrink": True,
                "database": "none",
            },
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
        }
    ),
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, ray_cluster: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    # (the server's test lock held shared only by the PostgreSQL module, and given up however
    # its setup ends: tests/conftest.py's PostgresDatabases)
    databases = PostgresDatabases() if request.param == "postgresql" else None
    try:
        yield from _live_service(databases, tmp_path_factory)
    finally:
        if databases is not None:
            databases.drop_all()


def _live_service(
    databases: PostgresDatabases | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """The service of `live` (on SQLite without `databases`), until the module ends."""
    db_path: Path | None = None
    if databases is None:
        db_path = tmp_path_factory.mktemp("schemathesis") / "seedgrid.db"
        url = f"sqlite:///{db_path}"
    else:
        url = databases.url()
    settings = Settings(database_url=url, **SETTINGS)
    service = Service(BackgroundServer(settings).start(), db_path, url)
    service.client.headers["Authorization"] = f"Bearer {TOKEN}"
    # Id 1, the coverage phase's boundary value, then names a finished experiment and run, so
    # that detail, runs, stats and metrics are reached with data behind them, not only 404s.
    created = service.submit(
        {
            "name": "seed-data",
            "trainer": "collapse",
            "config": {"n_samples": 64, "steps": 50},
            "grid": {"stop_gradient": [False, True]},
            "seeds": 2,
        }
    )
    assert created["id"] == 1
    service.wait(created["id"])
    # The first /stats of an experiment computes and caches it (bootstrap, permutations, power:
    # seconds on a busy 2-core machine); pay that here, where no request timeout applies, not
    # inside a generated case, whose client gives up after 10 s.
    assert service.client.get("/experiments/1/stats", timeout=120).status_code == 200
    yield service
    service.client.close()
    service.server.stop()


def test_the_live_schema_is_the_one_tested(live: Service) -> None:
    assert live.client.get("/openapi.json").json() == OPENAPI
    assert len([op for ops in OPENAPI["paths"].values() for op in ops]) >= 10


@schema.exclude(method="DELETE").parametrize()
def test_no_input_gets_a_server_error(case: schemathesis.Case, live: Service) -> None:
    case.call_and_validate(base_url=live.server.url, checks=[not_a_server_error], timeout=60)


# Last (pytest runs a module's tests in order): a DELETE of experiment 1 would leave the other
# operations nothing but 404s to reach.
@schema.include(method="DELETE").parametrize()
def test_no_deletion_gets_a_server_error(case: schemathesis.Case, live: Service) -> None:
    case.call_and_validate(base_url=live.server.url, checks=[not_a_server_error], timeout=60)
