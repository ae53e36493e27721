"""A dispatcher's harvesting (service.scheduling.dispatcher): forward cancels to Ray, read what
the tasks in flight streamed, and store it in one transaction, or run by run when the database
refuses a run's rows."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayError, TaskCancelledError

from api_schemas import RunStatus, storable_text
from api_schemas.system_metrics import is_system_metric
from api_schemas.tracebacks import innermost_frame
from service.scheduling.dispatcher_base import DispatcherBase
from service.scheduling.flights import Harvest, InFlight, TaskFlight, tasks_of
from service.scheduling.ray_helpers import error_line, operator_paths
from service.scheduling.run_store import FinishedAttempt, RunStore, StartedAttempt
from service.storage.db import database_trouble
from trainers import REGISTRY
from workers.messages import MetricBatch, Result, Started, WorkerMessage, unbundled

log = logging.getLogger("seedgrid.dispatcher")

# After a cooperative cancel, how long a task gets before it is killed.
FORCE_CANCEL_AFTER_S = 15.0
CANCEL_CHECK_INTERVAL_S = 0.25
# What the tasks stream is held up to this long before its transaction, so that one
# transaction stores the results of the many small tasks that end meanwhile: written a pump at
# a time, the transactions (the held attempts, the points, the results, the experiments'
# counts and status) were most of the dispatcher's time per run with small tasks
# (benchmarks/dispatch.py). A failed, lost or cancelled run, and the last runs in flight, are
# written at once.
PERSIST_HOLD_S = 0.05


def metric_rows(run_id: int, batch: MetricBatch) -> list[dict[str, Any]]:
    """A worker's batch of points as the metricpoint rows the harvest stores
    (service.scheduling.run_moves.record_points; benchmarks/ingest.py times the two)."""
    return [
        {"run_id": run_id, "step": s, "epoch": e, "name": n, "value": v}
        for s, e, n, v in batch.points
    ]


class Harvesting(DispatcherBase):
    """Reading from Ray and storing."""

    def _forward_cancellations(self) -> None:
        now = time.monotonic()
        if not self.in_flight or now - self._last_cancel_check < CANCEL_CHECK_INTERVAL_S:
            return
        self._last_cancel_check = now
        with self._session() as session:
            ids = RunStore(session).cancel_requested(self.in_flight)
        # A cancel ends every seed of a task (an experiment's cancel asks it of all its runs).
        for task in tasks_of(self.in_flight[i] for i in ids if i in self.in_flight):
            if task.cancel_sent_at is None:
                ray.cancel(task.generator)
                task.cancel_sent_at = now
            elif now - task.cancel_sent_at > FORCE_CANCEL_AFTER_S:
                ray.cancel(task.generator, force=True)

    def _pump(self, timeout_s: float) -> Harvest:
        harvest = Harvest()
        if not self.in_flight:
            if timeout_s:
                if self._wake.wait(timeout_s):
                    self.idle_waits_woken += 1
                self._wake.clear()
            return harvest
        tasks = tasks_of(self.in_flight.values())
        by_generator = {id(task.generator): task for task in tasks}
        generators = [task.generator for task in tasks]
        ready, _ = ray.wait(generators, num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = ray.wait(generators, num_returns=len(generators), timeout=0)
        for generator in ready:
            task = by_generator[id(generator)]
            harvest.flights.update({f.run_id: f for f in task.runs.values()})
            try:
                self._drain(task, harvest)
            except Exception as exc:  # a message this process cannot read: this task only
                log.exception("cannot read the messages of task %s", task.runs)
                self._lose(
                    task,
                    harvest,
                    storable_text(
                        f"its messages could not be read: {type(exc).__name__}: {error_line(exc)}"
                    ),
                )
        if harvest.results or harvest.cancelled or harvest.lost:
            self.metrics.keep_system_of({f.task.trainer for f in self.in_flight.values()})
        return harvest

    def _drain(self, task: TaskFlight, harvest: Harvest) -> None:
        """Read every message the task has ready now."""
        generator = task.generator
        while True:
            try:
                ref = next(generator)
                message = ray.get(ref)
            except StopIteration:
                self._lose(task, harvest, "the task ended without a result")
                return
            except TaskCancelledError:
                self._end_cancelled(task, harvest)
                return
            except RayError as exc:
                # After a cancel, a worker that ends (forced, or the worker ending itself when
                # its trainer outlasts the grace: workers.task) ends its runs cancelled.
                if task.cancel_sent_at is not None or isinstance(
                    getattr(exc, "cause", None), TaskCancelledError
                ):
                    self._end_cancelled(task, harvest)
                else:
                    self._lose(
                        task, harvest, storable_text(f"{type(exc).__name__}: {error_line(exc)}")
                    )
                return
            for part in unbundled(message):
                if self._take(task, harvest, part):
                    return
            if not generator.next_ready():
                return

    def _take(self, task: TaskFlight, harvest: Harvest, message: WorkerMessage) -> bool:
        """One message of the task into the harvest; True when the task has no seed left."""
        if isinstance(message, Started):
            now = time.monotonic()
            if task.started is None:
                task.started = message
            # the seeds that began now: all of them, or (a task running its seeds one
            # after another) each in turn; one dispatch per run attempt
            indices = task.runs.keys() if message.indices is None else message.indices
            for flight in [task.runs[i] for i in indices if i in task.runs]:
                flight.started_at = now
                self.metrics.dispatch_latency.observe(now - task.claimed_at)
                harvest.started.append((flight, message))
        elif isinstance(message, MetricBatch):
            batched = task.runs.get(message.index)
            if batched is not None:
                harvest.metrics += metric_rows(batched.run_id, message)
                for _, _, name, value in message.points:
                    if is_system_metric(name) and value is not None:
                        self.metrics.record_system(task.trainer, name, value)
        elif isinstance(message, Result):
            ended = task.runs.pop(message.index, None)
            if ended is not None:
                result = message.storable()
                if result.traceback:  # the operator's file, not Ray's copy of it
                    result = replace(result, traceback=operator_paths(result.traceback))
                harvest.results.append((ended, result))
                del self.in_flight[ended.run_id]
                began = ended.started_at if ended.started_at is not None else task.claimed_at
                self.metrics.run_duration.labels(task.trainer).observe(time.monotonic() - began)
            if not task.runs:
                return True
        return False

    def _end_cancelled(self, task: TaskFlight, harvest: Harvest) -> None:
        """The task was cancelled: every seed of it without a result ends cancelled."""
        for flight in task.runs.values():
            harvest.cancelled.append(flight)
            del self.in_flight[flight.run_id]
        task.runs.clear()

    def _lose(self, task: TaskFlight, harvest: Harvest, reason: str) -> None:
        """The task died without a result for some seeds: its worker or node is gone (the runs
        store retries or fails each of those runs when the harvest is written; the seeds that
        sent their result are kept)."""
        if not task.runs:
            return
        for flight in task.runs.values():
            harvest.lost.append((flight, reason))
            del self.in_flight[flight.run_id]
        task.runs.clear()
        self.metrics.worker_losses.inc()

    # -- persistence ---------------------------------------------------------------------------

    def _persist(self, harvest: Harvest) -> None:
        with self._session() as session:
            store = RunStore(session)
            store.lock_experiments(flight.experiment_id for flight in harvest.flights.values())
            store.start(
                [
                    StartedAttempt(
                        key=flight.key,
                        node_id=started.node_id,
                        worker_id=started.worker_id,
                        pid=started.pid,
                    )
                    for flight, started in harvest.started
                ]
            )
            store.record_points(
                harvest.metrics,
                {run_id: flight.experiment_id for run_id, flight in harvest.flights.items()},
            )
            store.finish(
                [
                    FinishedAttempt(
                        key=flight.key,
                        status=result.status,
                        metrics=result.metrics,
                        diagnostics=result.diagnostics,
                        warnings=result.warnings,
                        # where it ran and who stored it, beside what the trainer recorded
                        provenance={
                            **result.provenance,
                            "hostname": flight.started.hostname if flight.started else None,
                            "attempt": flight.attempt,
                            "dispatcher": self.identity,
                            # read by /stats where the trainer's code is not loaded
                            "test_set_sizes": recorded_test_set_sizes(
                                flight.task.trainer, result.diagnostics
                            ),
                        },
                        error=result.error,
                        traceback=result.traceback,
                    )
                    for flight, result in harvest.results
                ]
            )
            for flight in harvest.cancelled:
                store.end_cancelled(flight.key)
            for flight, reason in harvest.lost:
                if store.lose(flight.key, reason) is RunStatus.queued:
                    log.warning("run %s was lost (%s); retrying", flight.run_id, reason)
            store.commit()
        for flight, result in harvest.results:
            if result.status == RunStatus.failed:
                frame = innermost_frame(result.traceback)
                where = f" at {frame}" if frame is not None else ""
                log.warning("run %s failed%s: %s", flight.run_id, where, result.error)

    def _hold(self, harvest: Harvest) -> None:
        """Keep what a pump read for the next write (`_save_unsaved`), after what is held."""
        if self._unsaved is None:
            self._unsaved = harvest
            self._unsaved_since = time.monotonic()
        else:
            self._unsaved.extend(harvest)

    def _hold_left(self) -> float:
        """Seconds until the held harvest is due (PERSIST_HOLD_S); 0 when it is due now."""
        harvest = self._unsaved
        if harvest is None:
            return math.inf
        if (
            harvest.lost
            or harvest.cancelled
            or not self.in_flight
            # a failure may stop its experiment (its first-failures stop): at once
            or any(result.status == RunStatus.failed for _, result in harvest.results)
        ):
            return 0.0
        return max(0.0, self._unsaved_since + PERSIST_HOLD_S - time.monotonic())

    def _save_unsaved(self, *, when_due: bool = False) -> None:
        """Write the harvest read from Ray (`when_due`: only once it has been held
        PERSIST_HOLD_S). When its transaction fails, write it run by run, so that one run whose
        rows the database refuses can neither hold back nor fail another: that run alone ends
        `failed`, with the reason stored. A failure of the database itself (a dropped
        connection, a lock) keeps what is unwritten for the next loop."""
        harvest = self._unsaved
        if harvest is None or (when_due and self._hold_left() > 0):
            return
        try:
            self._persist(harvest)
        except Exception as exc:
            self.lock.check()  # a lost lock is not the harvest's fault: LockLost, keep it
            if database_trouble(exc):
                raise  # kept; the loop pauses and writes it again
            self._persist_run_by_run(harvest)
        self._unsaved = None

    def _persist_run_by_run(self, harvest: Harvest) -> None:
        """Each run's part of `harvest` in its own transaction; a part the database refuses ends
        its run `failed`. What is not written yet (database trouble, a lost lock) stays unsaved,
        never a part already written: that would store its points twice."""
        remaining = set(harvest.flights)
        trouble: Exception | None = None
        try:
            for run_id, flight in list(harvest.flights.items()):
                try:
                    self._persist(harvest.only({run_id}))
                except Exception as exc:
                    self.lock.check()
                    if database_trouble(exc):
                        trouble = exc
                        continue
                    reason = f"its results could not be stored: {error_line(exc)}"
                    log.error("run %s: %s", run_id, reason)
                    self._fail_unstorable(flight, storable_text(reason))
                remaining.discard(run_id)
        finally:
            self._unsaved = harvest.only(remaining) if remaining else None
        if trouble is not None:
            raise trouble

    def _fail_unstorable(self, flight: InFlight, reason: str) -> None:
        """The run's rows cannot be stored: end it `failed` with `reason` (not retried: the
        same config would send the same rows again) and stop its task. In a seed-batched task
        the other seeds go on: only the failed seed's messages are ignored from now on, and
        the task is stopped once none of its seeds is left."""
        if self.in_flight.pop(flight.run_id, None) is not None:
            flight.task.runs.pop(flight.index, None)
            if not flight.task.runs:
                ray.cancel(flight.generator, force=True)
        try:
            with self._session() as session:
                store = RunStore(session)
                store.lock_experiments([flight.experiment_id])
                store.fail(flight.key, reason)
                store.commit()
        except Exception:  # the next dispatcher to take the lock re-queues it as an orphan
            log.exception("run %s: could not store its failure either", flight.run_id)


def recorded_test_set_sizes(trainer: str, diagnostics: dict[str, Any]) -> dict[str, int]:
    """A completed run's {metric: test examples it averages}, from its trainer's code while it
    is loaded, stored with the run so that /stats reports the noise floor without that code
    (service.analysis.catalogue.test_set_sizes). A trainer's own code that raises here costs
    only this record, never the run's result."""
    registered = REGISTRY.get(trainer)
    if registered is None:
        return {}
    try:
        sizes = registered.test_set_sizes(diagnostics or {})
    except Exception:
        log.exception("trainer %r: test_set_sizes raised; its sizes are not recorded", trainer)
        return {}
    return {
        str(m): n
        for m, n in (sizes or {}).items()
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1
    }
