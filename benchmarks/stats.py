"""GET /stats of a large completed experiment: cold (computed), warm (the stored page), and the
poll after one more run completes, beside the per-comparison scipy path /stats used before
(issue 21), in the same process on the same values.

The script writes one completed cff experiment straight into a temporary SQLite file (a
margin_mode x depth grid, 4 x 5 = 20 conditions, the same seeds in every condition, accuracies
with their test-set sizes, so that pairing, the noise floor, the bounded intervals, the Holm
families, the omnibus tests and the warnings are all computed), then asks the real app
(FastAPI's TestClient, the API without a dispatcher) for its statistics: once cold, then R times
warm; then it adds one completed run and asks again (only the comparisons whose cells it joined
are recomputed). The baseline is the earlier path: for every comparison, scipy.stats'
permutation_test (9,999 resamples, log variance ratio), bootstrap (9,999, percentile), levene
and ttest_ind on the raw values, one Python call per comparison (the script stops if it makes
another number of comparisons than /stats). It prints each time and the ratios. The goals: cold
1 s or less and warm 200 ms or less for 1,000 runs.

    python benchmarks/stats.py --runs 1000 --repeats 20
    python benchmarks/stats.py --smoke        # 60 runs, 2 warm requests, seconds (CI)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from scipy import stats
from sqlmodel import Session

from api_schemas import RunStatus
from service.api.app import create_app
from service.settings import Settings
from service.specs import condition_key
from service.storage.db import Experiment, Run, make_engine, upgrade_database

GRID = {"margin_mode": ["clamp", "subtract", "none", "soft"], "depth": [1, 2, 3, 4, 5]}
CONDITIONS = [{"margin_mode": m, "depth": d} for m in GRID["margin_mode"] for d in GRID["depth"]]
N_TEST = 10_000
# --smoke's defaults: 3 seeds a condition, a run of a few seconds
SMOKE = {"runs": 60, "repeats": 2}


def accuracy(rng: np.random.Generator, condition: dict) -> float:
    return float(np.clip(rng.normal(0.6 + 0.05 * condition["depth"], 0.02), 0, 1))


def add_run(session: Session, experiment_id: int, condition: dict, seed: int, value: float) -> None:
    session.add(
        Run(
            experiment_id=experiment_id,
            condition=condition,
            condition_key=condition_key(condition),
            seed=seed,
            trainer="cff",
            status=RunStatus.completed,
            metrics={"test_accuracy": value, "loss": 1.0},
            diagnostics={"n_test": N_TEST},
        )
    )


def write_experiment(url: str, runs: int) -> tuple[int, dict[str, list[float]]]:
    """A completed cff experiment of `runs` runs (seed s in every condition, in turn), and its
    values by condition key."""
    rng = np.random.default_rng(0)
    engine = make_engine(url)
    values: dict[str, list[float]] = {}
    with Session(engine) as session:
        experiment = Experiment(
            name="bench-stats",
            trainer="cff",
            metric="test_accuracy",
            spec={"name": "bench-stats", "trainer": "cff", "grid": GRID},
            n_conditions=len(CONDITIONS),
            n_runs=runs,
            runs_completed=runs,
        )
        session.add(experiment)
        session.commit()
        assert experiment.id is not None
        for i in range(runs):
            condition = CONDITIONS[i % len(CONDITIONS)]
            value = accuracy(rng, condition)
            values.setdefault(condition_key(condition), []).append(value)
            add_run(session, experiment.id, condition, i // len(CONDITIONS), value)
        session.commit()
        experiment_id = experiment.id
    engine.dispose()
    return experiment_id, values


def one_more_run(url: str, experiment_id: int, seed: int) -> None:
    engine = make_engine(url)
    with Session(engine) as session:
        add_run(
            session,
            experiment_id,
            CONDITIONS[0],
            seed,
            accuracy(np.random.default_rng(1), CONDITIONS[0]),
        )
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.runs_completed += 1
        experiment.n_runs += 1
        session.commit()
    engine.dispose()


def earlier_path(values: dict[str, list[float]]) -> int:
    """The per-comparison scipy calls /stats made before issue 21, for every comparison of the
    grid (pooled and within each combination of the other factor); returns how many."""

    def log_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.log(np.var(a, ddof=1, axis=axis) / np.var(b, ddof=1, axis=axis))

    def ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.var(a, ddof=1, axis=axis) / np.var(b, ddof=1, axis=axis)

    def level(factor: str, value: object, within: dict | None) -> np.ndarray:
        return np.array(
            [
                v
                for c in CONDITIONS
                for v in values[condition_key(c)]
                if c[factor] == value and all(c[f] == w for f, w in (within or {}).items())
            ]
        )

    count = 0
    for factor in GRID:
        other = next(f for f in GRID if f != factor)
        for a_level, b_level in itertools.combinations(GRID[factor], 2):
            for within in [None, *({other: v} for v in GRID[other])]:
                a, b = level(factor, a_level, within), level(factor, b_level, within)
                stats.permutation_test(
                    (a, b),
                    log_ratio,
                    permutation_type="independent",
                    vectorized=True,
                    n_resamples=9999,
                    random_state=0,
                )
                stats.bootstrap(
                    (a, b),
                    ratio,
                    vectorized=True,
                    paired=False,
                    n_resamples=9999,
                    method="percentile",
                    random_state=0,
                )
                stats.levene(a, b, center="median")
                stats.ttest_ind(a, b, equal_var=False)
                count += 1
    return count


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20, help="warm requests timed")
    parser.add_argument("--smoke", action="store_true", help="60 runs, 2 warm requests (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade_database(url)
        experiment_id, values = write_experiment(url, args.runs)
        app = create_app(Settings(database_url=url, api_token=""), dispatch=False)
        # a loopback Host: the API refuses another name when it runs without a token
        with TestClient(app, base_url="http://127.0.0.1") as client:
            path = f"/experiments/{experiment_id}/stats"
            started = time.perf_counter()
            cold = client.get(path)
            cold_ms = (time.perf_counter() - started) * 1000
            assert cold.status_code == 200, cold.text
            body = cold.json()
            warm = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                response = client.get(path)
                warm.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200 and response.json() == body
            one_more_run(url, experiment_id, seed=args.runs // len(CONDITIONS))
            started = time.perf_counter()
            polled = client.get(path)
            poll_ms = (time.perf_counter() - started) * 1000
            assert polled.status_code == 200 and polled.json()["n_completed"] == args.runs + 1
        started = time.perf_counter()
        compared = earlier_path(values)
        earlier_ms = (time.perf_counter() - started) * 1000
    if compared != body["total_comparisons"]:
        raise SystemExit(
            f"unequal work: the earlier path made {compared} comparisons, /stats "
            f"{body['total_comparisons']}"
        )
    warm_ms = statistics.median(warm)
    print(
        f"{args.runs:,} runs, {len(body['conditions'])} conditions, "
        f"{body['total_comparisons']} comparisons "
        f"({sum(c['pairing'] == 'paired' for c in body['comparisons'])} paired), "
        f"{len(cold.content):,} bytes"
    )
    print(
        f"earlier path (scipy per comparison, {compared} comparisons, no HTTP): "
        f"{earlier_ms:,.0f} ms"
    )
    print(
        f"cold {cold_ms:,.0f} ms; warm {warm_ms:.1f} ms (median of {args.repeats}, "
        f"max {max(warm):.1f}); after one more run {poll_ms:,.0f} ms"
    )
    print(
        f"cold/earlier {cold_ms / earlier_ms:.3f}; warm/cold {warm_ms / cold_ms:.4f}; "
        f"one-more-run/cold {poll_ms / cold_ms:.3f}"
    )


if __name__ == "__main__":
    main()
