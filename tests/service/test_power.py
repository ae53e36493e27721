"""service.analysis.power against independent references: the exact F interval against scipy's F
quantiles and its coverage in simulation, the F-test's power against a Monte Carlo simulation
of normal samples, the seeds-needed answer as the smallest n whose simulated power reaches the
target; the planning endpoint and command (which answer for the primary test, with the
F-test's answer beside it: tests/service/test_primary_power.py checks the primary test's
power)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy import stats

from service.analysis.power import detectable_ratio, f_ratio_interval, f_test_power, seeds_needed
from service.analysis.primary_power import primary_detectable_ratio, primary_seeds_needed
from service.analysis.stats import compare
from service.api.server import BackgroundServer
from service.settings import Settings

ALPHA = 0.05


def simulated_power(ratio: float, n_a: int, n_b: int, sims: int, seed: int = 0) -> float:
    """Fraction of `sims` pairs of normal samples (variances ratio : 1) whose two-sided F-test
    rejects at ALPHA, the p-value computed from scipy's F distribution."""
    rng = np.random.default_rng(seed)
    a = rng.normal(0.0, np.sqrt(ratio), size=(sims, n_a))
    b = rng.normal(0.0, 1.0, size=(sims, n_b))
    f = a.var(axis=1, ddof=1) / b.var(axis=1, ddof=1)
    dist = stats.f(n_a - 1, n_b - 1)
    p = np.minimum(1.0, 2 * np.minimum(dist.cdf(f), dist.sf(f)))
    return float((p < ALPHA).mean())


def test_the_f_interval_is_the_ratio_over_scipys_f_quantiles() -> None:
    low, high = f_ratio_interval(5.9, 14, 14)
    assert low == pytest.approx(5.9 / stats.f.ppf(0.975, 13, 13), rel=1e-12)
    assert high == pytest.approx(5.9 / stats.f.ppf(0.025, 13, 13), rel=1e-12)
    low, high = f_ratio_interval(0.5, 3, 5, confidence=0.9)
    assert (low, high) == pytest.approx(
        (0.5 / stats.f.ppf(0.95, 2, 4), 0.5 / stats.f.ppf(0.05, 2, 4)), rel=1e-12
    )


def test_the_f_interval_covers_the_true_ratio_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(1)
    true_ratio, sims = 3.0, 4000
    a = rng.normal(0, np.sqrt(true_ratio), size=(sims, 4))
    b = rng.normal(0, 1, size=(sims, 3))
    ratios = a.var(axis=1, ddof=1) / b.var(axis=1, ddof=1)
    covered = [lo <= true_ratio <= hi for lo, hi in (f_ratio_interval(r, 4, 3) for r in ratios)]
    assert np.mean(covered) == pytest.approx(0.95, abs=0.015)


@pytest.mark.parametrize(("ratio", "n_a", "n_b"), [(4.0, 8, 8), (2.5, 12, 6), (0.25, 5, 9)])
def test_the_power_formula_matches_a_simulation(ratio: float, n_a: int, n_b: int) -> None:
    assert f_test_power(ratio, n_a, n_b, ALPHA) == pytest.approx(
        simulated_power(ratio, n_a, n_b, sims=4000), abs=0.03
    )


def test_seeds_needed_is_the_smallest_n_whose_simulated_power_reaches_80_percent() -> None:
    ratio = 8.0
    n = seeds_needed(ratio)
    assert n == 10
    assert simulated_power(ratio, n, n, sims=20_000) >= 0.8
    assert simulated_power(ratio, n - 1, n - 1, sims=20_000) < 0.8
    assert seeds_needed(1 / ratio) == n  # the test is two-sided and the sizes equal
    assert seeds_needed(1.0) is None


def test_the_detectable_ratio_is_detected_with_80_percent_power() -> None:
    rho = detectable_ratio(7, 7)
    assert rho > 1 and f_test_power(rho, 7, 7) == pytest.approx(0.8, abs=1e-8)
    assert simulated_power(rho, 7, 7, sims=4000) == pytest.approx(0.8, abs=0.03)
    assert detectable_ratio(14, 14) < rho  # more seeds detect smaller ratios
    assert detectable_ratio(7, 7, alpha=0.4, power=0.3) == 1.0  # power below the test's size


def test_three_seeds_per_level_get_a_finite_f_interval_and_a_target_ratio_plan() -> None:
    result = compare([0.71, 0.69, 0.75], [0.70, 0.72, 0.71])
    # the primary test has 6 re-assignments at 3 seeds: it cannot exclude any ratio, and says so
    assert result["primary_ci95"] == [0.0, None]
    assert any("cannot fall below" in w for w in result["warnings"])
    low, high = result["var_ratio_ci95_f"]
    assert 0 < low < result["var_ratio"] < high
    # so has the permutation mean test: 20 re-assignments exclude no shift
    assert result["mean_diff_ci95"] == [None, None]
    assert any(
        w.startswith("mean_p from 3 and 3 seeds: they allow only 20") for w in result["warnings"]
    )
    # no ratio is detectable with 6 re-assignments: infinite, served as null
    assert primary_detectable_ratio(3, 3) == math.inf and result["detectable_ratio"] is None
    # not from the observed ratio: the seeds the primary test needs for the target ratio, 2
    assert result["target_ratio"] == 2.0
    assert result["seeds_for_target_ratio"] == primary_seeds_needed(2.0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BackgroundServer]:
    with BackgroundServer(
        Settings(database_url=f"sqlite:///{tmp_path / 'seedgrid.db'}"), dispatch=False
    ) as running:
        yield running


