"""The cancel grace's clock (workers.grace) on a real kernel: a process that shares its one CPU
with two CPU-bound processes gets its waits for that CPU back, one that sleeps does not. Each
case runs in a child process pinned to one CPU beside two busy loops pinned to the same CPU, so
the starvation is the test's own whatever else the machine runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workers.grace import MAX_STRETCH, GraceClock, runqueue_waits

CHILD = """
import json, os, subprocess, sys, time
from workers.grace import GraceClock
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
hogs = [
    subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    for _ in range(2)
]
try:
    time.sleep(0.3)  # the hogs are running
    clock = GraceClock(10.0)
    start = time.monotonic()
    if sys.argv[1] == "spin":
        while time.monotonic() - start < 2.0:
            pass
    else:
        time.sleep(2.0)
    wall = time.monotonic() - start
    print(json.dumps({"wall": wall, "starved": clock.starved_s(), "left": clock.left()}))
finally:
    for hog in hogs:
        hog.kill()
"""


def pinned_child(mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_kernel_says_how_long_each_thread_waited_for_a_cpu() -> None:
    waits = runqueue_waits()
    assert waits is not None, "/proc/self/task/*/schedstat is missing: the grace is wall time"
    assert os.getpid() in waits and all(w >= 0 for w in waits.values())


def test_a_starved_trainer_gets_its_waits_for_the_cpu_back() -> None:
    got = pinned_child("spin")
    # one of three busy processes on one CPU: it ran about a third of the time
    assert got["starved"] > 0.4 * got["wall"], got
    assert got["left"] == pytest.approx(10.0 - got["wall"] + got["starved"], abs=0.3)


def test_a_sleeping_trainer_gets_wall_time() -> None:
    got = pinned_child("sleep")
    assert got["starved"] < 0.2, got
    assert got["left"] == pytest.approx(10.0 - got["wall"], abs=0.3)


def test_the_stretch_is_bounded() -> None:
    clock = GraceClock(1.0)
    clock.started -= 2 * MAX_STRETCH  # as if long ago, however starved since
    clock.starved_s = lambda: 1e9  # type: ignore[method-assign]
    assert clock.left() == 0.0
