"""Crash soak of the embedded default mode: `seedgrid serve` (the API, the dispatcher and its own
local Ray on one SQLite file) is killed with SIGKILL again and again while an experiment runs,
and restarted on the same file each time. Every run must end exactly once, with exactly the metric
curve its trainer logs, and a run completed before a kill must never run again.

What a SIGKILLed serve leaves of its local Ray (Ray 2.60, measured here): gcs_server, raylet and
the other head processes die with it within ~0.5 s; the workers (each in its own process group,
in the serve's session) exit within ~2 s, one possibly still inside a task until then; the
dashboard and runtime-env agents (in the serve's process group) linger for about a minute,
blocked reporting the raylet's death to the dead GCS. None of them can write to the database,
and a restarted serve starts a Ray of its own (ray.init without an address joins only a cluster
named by RAY_ADDRESS or by `ray start`'s address file). The test still kills the dead serve's
whole session before restarting, so that no leftover takes CPU from the next serve.

The kill moments come from a seeded random generator: SEEDGRID_SOAK_SEED=<seed> replays the
schedule of a failed run (the timing of the machine itself does not replay).
"""

from __future__ import annotations

import math
import os
import random
import re
import signal
import sqlite3
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from service.api.server import free_port
from tests.cluster import alive_in_sessions, kill_sessions, processes, run_ids_of
from tests.seedgrid_process import SeedgridProcess
from trainers import MemoryReporter, get_trainer

# The phase of a serve's life each of the 6 kills aims at; the seed shuffles their order.
PHASES = ["starting"] * 3 + ["running"] * 2 + ["completing"]
# ~0.5 s per run in a warm Ray worker here (seconds in a fresh one).
CONFIG = {"n_samples": 200, "steps": 3000, "r": 0.1}
GRID = {"stop_gradient": [False, True]}
SEEDS = 10
# How many runs a kill that aims at a running serve wants left to do. The dispatcher batches
# the seeds of a condition (up to 8 in one task), and they complete together: on a busy machine
# a kill aimed at a running serve once came after the last 10 runs had completed (CI, stop 41).
# So before such a kill the test adds seeds, as a user may, until this many runs are left: the
# experiment lasts as long as the kills need it on any machine, not on the one it was sized on.
HEADROOM_RUNS = 16
TOP_UP_SEEDS = 8
# A kill charges an attempt only to the runs a worker had started (at most two here); with
# this many retries no run can fail for want of them.
MAX_RETRIES = 20
# A few runs queued in Ray behind the two running, so that a kill catches queued ones too.
MAX_IN_FLIGHT = 4
ACTIVE = re.compile(r"dispatcher (\S+) is active")
OWN_RAY = "Started a local Ray instance"
POINT_TOLERANCE = {"rel_tol": 1e-9, "abs_tol": 1e-12}


@dataclass
class Snapshot:
    """The experiment as the SQLite file holds it while no serve runs."""

    runs: dict[int, tuple[str, int, str | None]]  # id -> (status, attempts, finished_at)
    # (attempt, outcome, error, worker pid: None when no worker reported starting it)
    attempts: dict[int, list[tuple[int, str | None, str | None, int | None]]]
    points: dict[int, list[tuple[Any, ...]]]  # completed runs' (name, step, epoch, value)

    def with_status(self, status: str) -> dict[int, int]:
        """Run id -> attempts, of the runs in this status."""
        return {i: a for i, (s, a, _) in self.runs.items() if s == status}


@dataclass
class Kill:
    phase: str  # the phase aimed at
    at_s: float  # after the process started
    ray_up: bool
    active: bool
    executing: set[int]  # runs a worker of this serve was executing at the kill
    left_running: dict[int, int]  # runs `running` in the database after it, with their attempt
    left_pending: dict[int, int]  # runs `pending` (handed to Ray, not started), likewise
    completed: int
    leftovers: list[str]  # processes of its session alive after it exited

    def describe(self) -> str:
        state = "dispatcher active" if self.active else ("Ray up" if self.ray_up else "before Ray")
        return (
            f"aimed at {self.phase}, {self.at_s:.1f} s after start ({state}); executing "
            f"{sorted(self.executing)}; left running {sorted(self.left_running)}, pending "
            f"{sorted(self.left_pending)}; {self.completed} completed; leftovers killed: "
            f"{self.leftovers}"
        )


