"""GET /experiments/{id}'s curve_metrics (service.experiments.views.curve_metrics) picks one
started run per condition in one aggregate, the first completed where there is one, else the
first started, and names the metrics those runs logged as points; on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlmodel import Session

from api_schemas import ExperimentSpec
from service.experiments import create_experiment
from service.experiments.views import curve_metrics, experiment_detail
from service.settings import Settings
from service.storage.db import make_engine, upgrade_database
from tests.conftest import PostgresDatabases


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    else:
        databases: PostgresDatabases = request.getfixturevalue("pg_databases")
        url = databases.url()
    upgrade_database(url)
    return url


def test_one_run_per_condition_names_the_curves(database_url: str) -> None:
    engine = make_engine(database_url)
    spec = ExperimentSpec.model_validate(
        {
            "name": "curves",
            "trainer": "collapse",
            "config": {"steps": 50},
            "grid": {"r": [0.1, 0.2, 0.3]},
            "seeds": 3,
        }
    )
    try:
        with Session(engine) as session:
            created = create_experiment(
                session=session, spec=spec, settings=Settings(database_url=database_url)
            )
            assert created.id is not None
            assert curve_metrics(session=session, experiment_id=created.id) == []
            runs = session.execute(
                text("SELECT id, condition_key FROM run WHERE experiment_id = :e ORDER BY id"),
                {"e": created.id},
            ).all()
            by_condition: dict[str, list[int]] = {}
            for run_id, key in runs:
                by_condition.setdefault(key, []).append(run_id)
            (first, second, third) = sorted(by_condition.values())
            started = "UPDATE run SET status = :s, started_at = '2026-01-01 00:00:00' WHERE id = :i"
            point = "INSERT INTO metricpoint (run_id, name, step, value) VALUES (:i, :n, 0, 1.0)"
            # the first condition: its first run still running (a name), its second completed
            # (every name it will log): the completed one is read
            session.execute(text(started), {"s": "running", "i": first[0]})
            session.execute(text(point), {"i": first[0], "n": "early"})
            session.execute(text(started), {"s": "completed", "i": first[1]})
            for name in ("loss", "grad_norm_layer1"):
                session.execute(text(point), {"i": first[1], "n": name})
            session.execute(text(started), {"s": "completed", "i": first[2]})
            session.execute(text(point), {"i": first[2], "n": "later_completed"})
            # the second: running runs only, the first started is read
            session.execute(text(started), {"s": "running", "i": second[1]})
            session.execute(text(point), {"i": second[1], "n": "deeper_layer"})
            session.execute(text(started), {"s": "running", "i": second[2]})
            session.execute(text(point), {"i": second[2], "n": "not_read"})
            # the third: nothing started
            session.commit()
            expected = ["deeper_layer", "grad_norm_layer1", "loss"]
            assert curve_metrics(session=session, experiment_id=created.id) == expected
            detail = experiment_detail(session=session, experiment_id=created.id)
            assert detail.curve_metrics == expected
    finally:
        engine.dispose()
