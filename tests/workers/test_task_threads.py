"""The worker task with a trainer that calls on_start / on_done and logs from several threads at
once while the worker drains and reports: every seed's messages arrive whole and in order."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from api_schemas import RunStatus
from tests.e2e.toy_trainer import ToyTrainer
from trainers import REGISTRY
from trainers.base import RunResult
from workers.messages import MetricBatch, Result, Started, WorkerMessage
from workers.task import execute_seeds

POINTS = 600  # per seed
FAILING = 2  # the seed whose thread ends it with an exception


class _ThreadedTrainer(ToyTrainer):
    """Trains each seed of a task in a thread of its own, all released at once: on_start, the
    points and on_done reach the worker from every thread together, interleaved with its
    drains and its reports."""

    name = "threaded"

    def run_seeds(
        self,
        config: Any,
        seeds: Sequence[int],
        reporters: Sequence[Any],
        *,
        threads: int | None = None,
        source_seeds: Sequence[dict[str, int] | None] | None = None,
        stop_on_checks: Any = (),
        on_done: Callable[[int, RunResult | Exception], None] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> list[RunResult | Exception]:
        assert on_done is not None and on_start is not None
        barrier = threading.Barrier(len(seeds))

        def one(index: int) -> None:
            barrier.wait()
            on_start(index)
            for step in range(POINTS):
                reporters[index].log(step, {"loss": float(index * POINTS + step)})
            if index == FAILING:
                on_done(index, RuntimeError(f"seed {index} failed"))
            else:
                on_done(index, RunResult(metrics={"loss": float(index)}))

        workers = [threading.Thread(target=one, args=(i,)) for i in range(len(seeds))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return []


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Threads switch as often as the interpreter allows: the interleavings a race needs."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def by_seed(messages: list[WorkerMessage], seeds: int) -> dict[int, list[str | list[Any]]]:
    """Each seed's messages in order: "started", its points (one list per batch), "result"."""
    mine: dict[int, list[str | list[Any]]] = {i: [] for i in range(seeds)}
    for m in messages:
        if isinstance(m, Started):
            assert m.indices is not None
            for i in m.indices:
                mine[i].append("started")
        elif isinstance(m, MetricBatch):
            assert m.points
            mine[m.index].append(list(m.points))
        else:
            mine[m.index].append("result")
    return mine


def assert_whole_and_in_order(
    messages: list[WorkerMessage], seeds: int, steps: Callable[[int], list[int]]
) -> None:
    """One Started per seed before its points, every point once and in order (`steps`: the
    steps of a seed's "loss" points), one Result after them."""
    for index, mine in by_seed(messages, seeds).items():
        assert mine[0] == "started" and mine[-1] == "result", (index, mine[:3], mine[-3:])
        assert mine.count("started") == 1 and mine.count("result") == 1, index
        logged = [p[0] for batch in mine[1:-1] for p in batch if p[2] == "loss"]
        assert logged == steps(index), index


@pytest.mark.usefixtures("fast_switching")
def test_seeds_ending_in_several_threads_at_once_lose_and_repeat_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = _ThreadedTrainer()
    monkeypatch.setitem(REGISTRY, trainer.name, trainer)
    seeds = list(range(8))
    for _ in range(10):
        messages = list(execute_seeds("threaded", {}, seeds, batch_interval_s=0.001))
        assert_whole_and_in_order(messages, len(seeds), lambda _: list(range(POINTS)))
        results = {m.index: m for m in messages if isinstance(m, Result)}
        assert sorted(results) == seeds
        for index, result in results.items():
            assert result.provenance["task_seeds"] == seeds
            assert result.provenance["train_seconds"] > 0
            if index == FAILING:
                assert result.status == RunStatus.failed
                assert result.error == f"RuntimeError: seed {index} failed"
                # the last finite point the thread logged before it failed
                assert result.metrics == {"loss": float(index * POINTS + POINTS - 1)}
            else:
                assert result.status == RunStatus.completed
                assert result.metrics == {"loss": float(index)}


@pytest.mark.usefixtures("fast_switching")
def test_a_batched_trainer_streams_each_seed_whole_and_in_order() -> None:
    config = {"n_samples": 16, "steps": 200, "log_every": 10}
    messages = list(execute_seeds("collapse", config, [0, 1, 2, 3], batch_interval_s=0.001))
    assert_whole_and_in_order(messages, 4, lambda _: list(range(0, 201, 10)))
    assert {m.status for m in messages if isinstance(m, Result)} == {RunStatus.completed}
