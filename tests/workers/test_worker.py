"""The worker task body without Ray: the typed messages it streams, and how runs end."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from api_schemas import RunStatus
from tests.e2e.toy_trainer import ToyTrainer
from trainers import REGISTRY
from trainers.runtime import RunContext, TrainOutput
from workers import task as task_module
from workers.messages import Bundle, MetricBatch, Result, Started, unbundled
from workers.task import StreamingReporter, execute, execute_seeds, task_messages


def test_execute_streams_started_metric_batches_then_result() -> None:
    messages = list(
        execute("collapse", {"steps": 50, "log_every": 10}, seed=0, batch_interval_s=0.01)
    )
    assert isinstance(messages[0], Started) and messages[0].pid > 0
    result = messages[-1]
    assert isinstance(result, Result) and result.status == RunStatus.completed
    batches = messages[1:-1]
    assert batches and all(isinstance(m, MetricBatch) for m in batches)
    points = [p for m in batches for p in m.points]
    assert sorted({p[0] for p in points}) == [0, 10, 20, 30, 40, 50]
    assert result.provenance["train_seconds"] > 0
    assert result.metrics["min_l2"] > 0


def test_unknown_trainer_and_invalid_config_fail_with_their_message() -> None:
    result = list(execute("nonexistent", {}, seed=0, batch_interval_s=0.01))[-1]
    assert isinstance(result, Result)
    assert result.status == RunStatus.failed and "unknown trainer 'nonexistent'" in result.error
    result = list(execute("collapse", {"r": 7.0}, seed=0, batch_interval_s=0.01))[-1]
    assert result.status == RunStatus.failed and result.error.startswith("ValidationError")


def test_divergence_stops_the_trainer_and_keeps_the_last_finite_metrics() -> None:
    result = list(
        execute(
            "collapse", {"lr": 50.0, "steps": 5000, "log_every": 1}, seed=0, batch_interval_s=0.01
        )
    )[-1]
    assert isinstance(result, Result) and result.status == RunStatus.diverged
    d = result.diagnostics
    assert d["diverged_at_step"] < 5000 and d["last_finite_step"] == d["diverged_at_step"] - 1
    assert result.error == f"non-finite loss at step {d['diverged_at_step']}"
    assert all(v is None or v == v for v in result.metrics.values())


def test_a_run_stopped_by_its_check_ends_stopped_with_the_stop_in_its_diagnostics() -> None:
    # D1 at a threshold of 1e-3 fires when the initialisation is audited (epoch 0)
    config = {
        "arch": "studentnet",
        "width": 8,
        "depth": 2,
        "epochs": 3,
        "student_input_dim": 4,
        "student_train_size": 64,
        "student_test_size": 32,
        "eval_batch_size": 32,
        "scale_growth_threshold": 1e-3,
        "device": "cpu",
    }
    result = list(
        execute("feedback", config, seed=0, batch_interval_s=0.01, stop_on_checks=["D1"])
    )[-1]
    assert isinstance(result, Result) and result.status == RunStatus.stopped
    assert result.error is None
    assert result.diagnostics["stop"]["checks"] == ["D1"]
    assert result.diagnostics["stop"]["epoch"] == 0
    assert result.diagnostics["protocol"]["verdict"] == "FAIL(D1)"
    unasked = list(execute("feedback", config, seed=0, batch_interval_s=0.01))[-1]
    assert unasked.status == RunStatus.completed and "stop" not in unasked.diagnostics
    assert unasked.diagnostics["epochs_run"] == 3
    refused = list(
        execute("collapse", {"steps": 5}, seed=0, batch_interval_s=0.01, stop_on_checks=["D1"])
    )[-1]
    assert refused.status == RunStatus.failed
    assert "stop_on_checks: trainer 'collapse' has no check 'D1'" in refused.error


def test_reporter_drops_nothing_and_keeps_the_last_finite_point() -> None:
    reporter = StreamingReporter()
    reporter.log(0, {"loss": 1.0, "acc": 0.5})
    reporter.log(1, {"loss": float("nan"), "acc": 0.6})
    reporter.log(2, {"loss": float("inf")})
    assert not reporter.should_stop()  # only a cancel stops it; divergence is the runtime's
    reporter.stop_requested.set()
    assert reporter.should_stop()
    assert reporter.last_finite == {"loss": 1.0, "acc": 0.5}
    points = reporter.drain()
    assert [p[:3] for p in points] == [
        (0, None, "loss"),
        (0, None, "acc"),
        (1, None, "loss"),
        (1, None, "acc"),
        (2, None, "loss"),
    ]
    assert points[2][3] is None and reporter.drain() == []


def test_a_result_is_made_storable() -> None:
    result = Result(status=RunStatus.failed, metrics={"a\ud800": 1.0}, error="bad\x00byte")
    stored = result.storable()
    assert stored.error == "bad\ufffdbyte"
    assert stored.metrics == {"a\ufffd": 1.0}


def test_source_seeds_reach_the_trainer_and_bad_ones_fail_the_run() -> None:
    config = {"n_samples": 16, "r": 0.5, "steps": 20, "log_every": 10}

    def run(seed: int, source_seeds: dict[str, int] | None) -> Result:
        result = list(execute("collapse", config, seed, 0.01, source_seeds))[-1]
        assert isinstance(result, Result)
        return result

    everything = {"init": 3, "data": 3, "augment": 3, "evaluate": 3}
    one, two = run(1, everything), run(2, everything)
    assert one.status == RunStatus.completed and one.metrics == two.metrics
    assert one.provenance["source_seeds"] == everything
    assert run(1, {"data": 3}).metrics != one.metrics  # init follows seed 1 again
    bad = run(1, {"data": -1})
    assert bad.status == RunStatus.failed
    assert bad.error == (
        "ValueError: the seed of random source 'data' must be an int in [0, 2147483647], not -1"
    )


class _GatedTrainer(ToyTrainer):
    """A batched trainer whose seeds log their last point only when the test opens the gate:
    the point then lands after the worker has drained those seeds once."""

    name = "gated"
    batched = True

    def __init__(self) -> None:
        self.gate = threading.Event()

    def train_seeds(self, config: Any, runs: list[RunContext]) -> list[TrainOutput]:
        for run in runs:
            run.log(0, {"loss": 1.0})
        assert self.gate.wait(30)
        for run in runs:
            run.log(1, {"loss": 0.5})
        return [TrainOutput(metrics={"loss": 0.5}) for _ in runs]


def test_a_seeds_last_points_go_before_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _GatedTrainer()
    monkeypatch.setitem(REGISTRY, trainer.name, trainer)
    messages = execute_seeds("gated", {}, [0, 1], batch_interval_s=0.01)
    assert isinstance(next(messages), Started)
    first = next(messages)  # seed 0's first point, drained while the gate is shut
    assert isinstance(first, MetricBatch) and first.index == 0
    trainer.gate.set()  # both seeds log their last point and end while the worker waits
    (thread,) = [t for t in threading.enumerate() if t.name == "trainer-gated-0"]
    thread.join(30)
    assert not thread.is_alive()
    rest = [first, *messages]
    for index in (0, 1):
        mine = [m for m in rest if getattr(m, "index", None) == index]
        assert isinstance(mine[-1], Result) and mine[-1].status == RunStatus.completed
        steps = [p[0] for m in mine if isinstance(m, MetricBatch) for p in m.points]
        assert steps == [0, 1], (index, mine)


def seed_order(messages: list[Any]) -> list[tuple[str, int]]:
    """The messages as (kind, seed index), one Started per index it names."""
    order = []
    for m in messages:
        if isinstance(m, Started):
            assert m.indices is not None and m.pid > 0
            order += [("started", i) for i in m.indices]
        else:
            order.append(("points" if isinstance(m, MetricBatch) else "result", m.index))
    return order


def test_seeds_run_one_after_another_each_start_when_their_turn_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = ToyTrainer()
    assert not trainer.batched
    monkeypatch.setitem(REGISTRY, trainer.name, trainer)
    order = seed_order(
        list(
            execute_seeds(
                "toy", {"steps": 2000, "log_every": 500}, [0, 1, 2], batch_interval_s=0.01
            )
        )
    )
    for index in (0, 1, 2):
        mine = [kind for kind, i in order if i == index]
        assert mine[0] == "started" and mine[-1] == "result" and "points" in mine, order
        assert mine.count("started") == 1
    # seed 1 starts only after seed 0's result, seed 2 after seed 1's
    assert order.index(("started", 1)) > order.index(("result", 0))
    assert order.index(("started", 2)) > order.index(("result", 1))


def test_a_batched_task_starts_every_seed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _GatedTrainer()
    trainer.gate.set()
    monkeypatch.setitem(REGISTRY, trainer.name, trainer)
    messages = list(execute_seeds("gated", {}, [0, 1, 2], batch_interval_s=0.01))
    assert isinstance(messages[0], Started) and messages[0].indices == (0, 1, 2)
    assert sum(isinstance(m, Started) for m in messages) == 1


def test_a_small_run_of_one_seed_streams_one_bundle_and_a_long_one_its_started_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each streamed object costs the worker and the dispatcher a Ray object and a read: a run
    # that ends within STARTED_WITHIN_S sends Started, its points and its Result as one Bundle
    # (the window widened here so that a busy machine cannot stretch the run past it)
    monkeypatch.setattr(task_module, "STARTED_WITHIN_S", 30.0)
    small = list(task_messages("collapse", {"steps": 5, "n_samples": 64}, [0], 60.0))
    assert len(small) == 1 and isinstance(small[0], Bundle), small
    kinds = [type(m) for m in small[0].messages]
    assert kinds == [Started, MetricBatch, Result], kinds
    assert small[0].messages[-1].status == RunStatus.completed
    # the plain generator (execute) streams the same messages one by one
    plain = list(execute("collapse", {"steps": 5, "n_samples": 64}, seed=0, batch_interval_s=60))
    assert [type(m) for m in plain] == [Started, MetricBatch, Result]
    # a run past the window: its Started leads the first object, then its points every batch
    # interval, its last points with its result; unbundled, in the messages' own order
    monkeypatch.setattr(task_module, "STARTED_WITHIN_S", 0.0)
    streamed = list(
        task_messages("collapse", {"steps": 400, "n_samples": 64, "log_every": 10}, [0], 0.01)
    )
    assert len(streamed) > 1
    parts = [m for s in streamed for m in unbundled(s)]
    assert isinstance(parts[0], Started) and isinstance(unbundled(streamed[0])[0], Started)
    assert isinstance(parts[-1], Result) and parts[-1].status == RunStatus.completed
    assert all(isinstance(m, MetricBatch) for m in parts[1:-1])
    steps = [p[0] for m in parts[1:-1] if isinstance(m, MetricBatch) for p in m.points]
    assert steps == sorted(steps) and sorted(set(steps)) == list(range(0, 401, 10)), steps
