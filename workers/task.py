"""The Ray task that runs one (condition, seed), or K seeds of one condition, and streams their
metrics back.

`run_task` is a Ray streaming generator of the messages in workers.messages: one `Started`, zero
or more `MetricBatch`es, one `Result` per seed. Each `MetricBatch` and `Result` names the seed it
is about by its index in the task's seeds. A task of K > 1 seeds (a spec's
`resources.seeds_per_task`) runs them through the trainer's `run_seeds`: as one batched
computation for a batched trainer, else one after another; a seed's `Result` is sent as soon as
that seed has ended, so that a task lost later keeps the seeds it finished.

The trainer runs in a thread of the worker process while the generator forwards the metric
batches it logs, so that the caller (the dispatcher) sees curves while the run goes on. The
worker never opens the database. Cancellation (`ray.cancel` on the generator) arrives as
KeyboardInterrupt in the generator: the reporters then answer should_stop() = True, the trainer
returns at its next check (the loop contract of trainers.runtime: within about a second), and
the interrupt propagates so that Ray reports the task cancelled: a cancel ends every seed, and
a seed-batched task running its seeds one after another starts no further one. A trainer that
has not returned CANCEL_GRACE_S after the cancel ends its worker process with it.
"""

from __future__ import annotations

import math
import os
import socket
import sys
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

# How long the trainer thread gets to notice a cancellation; past it the worker process ends
# itself (a Python thread cannot be stopped), so that no trainer outlives its cancel in a
# worker Ray would hand new tasks to.
CANCEL_GRACE_S = 10.0


class StreamingReporter:
    """Buffers one seed's logged points for the generator. The seeds of one task share the
    stop event: a cancel stops them all."""

    def __init__(self, stop_requested: threading.Event | None = None) -> None:
        self._lock = threading.Lock()
        self._points: list[Point] = []
        self.stop_requested = stop_requested or threading.Event()
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


def _outcome(outcome: RunResult | BaseException, reporter: StreamingReporter,
             divergence_metric: str | None, index: int) -> Result:
    if isinstance(outcome, BaseException):
        # A message may quote anything (a config value, a file's bytes): stored as text.
        return Result(status=RunStatus.failed, metrics=reporter.last_finite, index=index,
                      error=storable_text(f"{type(outcome).__name__}: {outcome}"))
    payload = outcome.as_dict()
    error_text = None
    if outcome.diverged:
        step = outcome.diverged_at_step
        where = f" at step {step}" if step is not None else ""
        error_text = f"non-finite {divergence_metric}{where}"
    status = (RunStatus.diverged if outcome.diverged
              else RunStatus.stopped if outcome.stop is not None else RunStatus.completed)
    return Result(
        status=status,
        metrics=payload["metrics"],
        diagnostics=payload["diagnostics"],
        warnings=payload["warnings"],
        provenance=payload["provenance"],
        error=error_text,
        index=index,
    )


def in_ray_task() -> bool:
    """Whether this code runs inside a Ray task (not a driver, not without Ray)."""
    return ray.is_initialized() and ray.get_runtime_context().get_task_id() is not None


def assigned_cpus() -> int | None:
    """The whole CPUs Ray gave this task (at least 1): the run's torch thread count; None
    outside a Ray task (a driver, or no Ray at all)."""
    if not in_ray_task():
        return None
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, int(cpus))


def execute(
    trainer_name: str, config: dict[str, Any], seed: int, batch_interval_s: float,
    source_seeds: dict[str, int] | None = None,
    stop_on_checks: Sequence[str] = (),
) -> Iterator[WorkerMessage]:
    """One seed: `execute_seeds` with a task of one (the trainer's single-run path)."""
    yield from execute_seeds(trainer_name, config, [seed], batch_interval_s, [source_seeds],
                             stop_on_checks)


