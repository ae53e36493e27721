"""Variance by random source through HTTP and a real Ray, on `collapse` (issue 14, item 5).

`collapse` draws its initial embeddings from `init` and, with the embedding model, only the
choice of frustrated samples from `data`; it has no augmentation and no evaluation noise. So at
r = 0 (no frustrated sample) nothing it computes depends on `data`: the data source's variance
must be exactly 0 there, and at r = 0.5 it must not be. Every run is float64 on one CPU thread
with deterministic algorithms, so the `none` level (every source pinned) must repeat one value.
"""

from __future__ import annotations

import pytest
from scipy import stats

from api_schemas import SOURCE_FACTOR, SOURCE_LEVELS
from tests.conftest import Service

CONFIG = {"n_samples": 16, "n_classes": 4, "dim": 4, "steps": 40, "log_every": 20}
SEEDS = 3


def test_a_decomposition_serves_each_sources_variance_with_its_interval(
    backend_service: Service,
) -> None:
    service = backend_service
    experiment = service.submit(
        {
            "name": "sources",
            "trainer": "collapse",
            "config": CONFIG,
            "grid": {"r": [0.0, 0.5]},
            "seeds": SEEDS,
            "metric": "min_l2",
            "decompose_sources": True,
        }
    )
    pinned = service.submit(
        {
            "name": "init-pinned",
            "trainer": "collapse",
            "config": {**CONFIG, "r": 0.0},
            "seeds": 2,
            "seed_sources": {"init": 0},
        }
    )
    assert experiment["n_runs"] == 2 * len(SOURCE_LEVELS) * SEEDS
    for created in (experiment, pinned):
        assert service.wait(created["id"])["counts"]["completed"] == created["n_runs"]

    runs = service.runs(experiment["id"])
    value = {
        (r["condition"]["r"], r["condition"][SOURCE_FACTOR], r["seed"]): r["metrics"]["min_l2"]
        for r in runs
    }
    # At r = 0 only init matters: the all-varying runs repeat the init-varying ones seed by
    # seed, and every level pinning init (to the first seed, 0) repeats seed 0's run.
    init = [value[(0.0, "init", seed)] for seed in range(SEEDS)]
    assert len(set(init)) == SEEDS
    assert [value[(0.0, "all", seed)] for seed in range(SEEDS)] == init
    for level in ("data", "augment", "none"):
        assert {value[(0.0, level, seed)] for seed in range(SEEDS)} == {init[0]}, level
    detail = service.client.get(f"/runs/{runs[0]['id']}").json()
    assert SOURCE_FACTOR not in detail["config"]

    stats_page = service.client.get(f"/experiments/{experiment['id']}/stats").json()
    decompositions = {d["within"]["r"]: d for d in stats_page["source_decomposition"]}
    assert set(decompositions) == {0.0, 0.5}
    for decomposition in decompositions.values():
        by_source = {s["source"]: s for s in decomposition["sources"]}
        assert list(by_source) == list(SOURCE_LEVELS)
        assert by_source["none"]["var"] == 0.0  # a deterministic CPU: no hardware noise
        assert by_source["augment"]["var"] == 0.0  # collapse draws no augmentation
        for source in SOURCE_LEVELS:
            var, (low, high) = by_source[source]["var"], by_source[source]["var_ci95"]
            assert by_source[source]["n"] == SEEDS
            assert low == pytest.approx((SEEDS - 1) * var / stats.chi2.ppf(0.975, SEEDS - 1))
            assert high == pytest.approx((SEEDS - 1) * var / stats.chi2.ppf(0.025, SEEDS - 1))
        assert by_source["init"]["var"] > 0
        parts = sum(by_source[s]["var"] for s in ("init", "data", "augment"))
        assert decomposition["sum_var"] == pytest.approx(parts)
        assert decomposition["sum_minus_all"] == pytest.approx(parts - by_source["all"]["var"])
        assert decomposition["sum_over_all"] == pytest.approx(parts / by_source["all"]["var"])
    assert decompositions[0.0]["sources"][1]["var"] == 0.0  # data, with nothing frustrated
    assert decompositions[0.5]["sources"][1]["var"] > 0  # data picks the frustrated samples
    # init alone is everything there
    assert decompositions[0.0]["sum_over_all"] == pytest.approx(1.0, rel=1e-12)

    # the reserved factor is an ordinary factor to the comparisons
    comparisons = service.client.get(
        f"/experiments/{experiment['id']}/stats", params={"factor": SOURCE_FACTOR}
    ).json()["comparisons"]
    pooled = next(
        c for c in comparisons if (c["a"], c["b"], c["within"]) == ("init", "data", {"r": 0.0})
    )
    assert pooled["n_a"] == pooled["n_b"] == SEEDS and pooled["var_b"] == 0.0

    # seed_sources: init pinned at r = 0 leaves every run one computation
    pinned_runs = service.runs(pinned["id"])
    assert len({r["metrics"]["min_l2"] for r in pinned_runs}) == 1
    provenance = service.client.get(f"/runs/{pinned_runs[1]['id']}").json()["provenance"]
    assert provenance["seed"] == 1
    assert provenance["source_seeds"] == {"init": 0, "data": 1, "augment": 1, "evaluate": 1}
