"""The Ray task that runs one (condition, seed) and streams its metrics back.

`run_task` is a Ray streaming generator of the messages in workers.messages: one `Started`,
zero or more `MetricBatch`es, one `Result`.

The trainer runs in a thread of the worker process while the generator forwards the metric
batches it logs, so that the caller (the dispatcher) sees curves while the run goes on. The
worker never opens the database. Cancellation (`ray.cancel` on the generator) arrives as
KeyboardInterrupt in the generator: the reporter then answers should_stop() = True, the trainer
returns at its next check (the loop contract of trainers.runtime: within about a second), and
the interrupt propagates so that Ray reports the task cancelled.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray

from api_schemas import RunStatus, storable_text
from trainers import get_trainer
from trainers.base import RunResult
from trainers.runtime import warm_up
from workers.messages import MetricBatch, Point, Result, Started, WorkerMessage

# How long the trainer thread gets to notice a cancellation before the worker gives up on it.
CANCEL_GRACE_S = 10.0


class StreamingReporter:
    """Buffers logged points for the generator and watches the loss for divergence."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._points: list[Point] = []
        self.wake = threading.Event()
        self.stop_requested = threading.Event()
        # The last logged point with every value finite: a failed run's metrics.
        self.last_finite: dict[str, float] = {}

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None:
        values = {name: float(v) for name, v in metrics.items()}
        if all(math.isfinite(v) for v in values.values()):
            self.last_finite = values
        rows = [(step, epoch, n, v if math.isfinite(v) else None) for n, v in values.items()]
        with self._lock:
            self._points.extend(rows)

    def should_stop(self) -> bool:
        return self.stop_requested.is_set()

    def drain(self) -> list[Point]:
        with self._lock:
            points, self._points = self._points, []
        return points


def _outcome(result: RunResult | None, error: BaseException | None,
             reporter: StreamingReporter, divergence_metric: str | None) -> Result:
    if error is not None:
        # A message may quote anything (a config value, a file's bytes): stored as text.
        return Result(status=RunStatus.failed, metrics=reporter.last_finite,
                      error=storable_text(f"{type(error).__name__}: {error}"))
    assert result is not None
    payload = result.as_dict()
    error_text = None
    if result.diverged:
        step = result.diverged_at_step
        where = f" at step {step}" if step is not None else ""
        error_text = f"non-finite {divergence_metric}{where}"
    status = (RunStatus.diverged if result.diverged
              else RunStatus.stopped if result.stop is not None else RunStatus.completed)
    return Result(
        status=status,
        metrics=payload["metrics"],
        diagnostics=payload["diagnostics"],
        warnings=payload["warnings"],
        provenance=payload["provenance"],
        error=error_text,
    )


def assigned_cpus() -> int | None:
    """The whole CPUs Ray gave this task (at least 1): the run's torch thread count; None
    outside a Ray task (a driver, or no Ray at all)."""
    if not ray.is_initialized() or ray.get_runtime_context().get_task_id() is None:
        return None
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, int(cpus))


def execute(
    trainer_name: str, config: dict[str, Any], seed: int, batch_interval_s: float,
    source_seeds: dict[str, int] | None = None,
    stop_on_checks: Sequence[str] = (),
) -> Iterator[WorkerMessage]:
    """The body of the Ray task, usable without Ray (a plain generator). `source_seeds` pins
    random sources to other seeds (source name -> seed; checked by trainers.random_sources,
    a bad one fails the run). `stop_on_checks`: the spec's checks on which the run ends early
    (status `stopped`)."""
    context = ray.get_runtime_context() if ray.is_initialized() else None
    warm_up()  # before Started: a run counts as started when it can train at once
    yield Started(pid=os.getpid(), node_id=context.get_node_id() if context else None,
                  worker_id=context.get_worker_id() if context else None,
                  hostname=socket.gethostname())
    reporter = StreamingReporter()
    box: dict[str, Any] = {}
    started = time.perf_counter()

    def target() -> None:
        try:
            trainer = box["trainer"] = get_trainer(trainer_name)
            box["result"] = trainer.run(trainer.Config.model_validate(config), seed, reporter,
                                        threads=assigned_cpus(), source_seeds=source_seeds,
                                        stop_on_checks=stop_on_checks)
        except BaseException as exc:  # noqa: BLE001 - every trainer failure becomes a failed run
            box["error"] = exc
        finally:
            reporter.wake.set()

    thread = threading.Thread(target=target, name=f"trainer-{trainer_name}-{seed}", daemon=True)
    thread.start()
    try:
        while not reporter.wake.wait(batch_interval_s):
            points = reporter.drain()
            if points:
                yield MetricBatch(points)
    except KeyboardInterrupt:
        reporter.stop_requested.set()
        thread.join(CANCEL_GRACE_S)
        raise
    thread.join()
    points = reporter.drain()
    if points:
        yield MetricBatch(points)
    outcome = _outcome(box.get("result"), box.get("error"), reporter,
                       getattr(box.get("trainer"), "divergence_metric", None))
    outcome.provenance["train_seconds"] = time.perf_counter() - started
    yield outcome


@ray.remote(max_retries=0)
def run_task(
    trainer_name: str, config: dict[str, Any], seed: int, batch_interval_s: float = 0.5,
    source_seeds: dict[str, int] | None = None,
    stop_on_checks: Sequence[str] = (),
) -> Iterator[WorkerMessage]:
    """Ray streaming generator running one (condition, seed); the dispatcher does retries."""
    yield from execute(trainer_name, config, seed, batch_interval_s, source_seeds,
                       stop_on_checks)
