"""The stored /stats pages (service.analysis.stats_store) on a real SQLite file (and PostgreSQL
where
noted): two viewers of a page that is not stored yet get one computation between them, the
spec's analysis settings (scale, target ratio) reach the comparisons, pages share their stored
Holm families, and a family is analysed within a memory bound."""

from __future__ import annotations

import itertools
import json
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import delete, text
from sqlmodel import Session, select

from api_schemas import RunStatus
from service.analysis import omnibus, stats_store, variance
from service.analysis.stats import experiment_stats
from service.experiments import SpecError
from service.limits import Busy, HeavyReads
from service.scheduling.purge import purge_deleted
from service.scheduling.run_store import RunStore
from service.specs import condition_key
from service.storage.db import Experiment, Run, StatsCache, make_engine, upgrade_database
from tests.service.test_stats_guidance import store_cff_experiment

ACCURACIES = {"clamp": [0.80, 0.85, 0.83, 0.86, 0.81], "subtract": [0.84, 0.845, 0.842, 0.83, 0.85]}


def served(url: str, experiment_id: int, **query: Any) -> dict[str, Any]:
    engine = make_engine(url)
    page = {"factor": None, "offset": 0, "limit": None, "metric": None, **query}
    try:
        with Session(engine) as session:
            experiment = session.get(Experiment, experiment_id)
            return json.loads(
                stats_store.stats_json(session=session, experiment=experiment, **page)
            )
    finally:
        engine.dispose()


def test_two_viewers_of_a_page_not_stored_yet_compute_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    experiment_id = store_cff_experiment(url, ACCURACIES, n_test=1000)
    computed = []
    real, real_stored = stats_store.experiment_stats, stats_store._stored
    # The threads that found the page not stored; the computation ends only once both viewers
    # have (a sleep long enough for the second to come was not, on a loaded machine).
    missed: set[int] = set()
    both_missed = threading.Event()

    def stored(*args: Any, **kwargs: Any) -> str | None:
        page = real_stored(*args, **kwargs)
        if page is None:
            missed.add(threading.get_ident())
            if len(missed) == 2:
                both_missed.set()
        return page

    def slow(**kwargs: Any) -> Any:
        computed.append(1)
        assert both_missed.wait(60), "the second viewer never looked for the page"
        return real(**kwargs)

    monkeypatch.setattr(stats_store, "_stored", stored)
    monkeypatch.setattr(stats_store, "experiment_stats", slow)
    pages: list[dict[str, Any]] = []
    viewers = [
        threading.Thread(target=lambda: pages.append(served(url, experiment_id))) for _ in range(2)
    ]
    for viewer in viewers:
        viewer.start()
    for viewer in viewers:
        viewer.join(60)
    assert len(pages) == 2 and pages[0] == pages[1]
    assert len(computed) == 1
    served(url, experiment_id)  # stored: not computed again
    assert len(computed) == 1


