"""The noise floor, bounded mean intervals, the seed warnings and the compact CLI view of
/stats (issue 14, items 4 and 8), against float64 hand math; the noise floor also through the
stats store with rows in a real SQLite database and the trainers' own hooks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from scipy import stats as scipy_stats
from sqlmodel import Session

from api_schemas import RunStatus
from service import cli
from service.analysis.conditions import condition_stats
from service.analysis.stats import compare, experiment_stats
from service.analysis.stats_store import stats_json
from service.analysis.variance import MIN_SEEDS_BROWN_FORSYTHE
from service.experiments import condition_key
from service.storage.db import Experiment, Run, make_engine, upgrade_database
from trainers import REGISTRY


def test_the_noise_floor_is_the_mean_binomial_variance_and_its_share_of_the_seed_variance() -> None:
    accuracies = [0.91, 0.87, 0.95, 0.90]
    sizes = [360, 360, 500, 250]
    got = condition_stats({"m": 1}, "m=1", accuracies, bounds=(0.0, 1.0), test_set_sizes=sizes)
    by_hand = sum(p * (1.0 - p) / n for p, n in zip(accuracies, sizes, strict=True)) / 4
    mean = sum(accuracies) / 4
    seed_var = sum((p - mean) ** 2 for p in accuracies) / 3
    assert got.noise_floor_var == pytest.approx(by_hand, rel=1e-12)
    assert got.noise_floor_share == pytest.approx(by_hand / seed_var, rel=1e-12)
    # no declared test set (or one run without it): null, not a guess
    assert condition_stats({}, "", accuracies).noise_floor_var is None
    partial = condition_stats({}, "", accuracies, test_set_sizes=[360, None, 500, 250])
    assert partial.noise_floor_var is None and partial.noise_floor_share is None


def test_a_noise_floor_that_explains_most_of_the_variance_is_a_warning() -> None:
    # accuracies 0.5 +- 0.01 on 100 test images: p(1 - p)/n = 0.0025, far above the spread
    got = condition_stats({}, "", [0.49, 0.50, 0.51], bounds=(0, 1), test_set_sizes=[100] * 3)
    assert got.noise_floor_share > 1
    # every seed is scored on the same test set: p(1 - p)/n is not a floor under the seed
    # variance, and the warning does not call the spread measurement noise
    (warning,) = got.warnings
    assert "is not a floor under the seed-to-seed variance" in warning
    assert "same test set" in warning
    quiet = condition_stats({}, "", [0.2, 0.5, 0.8], test_set_sizes=[10_000] * 3)
    assert quiet.warnings == []


def logit_interval_by_hand(values: list[float], low: float, high: float) -> list[float]:
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    m = (x.mean() - low) / (high - low)
    sem = x.std(ddof=1) / math.sqrt(n) / (high - low)
    half = scipy_stats.t.ppf(0.975, n - 1) * sem / (m * (1 - m))
    centre = math.log(m / (1 - m))
    return [low + (high - low) / (1 + math.exp(-(centre + s * half))) for s in (-1, 1)]


@pytest.mark.parametrize(
    "values,bounds",
    [
        ([0.99, 1.0, 1.0, 0.98], (0.0, 1.0)),  # the t interval's top is above 1
        ([0.01, 0.0, 0.03], (0.0, 1.0)),  # its bottom is below 0
        ([0.62, 0.71, 0.55, 0.80, 0.66], (0.0, 1.0)),
        ([-0.95, -0.99, -0.80], (-1.0, 1.0)),  # a Spearman correlation
    ],
)
def test_a_bounded_metric_gets_a_logit_interval_that_never_crosses_a_bound(
    values: list[float], bounds: tuple[float, float]
) -> None:
    got = condition_stats({}, "", values, bounds=bounds)
    assert got.ci95 == pytest.approx(logit_interval_by_hand(values, *bounds), rel=1e-12)
    low, high = got.ci95
    assert bounds[0] < low < got.mean < high < bounds[1]
    assert got.ci95_method == f"logit-t within [{bounds[0]:g}, {bounds[1]:g}]"
    plain = condition_stats({}, "", values)
    assert plain.ci95_method == "t"


def test_near_a_bound_the_plain_t_interval_crosses_it_and_the_bounded_one_does_not() -> None:
    values = [0.99, 1.0, 1.0, 0.98]
    assert condition_stats({}, "", values).ci95[1] > 1.0
    assert condition_stats({}, "", values, bounds=(0.0, 1.0)).ci95[1] < 1.0
    # every run at the bound: the interval is the point, inside the bounds
    assert condition_stats({}, "", [1.0, 1.0, 1.0], bounds=(0.0, 1.0)).ci95 == [1.0, 1.0]


def test_too_few_seeds_are_warned_about_by_name_and_enough_seeds_are_not() -> None:
    two = compare([0.10, 0.30], [0.20, 0.21])
    text = " ".join(two["warnings"])
    assert two["brown_forsythe_p"] is not None and "brown_forsythe_p from 2 and 2 seeds" in text
    assert "var_ratio_ci95_f spans" in text  # F(1, 1) quantiles: about 5.6 decades
    assert (
        "primary_p from 2 and 2 seeds: they allow only 6 distinct re-assignments" in text
        and two["primary_ci95"] == [0.0, None]
    )
    assert "mean_p from 2 and 2 seeds: they allow only 6 distinct re-assignments" in text
    rng = np.random.default_rng(3)
    many = compare(list(rng.normal(size=12)), list(rng.normal(size=12)))
    # no seed-count warning; these seeds happen to make the F-test and the primary test disagree
    assert [w for w in many["warnings"] if "disagree at 0.05" not in w] == []
    four = compare(list(rng.normal(size=4)), list(rng.normal(size=4)))
    assert any(w.startswith("brown_forsythe_p from 4 and 4") for w in four["warnings"])
    assert not any("var_ratio_ci95_f" in w for w in four["warnings"])  # F(3, 3): 2.4 decades
    single = compare([1.0], [1.0, 2.0])
    assert single["warnings"] == [
        "1 and 2 seeds: a within-cell variance needs 2 seeds in a "
        "cell on each side, so no variance test"
    ]
    assert condition_stats({}, "", [1.0, 2.0]).warnings[0].startswith("ci95 from 2 seeds")
    assert condition_stats({}, "", [1.0, 2.0, 4.0]).warnings == []


def test_an_omnibus_from_too_few_seeds_is_warned_about() -> None:
    grid = {"lr": [1, 2, 3]}
    runs = [({"lr": lr}, f"lr={lr}", float(v)) for lr in grid["lr"] for v in (lr, 2 * lr, 0.5)]
    (small,) = experiment_stats(metric="m", grid=grid, runs=runs, limit=0).omnibus
    assert small.brown_forsythe_p is not None
    assert small.warnings and f"needs {MIN_SEEDS_BROWN_FORSYTHE} per cell" in small.warnings[0]
    assert small.primary_p is not None and small.primary_test.startswith("stratified")


def store_cff_experiment(
    url: str, accuracies: dict[str, list[float]], n_test: int, scale: str | None = None
) -> int:
    """A completed cff experiment over `margin_mode` written straight into the database (its
    spec's analysis.scale `scale` when given)."""
    engine = make_engine(url)
    with Session(engine) as session:
        n_runs = sum(len(v) for v in accuracies.values())
        experiment = Experiment(
            name="noise",
            trainer="cff",
            metric="test_accuracy",
            spec={
                "name": "noise",
                "trainer": "cff",
                "grid": {"margin_mode": list(accuracies)},
                **({"analysis": {"scale": scale}} if scale else {}),
            },
            n_conditions=len(accuracies),
            n_runs=n_runs,
            runs_completed=n_runs,
        )
        session.add(experiment)
        session.commit()
        assert experiment.id is not None
        for mode, values in accuracies.items():
            for seed, p in enumerate(values):
                condition = {"margin_mode": mode}
                session.add(
                    Run(
                        experiment_id=experiment.id,
                        condition=condition,
                        condition_key=condition_key(condition),
                        seed=seed,
                        trainer="cff",
                        status=RunStatus.completed,
                        metrics={
                            "test_accuracy": p,
                            "test_accuracy_noise_floor": p * (1 - p) / n_test,
                            "loss": 1.0,
                        },
                        diagnostics={"n_test": n_test},
                    )
                )
        session.commit()
        experiment_id = experiment.id
    engine.dispose()
    return experiment_id


def test_the_stats_store_serves_the_noise_floor_from_the_trainers_declared_test_set(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    accuracies = {"clamp": [0.80, 0.85, 0.83], "subtract": [0.84, 0.845, 0.842]}
    experiment_id = store_cff_experiment(url, accuracies, n_test=359)
    engine = make_engine(url)
    with Session(engine) as session:
        experiment = session.get(Experiment, experiment_id)
        served = json.loads(
            stats_json(
                session=session,
                experiment=experiment,
                metric=None,
                factor=None,
                offset=0,
                limit=None,
            )
        )
        loss = json.loads(
            stats_json(
                session=session,
                experiment=experiment,
                metric="loss",
                factor=None,
                offset=0,
                limit=None,
            )
        )
    engine.dispose()
    assert served["metric_bounds"] == [0.0, 1.0]
    for condition in served["conditions"]:
        values = accuracies[condition["condition"]["margin_mode"]]
        # cff's own per-run noise-floor metric, averaged: the same facts, one formula
        assert condition["noise_floor_var"] == pytest.approx(
            np.mean([p * (1 - p) / 359 for p in values]), rel=1e-12
        )
        assert condition["noise_floor_share"] == pytest.approx(
            condition["noise_floor_var"] / np.var(values, ddof=1), rel=1e-12
        )
        assert 0 < condition["ci95"][0] < condition["ci95"][1] < 1
    assert [c["noise_floor_var"] for c in loss["conditions"]] == [None, None]
    assert loss["metric_bounds"] is None


def test_trainers_declare_test_sets_and_bounds_only_for_their_own_metrics() -> None:
    assert REGISTRY["cff"].test_set_sizes({"n_test": 359}) == {
        "test_accuracy": 359,
        "test_top5_accuracy": 359,
    }
    assert REGISTRY["feedback"].test_set_sizes({"n_test": 1000}) == {"test_accuracy": 1000}
    assert REGISTRY["ssl"].test_set_sizes({"n_test_in_distribution": 300}) == {
        "knn_accuracy": 300,
        "knn_accuracy_clean": 300,
    }
    assert REGISTRY["collapse"].test_set_sizes({"n_test": 5}) == {}
    assert REGISTRY["cff"].test_set_sizes({}) == {}
    for trainer in REGISTRY.values():
        assert set(trainer.metric_bounds) <= set(trainer.metrics), trainer.name
        declared = trainer.test_set_sizes({"n_test": 10, "n_test_in_distribution": 10})
        assert set(declared) <= set(trainer.metric_bounds), trainer.name
        assert all(low < high for low, high in trainer.metric_bounds.values())


def bundled_like_stats() -> dict:
    """The bundled example's shape (stop_gradient x r, 3 seeds) with made-up values."""
    grid = {"stop_gradient": [False, True], "r": [0.0, 0.1, 0.2, 0.4]}
    rng = np.random.default_rng(5)
    runs = [
        ({"stop_gradient": sg, "r": r}, f"r={r},stop_gradient={str(sg).lower()}", float(v))
        for sg in grid["stop_gradient"]
        for r in grid["r"]
        for v in rng.normal(r, 0.1 + sg, size=3)
    ]
    return json.loads(experiment_stats(metric="min_l2", grid=grid, runs=runs).model_dump_json())


def test_every_comparison_of_three_seeds_has_a_finite_f_interval() -> None:
    for c in bundled_like_stats()["comparisons"]:
        low, high = c["var_ratio_ci95_f"]
        assert 0 < low < high < math.inf


def test_the_compact_cli_view_fits_100_columns_and_all_shows_every_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = bundled_like_stats()
    monkeypatch.setattr(cli.render, "console", Console(width=160, record=True))
    cli.print_stats(stats)
    compact = cli.render.console.export_text()
    assert max(len(line) for line in compact.splitlines()) <= 100
    for column in ("pairing", "var ratio", "primary ci95", "Holm p"):
        assert column in compact
    # the F-test is secondary: in --all, not in the compact table
    assert "F ci95" not in compact and "Holm F p" not in compact
    first = stats["comparisons"][0]
    assert first["within"] is None  # pooled over r: its ratio is the within-cell one
    assert f"{first['var_ratio']:.3g}" in compact.split()
    assert f"{first['marginal_var_ratio']:.3g}" not in compact.split()
    monkeypatch.setattr(cli.render, "console", Console(width=160, record=True))
    cli.print_stats(stats, full=True)
    everything = cli.render.console.export_text()
    for field in first:
        if field not in {"factor", "a", "b", "within", "warnings"}:
            assert f"  {field}: " in everything, field
    assert f"  primary_p: {first['primary_p']:.6g} (raw)" in everything
    assert f"  marginal_var_ratio: {first['marginal_var_ratio']:.6g}\n" in everything
    warned = next(c for c in stats["comparisons"] if c["warnings"])
    assert f"  warning: {warned['warnings'][0]}" in everything
    assert "Holm family: factor r" in everything and "omnibus r" in everything
