"""Leaving a task's message generator before its trainer has ended stops the trainer, whichever
way it is left: Ray's cancel arrives as a KeyboardInterrupt in the generator, or, when the
interrupt lands in Ray's own code between two messages, as the generator's close. Only the
first was handled once: a closed generator left its trainer thread training in a worker that
Ray counted idle (seen burning a core as ray::IDLE at the end of a CI run). Every registered
trainer's long run, alone and as a seed-batched task of 8, in this process (no Ray): the
trainer thread must have returned when the generator is gone."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.toy_trainer import ToyTrainer
from tests.trainers.test_runtime_contract import CASES
from trainers import REGISTRY
from workers.messages import MetricBatch, WorkerMessage
from workers.task import execute_seeds

# System metrics every 50 ms: a MetricBatch arrives soon after the trainer thread starts, even
# from a trainer that logs nothing until it ends (ssl_sim's convergence loop).
SAMPLING_S = 0.05


def trainer_threads() -> list[threading.Thread]:
    """The trainer threads whose OS thread still exists (/proc, not Thread.is_alive(): a join
    that a KeyboardInterrupt cut short marks a running thread as stopped)."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("trainer-") and Path(f"/proc/self/task/{t.native_id}").exists()
    ]


def until_training(messages: Iterator[WorkerMessage], metric: str | None = None) -> None:
    """Iterates until the first MetricBatch (the trainer thread is running by then), or the
    first that holds a point of `metric`."""
    for message in messages:
        if isinstance(message, MetricBatch) and (
            metric is None or any(point[2] == metric for point in message.points)
        ):
            return
    raise AssertionError("the run ended before the test could leave it: make it longer")


@pytest.mark.parametrize("seeds", [1, 8], ids=["solo", "k8"])
@pytest.mark.parametrize("trainer", sorted(CASES))
def test_closing_the_generator_stops_the_trainer(trainer: str, seeds: int) -> None:
    assert not trainer_threads()
    messages = execute_seeds(
        trainer,
        dict(CASES[trainer].long),
        list(range(seeds)),
        batch_interval_s=0.05,
        system_metrics_interval_s=SAMPLING_S,
    )
    until_training(messages)
    assert trainer_threads(), "no trainer thread to stop"
    messages.close()  # returns once the trainer thread has returned (or its grace has passed)
    assert not trainer_threads(), f"{trainer} ({seeds} seeds) kept training after the close"


def test_an_interrupt_in_the_generator_stops_the_trainer_and_propagates() -> None:
    messages = execute_seeds(
        "collapse",
        dict(CASES["collapse"].long),
        [0],
        batch_interval_s=0.05,
        system_metrics_interval_s=SAMPLING_S,
    )
    until_training(messages)
    with pytest.raises(KeyboardInterrupt):
        messages.throw(KeyboardInterrupt)
    assert not trainer_threads()


def test_a_second_interrupt_while_the_trainer_winds_down_does_not_leave_it_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The toy trainer sleeps through its cancel for 2 s (a step that does not check it); a
    second interrupt, a real SIGINT, lands while the generator waits for it."""
    toy = ToyTrainer()
    monkeypatch.setitem(REGISTRY, toy.name, toy)
    messages = execute_seeds(
        "toy",
        {"steps": 10**9, "log_every": 1, "stall_at_step": 1, "stall_s": 2.0},
        [0],
        batch_interval_s=0.05,
        system_metrics_interval_s=SAMPLING_S,
    )
    until_training(messages, "loss")  # step 0's: the toy is in its stall at step 1 now
    main = threading.get_ident()
    second = threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT))
    second.start()
    with pytest.raises(KeyboardInterrupt):
        messages.throw(KeyboardInterrupt)
    second.join()
    assert not trainer_threads(), "the trainer outlived a cancel interrupted twice"
