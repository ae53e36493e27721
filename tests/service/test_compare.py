"""GET /compare's logic (service.analysis.compare) on a real SQLite file and PostgreSQL: the
conditions match by the run config they train with (not by grid keys), the condition
intervals keep the metric's declared bounds, two experiments that ran the same seeds are
compared paired, pages are stored like /stats pages, and a 10,000-seed comparison stays within
a memory bound."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import insert
from sqlmodel import Session, select

from api_schemas import ExperimentComparison, ExperimentStatus, RunStatus
from service.analysis.compare import compare_json
from service.errors import SpecError
from service.experiments import delete_experiment
from service.scheduling.purge import purge_deleted
from service.specs import condition_key, grid_conditions
from service.storage.db import CompareCache, Experiment, Run, make_engine, upgrade_database
from tests.service.test_stats_guidance import store_cff_experiment


def test_compare_keeps_accuracies_within_their_bounds_and_pairs_shared_seeds(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    # accuracies near 1 with one poor seed: the plain t interval of the mean crosses 1
    first = {"clamp": [0.999, 0.998, 0.6, 0.999, 0.997, 0.999, 0.998]}
    rng = np.random.default_rng(0)
    second = {"clamp": [min(1.0, v + float(rng.normal(0, 1e-4))) for v in first["clamp"]]}
    a_id = store_cff_experiment(url, first, n_test=10_000)
    b_id = store_cff_experiment(url, second, n_test=10_000)
    engine = make_engine(url)
    with Session(engine) as session:
        body = ExperimentComparison.model_validate_json(
            compare_json(session=session, a_id=a_id, b_id=b_id, metric=None, offset=0, limit=10)
        )
    engine.dispose()
    (side,) = body.conditions
    values = np.asarray(first["clamp"])
    plain_high = values.mean() + 2.447 * values.std(ddof=1) / np.sqrt(7)  # t_{6, 0.975}
    assert plain_high > 1
    for summary in (side.a, side.b):
        low, high = summary.ci95
        assert 0 < low < high < 1 and summary.ci95_method.startswith("logit-t")
    # seeds 0..6 in both: paired, and the per-seed values move together
    assert side.comparison.pairing == "paired" and side.comparison.paired_seeds == 7
    assert side.comparison.seed_correlation == pytest.approx(1.0, abs=1e-3)
    assert side.comparison.mean_test == "paired t"


def served(url: str, a_id: int, b_id: int) -> ExperimentComparison:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            return ExperimentComparison.model_validate_json(
                compare_json(session=session, a_id=a_id, b_id=b_id, metric=None, offset=0, limit=10)
            )
    finally:
        engine.dispose()


def stored_pages(url: str) -> list[tuple[int, int, int, int]]:
    engine = make_engine(url)
    with Session(engine) as session:
        rows = session.exec(
            select(
                CompareCache.a_id,
                CompareCache.b_id,
                CompareCache.n_completed_a,
                CompareCache.n_completed_b,
            )
        ).all()
    engine.dispose()
    return [tuple(row) for row in rows]


def test_a_compare_page_is_stored_until_either_experiment_completes_a_run(
    database_url: str,
) -> None:
    """Like /stats: a page is computed once and served from the database while the completed
    runs of both experiments stay as many (a value changed behind the service's back shows it
    is not computed again), recomputed when one more run of either completes, and removed with
    either experiment."""
    accuracies = {
        "clamp": [0.80, 0.85, 0.83, 0.86, 0.81, 0.84],
        "subtract": [0.84, 0.845, 0.842, 0.83, 0.85, 0.86],
    }
    a_id = store_cff_experiment(database_url, accuracies, n_test=1000)
    b_id = store_cff_experiment(database_url, accuracies, n_test=1000)
    first = served(database_url, a_id, b_id)
    assert [(side.a.n, side.b.n) for side in first.conditions] == [(6, 6), (6, 6)]
    assert stored_pages(database_url) == [(a_id, b_id, 12, 12)]

    engine = make_engine(database_url)
    with Session(engine) as session:
        run = session.exec(select(Run).where(Run.experiment_id == a_id)).first()
        run.metrics = {**run.metrics, "test_accuracy": 0.1}
        session.add(run)
        session.commit()
    assert served(database_url, a_id, b_id) == first  # stored, not computed again

    with Session(engine) as session:  # one more run of b completes
        session.add(
            Run(
                experiment_id=b_id,
                condition={"margin_mode": "clamp"},
                condition_key="margin_mode=clamp",
                seed=6,
                trainer="cff",
                status=RunStatus.completed,
                metrics={"test_accuracy": 0.9},
            )
        )
        b = session.get(Experiment, b_id)
        b.runs_completed, b.n_runs, b.status = 13, 13, ExperimentStatus.completed
        session.commit()
    again = served(database_url, a_id, b_id)
    assert [(side.a.n, side.b.n) for side in again.conditions] == [(6, 7), (6, 6)]
    assert 0.1 in again.conditions[0].a.values  # a's changed value, read now
    assert stored_pages(database_url) == [(a_id, b_id, 12, 13)]
    assert served(database_url, b_id, a_id).a == b_id
    assert len(stored_pages(database_url)) == 2

    with Session(engine) as session:
        delete_experiment(session=session, experiment_id=b_id)
    assert purge_deleted(engine) == [b_id]
    engine.dispose()
    assert stored_pages(database_url) == []


def test_a_compare_of_two_10000_seed_experiments_stays_within_a_memory_bound(
    tmp_path: Path,
) -> None:
    """One condition of 10,000 seeds in each: the paired test's 9,999 sign flips of 10,000
    pairs made one 800 MB matrix (1.5 GB at its peak while drawn, for every call: too large to
    keep); drawn a block at a time they never hold more than a few MB."""
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    rng = np.random.default_rng(0)
    ids = []
    with Session(engine) as session:
        for name in ("a", "b"):
            experiment = Experiment(
                name=name,
                trainer="collapse",
                metric="min_l2",
                spec={"name": name, "trainer": "collapse"},
                n_conditions=1,
                n_runs=10_000,
                runs_completed=10_000,
                status=ExperimentStatus.completed,
            )
            session.add(experiment)
            session.commit()
            ids.append(experiment.id)
            session.execute(
                insert(Run),
                [
                    {
                        "experiment_id": experiment.id,
                        "condition": {},
                        "condition_key": "",
                        "seed": seed,
                        "trainer": "collapse",
                        "status": RunStatus.completed,
                        "metrics": {"min_l2": float(value)},
                        "diagnostics": {},
                        "warnings": [],
                        "provenance": {},
                        "created_at": experiment.created_at,
                    }
                    for seed, value in enumerate(rng.lognormal(size=10_000))
                ],
            )
            session.commit()
    engine.dispose()
    tracemalloc.start()
    try:
        body = served(url, ids[0], ids[1])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (side,) = body.conditions
    assert side.comparison.pairing == "paired" and side.comparison.paired_seeds == 10_000
    assert side.comparison.primary_p is not None
    assert peak < 150 * 2**20, f"{peak / 2**20:.0f} MB"


def store_collapse_experiment(
    url: str, spec: dict[str, Any], values: dict[str, list[float]]
) -> int:
    """A completed collapse experiment of `spec` written straight into the database: per
    condition of its grid (in grid order), one completed run per value of `values`."""
    engine = make_engine(url)
    conditions = grid_conditions(spec["grid"])
    with Session(engine) as session:
        experiment = Experiment(
            name=spec["name"],
            trainer="collapse",
            metric="min_l2",
            spec=spec,
            n_conditions=len(conditions),
            n_runs=sum(len(v) for v in values.values()),
            runs_completed=sum(len(v) for v in values.values()),
            status=ExperimentStatus.completed,
        )
        session.add(experiment)
        session.commit()
        experiment_id = experiment.id
        assert experiment_id is not None
        for condition in conditions:
            key = condition_key(condition)
            for seed, value in enumerate(values[key]):
                session.add(
                    Run(
                        experiment_id=experiment_id,
                        condition=condition,
                        condition_key=key,
                        seed=seed,
                        trainer="collapse",
                        status=RunStatus.completed,
                        metrics={"min_l2": value},
                    )
                )
        session.commit()
    engine.dispose()
    return experiment_id


def test_conditions_match_by_the_run_config_they_train_with_not_by_grid_keys(
    tmp_path: Path,
) -> None:
    """A follow-up that fixes r = 0.1 in its base config and grids stop_gradient runs its
    stop_gradient=false condition as the first experiment runs r=0.1 (stop_gradient false is
    the default): the two share that condition; the base-config field they set differently
    (dim) is listed."""
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    first = {
        "name": "first",
        "trainer": "collapse",
        "config": {"n_samples": 64, "steps": 300},
        "grid": {"r": [0.0, 0.1]},
        "seeds": 3,
    }
    follow_up = {
        "name": "follow-up",
        "trainer": "collapse",
        "config": {"n_samples": 64, "steps": 300, "r": 0.1, "dim": 12},
        "grid": {"stop_gradient": [False, True]},
        "seeds": 3,
    }
    a_id = store_collapse_experiment(url, first, {"r=0.0": [1.0, 2.0, 3.0], "r=0.1": [4.0, 5, 7]})
    b_id = store_collapse_experiment(
        url,
        follow_up,
        {"stop_gradient=false": [4.5, 5.5, 6.0], "stop_gradient=true": [9.0, 9.5, 8.0]},
    )
    body = served(url, a_id, b_id)
    (side,) = body.conditions
    assert (side.condition_key, side.condition_key_b) == ("r=0.1", "stop_gradient=false")
    assert side.a.values == [4.0, 5.0, 7.0] and side.b.values == [4.5, 5.5, 6.0]
    assert body.only_in_a == ["r=0.0"] and body.only_in_b == ["stop_gradient=true"]
    # dim is base config in both: its change is listed; r and stop_gradient are gridded by one
    # of them, their levels are in the keys
    assert [(d.field, d.a, d.b) for d in body.config_differences] == [("dim", "8", "12")]


def test_compare_tests_on_the_specs_analysis_scale_and_says_which(tmp_path: Path) -> None:
    """Issue 39: `compare` tested raw variances although both specs analyse on the log scale.
    Now the scale both specs name is the default, ?scale= chooses, specs that disagree are
    compared raw with a note, and a value log cannot take is a 422 naming `scale`."""
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    a_values = [0.91, 0.95, 0.5, 0.93, 0.97, 0.92]
    b_values = [0.90, 0.94, 0.92, 0.96, 0.91, 0.93]
    a_id = store_cff_experiment(url, {"clamp": a_values}, n_test=10_000, scale="log")
    b_id = store_cff_experiment(url, {"clamp": b_values}, n_test=10_000, scale="log")
    raw_b = store_cff_experiment(url, {"clamp": b_values}, n_test=10_000)
    zero = store_cff_experiment(url, {"clamp": [0.0, *b_values[1:]]}, n_test=10_000, scale="log")
    engine = make_engine(url)

    def page(b: int, scale: str | None = None) -> ExperimentComparison:
        with Session(engine) as session:
            return ExperimentComparison.model_validate_json(
                compare_json(
                    session=session,
                    a_id=a_id,
                    b_id=b,
                    metric=None,
                    offset=0,
                    limit=10,
                    scale=scale,
                )
            )

    try:
        logs = page(b_id)
        (side,) = logs.conditions
        assert logs.scale == "log" and logs.scale_note is None
        want = np.var(np.log(a_values), ddof=1) / np.var(np.log(b_values), ddof=1)
        assert side.comparison.var_ratio == pytest.approx(want, rel=1e-9)
        assert side.a.mean == pytest.approx(np.mean(a_values), rel=1e-12)  # summaries raw
        raw = page(b_id, "raw")
        (raw_side,) = raw.conditions
        assert raw.scale == "raw"
        assert raw_side.comparison.var_ratio == pytest.approx(
            np.var(a_values, ddof=1) / np.var(b_values, ddof=1), rel=1e-9
        )
        mixed = page(raw_b)
        assert mixed.scale == "raw" and mixed.scale_note is not None
        assert "a: log, b: raw" in mixed.scale_note
        with pytest.raises(SpecError) as refused:
            page(zero)
        assert refused.value.errors[0]["loc"] == ["query", "scale"]
    finally:
        engine.dispose()
