"""The dispatcher: the database queue -> Ray tasks, and their results -> the database.

One dispatcher acts per deployment; it is the Ray driver. Each loop it
1. claims queued runs in priority order (higher first, then oldest) up to `max_in_flight`,
   marks them running, counts the attempt and submits one `workers.run_task` per run with the
   run's resources;
2. forwards cancellations requested through the API to Ray;
3. reads whatever the in-flight tasks streamed (start, metric batches, final result) and
   persists it in one transaction.
A run whose worker or node died is re-queued until it has used max_retries + 1 attempts. Runs
left `running` by a previous process are re-queued when the dispatcher starts.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError, TaskCancelledError
from sqlalchemy import delete, insert, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from api_schemas import RunStatus
from service.db import MetricPoint, Run, RunAttempt, utcnow
from service.experiments import refresh_experiment_status
from service.settings import Settings
from workers import run_task

log = logging.getLogger("seedgrid.dispatcher")

# After a cooperative cancel, how long a task gets before it is killed.
FORCE_CANCEL_AFTER_S = 15.0
CANCEL_CHECK_INTERVAL_S = 0.25


def ensure_ray(settings: Settings) -> None:
    """Join the configured cluster, or start a local Ray, once per process."""
    if ray.is_initialized():
        return
    if settings.ray_address:
        ray.init(address=settings.ray_address, log_to_driver=False)
    else:
        ray.init(num_cpus=settings.ray_num_cpus, include_dashboard=False, log_to_driver=False)


@dataclass
class InFlight:
    run_id: int
    experiment_id: int
    attempt: int
    generator: Any
    cancel_sent_at: float | None = None
    started: dict[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    """Everything one pump of the dispatcher writes, in one transaction."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    started: list[tuple[InFlight, dict[str, Any]]] = field(default_factory=list)
    results: list[tuple[InFlight, dict[str, Any]]] = field(default_factory=list)
    lost: list[tuple[InFlight, str]] = field(default_factory=list)
    cancelled: list[InFlight] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.metrics or self.started or self.results or self.lost or self.cancelled)


