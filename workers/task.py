"""The Ray task that runs one (condition, seed), or K seeds of one condition, and streams their
metrics back.

`run_task` is a Ray streaming generator of the messages in workers.messages: one `Started`, zero
or more `MetricBatch`es, one `Result` per seed. Each `MetricBatch` and `Result` names the seed it
is about by its index in the task's seeds. A task of K > 1 seeds (a spec's
`resources.seeds_per_task`) runs them through the trainer's `run_seeds`: as one batched
computation for a batched trainer, else one after another; a seed's `Result` is sent as soon as
that seed has ended, so that a task lost later keeps the seeds it finished.

The trainer runs in a thread of the worker process while the generator forwards the metric
batches it logs, so that the caller (the dispatcher) sees curves while the run goes on
(`SeedTask`: the trainer's side puts the seeds' starts and outcomes on a queue that the
generator alone reads, and logs points into per-seed reporters behind locks). The worker
never opens the database. Cancellation (`ray.cancel` on the generator) arrives as
KeyboardInterrupt in the generator, or as its close when the interrupt lands in Ray's code
between two messages; either way (and whenever the generator is left before its trainer ended)
the reporters then answer should_stop() = True, the trainer
returns at its next check (the loop contract of trainers.runtime: within about a second), and
the interrupt propagates so that Ray reports the task cancelled: a cancel ends every seed, and
a seed-batched task running its seeds one after another starts no further one. A trainer that
has not returned CANCEL_GRACE_S after the cancel (in its own time: workers.grace) ends its
worker process with it.

With a sampling interval, the same consuming thread records the process's system metrics
(workers.system_metrics) into the points of the seeds training: at each seed's start and end
and every interval between; every seed of a task gets the process's values.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any, TypeVar

import ray

from api_schemas import RunStatus, storable_text
from api_schemas import system_metrics as names
from api_schemas.tracebacks import format_traceback
from trainers import get_trainer
from trainers.base import RunResult
from trainers.runtime import warm_up
from workers.grace import GraceClock
from workers.interrupts import accept_cancels
from workers.messages import (
    Bundle,
    MetricBatch,
    Point,
    Result,
    Started,
    StreamedMessage,
    WorkerMessage,
)
from workers.system_metrics import SystemSampler

# How long the trainer thread gets to notice a cancellation; past it the worker process ends
# itself (a Python thread cannot be stopped), so that no trainer outlives its cancel in a
# worker Ray would hand new tasks to.
CANCEL_GRACE_S = 10.0
# How often the wait re-reads the grace's clock.
GRACE_POLL_S = 0.25
# A task of one seed sends its Started with what its trainer does in this time (at most a
# batch interval): a small run's whole stream (Started, its points, its Result) is then one
# streamed object, where each one cost the worker and the dispatcher more than a small run's
# messages themselves (benchmarks/dispatch.py); a longer run's Started comes this much later.
STARTED_WITHIN_S = 0.02


class StreamingReporter:
    """Buffers one seed's logged points for the generator, behind a lock (the trainer's thread
    logs, the generator's drains). The seeds of one task share the stop event: a cancel stops
    them all."""

    def __init__(self, stop_requested: threading.Event | None = None) -> None:
        self._lock = threading.Lock()
        self._points: list[Point] = []
        self.stop_requested = stop_requested or threading.Event()
        self._last_finite: dict[str, float] = {}
        # where system values are put: the run's latest step and epoch
        self._last_step: int = 0
        self._last_epoch: int | None = None

    @property
    def last_finite(self) -> dict[str, float]:
        """The last logged point with every value finite: a failed run's metrics."""
        with self._lock:
            return dict(self._last_finite)

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None:
        values = {name: float(v) for name, v in metrics.items()}
        rows = [(step, epoch, n, v if math.isfinite(v) else None) for n, v in values.items()]
        with self._lock:
            if all(math.isfinite(v) for v in values.values()):
                self._last_finite = values
            self._points.extend(rows)
            self._last_step, self._last_epoch = step, epoch

    def record_system(self, values: Mapping[str, float]) -> None:
        """System values (api_schemas.system_metrics) at the run's latest step; never the run's
        metrics, so never a failed run's last finite ones."""
        with self._lock:
            self._points.extend(
                (self._last_step, self._last_epoch, name, value) for name, value in values.items()
            )

    def should_stop(self) -> bool:
        return self.stop_requested.is_set()

    def drain(self) -> list[Point]:
        with self._lock:
            points, self._points = self._points, []
        return points