def serve_env(database: Path) -> dict[str, str]:
    """The embedded default mode on a SQLite file, with a local Ray of its own."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_") and k != "RAY_ADDRESS"
    }
    env.update(
        SEEDGRID_DATABASE_URL=f"sqlite:///{database}",
        SEEDGRID_RAY_NUM_CPUS="2",
        SEEDGRID_METRICS_BATCH_INTERVAL_S="0.1",
        SEEDGRID_MAX_IN_FLIGHT=str(MAX_IN_FLIGHT),
        SEEDGRID_LOG_LEVEL="info",
        SEEDGRID_HOST="127.0.0.1",
        SEEDGRID_PORT=str(free_port()),
    )
    return env


def snapshot(database: Path, experiment_id: int) -> Snapshot:
    with closing(sqlite3.connect(database)) as db:
        runs = {
            i: (s, a, f)
            for i, s, a, f in db.execute(
                "SELECT id, status, attempts, finished_at FROM run WHERE experiment_id = ?",
                (experiment_id,),
            )
        }
        attempts: dict[int, list[tuple[int, str | None, str | None, int | None]]] = defaultdict(
            list
        )
        for run_id, attempt, outcome, error, pid in db.execute(
            "SELECT a.run_id, a.attempt, a.outcome, a.error, a.worker_pid FROM runattempt a "
            "JOIN run r ON r.id = a.run_id WHERE r.experiment_id = ? ORDER BY a.run_id, a.attempt",
            (experiment_id,),
        ):
            attempts[run_id].append((attempt, outcome, error, pid))
        points: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
        for run_id, *point in db.execute(
            "SELECT p.run_id, p.name, p.step, p.epoch, p.value FROM metricpoint p "
            "JOIN run r ON r.id = p.run_id WHERE r.experiment_id = ? AND r.status = 'completed' "
            # the trainer's points; the system series (sys/...) are the hardware's
            "AND p.name NOT LIKE 'sys/%' ORDER BY p.run_id, p.name, p.step, p.id",
            (experiment_id,),
        ):
            points[run_id].append(tuple(point))
    return Snapshot(runs, dict(attempts), dict(points))


def executing_runs(session: int) -> set[int]:
    """Runs a Ray worker of this session executes now (Ray titles a worker after its task)."""
    return {
        run_id for proc in processes() if proc.session == session for run_id in run_ids_of(proc)
    }


def reference_curves(seeds: range | list[int]) -> dict[tuple[bool, int], list[tuple[Any, ...]]]:
    """(stop_gradient, seed) -> the (name, step, epoch, value) points the trainer logs, sorted
    as `snapshot` sorts them; computed here, one thread, as a Ray worker computes them."""
    trainer = get_trainer("collapse")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        curves = {}
        for stop_gradient in GRID["stop_gradient"]:
            for seed in seeds:
                reporter = MemoryReporter()
                config = trainer.Config(**{**CONFIG, "stop_gradient": stop_gradient})
                trainer.run(config, seed, reporter)
                curves[stop_gradient, seed] = sorted(
                    (name, step, epoch, value) for step, epoch, name, value in reporter.points
                )
        return curves
    finally:
        torch.set_num_threads(threads)


def wait_until(
    condition: Callable[[], bool], what: str, process: SeedgridProcess, timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.process.poll() is None, f"{process.name} exited:\n{process.log()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{process.log()}"
        time.sleep(0.02)


def counts(process: SeedgridProcess, experiment_id: int) -> dict[str, int] | None:
    """The experiment's run counts over HTTP; None while the API does not answer yet."""
    try:
        response = httpx.get(f"{process.url}/experiments/{experiment_id}", timeout=10)
    except httpx.HTTPError:
        return None
    return response.json()["counts"] if response.status_code == 200 else None


