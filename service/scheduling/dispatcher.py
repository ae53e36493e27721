"""The dispatcher: the database queue -> Ray tasks, and their results -> the database.

One dispatcher acts per database; it is the Ray driver. It acts only while it holds the dispatch
lock (service.scheduling.lease); a dispatcher that cannot take it stands by and polls, and takes
over when
the holder is gone. Taking over, it re-queues the runs a previous holder left in Ray. Then
each loop it
1. claims queued runs in priority order (higher first, then oldest) up to `max_in_flight` tasks,
   marks them pending, counts the attempt and submits one `workers.run_task` per task with the
   run's resources: a task runs one seed, or up to the experiment's seeds_per_task seeds of one
   condition claimed together (a seed-batched task; each seed stays its own run);
2. forwards cancellations requested through the API to Ray;
3. reads whatever the in-flight tasks streamed (start, metric batches, final result) and
   persists it in one transaction; when the database refuses that, run by run, so that a run
   whose rows cannot be stored ends `failed` alone and every other run is written.
A run whose worker or node died is re-queued until it has used max_retries + 1 attempts; when
a seed-batched task dies, only its seeds without a result are.

Stopping (SIGTERM, the API's shutdown), it saves the results Ray already has, cancels the runs
still in flight and puts them back in the queue without charging them an attempt: Ray ties a
task's life to its driver's, so none of them could outlive this process anyway.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import ray
from ray.exceptions import RayError, TaskCancelledError
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from api_schemas import RunStatus, storable_text
from service.analysis.sources import SourcePlan
from service.scheduling.adaptive import decide_due
from service.scheduling.lease import DispatchLock, LockLost, dispatcher_identity, make_dispatch_lock
from service.scheduling.metrics import DispatcherMetrics
from service.scheduling.run_store import (
    AttemptKey,
    ClaimedRun,
    FinishedAttempt,
    RunStore,
    StartedAttempt,
)
from service.settings import Settings
from service.specs import config_condition, seeds_per_task
from service.storage.db import database_trouble, masked_url
from trainers import REGISTRY
from workers import run_task
from workers.messages import MetricBatch, Result, Started

log = logging.getLogger("seedgrid.dispatcher")

# After a cooperative cancel, how long a task gets before it is killed.
FORCE_CANCEL_AFTER_S = 15.0
CANCEL_CHECK_INTERVAL_S = 0.25
# How often the dispatcher re-reads the nodes' resources for the feasibility check.
NODE_CHECK_INTERVAL_S = 5.0
# How often a standby tries the lock: the bound on a takeover's delay once the holder is gone.
STANDBY_POLL_S = 0.5
# How often the active dispatcher confirms it still holds the lock when it has nothing to write.
LOCK_CHECK_INTERVAL_S = 1.0
# How often the adaptive experiments are checked for a due look.
LOOK_CHECK_INTERVAL_S = 0.5


def infeasible(num_cpus: float, num_gpus: float, nodes: list[tuple[float, float]]) -> str | None:
    """Why no node in `nodes` ((CPUs, GPUs) each) can ever hold a run asking for these, or
    None when one can (or when nothing is known about the nodes)."""
    if not nodes or any(c >= num_cpus and g >= num_gpus for c, g in nodes):
        return None
    cpus, gpus = max(c for c, _ in nodes), max(g for _, g in nodes)
    return (f"no node of the Ray cluster can hold this run: it asks for num_cpus={num_cpus:g}, "
            f"num_gpus={num_gpus:g}, and the largest nodes have {cpus:g} CPUs and {gpus:g} GPUs "
            f"(set SEEDGRID_FAIL_INFEASIBLE_RUNS=false on an autoscaling cluster)")


def ensure_ray(settings: Settings) -> None:
    """Join the configured cluster, or start a local Ray, once per process."""
    if ray.is_initialized():
        return
    # ray.init makes SIGTERM exit the process at once; keep the handler we had (uvicorn's, the
    # dispatcher command's), so that SIGTERM still stops seedgrid cleanly.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        if settings.ray_address:
            ray.init(address=settings.ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=settings.ray_num_cpus, include_dashboard=False, log_to_driver=False)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@dataclass(eq=False)
class TaskFlight:
    """One Ray task in flight: the seeds of one condition it runs (one, or a seed-batched
    task's), by their index in the task, while they have no result."""

    generator: Any
    trainer: str
    # time.monotonic() at the claim: the dispatch latency (/metrics)
    claimed_at: float
    runs: dict[int, InFlight] = field(default_factory=dict)
    cancel_sent_at: float | None = None
    # the task's first Started (where it runs)
    started: Started | None = None


@dataclass(eq=False)
class InFlight:
    """One run in flight: its attempt, and the task (and place in it) that runs it."""

    run_id: int
    experiment_id: int
    attempt: int
    task: TaskFlight
    index: int = 0
    # time.monotonic() at its seed's Started: the run's duration (/metrics)
    started_at: float | None = None

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(run_id=self.run_id, experiment_id=self.experiment_id,
                          attempt=self.attempt)

    @property
    def generator(self) -> Any:
        return self.task.generator

    @property
    def started(self) -> Started | None:
        return self.task.started


def tasks_of(flights: Any) -> list[TaskFlight]:
    """The distinct tasks of some flights, in first-seen order."""
    return list({id(f.task): f.task for f in flights}.values())


@dataclass(frozen=True)
class RunTemplate:
    """What every run of one experiment shares: the base config, how its runs seed their
    random sources, the checks on which a run ends early and the seeds one task runs."""

    config: dict[str, Any]
    sources: SourcePlan
    stop_on_checks: tuple[str, ...]
    seeds_per_task: int = 1


@dataclass
class Harvest:
    """Everything one pump read from Ray, written in one transaction."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    started: list[tuple[InFlight, Started]] = field(default_factory=list)
    results: list[tuple[InFlight, Result]] = field(default_factory=list)
    lost: list[tuple[InFlight, str]] = field(default_factory=list)
    cancelled: list[InFlight] = field(default_factory=list)
    # every flight something above came from, by run id
    flights: dict[int, InFlight] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.metrics or self.started or self.results or self.lost or self.cancelled)

    def only(self, run_ids: set[int]) -> Harvest:
        """The part of this harvest about the given runs."""
        return Harvest(
            metrics=[m for m in self.metrics if m["run_id"] in run_ids],
            started=[(f, m) for f, m in self.started if f.run_id in run_ids],
            results=[(f, m) for f, m in self.results if f.run_id in run_ids],
            lost=[(f, r) for f, r in self.lost if f.run_id in run_ids],
            cancelled=[f for f in self.cancelled if f.run_id in run_ids],
            flights={i: f for i, f in self.flights.items() if i in run_ids},
        )


class Dispatcher:
    def __init__(
        self, settings: Settings, engine: Engine, *, lock: DispatchLock | None = None,
        metrics: DispatcherMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics = metrics or DispatcherMetrics()
        self.identity = lock.identity if lock is not None else dispatcher_identity()
        self.lock = lock or make_dispatch_lock(settings.database_url, self.identity)
        self.in_flight: dict[int, InFlight] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_cancel_check = 0.0
        self._nodes: list[tuple[float, float]] = []
        self._nodes_checked_at = -math.inf
        self._last_lock_check = 0.0
        self._last_look_check = -math.inf
        # A harvest read from Ray whose transaction failed: written before anything else.
        self._unsaved: Harvest | None = None
        # What the runs of each experiment with runs in flight share (a spec never changes);
        # a str: why the experiment's stored spec cannot make a task.
        self._templates: dict[int, RunTemplate | str] = {}
        # Claimed runs Ray refused a task for, whose failure is not stored yet.
        self._refused: list[tuple[AttemptKey, str]] = []
        self._standby_announced = False
        self._database_unreachable = False
        self.max_in_flight = settings.max_in_flight or 4
        self.error: BaseException | None = None
        # Steps that failed since this dispatcher started (/healthz, /metrics), the last one's
        # error, and whether the latest step failed (a step that succeeds clears it).
        self.step_errors = 0
        self.last_step_error: str | None = None
        self.failing = False
        # "active" (holds the lock and dispatches), "standby" (waits for the lock) or "stopped"
        self.state = "stopped"

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Take the lock now if it is free (then Ray is up and orphans re-queued on return);
        otherwise stand by in the background."""
        self._stop.clear()
        self.state = "standby"
        acquired = self._try_acquire()
        if acquired is False or (acquired and not self._activate()):
            self._announce_standby()
        self._thread = threading.Thread(target=self._run, name="seedgrid-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop dispatching: save what Ray already returned, put the runs still in flight back
        in the queue (not charged as an attempt), release the lock."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        else:
            self.lock.close()
            self.state = "stopped"

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.state == "active":
                    self._dispatch()
                else:
                    self._stand_by()
        except BaseException as exc:  # only Ray failing to start gets here; the CLI reports it
            self.error = exc
            log.exception("the dispatcher stopped")
        finally:
            self._shut_down()

    # -- the lock ------------------------------------------------------------------------------
    def _try_acquire(self) -> bool | None:
        """Whether this process holds the lock now; None when the database did not answer."""
        try:
            acquired = self.lock.try_acquire()
        except (DBAPIError, OSError) as exc:
            if not self._database_unreachable:
                log.warning("cannot take the dispatch lock (%s); retrying every %s s",
                            _first_line(exc), STANDBY_POLL_S)
                self._database_unreachable = True
            return None
        self._database_unreachable = False
        return acquired

    def _activate(self) -> bool:
        """Just took the lock: connect to Ray and settle what earlier holders left running."""
        try:
            ensure_ray(self.settings)
        except BaseException:
            self.lock.release()
            raise
        if self.settings.max_in_flight is None:
            # Enough submitted runs that Ray's own queue never runs dry between two loops.
            cpus = int(ray.cluster_resources().get("CPU", 2))
            self.max_in_flight = max(32, 4 * cpus)
        try:
            self.requeue_orphans()
        except (LockLost, DBAPIError) as exc:
            log.warning("took the dispatch lock but could not take over (%s); standing by", exc)
            self.lock.drop()
            return False
        self.state = "active"
        self._standby_announced = False
        self._last_lock_check = time.monotonic()
        log.info("dispatcher %s is active on %s", self.identity,
                 masked_url(self.settings.database_url))
        return True

    def _announce_standby(self) -> None:
        if not self._standby_announced:
            log.info("dispatcher %s is standby: %s holds the dispatch lock on %s; polling "
                     "every %s s", self.identity, self.lock.holder() or "another dispatcher",
                     masked_url(self.settings.database_url), STANDBY_POLL_S)
            self._standby_announced = True

    def _stand_by(self) -> None:
        while not self._stop.is_set():
            acquired = self._try_acquire()
            if acquired and self._activate():
                return
            if acquired is False:
                # Another dispatcher holds the lock, so it has re-queued what this one had left
                # in Ray; those copies could never be saved.
                self._cancel_in_ray("another dispatcher holds the lock")
                self._announce_standby()
            self._stop.wait(STANDBY_POLL_S)

    def _lost_lock(self, reason: str) -> None:
        """Stop dispatching at once. What is in flight stays in Ray until this process takes
        the lock back (then it is kept) or sees that another dispatcher holds it."""
        self.lock.drop()
        self.state = "standby"
        log.error("dispatcher %s lost the dispatch lock (%s) and stopped dispatching; %d runs "
                  "are left in Ray", self.identity, reason, len(self.in_flight))

    def _session(self) -> Session:
        """A session for the holder's work; on PostgreSQL it runs on the lock's connection."""
        return Session(bind=self.lock.bind(self.engine))

    # -- taking over and stopping --------------------------------------------------------------
    def requeue_orphans(self) -> int:
        """Runs pending or running that this process is not running go back to the queue.

        Only a holder of the lock claims runs, and its claims commit only while it holds it,
        so every such run was left by an earlier holder: a process that died, or this one
        before it lost the lock (its runs still in flight at the same attempt are kept). The
        lost attempt counts against the run's max_retries, as a lost worker's does.
        """
        ours = {flight.run_id: flight for flight in self.in_flight.values()}
        if self._unsaved is not None:
            ours.update(self._unsaved.flights)
        with self._session() as session:
            store = RunStore(session)
            orphans = store.requeue_orphans({i: f.attempt for i, f in ours.items()})
            store.commit()
        kept = set(ours) - set(orphans)
        dropped = [self.in_flight.pop(run_id) for run_id in list(self.in_flight)
                   if run_id not in kept]
        for task in tasks_of(dropped):
            # Cooperatively: the trainer returns at its next step and the worker stays warm.
            ray.cancel(task.generator)
        if self._unsaved is not None:
            self._unsaved = self._unsaved.only(kept)
        if orphans:
            log.info("re-queued %d runs left in Ray by an earlier dispatcher", len(orphans))
        return len(orphans)

    def _shut_down(self) -> None:
        was_active = self.state == "active"
        if was_active:
            try:
                self._save_and_interrupt()
            except Exception:  # the next holder re-queues them as orphans instead
                log.exception("could not put the runs in flight back in the queue")
        self._cancel_in_ray("the dispatcher stopped", force=True)
        self.lock.close()
        self.state = "stopped"
        log.info("dispatcher %s stopped%s", self.identity,
                 " and released the dispatch lock" if was_active else "")

    def _save_and_interrupt(self) -> None:
        self._save_unsaved()
        harvest = self._pump(timeout_s=0)  # results Ray already has are kept, not re-run
        if harvest:
            self._unsaved = harvest
            self._save_unsaved()
        if not self.in_flight:
            return
        flights = list(self.in_flight.values())
        for task in tasks_of(flights):
            ray.cancel(task.generator, force=True)
        with self._session() as session:
            store = RunStore(session)
            store.lock_experiments(flight.experiment_id for flight in flights)
            store.interrupt([flight.key for flight in flights], "the dispatcher stopped")
            store.commit()
        self.in_flight.clear()
        log.info("put %d runs in flight back in the queue", len(flights))

    def _cancel_in_ray(self, reason: str, force: bool = False) -> None:
        """Drop this process's flights without a database write (it may not hold the lock).
        Cooperatively unless `force`: the trainers return at their next step, and their
        workers stay up for the next runs."""
        if self.in_flight:
            log.warning("cancelling the %d runs this dispatcher had in Ray: %s",
                        len(self.in_flight), reason)
            for task in tasks_of(self.in_flight.values()):
                ray.cancel(task.generator, force=force)
            self.in_flight.clear()
        self._unsaved = None

    # -- the loop ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
                now = time.monotonic()
                if now - self._last_lock_check >= LOCK_CHECK_INTERVAL_S:
                    self._last_lock_check = now
                    self.lock.check()
            except LockLost as exc:
                self._lost_lock(str(exc))
                return
            except Exception as exc:  # keep dispatching; a database blip must not stop it
                try:
                    self.lock.check()
                except LockLost as lost:  # the blip took the lock's connection with it
                    self._lost_lock(str(lost))
                    return
                self.error = exc
                self.step_errors += 1
                self.last_step_error = storable_text(f"{type(exc).__name__}: {_first_line(exc)}",
                                                     1000)
                self.failing = True
                self.metrics.step_errors.inc()
                log.exception("dispatcher step failed; retrying")
                self._stop.wait(1.0)
            else:
                self.failing = False

    def step(self) -> None:
        """One pass. An error that belongs to one experiment (its look, its stored spec, a task
        Ray refuses) ends that experiment's affected runs or its rule, and the pass goes on for
        the others; what escapes is the database's or Ray's own trouble, retried next pass."""
        self._save_unsaved()
        self._store_refused()
        self._take_due_looks()
        claimed = self._fill()
        self._forward_cancellations()
        harvest = self._pump(timeout_s=0 if claimed else self.settings.dispatch_poll_interval_s)
        if harvest:
            # Read from Ray once only: kept until a transaction has written it.
            self._unsaved = harvest
            self._save_unsaved()

    def _take_due_looks(self) -> None:
        """Adaptive experiments whose round ended get their look (service.scheduling.adaptive):
        stopped,
        or their next round queued before this pass claims runs."""
        now = time.monotonic()
        if now - self._last_look_check < LOOK_CHECK_INTERVAL_S:
            return
        self._last_look_check = now
        with self._session() as session:
            decide_due(session, settings=self.settings)

    def _save_unsaved(self) -> None:
        """Write the harvest read from Ray. When its transaction fails, write it run by run, so
        that one run whose rows the database refuses can neither hold back nor fail another:
        that run alone ends `failed`, with the reason stored. A failure of the database itself
        (a dropped connection, a lock) keeps what is unwritten for the next loop."""
        harvest = self._unsaved
        if harvest is None:
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
                    reason = f"its results could not be stored: {_first_line(exc)}"
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

    def _fill(self) -> int:
        free = self.max_in_flight - len(tasks_of(self.in_flight.values()))
        if free <= 0:
            return 0
        nodes = self._node_capacities()
        # Only an experiment with runs in flight keeps its template: such an experiment cannot
        # be deleted, so no cached spec outlives its row (the others are read again when their
        # runs are claimed, in the claim's transaction).
        live = {flight.experiment_id for flight in self.in_flight.values()}
        self._templates = {i: t for i, t in self._templates.items() if i in live}
        with self._session() as session:
            store = RunStore(session)
            # max_in_flight counts tasks: room for `free` tasks as large as those of the
            # experiments next in the queue, so that a seed-batched experiment's first claim
            # (after a restart too) makes whole tasks of its seeds_per_task.
            upcoming = self._run_templates(store, set(store.next_queued_experiments(free)))
            factor = max([_task_size(t) for t in upcoming.values()], default=1)

            def whole_tasks(rows: list[Any]) -> list[Any]:
                """The runs of the first `free` tasks the candidates make, no more: one task
                slot is one task, however many seeds it runs."""
                sizes = {i: _task_size(t) for i, t in self._run_templates(
                    store, {row.experiment_id for row in rows}).items()}
                return [row for group in task_groups(rows, sizes)[:free] for row in group]

            claimed = store.claim(free * factor, take=whole_tasks,
                                  unschedulable=lambda cpus, gpus: infeasible(cpus, gpus, nodes))
            templates = self._run_templates(store, {run.experiment_id for run in claimed})
            store.commit()
        refused: list[tuple[ClaimedRun, str]] = []
        for group in task_groups(claimed, {i: _task_size(t) for i, t in templates.items()}):
            try:
                task = self._submit(group, templates[group[0].experiment_id])
            except Exception as exc:  # this task's runs fail; the other tasks go on
                reason = storable_text(f"its task could not be submitted to Ray: "
                                       f"{type(exc).__name__}: {_first_line(exc)}")
                template = templates[group[0].experiment_id]
                reason = template if isinstance(template, str) else reason
                log.error("runs %s: %s", ",".join(str(run.id) for run in group), reason)
                refused += [(run, reason) for run in group]
                continue
            for index, run in enumerate(group):
                flight = InFlight(run_id=run.id, experiment_id=run.experiment_id,
                                  attempt=run.attempt, task=task, index=index)
                task.runs[index] = flight
                self.in_flight[run.id] = flight
        if refused:
            self._refused += [(AttemptKey(run_id=run.id, experiment_id=run.experiment_id,
                                          attempt=run.attempt), reason)
                              for run, reason in refused]
            self._store_refused()
        return len(claimed)

    def _submit(self, group: list[ClaimedRun], template: RunTemplate | str) -> TaskFlight:
        """One Ray task for a group of claimed runs (one condition's seeds); raises when the
        experiment's spec cannot make one or Ray refuses it."""
        if isinstance(template, str):
            raise ValueError(template)
        first = group[0]
        config = {**template.config, **config_condition(first.condition)}
        # Ray titles the worker process after its task: "seedgrid-run-7" or, for a
        # seed-batched task, "seedgrid-run-7,8,9,10"
        name = "seedgrid-run-" + ",".join(str(run.id) for run in group)
        generator = run_task.options(
            num_cpus=first.num_cpus, num_gpus=first.num_gpus, name=name
        ).remote(first.trainer, config, [run.seed for run in group],
                 self.settings.metrics_batch_interval_s,
                 [template.sources.source_seeds(run.condition) for run in group],
                 template.stop_on_checks)
        return TaskFlight(generator=generator, trainer=first.trainer,
                          claimed_at=time.monotonic())

    def _store_refused(self) -> None:
        """End the claimed runs Ray refused a task for `failed`, with the reason (not retried:
        the same spec would be refused again), so that none stays pending outside Ray. Kept
        for the next pass when the database does not answer."""
        if not self._refused:
            return
        with self._session() as session:
            store = RunStore(session)
            store.lock_experiments(key.experiment_id for key, _ in self._refused)
            for key, reason in self._refused:
                store.fail(key, reason)
            store.commit()
        self._refused = []

    def _run_templates(self, store: RunStore, experiment_ids: set[int]
                       ) -> dict[int, RunTemplate | str]:
        """What the runs of each experiment share (from its spec, stored once), read once
        while it has runs in flight: a spec never changes. A spec that cannot make a template
        gives the reason instead, and only that experiment's runs fail."""
        missing = experiment_ids - set(self._templates)
        for i, spec in store.specs(missing).items():
            try:
                self._templates[i] = RunTemplate(
                    config=dict(spec.get("config", {})), sources=SourcePlan.of(spec),
                    stop_on_checks=tuple(spec.get("stop_on_checks", ())),
                    seeds_per_task=_seeds_per_task(spec))
            except Exception as exc:  # a spec stored by an older version, say
                self._templates[i] = storable_text(
                    f"its stored spec cannot make a task: {type(exc).__name__}: "
                    f"{_first_line(exc)}")
        return {i: self._templates[i] for i in experiment_ids if i in self._templates}

    def _node_capacities(self) -> list[tuple[float, float]]:
        """(CPUs, GPUs) of every alive Ray node, refreshed every few seconds; empty when the
        check is off."""
        if not self.settings.fail_infeasible_runs:
            return []
        now = time.monotonic()
        if now - self._nodes_checked_at > NODE_CHECK_INTERVAL_S:
            self._nodes = [
                (float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)))
                for n in ray.nodes() if n.get("Alive")
            ]
            self._nodes_checked_at = now
        return self._nodes

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
                self._stop.wait(timeout_s)
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
                self._lose(task, harvest, storable_text(
                    f"its messages could not be read: {type(exc).__name__}: {_first_line(exc)}"))
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
                if (task.cancel_sent_at is not None
                        or isinstance(getattr(exc, "cause", None), TaskCancelledError)):
                    self._end_cancelled(task, harvest)
                else:
                    self._lose(task, harvest,
                               storable_text(f"{type(exc).__name__}: {_first_line(exc)}"))
                return
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
                    harvest.metrics += [
                        {"run_id": batched.run_id, "step": s, "epoch": e, "name": n, "value": v}
                        for s, e, n, v in message.points
                    ]
            elif isinstance(message, Result):
                ended = task.runs.pop(message.index, None)
                if ended is not None:
                    harvest.results.append((ended, message.storable()))
                    del self.in_flight[ended.run_id]
                    began = (ended.started_at if ended.started_at is not None
                             else task.claimed_at)
                    self.metrics.run_duration.labels(task.trainer).observe(
                        time.monotonic() - began)
                if not task.runs:
                    return
            if not generator.next_ready():
                return

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
            store.start([StartedAttempt(key=flight.key, node_id=started.node_id,
                                        worker_id=started.worker_id, pid=started.pid)
                         for flight, started in harvest.started])
            store.record_points(harvest.metrics)
            store.finish([FinishedAttempt(
                key=flight.key, status=result.status, metrics=result.metrics,
                diagnostics=result.diagnostics, warnings=result.warnings,
                # where it ran and who stored it, beside what the trainer recorded
                provenance={**result.provenance,
                            "hostname": flight.started.hostname if flight.started else None,
                            "attempt": flight.attempt, "dispatcher": self.identity},
                error=result.error) for flight, result in harvest.results])
            for flight in harvest.cancelled:
                store.end_cancelled(flight.key)
            for flight, reason in harvest.lost:
                if store.lose(flight.key, reason) is RunStatus.queued:
                    log.warning("run %s was lost (%s); retrying", flight.run_id, reason)
            store.commit()


