"""The runs store's moves of runs an attempt at a time (service.scheduling.run_store): claim,
start, finish, end cancelled, fail, lose, interrupt, re-queue orphans. Each move keeps its
experiment's counts (`_moved`); `RunStore.commit` applies them."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, insert, or_, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from api_schemas import RunStatus
from service.scheduling.run_reads import ATTEMPT, METRIC, RUN, RunReads, changed, of_trainers
from service.scheduling.run_records import (
    AttemptKey,
    ClaimedRun,
    FinishedAttempt,
    QueuedRun,
    StartedAttempt,
)
from service.scheduling.run_rules import (
    HELD,
    ORPHANED,
    RESULT_STATUSES,
    cancelled_error,
    check_move,
    retry_decision,
)
from service.storage.db import AttemptOutcome, Experiment, Run, RunAttempt, RunMetric, utcnow

_THIS_ATTEMPT = (RUN.c.id == bindparam("b_run"), RUN.c.attempts == bindparam("b_attempt"))
_START_RUN = (
    update(RUN)
    .where(*_THIS_ATTEMPT)
    .values(
        started_at=bindparam("v_started_at"),
        node_id=bindparam("v_node_id"),
        worker_id=bindparam("v_worker_id"),
        worker_pid=bindparam("v_worker_pid"),
    )
)
_ATTEMPT_ROW = (ATTEMPT.c.run_id == bindparam("b_run"), ATTEMPT.c.attempt == bindparam("b_attempt"))
_START_ATTEMPT = (
    update(ATTEMPT)
    .where(*_ATTEMPT_ROW)
    .values(node_id=bindparam("v_node_id"), worker_pid=bindparam("v_worker_pid"))
)
# SQLite's metric points, through the driver (record_points)
_INSERT_POINTS = (
    f"INSERT INTO {METRIC.name} (run_id, step, epoch, name, value) VALUES (?, ?, ?, ?, ?)"
)
# (no IN: an expanding parameter cannot run once per batch)
_FINISH_RUN = (
    update(RUN)
    .where(*_THIS_ATTEMPT, or_(*(RUN.c.status == s for s in HELD)))
    .values(
        status=bindparam("v_status"),
        metrics=bindparam("v_metrics"),
        diagnostics=bindparam("v_diagnostics"),
        warnings=bindparam("v_warnings"),
        provenance=bindparam("v_provenance"),
        error=bindparam("v_error"),
        traceback=bindparam("v_traceback"),
        finished_at=bindparam("v_finished_at"),
    )
)
_END_ATTEMPT = (
    update(ATTEMPT)
    .where(*_ATTEMPT_ROW)
    .values(
        outcome=bindparam("v_outcome"),
        error=bindparam("v_error"),
        traceback=bindparam("v_traceback"),
        finished_at=bindparam("v_finished_at"),
    )
)


class RunMoves(RunReads):
    """Runs moved an attempt at a time, each move counted for its experiment."""

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self._moves: defaultdict[int, Counter[RunStatus]] = defaultdict(Counter)
        self._touched: set[int] = set()
        # experiments a run of which failed in this transaction: their first-failures stop
        self._failed: set[int] = set()

    def _moved(self, experiment_id: int, old: RunStatus, new: RunStatus, n: int = 1) -> None:
        """`n` runs of the experiment moved from `old` to `new` in this transaction: counted
        for `commit`, each move checked against RunStatus.moves() (IllegalRunMove: the
        transaction must not commit)."""
        if n:
            check_move(old, new)
        if n and old != new:
            self._moves[experiment_id][old] -= n
            self._moves[experiment_id][new] += n
            if new == RunStatus.failed:
                self._failed.add(experiment_id)
        self._touched.add(experiment_id)

    # -- claiming ------------------------------------------------------------------------------

    def claim(
        self,
        limit: int,
        *,
        unschedulable: Callable[[float, float], str | None] | None = None,
        take: Callable[[list[QueuedRun]], list[QueuedRun]] | None = None,
        trainers: Collection[str] | None = None,
    ) -> list[ClaimedRun]:
        """Up to `limit` queued runs in claim order (priority first, then oldest) become
        pending (handed to Ray; `start` makes them running), each with a new attempt.
        `unschedulable(num_cpus, num_gpus)` says why no node can ever hold a run (it then fails
        now) or None. `take(rows)`, when given, keeps the rows (in claim order, each with the
        run's id, experiment_id, condition, num_cpus and num_gpus) that are claimed: the
        dispatcher keeps as many whole tasks as it has room for. `trainers`, when given: only
        runs of these trainers (a dispatcher's, service.scheduling.lease)."""
        candidates = [
            QueuedRun(*row)
            for row in self.session.execute(
                sa_select(
                    RUN.c.id,
                    RUN.c.experiment_id,
                    RUN.c.trainer,
                    RUN.c.condition,
                    RUN.c.seed,
                    RUN.c.num_cpus,
                    RUN.c.num_gpus,
                )
                .where(RUN.c.status == RunStatus.queued, *of_trainers(RUN.c.trainer, trainers))
                .order_by(RUN.c.priority.desc(), RUN.c.id)
                .limit(limit)
            ).all()
        ]
        self.lock_experiments(row.experiment_id for row in candidates)
        problems = {
            row.id: unschedulable(row.num_cpus, row.num_gpus) if unschedulable else None
            for row in candidates
        }
        for row in candidates:
            problem = problems[row.id]
            if problem is not None:
                self._fail_unschedulable(row.id, row.experiment_id, problem)
        schedulable = [row for row in candidates if problems[row.id] is None]
        if take is not None:
            schedulable = take(schedulable)
        if not schedulable:
            return []
        # One statement for all: a run a concurrent cancel ended meanwhile is not returned.
        attempts: dict[int, int] = dict(
            self.session.execute(
                update(RUN)
                .where(
                    RUN.c.id.in_([row.id for row in schedulable]), RUN.c.status == RunStatus.queued
                )
                .values(
                    status=RunStatus.pending, attempts=RUN.c.attempts + 1, cancel_requested=False
                )
                .returning(RUN.c.id, RUN.c.attempts)
            ).all()
        )
        claimed = [
            ClaimedRun(
                id=row.id,
                experiment_id=row.experiment_id,
                attempt=attempts[row.id],
                trainer=row.trainer,
                condition=row.condition,
                seed=row.seed,
                num_cpus=row.num_cpus,
                num_gpus=row.num_gpus,
            )
            for row in schedulable
            if row.id in attempts
        ]
        if claimed:
            self.session.execute(
                insert(ATTEMPT),
                [
                    {"run_id": run.id, "attempt": run.attempt, "started_at": utcnow()}
                    for run in claimed
                ],
            )
        for run in claimed:
            self._moved(run.experiment_id, RunStatus.queued, RunStatus.pending)
        return claimed

    def _fail_unschedulable(self, run_id: int, experiment_id: int, problem: str) -> None:
        now = utcnow()
        attempt = self.session.execute(
            update(RUN)
            .where(RUN.c.id == run_id, RUN.c.status == RunStatus.queued)
            .values(
                status=RunStatus.failed, attempts=RUN.c.attempts + 1, error=problem, finished_at=now
            )
            .returning(RUN.c.attempts)
        ).scalar()
        if attempt is not None:
            self._moved(experiment_id, RunStatus.queued, RunStatus.failed)
            self.session.execute(
                insert(ATTEMPT),
                [
                    {
                        "run_id": run_id,
                        "attempt": attempt,
                        "outcome": AttemptOutcome.failed,
                        "error": problem,
                        "started_at": now,
                        "finished_at": now,
                    }
                ],
            )

    # -- running attempts ----------------------------------------------------------------------

    def start(self, started: Sequence[StartedAttempt]) -> None:
        """Workers began these attempts: each pending run becomes running, and where it runs
        is recorded. A message of an attempt that is not the run's current one (lost and
        re-queued meanwhile) moves nothing."""
        if not started:
            return
        now = utcnow()
        rows = [
            {
                "b_run": s.key.run_id,
                "b_attempt": s.key.attempt,
                "v_node_id": s.node_id,
                "v_worker_id": s.worker_id,
                "v_worker_pid": s.pid,
                "v_started_at": now,
            }
            for s in started
        ]
        held = self._held_attempts([s.key.run_id for s in started])
        starting = [
            s.key for s in started if held.get(s.key.run_id) == (s.key.attempt, RunStatus.pending)
        ]
        if starting:
            # The dispatcher holds these runs (its lock) and their experiments' rows: no other
            # writer moves them between the read above and this update.
            self.session.execute(
                update(RUN)
                .where(
                    RUN.c.id.in_([key.run_id for key in starting]),
                    RUN.c.status == RunStatus.pending,
                )
                .values(status=RunStatus.running)
            )
        for key in starting:
            self._moved(key.experiment_id, RunStatus.pending, RunStatus.running)
        self.session.execute(_START_RUN, rows)
        self.session.execute(_START_ATTEMPT, rows)

    def record_points(
        self, rows: Sequence[dict[str, Any]], experiments: dict[int, int] | None = None
    ) -> None:
        """Metric points ({run_id, step, epoch, name, value}) streamed by running attempts; a
        name new to its experiment joins the experiment's curve_names (GET /experiments/{id}
        reads them there, one row whatever its number of runs). `experiments`: the
        experiment of each run, where the caller knows it (the dispatcher's flights; the
        others are read)."""
        if not rows:
            return
        if self.session.get_bind().dialect.name == "sqlite":
            # the driver's executemany of a prepared INSERT: SQLAlchemy's per-row parameter
            # processing cost 0.31-0.5x raw sqlite3's rate (benchmarks/ingest.py)
            self.session.connection().exec_driver_sql(
                _INSERT_POINTS,
                [(r["run_id"], r["step"], r["epoch"], r["name"], r["value"]) for r in rows],
            )
        else:  # psycopg: SQLAlchemy batches the rows into multi-row INSERTs
            self.session.execute(insert(METRIC), rows)
        names_of_run: defaultdict[int, set[str]] = defaultdict(set)
        for run_id, name in {(row["run_id"], row["name"]) for row in rows}:
            names_of_run[int(run_id)].add(str(name))
        known_runs = experiments or {}
        experiment_of = {r: known_runs[r] for r in names_of_run if r in known_runs}
        unknown = [r for r in names_of_run if r not in experiment_of]
        if unknown:
            experiment_of.update(
                self.session.execute(
                    sa_select(RUN.c.id, RUN.c.experiment_id).where(RUN.c.id.in_(unknown))
                ).all()
            )
        names: defaultdict[int, set[str]] = defaultdict(set)
        for run_id, logged in names_of_run.items():
            if run_id in experiment_of:
                names[experiment_of[run_id]] |= logged
        known = self.session.execute(
            sa_select(col(Experiment.id), col(Experiment.curve_names)).where(
                col(Experiment.id).in_(list(names))
            )
        ).all()
        for experiment_id, stored in known:
            if stored is None:  # stored before migration 0014: read from its points
                continue
            grown = set(stored) | names[experiment_id]
            if len(grown) > len(stored):
                self.session.execute(
                    update(Experiment)
                    .where(col(Experiment.id) == experiment_id)
                    .values(curve_names=sorted(grown))
                    .execution_options(synchronize_session=False)
                )

    def finish(self, finished: Sequence[FinishedAttempt]) -> None:
        """These attempts returned results: each run ends completed, stopped, failed or
        diverged, from running or from pending (a result read before its Started was stored).
        A result of an attempt that is not the run's current one (lost and re-queued
        meanwhile) changes nothing."""
        for f in finished:
            if f.status not in RESULT_STATUSES:
                raise ValueError(f"a result cannot end a run as {f.status}")
        held = self._held_attempts([f.key.run_id for f in finished])
        ending = [
            f for f in finished if f.key.run_id in held and held[f.key.run_id][0] == f.key.attempt
        ]
        if not ending:
            return
        now = utcnow()
        self.session.execute(
            _FINISH_RUN,
            [
                {
                    "b_run": f.key.run_id,
                    "b_attempt": f.key.attempt,
                    "v_status": f.status,
                    "v_metrics": f.metrics,
                    "v_diagnostics": f.diagnostics,
                    "v_warnings": f.warnings,
                    "v_provenance": f.provenance,
                    "v_error": f.error,
                    "v_traceback": f.traceback,
                    "v_finished_at": now,
                }
                for f in ending
            ],
        )
        self.session.execute(
            _END_ATTEMPT,
            [
                {
                    "b_run": f.key.run_id,
                    "b_attempt": f.key.attempt,
                    "v_outcome": AttemptOutcome(f.status.value),
                    "v_error": f.error,
                    "v_traceback": f.traceback,
                    "v_finished_at": now,
                }
                for f in ending
            ],
        )
        for f in ending:
            self._moved(f.key.experiment_id, held[f.key.run_id][1], f.status)

    def end_cancelled(self, attempt: AttemptKey) -> None:
        """Ray reports the attempt's task cancelled (a cancel the dispatcher forwarded)."""
        self._end_held(attempt, RunStatus.cancelled, AttemptOutcome.cancelled, None, cancelled=True)

    def fail(self, attempt: AttemptKey, reason: str) -> None:
        """The attempt's rows cannot be stored: the run fails, not retried (the same config
        would send the same rows again)."""
        self._end_held(attempt, RunStatus.failed, AttemptOutcome.failed, reason)

    def _end_held(
        self,
        attempt: AttemptKey,
        status: RunStatus,
        outcome: AttemptOutcome,
        reason: str | None,
        *,
        cancelled: bool = False,
    ) -> None:
        """End the attempt's run, pending or running, as `status`; the run's error is `reason`,
        or for a cancel, whether the run had started."""
        for held in HELD:
            # a cancel keeps an error already set (the first-failures stop's reason)
            error = func.coalesce(col(Run.error), cancelled_error(held)) if cancelled else reason
            moved = changed(
                self.session.execute(
                    update(Run)
                    .where(
                        col(Run.id) == attempt.run_id,
                        col(Run.status) == held,
                        col(Run.attempts) == attempt.attempt,
                    )
                    .values(status=status, finished_at=utcnow(), error=error)
                )
            )
            if moved:
                self._moved(attempt.experiment_id, held, status)
                self._end_attempt(attempt, outcome, reason)

    def lose(self, attempt: AttemptKey, reason: str) -> RunStatus | None:
        """The attempt's worker or node died (or its task, pending in Ray's queue, failed):
        retry or fail by `retry_decision`. Only a run a worker reported starting (running) is
        charged the attempt; a pending one's is recorded interrupted. Returns the run's new
        status, None when the run had moved on (an older attempt)."""
        run = self.session.get(Run, attempt.run_id)
        if run is None or run.status not in HELD or run.attempts != attempt.attempt:
            return None
        started = run.status == RunStatus.running
        self._end_attempt(
            attempt, AttemptOutcome.lost if started else AttemptOutcome.interrupted, reason
        )
        self._after_lost(run, reason)
        return run.status

    def _after_lost(
        self, run: Run, reason: str, uncharged: dict[int, tuple[int, int]] | None = None
    ) -> None:
        """Retry or fail `run` by `retry_decision`, its attempts counted from their rows
        (`uncharged`: `_uncharged_attempts` of it, when the caller has read it already)."""
        assert run.id is not None
        if uncharged is None:
            uncharged = self._uncharged_attempts([run.id])
        interrupted, unstarted = uncharged.get(run.id, (0, 0))
        status, error = retry_decision(
            cancel_requested=run.cancel_requested,
            charged_attempts=run.attempts - interrupted,
            max_retries=run.max_retries,
            reason=reason,
            unstarted_losses=unstarted,
        )
        if status == RunStatus.queued:
            # the next attempt logs its own curves
            self.session.execute(delete(RunMetric).where(col(RunMetric.run_id) == run.id))
        else:
            # a cancel keeps the reason a first-failures stop gave the run
            keep = status == RunStatus.cancelled and run.error is not None
            run.finished_at, run.error = utcnow(), run.error if keep else error
        self._moved(run.experiment_id, run.status, status)
        run.status = status
        self.session.add(run)

    def interrupt(self, attempts: Sequence[AttemptKey], reason: str) -> None:
        """The dispatcher stops with these attempts in flight: each run goes back to the queue
        (or ends cancelled when a cancel was asked), not charged an attempt."""
        for attempt in attempts:
            for held in HELD:
                this_attempt = (
                    col(Run.id) == attempt.run_id,
                    col(Run.status) == held,
                    col(Run.attempts) == attempt.attempt,
                )
                cancelled = changed(
                    self.session.execute(
                        update(Run)
                        .where(*this_attempt, col(Run.cancel_requested) == True)  # noqa: E712
                        .values(
                            status=RunStatus.cancelled,
                            finished_at=utcnow(),
                            error=func.coalesce(col(Run.error), cancelled_error(held)),
                        )
                    )
                )
                requeued = changed(
                    self.session.execute(
                        update(Run)
                        .where(*this_attempt, col(Run.cancel_requested) == False)  # noqa: E712
                        .values(status=RunStatus.queued)
                    )
                )
                self._moved(attempt.experiment_id, held, RunStatus.cancelled, cancelled)
                self._moved(attempt.experiment_id, held, RunStatus.queued, requeued)
            self.session.execute(delete(RunMetric).where(col(RunMetric.run_id) == attempt.run_id))
            self._end_attempt(attempt, AttemptOutcome.interrupted, reason)

    def requeue_orphans(
        self, kept: dict[int, int], trainers: Collection[str] | None = None
    ) -> list[int]:
        """Runs pending or running that no live attempt of this dispatcher holds (`kept`: run id
        -> attempt it holds) were left by an earlier dispatcher: each is lost (retry or fail by
        `retry_decision`). An attempt no worker reported starting (it waited in Ray's queue
        when its dispatcher died) is recorded interrupted, not charged: a service that crashes
        a few times in a row must not fail runs that never ran. `trainers`, when given: only
        runs of these trainers (those whose locks the caller holds). Returns the orphans' ids."""
        held = and_(col(Run.status).in_(HELD), *of_trainers(col(Run.trainer), trainers))
        self.lock_experiments(
            self.session.exec(select(col(Run.experiment_id)).where(held).distinct()).all()
        )
        running = self.session.exec(select(Run).where(held)).all()
        orphans = [run for run in running if kept.get(run.id or -1) != run.attempts]
        now = utcnow()
        for run in orphans:
            unfinished = (col(RunAttempt.run_id) == run.id, col(RunAttempt.finished_at).is_(None))
            self.session.execute(
                update(RunAttempt)
                .where(*unfinished, col(RunAttempt.worker_pid).is_(None))
                .values(outcome=AttemptOutcome.interrupted, error=ORPHANED, finished_at=now)
            )
            self.session.execute(
                update(RunAttempt)
                .where(*unfinished)
                .values(outcome=AttemptOutcome.lost, error=ORPHANED, finished_at=now)
            )
        uncharged = self._uncharged_attempts([run.id for run in orphans if run.id])
        for run in orphans:
            self._after_lost(run, ORPHANED, uncharged)
        return [run.id for run in orphans if run.id is not None]

    def _end_attempt(self, attempt: AttemptKey, outcome: AttemptOutcome, error: str | None) -> None:
        self.session.execute(
            update(RunAttempt)
            .where(
                col(RunAttempt.run_id) == attempt.run_id, col(RunAttempt.attempt) == attempt.attempt
            )
            .values(outcome=outcome, error=error, finished_at=utcnow())
        )