def top_up(process: SeedgridProcess, experiment_id: int) -> list[int]:
    """Once the serve's API answers: the seeds added to the experiment so that at least
    HEADROOM_RUNS of its runs are left to do (none if that many are)."""
    deadline = time.monotonic() + 90
    while (now := counts(process, experiment_id)) is None:
        assert process.process.poll() is None, f"{process.name} exited:\n{process.log()}"
        assert time.monotonic() < deadline, f"timed out waiting for the API:\n{process.log()}"
        time.sleep(0.02)
    left = now["queued"] + now["pending"] + now["running"]
    if left >= HEADROOM_RUNS:
        return []
    response = httpx.post(
        f"{process.url}/experiments/{experiment_id}/seeds",
        json={"seeds": TOP_UP_SEEDS},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return list(response.json()["seeds"])


def ended(process: SeedgridProcess, experiment_id: int) -> bool:
    now = counts(process, experiment_id)
    return now is not None and now["queued"] == now["pending"] == now["running"] == 0


def reach(
    phase: str,
    process: SeedgridProcess,
    *,
    rng: random.Random,
    since: float,
    startup_s: float,
    experiment_id: int,
    completed_before: int,
) -> None:
    """Wait for the moment of the serve's life that a kill aims at."""
    if phase == "starting":  # anywhere in start-up: imports, migrations, Ray, the take-over
        time.sleep(max(0.0, since + rng.uniform(0.0, 0.9 * startup_s) - time.monotonic()))
    elif phase == "running":  # a worker is inside a run, and the database says so
        session = process.process.pid

        def inside_a_run() -> bool:
            # A task's process title comes first; its start is stored only once the fresh
            # worker has imported and warmed up (seconds on a loaded machine), and a kill
            # before then cuts short only pending runs (seen in CI: 2 kills aimed here did).
            now = counts(process, experiment_id)
            return now is not None and now["running"] > 0 and bool(executing_runs(session))

        wait_until(inside_a_run, "a run to execute", process)
        time.sleep(rng.uniform(0.0, 0.6))
    else:  # "completing": right after a batch of completions was stored (1 to 3 more runs)
        target = completed_before + rng.randint(1, 3)

        def more_completed() -> bool:
            now = counts(process, experiment_id)
            return now is not None and now["completed"] >= target

        wait_until(more_completed, "more runs to complete", process)
        time.sleep(rng.uniform(0.0, 0.05))


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[str], SeedgridProcess]]:
    """`serve(name)`: `seedgrid serve` on tmp_path/seedgrid.db; every process of its session
    is killed at teardown."""
    started: list[SeedgridProcess] = []

    def start(name: str) -> SeedgridProcess:
        process = SeedgridProcess(name, ["serve"], serve_env(tmp_path / "seedgrid.db"), tmp_path)
        started.append(process)
        return process

    yield start
    kill_sessions(process.process.pid for process in started)
    for process in started:
        process.process.wait(10)


