"""The stored /stats pages (service.stats_store) on a real SQLite file: two viewers of a page
that is not stored yet get one computation between them, and the spec's analysis settings
(scale, target ratio) reach the comparisons."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from service import stats_store
from service.db import Experiment, make_engine, upgrade_database
from service.experiments import SpecError
from tests.service.test_stats_guidance import store_cff_experiment

ACCURACIES = {"clamp": [0.80, 0.85, 0.83, 0.86, 0.81], "subtract": [0.84, 0.845, 0.842, 0.83,
                                                                     0.85]}


def served(url: str, experiment_id: int, **query: Any) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            experiment = session.get(Experiment, experiment_id)
            return json.loads(stats_store.stats_json(
                session=session, experiment=experiment, metric=query.pop("metric", None),
                factor=None, offset=0, limit=None, **query))
    finally:
        engine.dispose()


def test_two_viewers_of_a_page_not_stored_yet_compute_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    experiment_id = store_cff_experiment(url, ACCURACIES, n_test=1000)
    computed = []
    real = stats_store.experiment_stats

    def slow(**kwargs: Any) -> Any:  # a computation long enough for the second viewer to come
        computed.append(1)
        time.sleep(0.5)
        return real(**kwargs)

    monkeypatch.setattr(stats_store, "experiment_stats", slow)
    pages: list[dict[str, Any]] = []
    viewers = [threading.Thread(target=lambda: pages.append(served(url, experiment_id)))
               for _ in range(2)]
    for viewer in viewers:
        viewer.start()
    for viewer in viewers:
        viewer.join(60)
    assert len(pages) == 2 and pages[0] == pages[1]
    assert len(computed) == 1
    served(url, experiment_id)  # stored: not computed again
    assert len(computed) == 1


def test_the_spec_chooses_the_scale_and_the_target_ratio_and_a_query_overrides_the_scale(
        tmp_path: Path) -> None:
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
    at_zero = store_cff_experiment(url, {"clamp": [0.0, 0.5, 0.6], "subtract": [0.4, 0.5, 0.7]},
                                   n_test=1000)
    with pytest.raises(SpecError, match="1 of 6 are 0 or below") as refused:
        served(url, at_zero, scale="log")
    assert refused.value.errors[0]["loc"] == ["query", "scale"]