def test_the_spec_chooses_the_scale_and_the_target_ratio_and_a_query_overrides_the_scale(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    experiment_id = store_cff_experiment(url, ACCURACIES, n_test=1000)
    engine = make_engine(url)
    with Session(engine) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.spec = {**experiment.spec, "analysis": {"scale": "log", "target_ratio": 4}}
        session.add(experiment)
        session.commit()
    engine.dispose()
    by_spec = served(url, experiment_id)
    assert by_spec["scale"] == "log"
    (comparison,) = by_spec["comparisons"]
    assert comparison["scale"] == "log" and comparison["target_ratio"] == 4.0
    raw = served(url, experiment_id, scale="raw")
    assert raw["scale"] == "raw" and raw["comparisons"][0]["var_ratio"] != comparison["var_ratio"]
    # a run at accuracy 0 has no logarithm: a 422 naming the query field
    at_zero = store_cff_experiment(
        url, {"clamp": [0.0, 0.5, 0.6], "subtract": [0.4, 0.5, 0.7]}, n_test=1000
    )
    with pytest.raises(SpecError, match="1 of 6 are 0 or below") as refused:
        served(url, at_zero, scale="log")
    assert refused.value.errors[0]["loc"] == ["query", "scale"]


def completed_run(experiment_id: int, condition: dict[str, Any], seed: int, value: float) -> Run:
    """A completed collapse run of `condition` whose min_l2 is `value`."""
    return Run(
        experiment_id=experiment_id,
        condition=condition,
        condition_key=condition_key(condition),
        seed=seed,
        trainer="collapse",
        status=RunStatus.completed,
        warnings=[],
        provenance={},
        diagnostics={},
        metrics={"min_l2": value},
    )


def store_collapse_experiment(
    url: str,
    levels: int,
    seeds: int,
    rng_seed: int,
    grid: dict[str, list[Any]] | None = None,
    config: dict[str, Any] | None = None,
) -> int:
    """A completed collapse experiment over `levels` values of r (or over `grid`, with base
    `config`), random min_l2 per run."""
    rng = np.random.default_rng(rng_seed)
    grid = grid or {"r": [round(i / levels, 6) for i in range(levels)]}
    conditions = [
        dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())
    ]
    spec = {
        "name": "levels",
        "trainer": "collapse",
        "grid": grid,
        **({"config": config} if config else {}),
    }
    engine = make_engine(url)
    with Session(engine) as session:
        experiment = Experiment(
            name="levels",
            trainer="collapse",
            metric="min_l2",
            spec=spec,
            n_conditions=len(conditions),
            n_runs=len(conditions) * seeds,
            runs_completed=len(conditions) * seeds,
        )
        session.add(experiment)
        session.commit()
        experiment_id = experiment.id
        assert experiment_id is not None
        session.add_all(
            [
                completed_run(experiment_id, condition, seed, float(rng.lognormal()))
                for condition in conditions
                for seed in range(seeds)
            ]
        )
        session.commit()
    engine.dispose()
    assert experiment_id is not None
    return experiment_id