def execute_seeds(
    trainer_name: str, config: dict[str, Any], seeds: Sequence[int], batch_interval_s: float,
    source_seeds: Sequence[dict[str, int] | None] | None = None,
    stop_on_checks: Sequence[str] = (),
) -> Iterator[WorkerMessage]:
    """The body of the Ray task, usable without Ray (a plain generator). `seeds`: the seeds of
    one condition this task runs (one: the trainer's single-run path, `Trainer.run`; more: its
    `run_seeds`). `source_seeds`: per seed, random sources pinned to other seeds (source name ->
    seed; checked by trainers.random_sources, a bad one fails the run). `stop_on_checks`: the
    spec's checks on which a run ends early (status `stopped`)."""
    seeds = list(seeds)
    pins = list(source_seeds) if source_seeds is not None else [None] * len(seeds)
    if not seeds or len(pins) != len(seeds):
        raise ValueError("a task needs at least one seed, and one source_seeds entry per seed")
    context = ray.get_runtime_context() if ray.is_initialized() else None

    def began(indices: tuple[int, ...] | None) -> Started:
        return Started(pid=os.getpid(), node_id=context.get_node_id() if context else None,
                       worker_id=context.get_worker_id() if context else None,
                       hostname=socket.gethostname(), indices=indices)

    warm_up()  # before Started: a run counts as started when it can train at once
    announced: set[int] = set()  # the seeds whose Started was sent
    if len(seeds) == 1:
        announced.add(0)
        yield began(None)
    stop = threading.Event()
    reporters = [StreamingReporter(stop) for _ in seeds]
    news = threading.Event()  # a seed began or ended, or the trainer thread ended
    ended = threading.Event()
    # in the order they happened: ("start", index) and ("done", (index, outcome, seconds))
    events: list[tuple[str, Any]] = []
    box: dict[str, Any] = {}
    started = time.perf_counter()

    def on_start(index: int) -> None:
        events.append(("start", index))
        news.set()

    def on_done(index: int, outcome: RunResult | BaseException) -> None:
        events.append(("done", (index, outcome, time.perf_counter() - started)))
        news.set()

    def target() -> None:
        try:
            trainer = box["trainer"] = get_trainer(trainer_name)
            parsed = trainer.Config.model_validate(config)
            if len(seeds) == 1:
                on_done(0, trainer.run(parsed, seeds[0], reporters[0], threads=assigned_cpus(),
                                       source_seeds=pins[0], stop_on_checks=stop_on_checks))
            else:
                trainer.run_seeds(parsed, seeds, reporters, threads=assigned_cpus(),
                                  source_seeds=pins, stop_on_checks=stop_on_checks,
                                  on_done=on_done, on_start=on_start)
        except BaseException as exc:  # noqa: BLE001 - every trainer failure fails its seeds
            box["error"] = exc
        finally:
            ended.set()
            news.set()

    sent: set[int] = set()

    def flush() -> Iterator[WorkerMessage]:
        # in order: the seeds that began (before any of their points), the seeds that ended
        # (each with its last points before its result), then the points of those training
        while events:
            if events[0][0] == "start":
                starting = []
                while events and events[0][0] == "start":
                    starting.append(events.pop(0)[1])
                announced.update(starting)
                yield began(tuple(starting))
                continue
            index, outcome, seconds = events.pop(0)[1]
            points = reporters[index].drain()
            if points:
                yield MetricBatch(points, index=index)
            sent.add(index)
            yield _result(outcome, reporters[index], index, seconds)
        for index in sorted(announced - sent):  # a seed that began since waits for its Started
            points = reporters[index].drain()
            if points:
                yield MetricBatch(points, index=index)

    def _result(outcome: RunResult | BaseException, reporter: StreamingReporter, index: int,
                seconds: float) -> Result:
        result = _outcome(outcome, reporter,
                          getattr(box.get("trainer"), "divergence_metric", None), index)
        result.provenance["train_seconds"] = seconds
        if len(seeds) > 1:
            result.provenance["task_seeds"] = seeds
        return result

    thread = threading.Thread(target=target, name=f"trainer-{trainer_name}-{seeds[0]}",
                              daemon=True)
    thread.start()
    try:
        while True:
            news.wait(batch_interval_s)
            news.clear()
            finished = ended.is_set()
            yield from flush()
            if finished:
                break
    except KeyboardInterrupt:
        stop.set()
        thread.join(CANCEL_GRACE_S)
        if thread.is_alive() and in_ray_task():  # never a driver (a plain generator)
            end_worker(trainer_name, seeds)
        raise
    thread.join()
    error = box.get("error") or RuntimeError("the trainer returned no result for this seed")
    for index in range(len(seeds)):
        if index not in sent:
            yield _result(error, reporters[index], index, time.perf_counter() - started)


def end_worker(trainer_name: str, seeds: Sequence[int]) -> None:
    """End this Ray worker process now: its trainer thread ignored a cancel for the whole
    grace. The dispatcher, which sent the cancel, reads the lost worker as the task's cancel;
    Ray starts a fresh worker for the next task."""
    print(f"seedgrid: trainer {trainer_name!r} (seeds {list(seeds)}) did not stop within "
          f"{CANCEL_GRACE_S:g} s of its cancel; ending worker process {os.getpid()}",
          file=sys.stderr, flush=True)
    os._exit(1)


@ray.remote(max_retries=0)
def run_task(
    trainer_name: str, config: dict[str, Any], seeds: Sequence[int], batch_interval_s: float = 0.5,
    source_seeds: Sequence[dict[str, int] | None] | None = None,
    stop_on_checks: Sequence[str] = (),
) -> Iterator[WorkerMessage]:
    """Ray streaming generator running one condition's seeds (one, or a seed-batched task of
    several); the dispatcher does retries."""
    yield from execute_seeds(trainer_name, config, seeds, batch_interval_s, source_seeds,
                             stop_on_checks)
