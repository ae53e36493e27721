"""service.analysis.sources: the decomposition's arithmetic against scipy and exact hand
computations,
which sources each level pins, and the spec's random-source fields through HTTP (a 422 naming
the field for anything they cannot mean)."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from scipy import stats

from api_schemas import RANDOM_SOURCES, SOURCE_FACTOR, SOURCE_LEVELS, ExperimentSpec
from service import cli
from service.analysis.sources import SourcePlan, source_decomposition, variance_interval
from service.analysis.stats import experiment_stats
from service.api.server import BackgroundServer
from service.experiments import condition_key
from service.settings import Settings
from service.specs import config_condition, stats_grid
from trainers.random_sources import SOURCES


def test_the_source_names_of_the_contract_are_the_trainers_sources() -> None:
    assert tuple(SOURCES) == RANDOM_SOURCES == ("init", "data", "augment", "evaluate")


@pytest.mark.parametrize("n", [2, 3, 5, 14])
def test_the_variance_interval_is_the_chi_square_interval(n: int) -> None:
    var = 0.37
    low, high = variance_interval(var, n)
    # (n - 1) s^2 / sigma^2 ~ chi2(n - 1): the interval inverts its 2.5% and 97.5% quantiles.
    assert low == pytest.approx((n - 1) * var / stats.chi2.ppf(0.975, n - 1), rel=1e-12)
    assert high == pytest.approx((n - 1) * var / stats.chi2.ppf(0.025, n - 1), rel=1e-12)
    assert low < var < high


def test_the_variance_interval_covers_the_true_variance_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(14)
    sigma2, n, trials = 2.5, 4, 4000
    samples = rng.normal(0.0, np.sqrt(sigma2), size=(trials, n))
    covered = 0
    for sample in samples:
        low, high = variance_interval(float(sample.var(ddof=1)), n)
        covered += low <= sigma2 <= high
    # binomial standard error at 0.95 over 4000 trials is 0.0034: +-0.012 is 3.5 of them
    assert abs(covered / trials - 0.95) < 0.012


def runs_of(
    grid: dict[str, list[Any]], values: dict[tuple[Any, ...], list[float]]
) -> list[tuple[dict[str, Any], str, float]]:
    """(condition, key, value) rows, as the stats store reads them, for each grid cell."""
    rows = []
    for levels, cell in values.items():
        condition = dict(zip(grid, levels, strict=True))
        rows += [(condition, condition_key(condition), v) for v in cell]
    return rows


def test_the_decomposition_per_condition_matches_an_exact_hand_computation() -> None:
    rng = np.random.default_rng(5)
    grid = {"lr": [0.1, 0.2], SOURCE_FACTOR: list(SOURCE_LEVELS)}
    spread = {"init": 1.0, "data": 0.5, "augment": 0.2, "all": 1.2, "none": 0.0}
    values = {
        (lr, level): list(rng.normal(lr, spread[level], size=3))
        for lr in grid["lr"]
        for level in SOURCE_LEVELS
    }
    values[(0.2, "none")] = [0.7, 0.7, 0.7]
    got = source_decomposition(grid, runs_of(grid, values))

    assert [d.within for d in got] == [{"lr": 0.1}, {"lr": 0.2}]
    for decomposition in got:
        lr = decomposition.within["lr"]
        assert [s.source for s in decomposition.sources] == list(SOURCE_LEVELS)
        var = {}
        for source in decomposition.sources:
            # exact rational arithmetic: identical values have a variance of exactly 0
            x = [Fraction(v) for v in values[(lr, source.source)]]
            mean = sum(x) / len(x)
            expected = float(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
            var[source.source] = expected
            assert source.n == 3
            assert source.var == pytest.approx(expected, rel=1e-12, abs=0)
            assert source.var_ci95 == pytest.approx(
                [2 * expected / stats.chi2.ppf(0.975, 2), 2 * expected / stats.chi2.ppf(0.025, 2)],
                rel=1e-12,
                abs=0,
            )
        total = var["init"] + var["data"] + var["augment"]
        assert decomposition.sum_var == pytest.approx(total, rel=1e-12)
        assert decomposition.all_var == pytest.approx(var["all"], rel=1e-12)
        assert decomposition.sum_minus_all == pytest.approx(total - var["all"], rel=1e-12)
        assert decomposition.sum_over_all == pytest.approx(total / var["all"], rel=1e-12)
    none = got[1].sources[SOURCE_LEVELS.index("none")]
    # identical values: exactly zero, where the float mean of three 0.7s leaves about 1e-32
    assert np.var([0.7] * 3, ddof=1) != 0.0
    assert none.var == 0.0 and none.var_ci95 == [0.0, 0.0]


def test_a_decomposition_with_too_few_seeds_or_no_all_level_gives_nulls() -> None:
    grid = {SOURCE_FACTOR: list(SOURCE_LEVELS)}
    values = {
        ("init",): [1.0, 2.0, 4.0],
        ("data",): [1.0],
        ("augment",): [1.0, 1.5],
        ("all",): [3.0, 3.0],
        ("none",): [],
    }
    (decomposition,) = source_decomposition(grid, runs_of(grid, values))
    assert decomposition.within == {}
    by_source = {s.source: s for s in decomposition.sources}
    assert by_source["data"].n == 1 and by_source["data"].var is None
    assert by_source["data"].var_ci95 is None and by_source["none"].n == 0
    # a source without a variance: no sum; an all-varying variance of 0: no ratio
    assert decomposition.sum_var is None and decomposition.sum_minus_all is None
    assert decomposition.sum_over_all is None and decomposition.all_var == 0.0
    values[("data",)] = [2.0, 2.0]
    (decomposition,) = source_decomposition(grid, runs_of(grid, values))
    assert decomposition.sum_var == pytest.approx(7 / 3 + 0.125)
    assert decomposition.sum_minus_all == pytest.approx(7 / 3 + 0.125)
    assert decomposition.sum_over_all is None


def test_each_level_pins_every_source_but_the_ones_it_varies_to_the_first_seed() -> None:
    spec = ExperimentSpec.stored(
        {
            "name": "s",
            "trainer": "cff",
            "grid": {"lr": [0.1]},
            "seeds": [7, 3, 9],
            "decompose_sources": True,
        }
    )
    plan = SourcePlan.of(spec)
    assert plan.decomposition_seed == 7
    assert stats_grid(spec) == {"lr": [0.1], SOURCE_FACTOR: list(SOURCE_LEVELS)}
    seeds = {level: plan.source_seeds({"lr": 0.1, SOURCE_FACTOR: level}) for level in SOURCE_LEVELS}
    assert seeds == {
        "init": {"data": 7, "augment": 7, "evaluate": 7},
        "data": {"init": 7, "augment": 7, "evaluate": 7},
        "augment": {"init": 7, "data": 7, "evaluate": 7},
        "all": {},
        "none": {"init": 7, "data": 7, "augment": 7, "evaluate": 7},
    }
    four = ExperimentSpec.stored(
        {"name": "s", "trainer": "cff", "seeds": 4, "decompose_sources": True}
    )
    assert SourcePlan.of(four).decomposition_seed == 0
    assert config_condition({"lr": 0.1, SOURCE_FACTOR: "init"}) == {"lr": 0.1}


def test_pinned_sources_apply_to_every_run_and_no_factor_is_added() -> None:
    spec = ExperimentSpec.stored(
        {
            "name": "s",
            "trainer": "cff",
            "grid": {"lr": [0.1, 0.2]},
            "seeds": 3,
            "seed_sources": {"data": 0},
        }
    )
    plan = SourcePlan.of(spec)
    assert plan.source_seeds({"lr": 0.2}) == {"data": 0}
    assert stats_grid(spec) == {"lr": [0.1, 0.2]}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with (
        BackgroundServer(
            Settings(database_url=f"sqlite:///{tmp_path / 'seedgrid.db'}"), dispatch=False
        ) as running,
        httpx.Client(base_url=running.url, timeout=30) as http,
    ):
        yield http


BASE = {
    "name": "sources",
    "trainer": "collapse",
    "config": {"n_samples": 16, "steps": 5},
    "grid": {"r": [0.0, 0.25]},
    "seeds": 3,
}


def test_a_decomposition_spec_expands_into_the_reserved_factor(client: httpx.Client) -> None:
    created = client.post("/experiments", json={**BASE, "decompose_sources": True})
    assert created.status_code == 201, created.text
    assert (created.json()["n_conditions"], created.json()["n_runs"]) == (10, 30)
    experiment_id = created.json()["id"]
    runs = client.get(f"/experiments/{experiment_id}/runs", params={"limit": 100}).json()
    assert {r["condition_key"] for r in runs} == {
        f"r={r},{SOURCE_FACTOR}={level}" for r in (0.0, 0.25) for level in SOURCE_LEVELS
    }
    # the reserved factor is no trainer config field: the run's config has no trace of it
    detail = client.get(f"/runs/{runs[0]['id']}").json()
    assert SOURCE_FACTOR not in detail["config"] and detail["config"]["r"] == 0.0
    spec = client.get(f"/experiments/{experiment_id}").json()["spec"]
    assert spec["decompose_sources"] is True and spec["grid"] == BASE["grid"]
    stats = client.get(
        f"/experiments/{experiment_id}/stats", params={"factor": SOURCE_FACTOR}
    ).json()
    assert stats["total_comparisons"] == 10 * 3  # 10 pairs, pooled and within r = 0, 0.25
    assert [d["within"] for d in stats["source_decomposition"]] == [{"r": 0.0}, {"r": 0.25}]
    plain = client.post("/experiments", json={**BASE, "seed_sources": {"data": 0}})
    assert plain.status_code == 201, plain.text
    assert plain.json()["n_runs"] == 6
    assert (
        client.get(f"/experiments/{plain.json()['id']}/stats").json()["source_decomposition"]
        is None
    )


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"seed_sources": {"weights": 0}}, ["body", "seed_sources", "weights", "[key]"]),
        ({"seed_sources": {"data": -1}}, ["body", "seed_sources", "data"]),
        ({"seed_sources": {"data": 2**31}}, ["body", "seed_sources", "data"]),
        ({"seed_sources": {"data": 1.5}}, ["body", "seed_sources", "data"]),
        ({"seed_sources": {"data": True}}, ["body", "seed_sources", "data"]),
        ({"seed_sources": {"data": "0"}}, ["body", "seed_sources", "data"]),
        ({"seed_sources": [0]}, ["body", "seed_sources"]),
        ({"decompose_sources": "maybe"}, ["body", "decompose_sources"]),
        ({"decompose_sources": True, "seed_sources": {"data": 0}}, ["body", "seed_sources"]),
        ({"decompose_sources": True, "seeds": [4]}, ["body", "seeds"]),
        ({"grid": {SOURCE_FACTOR: ["init"]}}, ["body", "grid", SOURCE_FACTOR]),
    ],
)
def test_random_source_fields_it_cannot_mean_are_a_422_naming_the_field(
    client: httpx.Client, change: dict[str, Any], loc: list[Any]
) -> None:
    response = client.post("/experiments", json={**BASE, **change})
    assert response.status_code == 422, response.text
    assert [e["loc"] for e in response.json()["detail"]] == [loc], response.text
    assert client.get("/experiments").json() == []  # nothing stored


def test_the_decomposition_counts_toward_the_run_limit(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'seedgrid.db'}", max_runs_per_experiment=20
    )
    with (
        BackgroundServer(settings, dispatch=False) as running,
        httpx.Client(base_url=running.url, timeout=30) as http,
    ):
        assert http.post("/experiments", json=BASE).status_code == 201  # 6 runs
        response = http.post("/experiments", json={**BASE, "decompose_sources": True})
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body", "grid"] and "30 runs" in error["msg"]


def test_the_stats_command_prints_the_decomposition(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli.console, "width", 200)  # no wrapped cells
    grid = {SOURCE_FACTOR: list(SOURCE_LEVELS)}
    values = {(level,): [1.0, 2.0, 4.0] for level in SOURCE_LEVELS}
    runs = runs_of(grid, values)
    page = experiment_stats(metric="min_l2", grid=grid, runs=runs, factor=SOURCE_FACTOR, limit=0)
    page.source_decomposition = source_decomposition(grid, runs)
    cli.print_stats(page.model_dump(mode="json"))
    out = capsys.readouterr().out
    assert "variance of min_l2 by random source" in out
    assert "2.33 [0.63, 92]" in out  # var 7/3, chi-square interval with 2 dof
    assert "(all)" in out and "sum / all" in out