def test_pages_share_the_stored_holm_families(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every page needs the raw p-values of its whole Holm family: they are stored once, and
    another page (in another replica, or after a restart) computes only its own comparisons."""
    experiment_id = store_collapse_experiment(database_url, levels=24, seeds=4, rng_seed=11)
    first = served(database_url, experiment_id, factor="r", offset=0, limit=10)
    assert first["total_comparisons"] == 276
    stored = sql_rows(database_url, "SELECT page, n_completed FROM statscache")
    assert [n for page, n in stored if page.startswith(stats_store.FAMILIES_PAGE)] == [96]

    # what a fresh process holds: nothing computed
    variance._results.clear()
    omnibus._omnibus_results.clear()
    analysed: list[int] = []
    real = variance.analyse

    def counted(scopes: Any, **kwargs: Any) -> Any:
        analysed.append(len(scopes))
        return real(scopes, **kwargs)

    monkeypatch.setattr(variance, "analyse", counted)
    later = served(database_url, experiment_id, factor="r", offset=100, limit=10)
    assert sum(analysed) == 10  # the page's own; all 276 before the families were stored
    # adjusted over the whole family, as computed in one go from the same runs
    whole = experiment_stats_of(database_url, experiment_id)
    for comparison, reference in zip(later["comparisons"], whole.comparisons[100:110], strict=True):
        for field in ("primary_p_holm_factor", "f_test_p_holm_factor", "welch_p_holm_all"):
            assert comparison[field] == pytest.approx(getattr(reference, field), rel=1e-12)


def test_a_cold_page_needs_a_heavy_read_slot_unless_its_experiment_is_small(
    database_url: str,
) -> None:
    large = store_collapse_experiment(database_url, levels=16, seeds=3, rng_seed=5)
    small = store_collapse_experiment(database_url, levels=3, seeds=3, rng_seed=6)
    heavy = HeavyReads(1)
    assert heavy.try_acquire()  # another heavy read holds the only slot
    with pytest.raises(Busy, match="SEEDGRID_MAX_HEAVY_READS"):
        served(database_url, large, heavy=heavy)
    # 3 comparisons of 9 runs: milliseconds of work, computed without a slot
    assert len(served(database_url, small, heavy=heavy)["comparisons"]) == 3
    heavy.release()
    assert len(served(database_url, large, heavy=heavy)["comparisons"]) == 120
    assert heavy.in_use == 0
    assert heavy.try_acquire()
    # stored now: served whoever holds the slots
    assert len(served(database_url, large, heavy=heavy)["comparisons"]) == 120


def test_a_family_is_analysed_within_a_memory_bound() -> None:
    """The randomisation tests of a family run a batch of comparisons at a time: 780
    comparisons of 12 paired seeds peaked at 262 MB when analysed at once (20,000 at 16.7 GB);
    the peak now stays that of a batch."""
    rng = np.random.default_rng(23)
    levels = [i / 40 for i in range(40)]
    runs = [({"r": r}, f"r={r}", float(v)) for r in levels for v in rng.normal(size=12)]
    seeds = [seed for _ in levels for seed in range(12)]
    tracemalloc.start()
    try:
        stats = experiment_stats(
            metric="m", grid={"r": levels}, runs=runs, seeds=seeds, factor="r", limit=5
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats.multiplicity[0].tested["primary_p"] == 780
    assert peak < 120e6, peak


def sql_rows(url: str, statement: str) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(statement))]
    finally:
        engine.dispose()


def experiment_stats_of(url: str, experiment_id: int) -> Any:
    rows = sql_rows(
        url,
        f"SELECT condition_key, seed, metrics FROM run "
        f"WHERE experiment_id = {experiment_id} ORDER BY id",
    )
    runs, seeds = [], []
    for key, seed, metrics in rows:
        metrics = json.loads(metrics) if isinstance(metrics, str) else metrics
        level = float(key.split("=", 1)[1])
        runs.append(({"r": level}, key, metrics["min_l2"]))
        seeds.append(seed)
    grid = {"r": sorted({c["r"] for c, _, _ in runs})}
    return experiment_stats(metric="min_l2", grid=grid, runs=runs, seeds=seeds, factor="r")


def test_values_from_tasks_of_different_sizes_are_pooled_with_a_warning_saying_so(
    tmp_path: Path,
) -> None:
    """A condition whose seeds ran in tasks of 8 and of 1 (the last, smaller task), and each
    comparison with such runs on a side, says so; runs of one task size (or without one in
    their provenance, say imported) say nothing."""
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    experiment_id = store_cff_experiment(url, ACCURACIES, n_test=1000)

    def set_sizes(sizes: dict[str, list[int | None]]) -> None:
        engine = make_engine(url)
        with Session(engine) as session:
            for run in session.exec(select(Run).where(Run.experiment_id == experiment_id)):
                size = sizes[run.condition["margin_mode"]][run.seed]
                run.provenance = {} if size is None else {"task_size": size, "task_index": 0}
                session.add(run)
            session.execute(delete(StatsCache))  # the pages are computed again
            session.commit()
        engine.dispose()

    set_sizes({"clamp": [8, 8, 8, 8, 8], "subtract": [8, 8, 8, 8, None]})
    page = served(url, experiment_id)
    assert not any("tasks of" in w for c in page["conditions"] for w in c["warnings"])
    assert not any("tasks of" in w for c in page["comparisons"] for w in c["warnings"])

    set_sizes({"clamp": [8, 8, 8, 8, 8], "subtract": [8, 8, 8, 8, 1]})
    page = served(url, experiment_id)
    by_mode = {c["condition"]["margin_mode"]: c["warnings"] for c in page["conditions"]}
    assert not any("tasks of" in w for w in by_mode["clamp"])
    (note,) = [w for w in by_mode["subtract"] if "tasks of" in w]
    assert note.startswith("pools runs from tasks of 1, 8 seeds")
    (comparison,) = page["comparisons"]
    assert any(w.startswith("pools runs from tasks of 1, 8 seeds") for w in comparison["warnings"])


def test_a_page_as_large_as_the_whole_list_is_the_page_stored_without_a_limit(
    tmp_path: Path,
) -> None:
    """The dashboard asks every page with limit=COMPARISONS_PAGE: where that holds every
    comparison it is the page asked for without a limit, computed and stored once (it was a
    second copy of the whole list)."""
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    experiment_id = store_cff_experiment(url, ACCURACIES, n_test=1000)
    whole = served(url, experiment_id)
    assert whole["next_offset"] is None and whole["comparisons"]
    assert served(url, experiment_id, limit=2000) == whole
    assert served(url, experiment_id, limit=len(whole["comparisons"])) == whole
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            pages = session.exec(select(StatsCache.page)).all()
    finally:
        engine.dispose()
    assert len(pages) == 1, pages


def add_completed_run(url: str, experiment_id: int, condition: dict[str, Any], seed: int) -> None:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            session.add(completed_run(experiment_id, condition, seed, 3.5))
            experiment = session.get(Experiment, experiment_id)
            assert experiment is not None
            experiment.runs_completed += 1
            experiment.n_runs += 1
            session.commit()
    finally:
        engine.dispose()


def test_after_a_restart_one_more_run_computes_only_the_comparisons_of_its_cell(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Comparison results are stored by the digest of their data (ComparisonResult): a process
    that holds none of them (a restart, another replica) computes, after one more completed
    run, only the comparisons whose cells that run joined, and serves the same statistics as a
    computation from nothing. The stored results are pruned to the comparisons in use, and
    removed with the experiment."""
    grid = {"r": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], "lr": [0.1, 0.2, 0.3, 0.4, 0.5]}
    experiment_id = store_collapse_experiment(
        database_url, levels=0, seeds=4, rng_seed=3, grid=grid
    )
    # r: 15 pairs x (pooled + 5 cells of lr) = 90; lr: 10 pairs x (pooled + 6 cells of r) = 70
    cold = served(database_url, experiment_id)
    assert cold["total_comparisons"] == 160
    count = f"SELECT count(*) FROM comparisonresult WHERE experiment_id = {experiment_id}"
    assert sql_rows(database_url, count) == [(160,)]

    computed: list[int] = []
    real_fields = variance._fields

    def counted(*args: Any, **kwargs: Any) -> Any:
        computed.append(1)
        return real_fields(*args, **kwargs)

    monkeypatch.setattr(variance, "_fields", counted)
    variance._results.clear()  # a fresh process: nothing in memory
    omnibus._omnibus_results.clear()
    add_completed_run(database_url, experiment_id, {"r": 0.0, "lr": 0.1}, seed=4)
    after = served(database_url, experiment_id)
    assert after["n_completed"] == 121
    # the cell r=0.0, lr=0.1 is in r's 5 pooled pairs with 0.0 and its 5 pairs within lr=0.1,
    # and in lr's 4 pooled pairs with 0.1 and its 4 pairs within r=0.0: 18 of 160
    assert len(computed) == 18
    assert sql_rows(database_url, count) == [(160,)]  # the 18 replaced results pruned

    # the same statistics as computed from nothing
    variance._results.clear()
    omnibus._omnibus_results.clear()
    engine = make_engine(database_url)
    with Session(engine) as session:
        session.execute(delete(StatsCache))
        session.execute(text("DELETE FROM comparisonresult"))
        session.commit()
    engine.dispose()
    computed.clear()
    fresh = served(database_url, experiment_id)
    assert len(computed) == 160
    assert fresh["comparisons"] == after["comparisons"]
    assert fresh["multiplicity"] == after["multiplicity"]

    engine = make_engine(database_url)
    with Session(engine) as session:
        RunStore(session).mark_deleted(experiment_id)
        session.commit()
    assert purge_deleted(engine) == [experiment_id]
    engine.dispose()
    assert sql_rows(database_url, count) == [(0,)]