class Dispatcher:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.in_flight: dict[int, InFlight] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_cancel_check = 0.0
        self.max_in_flight = settings.max_in_flight or 4
        self.error: BaseException | None = None

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        ensure_ray(self.settings)
        if self.settings.max_in_flight is None:
            # Enough submitted runs that Ray's own queue never runs dry between two loops.
            cpus = int(ray.cluster_resources().get("CPU", 2))
            self.max_in_flight = max(32, 4 * cpus)
        self.requeue_orphans()
        self._thread = threading.Thread(target=self._loop, name="seedgrid-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop dispatching; cancel what is in flight and put it back in the queue."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for flight in list(self.in_flight.values()):
            ray.cancel(flight.generator, force=True)
        if self.in_flight:
            with Session(self.engine) as session:
                for flight in self.in_flight.values():
                    session.execute(
                        update(Run)
                        .where(Run.id == flight.run_id, Run.status == RunStatus.running.value)
                        .values(status=RunStatus.queued.value, attempts=Run.attempts - 1)
                    )
                    self._end_attempt(session, flight, "interrupted", "dispatcher stopped")
                session.commit()
            self.in_flight.clear()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def requeue_orphans(self) -> int:
        """Runs left `running` by a previous dispatcher go back to the queue."""
        with Session(self.engine) as session:
            orphans = session.exec(select(Run).where(Run.status == RunStatus.running.value)).all()
            for run in orphans:
                if run.cancel_requested:
                    run.status = RunStatus.cancelled.value
                    run.finished_at = utcnow()
                else:
                    run.status = RunStatus.queued.value
                session.add(run)
                session.execute(
                    update(RunAttempt)
                    .where(RunAttempt.run_id == run.id, RunAttempt.finished_at.is_(None))  # type: ignore[union-attr]
                    .values(outcome="lost", error="dispatcher restarted", finished_at=utcnow())
                )
                session.execute(delete(MetricPoint).where(MetricPoint.run_id == run.id))
            for experiment_id in {r.experiment_id for r in orphans}:
                refresh_experiment_status(session=session, experiment_id=experiment_id)
            session.commit()
        if orphans:
            log.info("re-queued %d runs left running by a previous process", len(orphans))
        return len(orphans)

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # keep dispatching; a database blip must not stop the service
                self.error = exc
                log.exception("dispatcher step failed; retrying")
                time.sleep(1.0)

    def step(self) -> None:
        claimed = self._fill()
        self._forward_cancellations()
        batch = self._pump(timeout_s=0 if claimed else self.settings.dispatch_poll_interval_s)
        if batch:
            self._persist(batch)

    def _fill(self) -> int:
        free = self.max_in_flight - len(self.in_flight)
        if free <= 0:
            return 0
        with Session(self.engine) as session:
            candidates = session.exec(
                select(Run.id, Run.experiment_id, Run.attempts, Run.trainer,
                       Run.config, Run.seed, Run.num_cpus, Run.num_gpus)
                .where(Run.status == RunStatus.queued.value)
                .order_by(Run.priority.desc(), Run.id)  # type: ignore[attr-defined]
                .limit(free)
            ).all()
            claimed = []
            for row in candidates:
                result = session.execute(
                    update(Run)
                    .where(Run.id == row.id, Run.status == RunStatus.queued.value)
                    .values(status=RunStatus.running.value, attempts=Run.attempts + 1,
                            cancel_requested=False)
                    .execution_options(synchronize_session=False)
                )
                if result.rowcount == 1:
                    claimed.append(row)
                    session.add(RunAttempt(run_id=row.id, attempt=row.attempts + 1))
            for experiment_id in {r.experiment_id for r in claimed}:
                refresh_experiment_status(session=session, experiment_id=experiment_id)
            session.commit()
        for row in claimed:
            generator = run_task.options(
                num_cpus=row.num_cpus, num_gpus=row.num_gpus, name=f"seedgrid-run-{row.id}"
            ).remote(row.trainer, row.config, row.seed, self.settings.metrics_batch_interval_s)
            self.in_flight[row.id] = InFlight(
                run_id=row.id,
                experiment_id=row.experiment_id,
                attempt=row.attempts + 1,
                generator=generator,
            )
        return len(claimed)

    def _forward_cancellations(self) -> None:
        now = time.monotonic()
        if not self.in_flight or now - self._last_cancel_check < CANCEL_CHECK_INTERVAL_S:
            return
        self._last_cancel_check = now
        with Session(self.engine) as session:
            ids = session.exec(
                select(Run.id).where(
                    Run.id.in_(list(self.in_flight)),  # type: ignore[union-attr]
                    Run.cancel_requested == True,  # noqa: E712
                )
            ).all()
        for run_id in ids:
            flight = self.in_flight.get(run_id)
            if flight is None:
                continue
            if flight.cancel_sent_at is None:
                ray.cancel(flight.generator)
                flight.cancel_sent_at = now
            elif now - flight.cancel_sent_at > FORCE_CANCEL_AFTER_S:
                ray.cancel(flight.generator, force=True)

    def _pump(self, timeout_s: float) -> Batch:
        batch = Batch()
        if not self.in_flight:
            if timeout_s:
                self._stop.wait(timeout_s)
            return batch
        by_generator = {id(f.generator): f for f in self.in_flight.values()}
        generators = [f.generator for f in self.in_flight.values()]
        ready, _ = ray.wait(generators, num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = ray.wait(generators, num_returns=len(generators), timeout=0)
        for generator in ready:
            flight = by_generator[id(generator)]
            self._drain(flight, batch)
        return batch

    def _drain(self, flight: InFlight, batch: Batch) -> None:
        """Read every message the task has ready now."""
        generator = flight.generator
        while True:
            try:
                ref = next(generator)
                message = ray.get(ref)
            except StopIteration:
                if flight.run_id in self.in_flight:
                    batch.lost.append((flight, "the task ended without a result"))
                    del self.in_flight[flight.run_id]
                return
            except TaskCancelledError:
                batch.cancelled.append(flight)
                del self.in_flight[flight.run_id]
                return
            except RayError as exc:
                if isinstance(getattr(exc, "cause", None), TaskCancelledError):
                    batch.cancelled.append(flight)
                else:
                    batch.lost.append((flight, f"{type(exc).__name__}: {_first_line(exc)}"))
                del self.in_flight[flight.run_id]
                return
            kind = message["type"]
            if kind == "started":
                flight.started = message
                batch.started.append((flight, message))
            elif kind == "metrics":
                batch.metrics += [
                    {"run_id": flight.run_id, "step": s, "epoch": e, "name": n, "value": v}
                    for s, e, n, v in message["points"]
                ]
            elif kind == "result":
                batch.results.append((flight, message))
                del self.in_flight[flight.run_id]
                return
            if not generator.next_ready():
                return

    # -- persistence ---------------------------------------------------------------------------
    def _persist(self, batch: Batch) -> None:
        now = utcnow()
        touched: set[int] = set()
        with Session(self.engine) as session:
            for flight, message in batch.started:
                session.execute(
                    update(Run)
                    .where(Run.id == flight.run_id, Run.attempts == flight.attempt)
                    .values(started_at=now, node_id=message["node_id"],
                            worker_id=message["worker_id"], worker_pid=message["pid"])
                )
                session.execute(
                    update(RunAttempt)
                    .where(RunAttempt.run_id == flight.run_id,
                           RunAttempt.attempt == flight.attempt)
                    .values(node_id=message["node_id"], worker_pid=message["pid"])
                )
            if batch.metrics:
                session.execute(insert(MetricPoint), batch.metrics)
            for flight, message in batch.results:
                provenance = {**message["provenance"], "hostname": flight.started.get("hostname"),
                              "attempt": flight.attempt}
                session.execute(
                    update(Run)
                    .where(Run.id == flight.run_id, Run.status == RunStatus.running.value,
                           Run.attempts == flight.attempt)
                    .values(status=message["status"], metrics=message["metrics"],
                            diagnostics=message["diagnostics"], warnings=message["warnings"],
                            provenance=provenance, error=message["error"], finished_at=now)
                )
                self._end_attempt(session, flight, message["status"], message["error"])
                touched.add(flight.experiment_id)
            for flight in batch.cancelled:
                session.execute(
                    update(Run)
                    .where(Run.id == flight.run_id, Run.status == RunStatus.running.value)
                    .values(status=RunStatus.cancelled.value, finished_at=now,
                            error="cancelled while running")
                )
                self._end_attempt(session, flight, "cancelled", None)
                touched.add(flight.experiment_id)
            for flight, reason in batch.lost:
                self._handle_lost(session, flight, reason, now)
                touched.add(flight.experiment_id)
            for experiment_id in touched:
                refresh_experiment_status(session=session, experiment_id=experiment_id)
            session.commit()

    def _handle_lost(self, session: Session, flight: InFlight, reason: str, now: Any) -> None:
        run = session.get(Run, flight.run_id)
        if run is None or run.status != RunStatus.running.value:
            return
        self._end_attempt(session, flight, "lost", reason)
        if run.cancel_requested:
            run.status, run.finished_at, run.error = RunStatus.cancelled.value, now, "cancelled"
        elif run.attempts <= run.max_retries:
            log.warning("run %s lost its worker (%s); retrying", run.id, reason)
            run.status = RunStatus.queued.value
            session.execute(delete(MetricPoint).where(MetricPoint.run_id == run.id))
        else:
            run.status, run.finished_at = RunStatus.failed.value, now
            run.error = f"worker lost on each of {run.attempts} attempts; last: {reason}"
        session.add(run)

    @staticmethod
    def _end_attempt(session: Session, flight: InFlight, outcome: str, error: str | None) -> None:
        session.execute(
            update(RunAttempt)
            .where(RunAttempt.run_id == flight.run_id, RunAttempt.attempt == flight.attempt)
            .values(outcome=outcome, error=error, finished_at=utcnow())
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
