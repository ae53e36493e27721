"""Leaving a task's message generator before its trainer has ended stops the trainer, whichever
way it is left: Ray's cancel arrives as a KeyboardInterrupt in the generator, or, when the
interrupt lands in Ray's own code between two messages, as the generator's close. Only the
first was handled once: a closed generator left its trainer thread training in a worker that
Ray counted idle (seen burning a core as ray::IDLE at the end of a CI run). Every registered
trainer's long run, alone and as a seed-batched task of 8, in this process (no Ray): the
trainer thread must have returned when the generator is gone."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.trainers.test_runtime_contract import CASES
from workers.messages import MetricBatch, WorkerMessage
from workers.task import execute_seeds

# System metrics every 50 ms: a MetricBatch arrives soon after the trainer thread starts, even
# from a trainer that logs nothing until it ends (ssl_sim's convergence loop).
SAMPLING_S = 0.05


def trainer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("trainer-") and t.is_alive()]


def until_training(messages: Iterator[WorkerMessage]) -> None:
    """Iterates until the first MetricBatch: the trainer thread is running by then."""
    for message in messages:
        if isinstance(message, MetricBatch):
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
