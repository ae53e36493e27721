"""Per-run dispatch overhead: seedgrid (HTTP -> SQLite -> dispatcher -> Ray -> SQLite) against
the same runs as bare Ray tasks, in one process on the same local Ray, at equal work.

Each repeat submits N trivial collapse runs (a handful of steps) and measures the wall time from
submission until every result is stored (seedgrid) or returned (bare Ray). Both arms group the
runs alike: --seeds-per-task K seeds a task (the spec's resources.seeds_per_task for seedgrid; a
bare task of K seeds calls the trainer's run_seeds, of one seed its run), so the two do the same
training. The arms alternate which goes first each repeat, so that an order effect (a warm
cache, a busier machine) cancels in the median. The per-run cost of a repeat is wall / N; the
script prints the median over repeats for each arm and their ratio. "Compute alone" is the same
training timed inside a Ray worker (one task of 20 runs), not in this driver, whose threads are
busy serving the API. Target: seedgrid at most 20 ms per run.

    python benchmarks/dispatch.py --runs 200 --repeats 3
    python benchmarks/dispatch.py --runs 200 --seeds-per-task 8   # seed-batched tasks
    python benchmarks/dispatch.py --smoke                          # 16 runs, 2 repeats (CI)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import ray

from service.api.server import BackgroundServer
from service.settings import Settings
from trainers import NullReporter, get_trainer

CONFIG = {"n_samples": 64, "steps": 5}
TRAINER = "collapse"


def train(config: dict[str, Any], seeds: Sequence[int]) -> None:
    """The seeds as one task does them: run for one seed, run_seeds for more."""
    trainer = get_trainer(TRAINER)
    parsed = trainer.Config.model_validate(config)
    if len(seeds) == 1:
        trainer.run(parsed, seeds[0], NullReporter())
        return
    outcomes = trainer.run_seeds(parsed, list(seeds), [NullReporter() for _ in seeds])
    failed = [o for o in outcomes if isinstance(o, Exception)]
    if failed:
        raise failed[0]


@ray.remote(num_cpus=1)
def bare_task(config: dict[str, Any], seeds: list[int]) -> None:
    train(config, seeds)


@ray.remote(num_cpus=1)
def compute_alone(config: dict[str, Any], runs: int, seeds_per_task: int) -> float:
    """Milliseconds per run of `runs` runs trained in this worker in tasks' groups, after one
    group as a warm-up."""
    train(config, list(range(seeds_per_task)))
    started = time.perf_counter()
    for first in range(0, runs, seeds_per_task):
        train(config, list(range(first, min(first + seeds_per_task, runs))))
    return (time.perf_counter() - started) / runs * 1000


def groups(n: int, size: int) -> list[list[int]]:
    return [list(range(first, min(first + size, n))) for first in range(0, n, size)]


def time_bare(n: int, seeds_per_task: int) -> float:
    started = time.perf_counter()
    ray.get([bare_task.remote(CONFIG, seeds) for seeds in groups(n, seeds_per_task)])
    return time.perf_counter() - started


def time_seedgrid(client: httpx.Client, n: int, seeds_per_task: int, repeat: int) -> float:
    spec = {
        "name": f"dispatch-bench-{repeat}",
        "trainer": TRAINER,
        "config": CONFIG,
        "grid": {},
        "seeds": n,
        "resources": {"seeds_per_task": seeds_per_task},
    }
    started = time.perf_counter()
    response = client.post("/experiments", json=spec)
    response.raise_for_status()
    created = response.json()
    while True:
        counts = client.get(f"/experiments/{created['id']}").json()["counts"]
        if counts["completed"] + counts["failed"] + counts["diverged"] == n:
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    assert counts["completed"] == n, counts
    return elapsed


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="runs a repeat (default 200)")
    parser.add_argument("--repeats", type=int, default=None, help="(default 3)")
    parser.add_argument(
        "--seeds-per-task", type=int, default=1, help="seeds a task, in both arms (default 1)"
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="SEEDGRID_MAX_IN_FLIGHT for the service (default: its own)",
    )
    parser.add_argument("--smoke", action="store_true", help="16 runs, 2 repeats (CI)")
    args = parser.parse_args(argv)
    runs = args.runs or (16 if args.smoke else 200)
    repeats = args.repeats or (2 if args.smoke else 3)
    k = args.seeds_per_task
    if runs < 1 or repeats < 1 or k < 1:
        parser.error("--runs, --repeats and --seeds-per-task must be at least 1")

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        compute_ms = ray.get(compute_alone.remote(CONFIG, 20, k))
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(
                database_url=f"sqlite:///{Path(tmp) / 'bench.db'}",
                max_in_flight=args.max_in_flight,
            )
            with (
                BackgroundServer(settings) as server,
                httpx.Client(base_url=server.url, timeout=120) as client,
            ):
                time_bare(2 * k, k)  # warm both arms: worker processes, imports
                time_seedgrid(client, 2 * k, k, -1)
                bare, seedgrid = [], []
                for repeat in range(repeats):
                    arms = ("bare", "seedgrid") if repeat % 2 == 0 else ("seedgrid", "bare")
                    for arm in arms:
                        if arm == "bare":
                            bare.append(time_bare(runs, k) / runs * 1000)
                        else:
                            seedgrid.append(time_seedgrid(client, runs, k, repeat) / runs * 1000)
                    print(
                        f"repeat {repeat} ({arms[0]} first): bare Ray {bare[-1]:.2f} ms/run, "
                        f"seedgrid {seedgrid[-1]:.2f} ms/run",
                        flush=True,
                    )
    finally:
        ray.shutdown()

    bare_ms, seedgrid_ms = statistics.median(bare), statistics.median(seedgrid)
    print(f"runs per repeat: {runs}, repeats: {repeats}, seeds per task: {k}, Ray CPUs: 2")
    print(f"compute alone (the runs in a Ray worker): {compute_ms:.2f} ms/run")
    print(f"bare Ray tasks:  median {bare_ms:.2f} ms/run")
    print(
        f"seedgrid:        median {seedgrid_ms:.2f} ms/run "
        f"(target <= 20 ms: {'met' if seedgrid_ms <= 20 else 'NOT met'})"
    )
    print(f"ratio seedgrid / bare Ray: {seedgrid_ms / bare_ms:.2f}x")
    return {"compute_ms": compute_ms, "bare_ms": bare_ms, "seedgrid_ms": seedgrid_ms}


if __name__ == "__main__":
    main()
