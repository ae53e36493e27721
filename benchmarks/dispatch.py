"""Per-run dispatch overhead: seedgrid (HTTP -> SQLite -> dispatcher -> Ray -> SQLite) against
the same runs as bare Ray tasks, at equal work, on one local Ray (issue 38, item 4).

This process starts the local Ray (2 CPUs) and a `seedgrid serve` in a process of its own
that joins it (SEEDGRID_RAY_ADDRESS), so that both arms share the same workers and CPUs; the
seedgrid arm is driven over HTTP from here, like any client, polling the experiment every
--poll-ms. Each repeat submits N trivial collapse runs (a handful of steps) and measures the
wall time from submission until every result is stored (seedgrid) or returned (bare Ray). Both
arms group the runs alike: --seeds-per-task K seeds a task (the spec's
resources.seeds_per_task for seedgrid; a bare task of K seeds calls the trainer's run_seeds,
of one seed its run), so the two do the same training. The arms alternate which goes first
each repeat, so that an order effect (a warm cache, a busier machine) cancels in the median.
The per-run cost of a repeat is wall / N; the script prints the median over repeats for each
arm, their ratio, and the goal as a ratio: seedgrid at most 2x bare Ray at one seed a task,
1.5x at more. "Compute alone" is the same training timed inside a Ray worker (one task of 20
runs), the floor under both.

    python benchmarks/dispatch.py --runs 1000 --repeats 3
    python benchmarks/dispatch.py --runs 1000 --seeds-per-task 8   # seed-batched tasks
    python benchmarks/dispatch.py --smoke                           # 16 runs, 2 repeats (CI)
"""

from __future__ import annotations

import argparse
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
import ray

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(
    db_path: Path, port: int, token: str, max_in_flight: int | None
) -> subprocess.Popen[bytes]:
    """`seedgrid serve` (the API and the dispatcher) in its own process, joining this
    process's Ray."""
    env = {
        **os.environ,
        "SEEDGRID_RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "SEEDGRID_DATABASE_URL": f"sqlite:///{db_path}",
        "SEEDGRID_PORT": str(port),
        "SEEDGRID_API_TOKEN": token,
        "SEEDGRID_LOG_LEVEL": "warning",
    }
    if max_in_flight is not None:
        env["SEEDGRID_MAX_IN_FLIGHT"] = str(max_in_flight)
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "serve"], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"seedgrid serve exited with {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit("seedgrid serve did not answer /healthz in 120 s")


def stop_service(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def time_seedgrid(
    client: httpx.Client, n: int, seeds_per_task: int, repeat: int, poll_s: float
) -> float:
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
        time.sleep(poll_s)
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
    parser.add_argument(
        "--poll-ms", type=float, default=50.0, help="the client's poll interval (default 50)"
    )
    parser.add_argument("--smoke", action="store_true", help="16 runs, 2 repeats (CI)")
    args = parser.parse_args(argv)
    runs = args.runs or (16 if args.smoke else 200)
    repeats = args.repeats or (2 if args.smoke else 3)
    k = args.seeds_per_task
    if runs < 1 or repeats < 1 or k < 1:
        parser.error("--runs, --repeats and --seeds-per-task must be at least 1")

    # Two jobs share the workers' pool (this driver's and serve's): past its soft limit (the
    # CPU count) Ray kills idle workers, and each of the other job's tasks would then start a
    # worker and import torch again (seconds a task): room for both jobs' workers.
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _system_config={"num_workers_soft_limit": 8},
    )
    try:
        compute_ms = ray.get(compute_alone.remote(CONFIG, 20, k))
        with tempfile.TemporaryDirectory() as tmp:
            port, token = free_port(), secrets.token_urlsafe(16)
            service = start_service(Path(tmp) / "bench.db", port, token, args.max_in_flight)
            poll_s = args.poll_ms / 1000
            try:
                with httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=120,
                ) as client:
                    time_bare(2 * k, k)  # warm both arms: worker processes, imports
                    time_seedgrid(client, 2 * k, k, -1, poll_s)
                    bare, seedgrid = [], []
                    for repeat in range(repeats):
                        arms = ("bare", "seedgrid") if repeat % 2 == 0 else ("seedgrid", "bare")
                        for arm in arms:
                            if arm == "bare":
                                bare.append(time_bare(runs, k) / runs * 1000)
                            else:
                                wall = time_seedgrid(client, runs, k, repeat, poll_s)
                                seedgrid.append(wall / runs * 1000)
                        print(
                            f"repeat {repeat} ({arms[0]} first): bare Ray {bare[-1]:.2f} ms/run, "
                            f"seedgrid {seedgrid[-1]:.2f} ms/run",
                            flush=True,
                        )
            finally:
                stop_service(service)
    finally:
        ray.shutdown()

    bare_ms, seedgrid_ms = statistics.median(bare), statistics.median(seedgrid)
    print(f"runs per repeat: {runs}, repeats: {repeats}, seeds per task: {k}, Ray CPUs: 2")
    print(f"compute alone (the runs in a Ray worker): {compute_ms:.2f} ms/run")
    print(f"bare Ray tasks:  median {bare_ms:.2f} ms/run")
    print(
        f"seedgrid:        median {seedgrid_ms:.2f} ms/run (serve in its own process, polled "
        f"over HTTP every {args.poll_ms:g} ms)"
    )
    goal = 2.0 if k == 1 else 1.5
    ratio = seedgrid_ms / bare_ms
    print(
        f"ratio seedgrid / bare Ray: {ratio:.2f}x (goal <= {goal:g}x at {k} seed"
        f"{'s' if k > 1 else ''} a task: {'met' if ratio <= goal else 'NOT met'})"
    )
    return {"compute_ms": compute_ms, "bare_ms": bare_ms, "seedgrid_ms": seedgrid_ms}


if __name__ == "__main__":
    main()
