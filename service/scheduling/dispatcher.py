"""The dispatcher: the database queue -> Ray tasks, and their results -> the database.

The runs of one trainer are dispatched by one dispatcher at a time; it is their Ray driver. A
dispatcher acts for the trainers it has loaded whose dispatch locks it holds
(service.scheduling.lease): a `seedgrid run --trainers FILE` beside a running service
dispatches its own trainer's runs, the service the rest, and neither claims a run it could not
run. A dispatcher that holds none of its trainers' locks stands by and polls; an active one
polls for the locks it lacks too, and takes over a trainer when its holder is gone. Taking over
a trainer, it re-queues the runs of that trainer a previous holder left in Ray. Then each loop it
1. claims queued runs of its trainers in priority order (higher first, then oldest) up to
   `max_in_flight` tasks, marks them pending, counts the attempt and submits one
   `workers.run_task` per task with the run's resources: a task runs one seed, or up to the
   experiment's seeds_per_task seeds of one condition claimed together (a seed-batched task;
   each seed stays its own run);
2. forwards cancellations requested through the API to Ray;
3. reads whatever the in-flight tasks streamed (start, metric batches, final result) and
   persists it in one transaction, what ends within PERSIST_HOLD_S (50 ms) together; when the
   database refuses that, run by run, so that a run whose rows cannot be stored ends `failed`
   alone and every other run is written.
A run whose worker or node died is re-queued until it has used max_retries + 1 attempts; when
a seed-batched task dies, only its seeds without a result are.

Stopping (SIGTERM, the API's shutdown), it saves the results Ray already has, cancels the runs
still in flight and puts them back in the queue without charging them an attempt: Ray ties a
task's life to its driver's, so none of them could outlive this process anyway.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

import ray
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from api_schemas import DispatcherState, storable_text
from service.scheduling import wakeups
from service.scheduling.adaptive import decide_due
from service.scheduling.flights import Harvest, InFlight, RunTemplate, tasks_of
from service.scheduling.harvesting import Harvesting
from service.scheduling.launching import Launching
from service.scheduling.lease import DispatchLock, LockLost, dispatcher_identity, make_dispatch_lock
from service.scheduling.metrics import DispatcherMetrics
from service.scheduling.ray_helpers import ensure_ray, error_line
from service.scheduling.run_store import AttemptKey, RunStore
from service.settings import Settings
from service.storage.db import masked_url
from trainers import REGISTRY

log = logging.getLogger("seedgrid.dispatcher")

# How often a standby tries the locks, and an active dispatcher the locks of its trainers that
# another process holds: the bound on a takeover's delay once the holder is gone.
STANDBY_POLL_S = 0.5
# How often the active dispatcher confirms it still holds the lock when it has nothing to write.
LOCK_CHECK_INTERVAL_S = 1.0
# An idle dispatcher (nothing in flight, nothing claimed) doubles its wait between passes from
# dispatch_poll_interval_s up to this: an idle `seedgrid serve` took 7.7% of a core passing over
# its database 20 times a second. Work queued by this process wakes it at once
# (service.scheduling.wakeups); work queued by another process waits at most this long.
IDLE_POLL_MAX_S = 0.5
# How often the adaptive experiments are checked for a due look.
LOOK_CHECK_INTERVAL_S = 0.5


class Dispatcher(Launching, Harvesting):
    """The dispatcher: its life cycle, the lock, taking over and stopping, and the loop; the
    parts it is made of launch tasks (service.scheduling.launching) and harvest them
    (service.scheduling.harvesting)."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        lock: DispatchLock | None = None,
        metrics: DispatcherMetrics | None = None,
        trainers: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        """`trainers`: the names of the trainers this dispatcher runs, asked again as it polls
        (code loaded later joins); every trainer this process has loaded by default."""
        self.settings = settings
        self.engine = engine
        self.metrics = metrics or DispatcherMetrics()
        self._trainers = trainers or (lambda: list(REGISTRY))
        self.identity = lock.identity if lock is not None else dispatcher_identity()
        self.lock = lock or make_dispatch_lock(
            settings.database_url, self.identity, self._trainers()
        )
        self.in_flight: dict[int, InFlight] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        wakeups.listen(self._wake)
        self._idle_wait = settings.dispatch_poll_interval_s
        # Passes over the database, and idle waits that new work ended early (for tests).
        self.passes = 0
        self.idle_waits_woken = 0
        self._thread: threading.Thread | None = None
        self._last_cancel_check = 0.0
        self._nodes: list[tuple[float, float]] = []
        self._nodes_checked_at = -math.inf
        self._last_lock_check = 0.0
        self._last_lock_poll = 0.0
        self._last_look_check = -math.inf
        # What was read from Ray and is not written yet: held up to PERSIST_HOLD_S for one
        # transaction (service.scheduling.harvesting), or kept after its transaction failed.
        self._unsaved: Harvest | None = None
        self._unsaved_since = 0.0
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
        # active (holds the lock and dispatches), standby (waits for the lock) or stopped; the
        # value /healthz serves (never `absent`: that is an API without a dispatcher)
        self.state: DispatcherState = DispatcherState.stopped

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Take the free locks of its trainers now (then Ray is up and their orphans re-queued
        on return); with none, stand by in the background."""
        self._stop.clear()
        self.state = DispatcherState.standby
        acquired = self._try_acquire()
        if acquired is not None and not (acquired and self._activate()):
            self._announce_standby()
        self._thread = threading.Thread(target=self._run, name="seedgrid-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop dispatching: save what Ray already returned, put the runs still in flight back
        in the queue (not charged as an attempt), release the lock."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        else:
            self.lock.close()
            self.state = DispatcherState.stopped

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.state == DispatcherState.active:
                    self._dispatch()
                else:
                    self._stand_by()
        except BaseException as exc:  # only Ray failing to start gets here; the CLI reports it
            self.error = exc
            log.exception("the dispatcher stopped")
        finally:
            self._shut_down()

    # -- the lock ------------------------------------------------------------------------------

    @property
    def trainers(self) -> list[str]:
        """The trainers whose runs this dispatcher dispatches (whose locks it holds)."""
        return sorted(self.lock.trainers)

    def _try_acquire(self) -> set[str] | None:
        """The trainers whose locks this process took now (its trainers are asked again); None
        when the database did not answer."""
        try:
            self.lock.want(self._trainers())
            acquired = self.lock.acquire_free()
        except (DBAPIError, OSError) as exc:
            if not self._database_unreachable:
                log.warning(
                    "cannot take the dispatch lock (%s); retrying every %s s",
                    error_line(exc),
                    STANDBY_POLL_S,
                )
                self._database_unreachable = True
            return None
        self._database_unreachable = False
        return acquired

    def _activate(self) -> bool:
        """Just took locks after holding none: connect to Ray and settle what earlier holders
        of its trainers left running."""
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
            self._take_over(self.lock.trainers)
        except (LockLost, DBAPIError) as exc:
            log.warning("took dispatch locks but could not take over (%s); standing by", exc)
            self.lock.drop()
            return False
        self.state = DispatcherState.active
        self._standby_announced = False
        self._last_lock_check = self._last_lock_poll = time.monotonic()
        waiting = self.lock.wanted - self.lock.trainers
        log.info(
            "dispatcher %s is active on %s for %s%s",
            self.identity,
            masked_url(self.settings.database_url),
            ", ".join(self.trainers),
            f"; {', '.join(sorted(waiting))} held by {self.lock.holder() or 'another dispatcher'}"
            if waiting
            else "",
        )
        return True

    def _take_over(self, trainers: set[str]) -> None:
        """Took these trainers' locks: the copies of their runs that this process still had in
        Ray from before it lost its locks, where another holder has re-queued them, are
        dropped; their runs left by earlier holders are re-queued."""
        others = [f for f in self.in_flight.values() if f.task.trainer not in self.lock.trainers]
        if others:
            log.warning(
                "cancelling %d runs this dispatcher had in Ray: another dispatcher holds their "
                "trainers' locks",
                len(others),
            )
            for task in tasks_of(others):
                ray.cancel(task.generator)
            for flight in others:
                self.in_flight.pop(flight.run_id, None)
        if self._unsaved is not None:  # what Ray returned of them is not ours to write either
            self._unsaved = self._unsaved.only(
                {
                    run_id
                    for run_id, flight in self._unsaved.flights.items()
                    if flight.task.trainer in self.lock.trainers
                }
            )
        self.requeue_orphans(trainers)

    def _poll_locks(self) -> None:
        """An active dispatcher takes the locks of its trainers that were held elsewhere (or
        loaded since) once they are free, and re-queues what their holder left."""
        now = time.monotonic()
        if now - self._last_lock_poll < STANDBY_POLL_S:
            return
        self._last_lock_poll = now
        self.lock.want(self._trainers())
        if self.lock.wanted <= self.lock.trainers:
            return
        taken = self.lock.acquire_free()
        if taken:
            self.requeue_orphans(taken)
            log.info(
                "dispatcher %s took over %s; it dispatches %s",
                self.identity,
                ", ".join(sorted(taken)),
                ", ".join(self.trainers),
            )

    def _announce_standby(self) -> None:
        if not self._standby_announced:
            log.info(
                "dispatcher %s is standby: %s holds the dispatch lock of %s on %s; polling "
                "every %s s",
                self.identity,
                self.lock.holder() or "another dispatcher",
                ", ".join(sorted(self.lock.wanted)) or "no trainer",
                masked_url(self.settings.database_url),
                STANDBY_POLL_S,
            )
            self._standby_announced = True

    def _stand_by(self) -> None:
        while not self._stop.is_set():
            acquired = self._try_acquire()
            if acquired and self._activate():
                return
            if acquired is not None and not acquired:
                # Another dispatcher holds the lock, so it has re-queued what this one had left
                # in Ray; those copies could never be saved.
                self._cancel_in_ray("another dispatcher holds the lock")
                self._announce_standby()
            self._stop.wait(STANDBY_POLL_S)

    def _lost_lock(self, reason: str) -> None:
        """Stop dispatching at once. What is in flight stays in Ray until this process takes
        the lock back (then it is kept) or sees that another dispatcher holds it."""
        self.lock.drop()
        self.state = DispatcherState.standby
        log.error(
            "dispatcher %s lost the dispatch lock (%s) and stopped dispatching; %d runs "
            "are left in Ray",
            self.identity,
            reason,
            len(self.in_flight),
        )

    # -- taking over and stopping --------------------------------------------------------------

    def requeue_orphans(self, trainers: set[str]) -> int:
        """Runs of these trainers (whose locks this process holds) pending or running that
        this process is not running go back to the queue.

        Only a holder of a trainer's lock claims its runs, and its claims commit only while it
        holds it, so every such run was left by an earlier holder: a process that died, or this
        one before it lost the lock (its runs still in flight at the same attempt are kept).
        The lost attempt counts against the run's max_retries, as a lost worker's does.
        """
        ours = {flight.run_id: flight for flight in self.in_flight.values()}
        if self._unsaved is not None:
            ours.update(self._unsaved.flights)
        with self._session() as session:
            store = RunStore(session)
            orphans = store.requeue_orphans({i: f.attempt for i, f in ours.items()}, trainers)
            store.commit()
        kept = set(ours) - set(orphans)
        dropped = [
            self.in_flight.pop(run_id) for run_id in list(self.in_flight) if run_id not in kept
        ]
        for task in tasks_of(dropped):
            # Cooperatively: the trainer returns at its next step and the worker stays warm.
            ray.cancel(task.generator)
        if self._unsaved is not None:
            self._unsaved = self._unsaved.only(kept)
        if orphans:
            log.info("re-queued %d runs left in Ray by an earlier dispatcher", len(orphans))
        return len(orphans)

    def _shut_down(self) -> None:
        was_active = self.state == DispatcherState.active
        if was_active:
            try:
                self._save_and_interrupt()
            except Exception:  # the next holder re-queues them as orphans instead
                log.exception("could not put the runs in flight back in the queue")
        self._cancel_in_ray("the dispatcher stopped", force=True)
        self.lock.close()
        self.state = DispatcherState.stopped
        log.info(
            "dispatcher %s stopped%s",
            self.identity,
            " and released the dispatch lock" if was_active else "",
        )

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
            log.warning(
                "cancelling the %d runs this dispatcher had in Ray: %s", len(self.in_flight), reason
            )
            for task in tasks_of(self.in_flight.values()):
                ray.cancel(task.generator, force=force)
            self.in_flight.clear()
        self._unsaved = None

    # -- the loop ------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
                self._poll_locks()
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
                self.last_step_error = storable_text(
                    f"{type(exc).__name__}: {error_line(exc)}", 1000
                )
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
        self.passes += 1
        self._save_unsaved(when_due=True)
        self._store_refused()
        self._take_due_looks()
        claimed = self._fill()
        self._forward_cancellations()
        held = self._hold_left()
        if 0 < held < math.inf:
            # Something is held for its transaction: let more tasks end meanwhile and read them
            # all at once (one pump, not one a task).
            self._stop.wait(held)
            harvest = self._pump(timeout_s=0)
        else:
            harvest = self._pump(timeout_s=self._next_wait(claimed))
        if harvest:
            # Read from Ray once only: kept until a transaction has written it.
            self._hold(harvest)
        self._save_unsaved(when_due=True)

    def _next_wait(self, claimed: int) -> float:
        """How long this pass waits for Ray or for new work: not at all when it claimed runs,
        the poll interval while runs are in flight, doubling on each idle pass up to
        IDLE_POLL_MAX_S."""
        poll = self.settings.dispatch_poll_interval_s
        if claimed or self.in_flight or self._wake.is_set():
            self._idle_wait = poll
            return 0.0 if claimed else poll
        wait = self._idle_wait
        self._idle_wait = min(2 * wait, max(poll, IDLE_POLL_MAX_S))
        return wait

    def _take_due_looks(self) -> None:
        """Adaptive experiments whose round ended get their look (service.scheduling.adaptive):
        stopped,
        or their next round queued before this pass claims runs."""
        now = time.monotonic()
        if now - self._last_look_check < LOOK_CHECK_INTERVAL_S:
            return
        self._last_look_check = now
        with self._session() as session:
            decide_due(session, settings=self.settings, trainers=self.lock.trainers)
