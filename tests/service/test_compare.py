"""GET /compare's logic (service.compare) on a real SQLite file: the condition intervals keep
the metric's declared bounds, and two experiments that ran the same seeds are compared paired."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlmodel import Session

from service.compare import compare_experiments
from service.db import make_engine, upgrade_database
from tests.service.test_stats_guidance import store_cff_experiment


def test_compare_keeps_accuracies_within_their_bounds_and_pairs_shared_seeds(
        tmp_path: Path) -> None:
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
        body = compare_experiments(session=session, a_id=a_id, b_id=b_id, metric=None,
                                   offset=0, limit=10)
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
