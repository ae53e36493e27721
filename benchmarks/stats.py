"""GET /stats of a large completed experiment through a real `seedgrid serve` (a subprocess,
the API only: --no-dispatch), asked over HTTP from this process: cold (computed), warm (the
stored page), the poll after one more run completes, then the same after a restart of the
service (the stored page, and one more run: only the comparisons whose cells it joined are
computed, the rest read from the stored comparison results), beside the per-comparison scipy
path /stats used before (issue 21) on the same values.

The script writes one completed cff experiment straight into a temporary SQLite file (a
margin_mode x depth grid, --levels A B conditions, the same seeds in every condition,
accuracies with their test-set sizes, so that pairing, the noise floor, the bounded intervals,
the Holm families, the omnibus tests and the warnings are all computed) and asks for its first
page (at most 2,000 comparisons). The baseline, for ratios measured in the same run, is the
cold request; the earlier path (for every comparison scipy.stats' permutation_test with 9,999
resamples of the log variance ratio, bootstrap 9,999 percentile, levene and ttest_ind, one
Python call per comparison; the script stops if it makes another number of comparisons than
/stats) is timed where the experiment has at most --earlier-max comparisons. Goals (issue 38):
cold <= 1 s at 1,000 runs and <= 3 s at 10,000 runs, warm <= 10 ms, one more run <= 100 ms
at 1,000 runs; the script prints each against its goal.

    python benchmarks/stats.py --runs 1000 --repeats 20
    python benchmarks/stats.py --runs 1000 --levels 10 10
    python benchmarks/stats.py --runs 10000 --levels 20 10
    python benchmarks/stats.py --smoke        # 60 runs, 2 warm requests, seconds (CI)
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from scipy import stats
from sqlmodel import Session

from api_schemas import RunStatus
from service.specs import condition_key
from service.storage.db import Experiment, Run, make_engine, upgrade_database

MODES = ["clamp", "subtract", "none", "soft", "hinge", "square", "log", "exp", "tanh", "abs"]
MODES += [f"mode{i}" for i in range(10, 50)]
N_TEST = 10_000
# --smoke's defaults: 3 seeds a condition, a run of a few seconds
SMOKE = {"runs": 60, "repeats": 2}
PAGE = 2000  # the first page: at most this many comparisons (MAX_COMPARISONS_PER_PAGE)
GOALS_MS = {"warm": 10.0, "one more run (1,000 runs)": 100.0}


def grid_of(levels: Sequence[int]) -> dict[str, list[Any]]:
    return {"margin_mode": MODES[: levels[0]], "depth": list(range(1, levels[1] + 1))}


def conditions_of(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [{"margin_mode": m, "depth": d} for m in grid["margin_mode"] for d in grid["depth"]]


def accuracy(rng: np.random.Generator, condition: dict) -> float:
    # deeper is better, saturating below 1 whatever the number of depths
    return float(np.clip(rng.normal(0.95 - 0.35 / condition["depth"], 0.02), 0, 1))


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


def write_experiment(
    url: str, runs: int, grid: dict[str, list[Any]]
) -> tuple[int, dict[str, list[float]]]:
    """A completed cff experiment of `runs` runs (seed s in every condition, in turn), and its
    values by condition key."""
    conditions = conditions_of(grid)
    rng = np.random.default_rng(0)
    engine = make_engine(url)
    values: dict[str, list[float]] = {}
    with Session(engine) as session:
        experiment = Experiment(
            name="bench-stats",
            trainer="cff",
            metric="test_accuracy",
            spec={"name": "bench-stats", "trainer": "cff", "grid": grid},
            n_conditions=len(conditions),
            n_runs=runs,
            runs_completed=runs,
        )
        session.add(experiment)
        session.commit()
        assert experiment.id is not None
        for i in range(runs):
            condition = conditions[i % len(conditions)]
            value = accuracy(rng, condition)
            values.setdefault(condition_key(condition), []).append(value)
            add_run(session, experiment.id, condition, i // len(conditions), value)
        session.commit()
        experiment_id = experiment.id
    engine.dispose()
    return experiment_id, values


def one_more_run(url: str, experiment_id: int, condition: dict[str, Any], seed: int) -> None:
    """A run completing, written as the dispatcher writes it: the run and the count."""
    engine = make_engine(url)
    with Session(engine) as session:
        add_run(
            session,
            experiment_id,
            condition,
            seed,
            accuracy(np.random.default_rng(seed), condition),
        )
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.runs_completed += 1
        experiment.n_runs += 1
        session.commit()
    engine.dispose()


def earlier_path(values: dict[str, list[float]], grid: dict[str, list[Any]]) -> int:
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
                for c in conditions_of(grid)
                for v in values[condition_key(c)]
                if c[factor] == value and all(c[f] == w for f, w in (within or {}).items())
            ]
        )

    count = 0
    for factor in grid:
        other = next(f for f in grid if f != factor)
        for a_level, b_level in itertools.combinations(grid[factor], 2):
            for within in [None, *({other: v} for v in grid[other])]:
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """`seedgrid serve --no-dispatch` on the SQLite file, in a process of its own."""

    def __init__(self, db_path: Path) -> None:
        self.port = free_port()
        self.token = secrets.token_urlsafe(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_path = db_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        env = {
            **os.environ,
            "SEEDGRID_DATABASE_URL": f"sqlite:///{self.db_path}",
            "SEEDGRID_PORT": str(self.port),
            "SEEDGRID_API_TOKEN": self.token,
            "SEEDGRID_LOG_LEVEL": "warning",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--no-dispatch"], env=env
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"seedgrid serve exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"seedgrid serve did not answer /healthz in {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def timed_get(client: httpx.Client, path: str, params: dict[str, Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    response = client.get(path, params=params)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise SystemExit(f"GET {path}: {response.status_code} {response.text[:500]}")
    return elapsed, response


def verdict(value_ms: float, goal_ms: float) -> str:
    return f"goal <= {goal_ms:,.0f} ms ({value_ms / goal_ms:.2f}x of it): " + (
        "met" if value_ms <= goal_ms else "NOT met"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--levels", type=int, nargs=2, default=[4, 5], metavar=("A", "B"), help="grid shape"
    )
    parser.add_argument("--repeats", type=int, default=20, help="warm requests timed")
    parser.add_argument(
        "--earlier-max",
        type=int,
        default=300,
        help="time the earlier scipy path only up to this many comparisons",
    )
    parser.add_argument("--smoke", action="store_true", help="60 runs, 2 warm requests (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    if not 2 <= args.levels[0] <= len(MODES) or args.levels[1] < 2:
        parser.error(f"--levels: 2 to {len(MODES)} margin modes and at least 2 depths")
    grid = grid_of(args.levels)
    conditions = conditions_of(grid)
    seeds = args.runs // len(conditions)
    with tempfile.TemporaryDirectory() as tmp:
        db_path = Path(tmp) / "bench.db"
        url = f"sqlite:///{db_path}"
        upgrade_database(url)
        experiment_id, values = write_experiment(url, args.runs, grid)
        service = Service(db_path)
        path = f"/experiments/{experiment_id}/stats"
        params = {"limit": PAGE}
        try:
            service.start()
            headers = {"Authorization": f"Bearer {service.token}"}
            with httpx.Client(base_url=service.url, headers=headers, timeout=600) as client:
                cold_ms, cold = timed_get(client, path, params)
                body = cold.json()
                warm = []
                for _ in range(args.repeats):
                    elapsed, response = timed_get(client, path, params)
                    warm.append(elapsed)
                    if response.json() != body:
                        raise SystemExit("a warm request answered other statistics than cold")
                one_more_run(url, experiment_id, conditions[0], seed=seeds)
                poll_ms, polled = timed_get(client, path, params)
                assert polled.json()["n_completed"] == args.runs + 1
            service.stop()
            service.start()
            with httpx.Client(base_url=service.url, headers=headers, timeout=600) as client:
                stored_ms, stored = timed_get(client, path, params)
                assert stored.json()["n_completed"] == args.runs + 1
                one_more_run(url, experiment_id, conditions[1], seed=seeds)
                restart_ms, restarted = timed_get(client, path, params)
                assert restarted.json()["n_completed"] == args.runs + 2
        finally:
            service.stop()
    total = body["total_comparisons"]
    earlier_ms = None
    if total <= args.earlier_max:
        started = time.perf_counter()
        compared = earlier_path(values, grid)
        earlier_ms = (time.perf_counter() - started) * 1000
        if compared != total:
            raise SystemExit(
                f"unequal work: the earlier path made {compared} comparisons, /stats {total}"
            )
    warm_ms = statistics.median(warm)
    print(
        f"{args.runs:,} runs, {len(body['conditions'])} conditions, {total:,} comparisons "
        f"({len(body['comparisons']):,} on the first page, "
        f"{sum(c['pairing'] == 'paired' for c in body['comparisons']):,} paired), "
        f"{len(cold.content):,} bytes; seedgrid serve in its own process, HTTP from this one"
    )
    if earlier_ms is None:
        print(f"earlier path: not timed ({total:,} comparisons > --earlier-max {args.earlier_max})")
    else:
        print(
            f"earlier path (scipy per comparison, {total} comparisons, no HTTP): "
            f"{earlier_ms:,.0f} ms"
        )
    print(
        f"cold {cold_ms:,.0f} ms; warm {warm_ms:.1f} ms (median of {args.repeats}, "
        f"max {max(warm):.1f}); after one more run {poll_ms:,.0f} ms"
    )
    print(f"after a restart: stored page {stored_ms:.1f} ms; one more run {restart_ms:,.0f} ms")
    ratios = [
        f"warm/cold {warm_ms / cold_ms:.4f}",
        f"one-more-run/cold {poll_ms / cold_ms:.3f}",
        f"after-restart one-more-run/cold {restart_ms / cold_ms:.3f}",
    ]
    if earlier_ms is not None:
        ratios.insert(0, f"cold/earlier {cold_ms / earlier_ms:.3f}")
    print("; ".join(ratios))
    cold_goal = 1000.0 if args.runs <= 1000 else 3000.0 if args.runs <= 10_000 else None
    if cold_goal is not None:
        print(f"cold: {verdict(cold_ms, cold_goal)}")
    print(f"warm: {verdict(warm_ms, GOALS_MS['warm'])}")
    if args.runs <= 1000:
        print(f"one more run: {verdict(poll_ms, GOALS_MS['one more run (1,000 runs)'])}")
        print(f"one more run after a restart: {verdict(restart_ms, 100.0)}")


if __name__ == "__main__":
    main()
