"""What watching costs: the completion time of an experiment of `--runs` small runs while a
client watches it as the dashboard's experiment page does, against the same experiment
unwatched, on one `seedgrid serve` (a subprocess: its own Ray and SQLite file, the token on; the
client in this process). The arms alternate, `--rounds` times: unwatched, watched with the
curves batched, watched with a request per run's curve (as the dashboard asked before
GET /experiments/{id}/curves).

A watcher does what the page does every refresh (REFRESH_S, 3 s): the experiment's detail, its
runs (pages of 1,000), one /stats page (limit 2,000), its params, and the curves of its first
20 started runs per condition (200 in all), an ended run's only once (the page caches them).
Every arm also polls the detail every 0.5 s to see the experiment end (the only client of the
unwatched arm). Prints each arm's seconds, its requests, and the ratio to the unwatched arm of
the same round; the goal (issue 38): watched <= 1.1 x unwatched at 1,000 runs.

    python benchmarks/watch.py                 # 1,000 runs (10 conditions x 100 seeds, a task
                                               # per run, 200 steps), 2 rounds
    python benchmarks/watch.py --steps 2000    # longer runs: more refreshes, longer curves
    python benchmarks/watch.py --smoke         # 20 runs, 1 round (CI)

Measured here (2 cores, 2026-12-07, `--steps 2000 --rounds 3`): 1,000 runs end in 32-34 s
unwatched; watched with batched curves 1.098, 1.081, 1.094x (65-71 watcher requests), with a
request per curve 1.147, 1.067, 1.018x (254-262 requests): the batch cuts the watcher's requests
by about 3.7x, not measurably the completion time at this size (docs/load-test.md).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import ENDED, free_port, start_service, wait_healthy  # noqa: E402

REFRESH_S = 3.0
END_POLL_S = 0.5
RUNS_PAGE = 1000
CURVES_PER_CONDITION, CURVES_IN_ALL, CURVE_RUNS = 20, 200, 20
GOAL = 1.1


def spec(name: str, conditions: int, seeds: int, steps: int) -> dict[str, object]:
    return {
        "name": name,
        "trainer": "collapse",
        "config": {"n_samples": 64, "steps": steps, "log_every": max(1, steps // 10)},
        "grid": {"r": [round(0.05 + 0.01 * i, 4) for i in range(conditions)]},
        "seeds": seeds,
        "metric": "min_l2",
        # a task per run: the per-run path a watcher competes with (seed-batched, 1,000 runs
        # of this size end in about 2 s, before a watcher's first refresh has ended)
        "resources": {"seeds_per_task": 1},
    }


async def watch_page(
    client: httpx.AsyncClient, experiment_id: int, batched: bool, done: asyncio.Event
) -> int:
    """The dashboard's refreshes of the experiment page until the experiment ends; returns the
    requests made."""
    requests = 0
    cached: set[int] = set()  # ended runs whose curve the page has

    async def get(url: str, **params: object) -> httpx.Response:
        nonlocal requests
        requests += 1
        response = await client.get(url, params=params)  # type: ignore[arg-type]
        response.raise_for_status()
        return response

    base = f"/experiments/{experiment_id}"
    while not done.is_set():
        await get(base)
        runs: list[dict[str, object]] = []
        offset = 0
        while True:
            page = (await get(f"{base}/runs", limit=RUNS_PAGE, offset=offset)).json()
            runs += page
            if len(page) < RUNS_PAGE:
                break
            offset += RUNS_PAGE
        if any(r["status"] == "completed" for r in runs):
            await get(f"{base}/stats", limit=2000, offset=0)
        await get(f"{base}/params")
        chosen: list[dict[str, object]] = []
        per_condition: dict[object, int] = {}
        for run in runs:
            key = run["condition_key"]
            if run["started_at"] is not None and per_condition.get(key, 0) < CURVES_PER_CONDITION:
                per_condition[key] = per_condition.get(key, 0) + 1
                chosen.append(run)
        wanted = [r for r in chosen[:CURVES_IN_ALL] if r["id"] not in cached]
        if batched:
            for i in range(0, len(wanted), CURVE_RUNS):
                batch = [r["id"] for r in wanted[i : i + CURVE_RUNS]]
                await get(f"{base}/curves", name="loss", run=batch)
        else:
            await asyncio.gather(
                *(get(f"/runs/{r['id']}/metrics", name="loss", limit=10_000) for r in wanted)
            )
        cached |= {int(str(r["id"])) for r in wanted if r["status"] in ENDED | {"stopped"}}
        try:
            await asyncio.wait_for(done.wait(), REFRESH_S)
        except TimeoutError:
            pass
    return requests


async def one_arm(
    client: httpx.AsyncClient, name: str, args: argparse.Namespace, watcher: str | None
) -> tuple[float, int, int]:
    """Submit, watch (or not) and wait for the end; (seconds to the end, watcher requests,
    runs completed)."""
    started = time.monotonic()
    response = await client.post(
        "/experiments", json=spec(name, args.conditions, args.seeds, args.steps)
    )
    response.raise_for_status()
    experiment_id = response.json()["id"]
    done = asyncio.Event()
    watching = (
        asyncio.create_task(watch_page(client, experiment_id, watcher == "batched", done))
        if watcher
        else None
    )
    while (detail := (await client.get(f"/experiments/{experiment_id}")).json())[
        "status"
    ] not in ENDED:
        if time.monotonic() - started > args.timeout_s:
            raise SystemExit(f"experiment {experiment_id} did not end in {args.timeout_s} s")
        await asyncio.sleep(END_POLL_S)
    elapsed = time.monotonic() - started
    done.set()
    requests = await watching if watching else 0
    if detail["status"] != "completed":  # equal work only: every run trained to its end
        raise SystemExit(
            f"experiment {experiment_id} ended {detail['status']}: {detail['counts']} "
            f"{detail.get('message') or ''}"
        )
    return elapsed, requests, int(detail["counts"]["completed"])


async def run(url: str, token: str, args: argparse.Namespace) -> dict[str, list[float]]:
    arms = ["unwatched", "batched", "per-run"]
    ratios: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
    async with httpx.AsyncClient(
        base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        # untimed: Ray starts its workers (a first arm took 30% longer than the same arm later)
        warm, _, _ = await one_arm(
            client,
            "warm-up",
            argparse.Namespace(**{**vars(args), "seeds": max(1, args.seeds // 10)}),
            None,
        )
        print(
            f"warm-up experiment ({args.conditions * max(1, args.seeds // 10)} runs) ended in "
            f"{warm:.1f} s"
        )
        for round_ in range(args.rounds):
            times: dict[str, float] = {}
            # each round starts with another arm: none always runs first
            for arm in arms[round_ % 3 :] + arms[: round_ % 3]:
                watcher = None if arm == "unwatched" else arm
                times[arm], requests, completed = await one_arm(
                    client, f"{arm}-{round_}", args, watcher
                )
                print(
                    f"round {round_ + 1} {arm:>9}: {times[arm]:7.1f} s, {requests} requests, "
                    f"{completed} runs completed"
                )
            for arm in arms[1:]:
                ratios[arm].append(times[arm] / times["unwatched"])
    return ratios


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=1200.0)
    parser.add_argument("--smoke", action="store_true", help="20 runs, one round (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.conditions, args.seeds, args.rounds = 2, 10, 1
    runs = args.conditions * args.seeds
    token = secrets.token_urlsafe(24)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="seedgrid-watch-") as tmp:
        process = start_service(Path(tmp) / "watch.db", port, token, args.ray_cpus)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, process)
            ratios = asyncio.run(run(url, token, args))
        finally:
            process.terminate()
            process.wait(60)
    print(
        f"\n{runs} runs ({args.conditions} conditions x {args.seeds} seeds), {args.rounds} rounds"
    )
    for arm, values in ratios.items():
        median = statistics.median(values)
        verdict = "met" if median <= GOAL else "not met"
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"watched ({arm} curves) / unwatched: {shown}; median {median:.3f} "
            f"(goal <= {GOAL}: {verdict})"
        )


if __name__ == "__main__":
    main()