def _outcome(
    outcome: RunResult | BaseException,
    reporter: StreamingReporter,
    divergence_metric: str | None,
    index: int,
) -> Result:
    if isinstance(outcome, BaseException):
        # A message may quote anything (a config value, a file's bytes): stored as text.
        return Result(
            status=RunStatus.failed,
            metrics=reporter.last_finite,
            index=index,
            error=storable_text(f"{type(outcome).__name__}: {outcome}"),
            traceback=format_traceback(outcome),
        )
    payload = outcome.as_dict()
    error_text = None
    if outcome.diverged:
        step = outcome.diverged_at_step
        where = f" at step {step}" if step is not None else ""
        error_text = f"non-finite {divergence_metric}{where}"
    status = (
        RunStatus.diverged
        if outcome.diverged
        else RunStatus.stopped
        if outcome.stop is not None
        else RunStatus.completed
    )
    return Result(
        status=status,
        metrics=payload["metrics"],
        diagnostics=payload["diagnostics"],
        warnings=payload["warnings"],
        provenance=payload["provenance"],
        error=error_text,
        index=index,
    )


M = TypeVar("M", WorkerMessage, StreamedMessage)


def bundled(messages: Iterable[WorkerMessage]) -> Iterator[StreamedMessage]:
    """Messages ready together as one Bundle (one alone as itself)."""
    ready = tuple(messages)
    if len(ready) == 1:
        yield ready[0]
    elif ready:
        yield Bundle(ready)


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
    trainer_name: str,
    config: dict[str, Any],
    seed: int,
    batch_interval_s: float,
    source_seeds: dict[str, int] | None = None,
    stop_on_checks: Sequence[str] = (),
    system_metrics_interval_s: float | None = None,
) -> Iterator[WorkerMessage]:
    """One seed: `execute_seeds` with a task of one (the trainer's single-run path)."""
    yield from execute_seeds(
        trainer_name,
        config,
        [seed],
        batch_interval_s,
        [source_seeds],
        stop_on_checks,
        system_metrics_interval_s,
    )


def execute_seeds(
    trainer_name: str,
    config: dict[str, Any],
    seeds: Sequence[int],
    batch_interval_s: float,
    source_seeds: Sequence[dict[str, int] | None] | None = None,
    stop_on_checks: Sequence[str] = (),
    system_metrics_interval_s: float | None = None,
) -> Iterator[WorkerMessage]:
    """The body of the Ray task, usable without Ray (a plain generator). `seeds`: the seeds of
    one condition this task runs (one: the trainer's single-run path, `Trainer.run`; more: its
    `run_seeds`). `source_seeds`: per seed, random sources pinned to other seeds (source name ->
    seed; checked by trainers.random_sources, a bad one fails the run). `stop_on_checks`: the
    spec's checks on which a run ends early (status `stopped`). `system_metrics_interval_s`:
    how often the process's system metrics join the points (None or 0: never). See
    `SeedTask`."""
    yield from SeedTask(
        trainer_name,
        config,
        seeds,
        batch_interval_s,
        source_seeds,
        stop_on_checks,
        system_metrics_interval_s,
    ).messages()


@dataclass(frozen=True, slots=True)
class _TrainerFound:
    """The trainer thread found the trainer: its divergence metric names a divergence."""

    divergence_metric: str | None


@dataclass(frozen=True, slots=True)
class _SeedStarted:
    index: int


@dataclass(frozen=True, slots=True)
class _SeedDone:
    index: int
    outcome: RunResult | BaseException
    seconds: float  # since the task began training


@dataclass(frozen=True, slots=True)
class _TrainerEnded:
    """The trainer thread's last event: the exception that ended it, if any."""

    error: BaseException | None


_Event = _TrainerFound | _SeedStarted | _SeedDone | _TrainerEnded