def test_the_planning_endpoint_answers_both_ways_and_names_bad_input(
    server: BackgroundServer,
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        plan = client.get("/planning/seeds", params={"ratio": 8.0}).json()
        # The primary test on shared seeds by default; the F-test's answer beside it.
        assert (
            plan["seeds_per_level"],
            plan["alpha"],
            plan["power"],
            plan["paired"],
            plan["correlation"],
        ) == (primary_seeds_needed(8.0, paired=True), 0.05, 0.8, True, 0.0)
        assert plan["method"].startswith("paired sign-flip test")
        assert (plan["f_test_seeds_per_level"], plan["f_test_ratio"]) == (10, 8.0)
        correlated = client.get("/planning/seeds", params={"ratio": 8.0, "correlation": 0.9}).json()
        assert correlated["seeds_per_level"] < plan["seeds_per_level"]
        unpaired = client.get("/planning/seeds", params={"ratio": 8.0, "paired": False}).json()
        assert (unpaired["paired"], unpaired["correlation"]) == (False, None)
        assert unpaired["method"].startswith("stratified permutation test")
        plan = client.get("/planning/seeds", params={"seeds": 7, "power": 0.9}).json()
        assert plan["ratio"] == pytest.approx(
            primary_detectable_ratio(7, 7, paired=True, power=0.9)
        )
        assert plan["f_test_ratio"] == pytest.approx(detectable_ratio(7, 7, 0.05, 0.9))
        assert client.get("/planning/seeds", params={"ratio": 1.0}).json()["note"] == (
            "no study detects a ratio of 1"
        )
        bad: tuple[tuple[dict[str, str | float], str], ...] = (
            ({}, "ratio"),
            ({"ratio": 2, "seeds": 3}, "ratio"),
            ({"ratio": 0}, "ratio"),
            ({"seeds": 1}, "seeds"),
            ({"ratio": 2, "alpha": 1.5}, "alpha"),
            ({"seeds": 9, "alpha": 0.4, "power": 0.3}, "power"),
            ({"ratio": 2, "paired": False, "correlation": 0.5}, "correlation"),
            ({"ratio": 2, "correlation": 1.0}, "correlation"),
            ({"ratio": 2, "correlation": -0.2}, "correlation"),
            ({"ratio": 2, "paired": "sometimes"}, "paired"),
        )
        for params, field in bad:
            response = client.get("/planning/seeds", params=params)
            assert response.status_code == 422, (params, response.text)
            assert response.json()["detail"][0]["loc"] == ["query", field]
        refused = client.get(
            "/planning/seeds", params={"ratio": 2, "paired": False, "correlation": 0.5}
        )
        assert "needs paired=true" in refused.json()["detail"][0]["msg"]


def test_the_plan_command_prints_the_answer_without_a_service() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "plan", "--ratio", "8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # The command plans for the primary test on shared seeds, as GET /planning/seeds does.
    assert f"{primary_seeds_needed(8.0, paired=True)} seeds per level" in done.stdout
    assert "paired sign-flip test" in done.stdout
    assert f"would promise {seeds_needed(8.0)} seeds per level" in done.stdout  # the F-test
    refused = subprocess.run(
        [sys.executable, "-m", "service.cli", "plan"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "exactly one of --ratio" in refused.stderr
    correlated = subprocess.run(
        [sys.executable, "-m", "service.cli", "plan", "--ratio", "5.9", "--correlation", "0.9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    want = primary_seeds_needed(5.9, paired=True, correlation=0.9)
    assert f"{want} seeds per level" in correlated.stdout and "correlate 0.9" in correlated.stdout
    independent = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "plan",
            "--ratio",
            "5.9",
            "--unpaired",
            "--correlation",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert independent.returncode == 2 and "--correlation is for paired" in independent.stderr


def test_a_factor_with_more_than_two_levels_gets_an_omnibus_brown_forsythe_test() -> None:
    from service.analysis.stats import experiment_stats

    rng = np.random.default_rng(3)
    grid = {"r": [0.0, 0.1, 0.2], "stop_gradient": [False, True]}
    runs, by_level = [], {0.0: [], 0.1: [], 0.2: []}
    for r in grid["r"]:
        for sg in grid["stop_gradient"]:
            values = rng.normal(5 * sg, 1 + 10 * r, size=4)
            runs += [({"r": r, "stop_gradient": sg}, f"r={r},sg={sg}", float(v)) for v in values]
            # Brown-Forsythe within cells: each value's distance from its cell's median
            by_level[r] += [float(v) for v in np.abs(values - np.median(values))]
    result = experiment_stats(metric="m", grid=grid, runs=runs)
    (omnibus,) = result.omnibus  # stop_gradient has two levels: its pairwise test suffices
    assert (omnibus.factor, omnibus.levels, omnibus.n) == ("r", [0.0, 0.1, 0.2], [8, 8, 8])
    expected = stats.f_oneway(*by_level.values()).pvalue
    assert omnibus.brown_forsythe_p == pytest.approx(expected, rel=1e-12)
    assert (
        experiment_stats(metric="m", grid=grid, runs=runs, factor="stop_gradient", limit=0).omnibus
        == []
    )