class TaskRun(Protocol):
    """What task_groups reads of a run: a ClaimedRun, or a queued run's row before its claim."""

    @property
    def experiment_id(self) -> int: ...
    @property
    def condition(self) -> dict[str, Any]: ...
    @property
    def num_cpus(self) -> float: ...
    @property
    def num_gpus(self) -> float: ...


R = TypeVar("R", bound=TaskRun)


def task_groups(claimed: list[R], sizes: dict[int, int]) -> list[list[R]]:
    """The claimed (or to be claimed) runs as tasks: consecutive runs (claim order) of one
    experiment and condition, up to the experiment's seeds_per_task (`sizes`, by experiment
    id) each; a run's resources are its task's."""
    groups: list[list[R]] = []
    open_groups: dict[tuple[Any, ...], list[R]] = {}
    for run in claimed:
        size = sizes.get(run.experiment_id, 1)
        if size <= 1:
            groups.append([run])
            continue
        key = (run.experiment_id, json.dumps(run.condition, sort_keys=True), run.num_cpus,
               run.num_gpus)
        group = open_groups.get(key)
        if group is None or len(group) >= size:
            group = open_groups[key] = []
            groups.append(group)
        group.append(run)
    return groups


def _task_size(template: RunTemplate | str) -> int:
    return template.seeds_per_task if isinstance(template, RunTemplate) else 1


def _seeds_per_task(spec: dict[str, Any]) -> int:
    """The stored spec's seeds per task (1 for a trainer this process does not know: its runs
    fail on the worker anyway)."""
    trainer = REGISTRY.get(spec.get("trainer", ""))
    return seeds_per_task(trainer, spec) if trainer is not None else 1


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