class SeedTask:
    """One task's seeds: a trainer thread trains them, the thread iterating `messages()` turns
    what happens into the task's messages.

    The trainer thread, and any thread of the trainer's that calls `on_start` / `on_done`, only
    puts events on a `queue.Queue` and logs points into the seeds' reporters (each behind its
    own lock). Everything else (which seeds were announced, which have their result, the
    trainer's divergence metric, the trainer's error) belongs to the consuming thread alone, in
    the order the events were put. What the two threads share besides is set before the
    trainer thread starts and never written again."""

    def __init__(
        self,
        trainer_name: str,
        config: dict[str, Any],
        seeds: Sequence[int],
        batch_interval_s: float,
        source_seeds: Sequence[dict[str, int] | None] | None = None,
        stop_on_checks: Sequence[str] = (),
        system_metrics_interval_s: float | None = None,
    ) -> None:
        self.seeds = list(seeds)
        self.pins = list(source_seeds) if source_seeds is not None else [None] * len(self.seeds)
        if not self.seeds or len(self.pins) != len(self.seeds):
            raise ValueError("a task needs at least one seed, and one source_seeds entry per seed")
        self.trainer_name, self.config = trainer_name, config
        self.batch_interval_s, self.stop_on_checks = batch_interval_s, stop_on_checks
        self.context = ray.get_runtime_context() if ray.is_initialized() else None
        self.stop = threading.Event()  # a cancel: every seed's reporter answers should_stop()
        self.reporters = [StreamingReporter(self.stop) for _ in self.seeds]
        self.events: queue.Queue[_Event] = queue.Queue()
        self.began_at = time.perf_counter()
        self.thread = threading.Thread(
            target=self._train, daemon=True, name=f"trainer-{trainer_name}-{self.seeds[0]}"
        )
        # Set as the trainer thread returns. Waits use it, never Thread.join: a join that a
        # KeyboardInterrupt cuts short marks a thread that is still running as stopped
        # (CPython 3.11's bpo-45274 handling), so that is_alive() answers False after a
        # second cancel and the worker, never ended, trains on while Ray counts it idle.
        self.trainer_done = threading.Event()
        # the consuming thread's own
        self._announced: set[int] = set()  # the seeds whose Started was sent
        self._sent: set[int] = set()  # the seeds whose Result was sent
        self._divergence_metric: str | None = None
        self._ended: _TrainerEnded | None = None
        self.sampler = SystemSampler.for_this_task(system_metrics_interval_s)
        self._seed_began_at: dict[int, float] = {}  # perf_counter() at each seed's Started
        self._points_sent_at = self.began_at  # perf_counter() when points were last flushed

    # -- the trainer's side: events on the queue --------------------------------------------

    def on_start(self, index: int) -> None:
        self.events.put(_SeedStarted(index))

    def on_done(self, index: int, outcome: RunResult | BaseException) -> None:
        self.events.put(_SeedDone(index, outcome, time.perf_counter() - self.began_at))

    def _train(self) -> None:
        try:
            self._run_trainer()
        except BaseException as exc:  # noqa: BLE001 - every trainer failure fails its seeds
            self.events.put(_TrainerEnded(exc))
        else:
            self.events.put(_TrainerEnded(None))
        finally:
            self.trainer_done.set()

    def _run_trainer(self) -> None:
        trainer = get_trainer(self.trainer_name)
        self.events.put(_TrainerFound(getattr(trainer, "divergence_metric", None)))
        parsed = trainer.Config.model_validate(self.config)
        if len(self.seeds) == 1:
            self.on_done(
                0,
                trainer.run(
                    parsed,
                    self.seeds[0],
                    self.reporters[0],
                    threads=assigned_cpus(),
                    source_seeds=self.pins[0],
                    stop_on_checks=self.stop_on_checks,
                ),
            )
        else:
            trainer.run_seeds(
                parsed,
                self.seeds,
                self.reporters,
                threads=assigned_cpus(),
                source_seeds=self.pins,
                stop_on_checks=self.stop_on_checks,
                on_done=self.on_done,
                on_start=self.on_start,
            )

    # -- the consuming side: the task's messages ----------------------------------------------

    def messages(self) -> Iterator[WorkerMessage]:
        """The task's messages: Started, MetricBatches and one Result per seed. Iterate it in
        one thread; leaving it before the trainer has ended (Ray's cancel as a
        KeyboardInterrupt, or the generator closed) stops the trainer."""
        return self._stream(iter)

    def streamed(self) -> Iterator[StreamedMessage]:
        """`messages()` with the messages ready together (a seed's last points and its
        result) as one Bundle: what `run_task` streams."""
        return self._stream(bundled)

    def _stream(self, grouped: Callable[[Iterable[WorkerMessage]], Iterator[M]]) -> Iterator[M]:
        """The messages, each group of those ready together passed through `grouped`."""
        warm_up()  # before Started: a run counts as started when it can train at once
        started: list[WorkerMessage] = []
        if len(self.seeds) == 1:
            self._announced.add(0)
            started.append(self._began(None))
            self._sample([0])
        self.began_at = self._points_sent_at = time.perf_counter()
        self.thread.start()
        try:
            if started:  # sent with what the first STARTED_WITHIN_S bring (a small run's all)
                yield from grouped([*started, *self._flush(self._first_events())])
            while self._ended is None:
                yield from grouped(self._flush(self._next_events()))
        finally:
            # Left before the trainer ended, whichever way: Ray's cancel (KeyboardInterrupt in
            # this frame, or the generator closed when the interrupt lands in Ray's own code
            # between two messages), a consumer that stops iterating, an error here. Only a
            # KeyboardInterrupt was handled once: a closed generator left its trainer thread
            # training in a worker Ray had marked idle (seen burning a core as ray::IDLE).
            if self._ended is None:
                self._cancel()
        self.thread.join()
        yield from grouped(self._unfinished(self._ended.error))

    def _first_events(self) -> list[_Event]:
        """The events of a task's first STARTED_WITHIN_S, or until a seed ends before."""
        deadline = time.perf_counter() + min(STARTED_WITHIN_S, self.batch_interval_s)
        events: list[_Event] = []
        while (left := deadline - time.perf_counter()) > 0:
            try:
                events.append(self.events.get(timeout=left))
            except queue.Empty:
                break
            if isinstance(events[-1], _SeedDone | _TrainerEnded):
                return events + self._next_events(wait=False)
        return events

    def _next_events(self, *, wait: bool = True) -> list[_Event]:
        """The events put since the last call: waits up to a batch interval for the first
        (`wait`: not at all)."""
        try:
            events = [self.events.get(timeout=self.batch_interval_s if wait else 0)]
        except queue.Empty:
            return []
        while True:
            try:
                events.append(self.events.get_nowait())
            except queue.Empty:
                return events

    def _flush(self, events: list[_Event]) -> Iterator[WorkerMessage]:
        """In order: the seeds that began (one Started for those that began together, before
        any of their points), the seeds that ended (each with its last points before its
        result), then, once a batch interval has passed since they were last sent, the points
        of the seeds still training (an event alone does not send them: a small run's points
        go with its result, one streamed object less)."""
        for starts, group in groupby(events, key=lambda event: isinstance(event, _SeedStarted)):
            if starts:
                indices = [e.index for e in group if isinstance(e, _SeedStarted)]
                yield self._announce(indices)
                self._sample(indices)
            else:
                for event in group:
                    yield from self._handle(event)
        now = time.perf_counter()
        if events and now - self._points_sent_at < self.batch_interval_s:
            return
        self._points_sent_at = now
        if self.sampler is not None and self.sampler.due():
            self._sample(self._announced - self._sent)
        for index in sorted(self._announced - self._sent):  # a seed begun since: after Started
            yield from self._points(index)

    def _announce(self, indices: list[int]) -> Started:
        self._announced.update(indices)
        return self._began(tuple(indices))

    def _handle(self, event: _Event) -> Iterator[WorkerMessage]:
        if isinstance(event, _SeedDone):
            self._sample([event.index])
            yield from self._points(event.index)
            self._sent.add(event.index)
            yield self._result(event.outcome, event.index, event.seconds)
        elif isinstance(event, _TrainerFound):
            self._divergence_metric = event.divergence_metric
        elif isinstance(event, _TrainerEnded):
            self._ended = event

    def _sample(self, indices: Iterable[int]) -> None:
        """One reading of the system values into these seeds' points (the first for a seed
        marks its start: `sys/elapsed_s` counts from it)."""
        if self.sampler is None:
            return
        values = self.sampler.read()
        now = time.perf_counter()
        for index in indices:
            began = self._seed_began_at.setdefault(index, now)
            self.reporters[index].record_system({**values, names.ELAPSED_S: now - began})

    def _points(self, index: int) -> Iterator[MetricBatch]:
        points = self.reporters[index].drain()
        if points:
            yield MetricBatch(points, index=index)

    def _unfinished(self, error: BaseException | None) -> Iterator[Result]:
        """A failed result for every seed the trainer gave no outcome."""
        error = error or RuntimeError("the trainer returned no result for this seed")
        for index in range(len(self.seeds)):
            if index not in self._sent:
                yield self._result(error, index, time.perf_counter() - self.began_at)

    def _cancel(self) -> None:
        """Stops the trainer: waits up to CANCEL_GRACE_S of the trainer's own time for its
        thread (workers.grace: time its threads waited for a CPU does not count), then ends
        the worker.
        A second cancel (another KeyboardInterrupt) while it waits does not cut the wait short:
        it once left a trainer that had not yet reached its next check running on."""
        self.stop.set()
        clock = GraceClock(CANCEL_GRACE_S)  # the trainer's own time: not its waits for a CPU
        while not self.trainer_done.is_set() and (left := clock.left()) > 0:
            try:
                self.trainer_done.wait(min(left, GRACE_POLL_S))
            except KeyboardInterrupt:  # the cancel under way already answers it
                continue
        if not self.trainer_done.is_set():
            if in_ray_task():  # never a driver (a plain generator)
                end_worker(self.trainer_name, self.seeds)
            return
        with contextlib.suppress(KeyboardInterrupt):  # the thread's last steps after the event
            self.thread.join(CANCEL_GRACE_S)

    def _began(self, indices: tuple[int, ...] | None) -> Started:
        context = self.context
        return Started(
            pid=os.getpid(),
            node_id=context.get_node_id() if context else None,
            worker_id=context.get_worker_id() if context else None,
            hostname=socket.gethostname(),
            indices=indices,
        )

    def _result(self, outcome: RunResult | BaseException, index: int, seconds: float) -> Result:
        result = _outcome(outcome, self.reporters[index], self._divergence_metric, index)
        result.provenance["train_seconds"] = seconds
        if len(self.seeds) > 1:
            result.provenance["task_seeds"] = list(self.seeds)
        return result