@pytest.mark.timeout(300)
def test_serve_killed_again_and_again_runs_every_run_exactly_once(
    serve: Callable[[str], SeedgridProcess], tmp_path: Path
) -> None:
    began = time.monotonic()
    seed = int(os.environ.get("SEEDGRID_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash soak: seed {seed} (SEEDGRID_SOAK_SEED={seed} replays the kill schedule)")
    rng = random.Random(seed)
    schedule = rng.sample(PHASES, len(PHASES))
    # The first serve is up before the experiment exists: its kill cannot aim at start-up.
    first = next(i for i, phase in enumerate(schedule) if phase != "starting")
    schedule.insert(0, schedule.pop(first))
    database = tmp_path / "seedgrid.db"
    with ThreadPoolExecutor(1) as pool:
        references: Future[dict[tuple[bool, int], list[tuple[Any, ...]]]] = pool.submit(
            reference_curves, range(SEEDS)
        )

        process = serve("serve-0")
        spawned = time.monotonic()
        process.wait_for_log(ACTIVE, timeout_s=90)
        startup_s = time.monotonic() - spawned
        # the dispatcher can be active before the API listens (a CI run beside two CPU-bound
        # processes posted in between and was refused)
        process.wait_healthy(timeout_s=90)
        response = httpx.post(
            f"{process.url}/experiments",
            timeout=30,
            json={
                "name": "crash-soak",
                "trainer": "collapse",
                "config": CONFIG,
                "grid": GRID,
                "seeds": SEEDS,
                "metric": "min_l2",
                "max_retries": MAX_RETRIES,
            },
        )
        assert response.status_code == 201, response.text
        experiment_id = response.json()["id"]
        n_runs = len(GRID["stop_gradient"]) * SEEDS

        kills: list[Kill] = []
        snapshots: list[Snapshot] = []
        added: list[Future[dict[tuple[bool, int], list[tuple[Any, ...]]]]] = []
        completed_before = 0
        for number, phase in enumerate(schedule, 1):
            if number > 1:
                process = serve(f"serve-{number - 1}")
                spawned = time.monotonic()
            session = process.process.pid
            if phase != "starting":
                seeds = top_up(process, experiment_id)
                if seeds:
                    print(f"kill {number}: seeds {seeds} added, for runs left to cut")
                    n_runs += len(GRID["stop_gradient"]) * len(seeds)
                    added.append(pool.submit(reference_curves, seeds))
            reach(
                phase,
                process,
                rng=rng,
                since=spawned,
                startup_s=startup_s,
                experiment_id=experiment_id,
                completed_before=completed_before,
            )
            log = process.log()
            executing = executing_runs(session)
            at_s = time.monotonic() - spawned
            process.process.send_signal(signal.SIGKILL)
            assert process.process.wait(10) == -signal.SIGKILL
            leftovers = sorted(
                p.title.split()[0] if p.title else p.comm for p in alive_in_sessions([session])
            )
            kill_sessions([session])
            state = snapshot(database, experiment_id)
            completed_before = len(state.with_status("completed"))
            kills.append(
                Kill(
                    phase,
                    at_s,
                    OWN_RAY in log,
                    bool(ACTIVE.search(log)),
                    executing,
                    state.with_status("running"),
                    state.with_status("pending"),
                    completed_before,
                    leftovers,
                )
            )
            snapshots.append(state)
            print(f"kill {number}/{len(schedule)}: {kills[-1].describe()}")
            assert completed_before < n_runs, (
                f"the experiment ended after {number} of {len(schedule)} kills: make it longer"
            )

        process = serve("serve-final")
        wait_until(
            lambda: ended(process, experiment_id), "the experiment to end", process, timeout_s=180
        )
        detail = httpx.get(f"{process.url}/experiments/{experiment_id}", timeout=30).json()
        runs = httpx.get(f"{process.url}/experiments/{experiment_id}/runs", timeout=30).json()
        assert process.terminate() in {0, -signal.SIGTERM}, process.log()
        kill_sessions([process.process.pid])
        curves = references.result(timeout=120)
        for more in added:
            curves.update(more.result(timeout=120))
    final = snapshot(database, experiment_id)
    logs = [path.read_text(errors="replace") for path in sorted(tmp_path.glob("serve-*.log"))]

    # every serve that got as far as Ray started its own, none joined another (a dead one's)
    assert OWN_RAY in logs[-1] and not any("existing Ray cluster" in log for log in logs)
    # every run ends exactly once
    assert detail["status"] == "completed", detail
    assert len(runs) == n_runs and all(r["status"] == "completed" for r in runs), runs
    assert len(final.attempts) == n_runs
    for run_id, history in final.attempts.items():
        outcomes = [outcome for _, outcome, _, _ in history]
        assert outcomes.count("completed") == 1 and outcomes[-1] == "completed", (run_id, history)
        assert set(outcomes[:-1]) <= {"lost", "interrupted"}, (run_id, history)
        assert [a for a, *_ in history] == list(range(1, final.runs[run_id][1] + 1)), history
    # the next serve re-queues what a kill left running or pending, charging the attempt it cut
    # short if a worker had started it (running), not if it still waited in Ray's queue
    # (pending: no worker reported it); a kill before the take-over leaves the same attempts:
    # counted once
    cut_short = {(cut, "running") for kill in kills for cut in kill.left_running.items()} | {
        (cut, "pending") for kill in kills for cut in kill.left_pending.items()
    }
    for (run_id, attempt), status in cut_short:
        outcome, error, pid = {a: (o, e, p) for a, o, e, p in final.attempts[run_id]}[attempt]
        assert (outcome, pid is None) == (
            ("lost", False) if status == "running" else ("interrupted", True)
        ), (run_id, attempt, status)
        assert "dispatcher stopped" in (error or ""), (run_id, attempt, error)
    # a run completed before a kill never runs again: same attempts, end time and points
    rerun = sum(
        (final.runs[run_id], final.attempts[run_id], final.points.get(run_id))
        != (state.runs[run_id], state.attempts[run_id], state.points.get(run_id))
        for state in snapshots
        for run_id in state.with_status("completed")
    )
    # each run's points are exactly its trainer's curve: none lost, none twice, same values
    lost = duplicated = wrong = 0
    for run in runs:
        expected = curves[run["condition"]["stop_gradient"], run["seed"]]
        stored = final.points.get(run["id"], [])
        keys = Counter((name, step) for name, step, _, _ in stored)
        expected_keys = Counter((name, step) for name, step, _, _ in expected)
        lost += sum((expected_keys - keys).values())
        duplicated += sum((keys - expected_keys).values())
        if keys == expected_keys:
            wrong += sum(
                (got[2], got[3] is None) != (want[2], False)
                or not math.isclose(got[3], want[3], **POINT_TOLERANCE)
                for got, want in zip(stored, expected, strict=True)
            )
    # executing in a worker at a kill and still `running` in the database after it: cut mid-run
    interrupted = {i for kill in kills for i in kill.executing & kill.left_running.keys()}
    retried = {r["id"] for r in runs if r["id"] in interrupted and r["attempts"] >= 2}
    run_s = statistics.median(
        (
            datetime.fromisoformat(r["finished_at"]) - datetime.fromisoformat(r["started_at"])
        ).total_seconds()
        for r in runs
    )
    total_s = time.monotonic() - began
    figures = {
        "faults injected (SIGKILL, exit -9)": len(kills),
        "  before Ray was up": sum(not k.ray_up for k in kills),
        "  Ray up, dispatcher not yet active": sum(k.ray_up and not k.active for k in kills),
        "  with runs executing": sum(bool(k.executing) for k in kills),
        "runs": n_runs,
        "attempts cut short and re-queued": len(cut_short),
        "  distinct runs": len({run_id for (run_id, _), _ in cut_short}),
        "runs cut short mid-run, completed later": len(retried),
        "attempts": sum(r["attempts"] for r in runs),
        "points lost": lost,
        "points duplicated": duplicated,
        "points with a wrong value or epoch": wrong,
        "completed runs re-run": rerun,
        "median run in a Ray worker (s)": round(run_s, 2),
        "total (s)": round(total_s, 1),
    }
    print(f"crash soak, seed {seed}:\n" + "\n".join(f"  {k}: {v}" for k, v in figures.items()))
    assert (lost, duplicated, wrong, rerun) == (0, 0, 0, 0)
    # the soak did what it claims: kills cut runs short mid-run, some landed before the
    # dispatcher took over, and runs had completed before kills (so a re-run would show)
    assert retried == interrupted and retried, [k.describe() for k in kills]
    assert kills[-1].completed > 0, [k.describe() for k in kills]
    assert any(not k.active for k in kills), [k.describe() for k in kills]
