"""GET /experiments/{id}'s curve_metrics: kept in the experiment's row as its runs' points are
stored (RunStore.record_points), so the detail reads one row whatever its number of runs; for
an experiment stored before migration 0014 (curve_names null), service.experiments.views.
curve_metrics picks one started run per condition in one aggregate, the first completed where
there is one, else the first started, and names the metrics those runs logged as points; on
SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import bindparam, text
from sqlmodel import Session

from api_schemas import ExperimentSpec
from service.experiments import create_experiment
from service.experiments.views import curve_metrics, experiment_detail
from service.scheduling.run_store import RunStore
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
            # stored before migration 0014: no curve names kept, read from the points
            session.execute(
                text("UPDATE experiment SET curve_names = NULL WHERE id = :e"), {"e": created.id}
            )
            session.commit()
            expected = ["deeper_layer", "grad_norm_layer1", "loss"]
            assert curve_metrics(session=session, experiment_id=created.id) == expected
            detail = experiment_detail(session=session, experiment_id=created.id)
            assert detail.curve_metrics == expected
    finally:
        engine.dispose()


def test_stored_points_keep_the_experiments_curve_names(database_url: str) -> None:
    engine = make_engine(database_url)
    spec = ExperimentSpec.model_validate(
        {
            "name": "kept",
            "trainer": "collapse",
            "config": {"steps": 50},
            "grid": {"r": [0.1, 0.2]},
            "seeds": 2,
        }
    )
    other_spec = spec.model_copy(update={"name": "other"})
    settings = Settings(database_url=database_url)
    try:
        with Session(engine) as session:
            created = create_experiment(session=session, spec=spec, settings=settings)
            other = create_experiment(session=session, spec=other_spec, settings=settings)
            assert created.id is not None and other.id is not None
            assert experiment_detail(session=session, experiment_id=created.id).curve_metrics == []
            runs = [
                run_id
                for (run_id,) in session.execute(
                    text("SELECT id FROM run WHERE experiment_id = :e ORDER BY id"),
                    {"e": created.id},
                ).all()
            ]
            other_run = session.execute(
                text("SELECT min(id) FROM run WHERE experiment_id = :e"), {"e": other.id}
            ).scalar_one()

            def point(run_id: int, name: str, step: int) -> dict[str, object]:
                return {"run_id": run_id, "step": step, "epoch": None, "name": name, "value": 1.0}

            store = RunStore(session)
            store.record_points(
                [point(runs[0], "loss", 0), point(runs[0], "loss", 1), point(other_run, "acc", 0)]
            )
            store.commit()
            # a later batch: a name only the last run logs (a deeper model), and one known
            store.record_points([point(runs[-1], "deeper_layer", 0), point(runs[1], "loss", 0)])
            store.commit()
            assert experiment_detail(session=session, experiment_id=created.id).curve_metrics == [
                "deeper_layer",
                "loss",
            ]
            assert experiment_detail(session=session, experiment_id=other.id).curve_metrics == [
                "acc"
            ]
            stored = session.execute(
                text("SELECT count(*) FROM metricpoint WHERE run_id IN :ids").bindparams(
                    bindparam("ids", expanding=True)
                ),
                {"ids": runs},
            ).scalar_one()
            assert stored == 4  # every point stored as before
    finally:
        engine.dispose()