def end_worker(trainer_name: str, seeds: Sequence[int]) -> None:
    """End this Ray worker process now: its trainer thread ignored a cancel for the whole
    grace. The dispatcher, which sent the cancel, reads the lost worker as the task's cancel;
    Ray starts a fresh worker for the next task."""
    print(
        f"seedgrid: trainer {trainer_name!r} (seeds {list(seeds)}) did not stop within "
        f"{CANCEL_GRACE_S:g} s of its cancel; ending worker process {os.getpid()}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def task_messages(
    trainer_name: str,
    config: dict[str, Any],
    seeds: Sequence[int],
    batch_interval_s: float = 0.5,
    source_seeds: Sequence[dict[str, int] | None] | None = None,
    stop_on_checks: Sequence[str] = (),
    system_metrics_interval_s: float | None = None,
) -> Iterator[StreamedMessage]:
    """The body of `run_task`, the Ray streaming generator running one condition's seeds (one,
    or a seed-batched task of several): `execute_seeds`' messages, those ready together as one
    Bundle (SeedTask.streamed); the dispatcher does retries. Ray's cancel lands in it whatever
    SIGINT disposition the worker inherited (workers.interrupts)."""
    accept_cancels()
    yield from SeedTask(
        trainer_name,
        config,
        seeds,
        batch_interval_s,
        source_seeds,
        stop_on_checks,
        system_metrics_interval_s,
    ).streamed()


run_task = ray.remote(max_retries=0)(task_messages)
