"""Per-run dispatch overhead: seedgrid (HTTP -> SQLite -> dispatcher -> Ray -> SQLite) against
the same runs as bare Ray tasks, in one process on the same local Ray.

Each repeat submits N trivial collapse runs (a handful of steps) and measures the wall time from
submission until every result is stored (seedgrid) or returned (bare Ray). The per-run cost of a
repeat is wall / N; the script prints the median over repeats for each path and their ratio.
Target: seedgrid at most 20 ms per run.

    python benchmarks/dispatch.py --runs 200 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import ray

from service.api.server import BackgroundServer
from service.settings import Settings
from trainers import NullReporter, get_trainer

CONFIG = {"n_samples": 64, "steps": 5}


@ray.remote(num_cpus=1)
def bare_run(config: dict, seed: int) -> dict:
    trainer = get_trainer("collapse")
    return trainer.run(trainer.Config.model_validate(config), seed, NullReporter()).as_dict()


def time_bare(n: int) -> float:
    started = time.perf_counter()
    ray.get([bare_run.remote(CONFIG, seed) for seed in range(n)])
    return time.perf_counter() - started


def time_seedgrid(client: httpx.Client, n: int, repeat: int) -> float:
    spec = {
        "name": f"dispatch-bench-{repeat}",
        "trainer": "collapse",
        "config": CONFIG,
        "grid": {},
        "seeds": n,
    }
    started = time.perf_counter()
    created = client.post("/experiments", json=spec).json()
    while True:
        counts = client.get(f"/experiments/{created['id']}").json()["counts"]
        if counts["completed"] + counts["failed"] + counts["diverged"] == n:
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    assert counts["completed"] == n, counts
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="SEEDGRID_MAX_IN_FLIGHT for the service (default: its own)",
    )
    args = parser.parse_args()

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    trainer = get_trainer("collapse")
    trainer.run(trainer.Config.model_validate(CONFIG), 0, NullReporter())  # warm-up
    started = time.perf_counter()
    for seed in range(20):
        trainer.run(trainer.Config.model_validate(CONFIG), seed, NullReporter())
    compute_ms = (time.perf_counter() - started) / 20 * 1000

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'bench.db'}", max_in_flight=args.max_in_flight
        )
        with (
            BackgroundServer(settings) as server,
            httpx.Client(base_url=server.url, timeout=120) as client,
        ):
            time_bare(20)  # warm both paths: worker processes, imports
            time_seedgrid(client, 20, -1)
            bare, seedgrid = [], []
            for repeat in range(args.repeats):
                bare.append(time_bare(args.runs) / args.runs * 1000)
                seedgrid.append(time_seedgrid(client, args.runs, repeat) / args.runs * 1000)
                print(
                    f"repeat {repeat}: bare Ray {bare[-1]:.2f} ms/run, "
                    f"seedgrid {seedgrid[-1]:.2f} ms/run",
                    flush=True,
                )

    bare_ms, seedgrid_ms = statistics.median(bare), statistics.median(seedgrid)
    print(f"runs per repeat: {args.runs}, repeats: {args.repeats}, Ray CPUs: 2")
    print(f"trainer compute alone (in process): {compute_ms:.2f} ms/run")
    print(f"bare Ray tasks:  median {bare_ms:.2f} ms/run")
    print(
        f"seedgrid:        median {seedgrid_ms:.2f} ms/run "
        f"(target <= 20 ms: {'met' if seedgrid_ms <= 20 else 'NOT met'})"
    )
    print(f"ratio seedgrid / bare Ray: {seedgrid_ms / bare_ms:.2f}x")
    ray.shutdown()


if __name__ == "__main__":
    main()
