"""The runs store: every change of a run's state, as named operations on one session.

The only module that assigns a run's status (MLflow's tracking store is the model: callers say
`claim`, `finish`, `lose` and never write SQL for a run). The state machine:

    queued --claim--> pending --start--> running
       |                 |                   |
       |                 +-------------------+--finish--> completed | stopped | failed | diverged
       |                 |  (a result can come before its Started is stored: from pending too)
       |                 +--end_cancelled / cancel flag--> cancelled
       |                 +--lose--> queued (retry) | failed (out of retries) | cancelled
       |                 |  (charged from running only: a pending run's lost attempt is not)
       |                 +--interrupt--> queued (not charged) | cancelled
       |                 `--fail--> failed (its rows cannot be stored, or Ray refused its task)
       `--cancel_experiment / unschedulable--> cancelled | failed
       `--the experiment's first runs all failed (failure_stop)--> cancelled

`pending` is a run handed to Ray (its attempt claimed) that no worker has reported starting:
Ray queues tasks beyond the cluster's free CPUs and GPUs, so a dispatcher keeps more runs
pending than the cluster runs. `running` is a run whose worker sent its Started message.

Each operation costs O(the runs it touches): the experiment keeps its run counts per status
(`Experiment.runs_<status>`), moved by the same transaction that moves a run, so the
experiment's status is derived from one row. `RunStore.commit` applies the counts and statuses
of the experiments touched, then commits.

An experiment whose first `stop_after_failures` ended runs all failed (its spec's; a missing
dataset the pre-flight could not see, say) stops there: `commit` cancels its queued runs and asks
the dispatcher to cancel those a worker has not started, each with the reason as its error (the
experiment's `message`), in the transaction that stored the last of those failures. Decided per
experiment, from its own counts: no other experiment's runs are touched.

Concurrency: the dispatcher and the API's cancel both lock an experiment's row before its runs'
(`lock_experiments`), in id order, so the two never deadlock on PostgreSQL; SQLite locks the
whole database.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, delete, func, insert, or_, update
from sqlalchemy import select as sa_select
from sqlalchemy.engine import CursorResult, Result
from sqlmodel import Session, col, select

from api_schemas import (
    ExperimentCounts,
    ExperimentSpec,
    ExperimentStatus,
    RunStatus,
    first_line,
    storable_text,
)
from service.storage.db import (
    AttemptOutcome,
    CompareCache,
    Experiment,
    Run,
    RunAttempt,
    RunMetric,
    StatsCache,
    utcnow,
)

log = logging.getLogger("seedgrid.runs")

ORPHANED = "its dispatcher stopped without finishing it (the process died or lost its lock)"
ENDED = frozenset({RunStatus.completed, RunStatus.stopped, RunStatus.failed,
                   RunStatus.diverged, RunStatus.cancelled})
# A run a dispatcher holds: handed to Ray (pending) or started by a worker (running).
HELD = (RunStatus.pending, RunStatus.running)
# What a worker's result can end a run as.
RESULT_STATUSES = frozenset({RunStatus.completed, RunStatus.stopped, RunStatus.failed,
                             RunStatus.diverged})


def changed(result: Result[Any]) -> int:
    """How many rows the UPDATE or DELETE whose result this is changed."""
    if not isinstance(result, CursorResult):
        raise TypeError(f"not the result of an UPDATE or DELETE: {type(result).__name__}")
    return result.rowcount


def ids(rows: Iterable[int | None]) -> list[int]:
    """The ids read from a primary key column (typed nullable: never null once stored)."""
    return [i for i in rows if i is not None]


def cancelled_error(held: RunStatus) -> str:
    """The error of a pending or running run that ends cancelled."""
    return "cancelled before start" if held == RunStatus.pending else "cancelled while running"


def count_column(status: RunStatus) -> Any:
    """The experiment's column that counts its runs in `status`."""
    return getattr(Experiment, f"runs_{status.value}")


def experiment_counts(experiment: Experiment) -> ExperimentCounts:
    return ExperimentCounts(**{s.value: getattr(experiment, f"runs_{s.value}") for s in RunStatus})


# An attempt lost before any worker reported starting it (its task waited in Ray's queue, or
# was one of a sequential task's later seeds) is not charged: whatever killed the worker, it was
# not this run. So that a task Ray can never start cannot come back for ever, a run whose
# attempts were lost unstarted more than max_retries + 1 + this many times fails.
UNSTARTED_LOSSES_ALLOWED = 5


def retry_decision(*, cancel_requested: bool, charged_attempts: int, max_retries: int,
                   reason: str, unstarted_losses: int = 0) -> tuple[RunStatus, str | None]:
    """What a run whose attempt was lost (worker or node died, dispatcher gone) becomes: the
    one retry policy. A cancel asked for wins; then the run is re-queued while its charged
    attempts are within max_retries + 1 and its attempts lost before a worker started them
    within max_retries + 1 + UNSTARTED_LOSSES_ALLOWED; then it fails with the last reason."""
    if cancel_requested:
        return RunStatus.cancelled, "cancelled"
    if unstarted_losses > max_retries + 1 + UNSTARTED_LOSSES_ALLOWED:
        return RunStatus.failed, (f"lost before any worker started it on each of "
                                  f"{unstarted_losses} attempts; last: {reason}")
    if charged_attempts <= max_retries:
        return RunStatus.queued, None
    return RunStatus.failed, f"lost on each of {charged_attempts} attempts; last: {reason}"


def experiment_status(*, cancel_requested: bool, n_runs: int, counts: ExperimentCounts,
                      deciding: bool = False) -> ExperimentStatus:
    """An experiment's status from its run counts. Once every run has ended, it is completed
    when each run completed or was stopped by a check its spec asked to stop on (the outcomes
    the spec asked for), failed when none did and some failed or diverged (calling that partial
    would hide that there is nothing to compare), partial otherwise. An adaptive
    experiment whose next look is due (`deciding`, no run queued, pending or running) is still
    running: its next round may follow. One with runs pending (handed to Ray) is running."""
    if cancel_requested:
        return ExperimentStatus.cancelled
    if counts.active == 0 and deciding:
        return ExperimentStatus.running
    if counts.active == 0:
        succeeded = counts.completed + counts.stopped
        if succeeded == n_runs:
            return ExperimentStatus.completed
        if succeeded == 0 and counts.failed + counts.diverged > 0:
            return ExperimentStatus.failed
        return ExperimentStatus.partial
    if any(getattr(counts, s.value) for s in RunStatus if s != RunStatus.queued):
        return ExperimentStatus.running
    return ExperimentStatus.queued


# A spec stored before stop_after_failures existed stops at the default.
STOP_AFTER_FAILURES_DEFAULT: int = ExperimentSpec.model_fields["stop_after_failures"].default
# The error of a run the first-failures stop cancelled starts with this; the rest is the
# experiment's message (service.experiments.stop_message reads it back).
STOPPED_RUN_PREFIX = "cancelled: the experiment "


def failure_stop(*, counts: ExperimentCounts, stop_after: int) -> bool:
    """Whether an experiment stops now because its first runs all failed: at least
    `stop_after` (> 0) of its runs have ended and every one of them `failed` (none completed,
    stopped or diverged, and none was cancelled: a cancel, or this stop, came first), while
    some are still queued, pending or running. A lost worker's retry is not an end; a run lost
    on every attempt is a failure."""
    ended = (counts.completed + counts.stopped + counts.diverged + counts.cancelled
             + counts.failed)
    return (stop_after > 0 and counts.failed >= stop_after and ended == counts.failed
            and counts.active > 0)


def failure_stop_message(n_failed: int, errors: Sequence[str | None]) -> str:
    """The experiment's message when its first runs all failed: the first failure's error
    (its first line), and how many other errors there were."""
    lines = [first_line(e) for e in errors] or ["(no error message)"]
    others = len(set(lines)) - 1
    runs = "run" if n_failed == 1 else f"{n_failed} runs"
    return (f"stopped after its first {runs} failed: {lines[0][:1000]}"
            + (f" (and {others} other errors: see its failed runs)" if others else ""))


@dataclass(frozen=True)
class QueuedRun:
    """A queued run the store may claim: what deciding its task needs."""

    id: int
    experiment_id: int
    trainer: str
    condition: dict[str, Any]
    seed: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class ClaimedRun:
    """A queued run the store just made `pending`, with what its task needs."""

    id: int
    experiment_id: int
    attempt: int
    trainer: str
    condition: dict[str, Any]
    seed: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class AttemptKey:
    """Which attempt of which run an operation is about: a message from an older attempt (a
    run lost and re-queued meanwhile) must change nothing."""

    run_id: int
    experiment_id: int
    attempt: int


@dataclass(frozen=True)
class StartedAttempt:
    """A worker reported starting an attempt, and where."""

    key: AttemptKey
    node_id: str | None
    worker_id: str | None
    pid: int | None


@dataclass(frozen=True)
class FinishedAttempt:
    """An attempt's result: how the run ended and what it reported."""

    key: AttemptKey
    status: RunStatus
    metrics: dict[str, Any]
    diagnostics: dict[str, Any]
    warnings: list[dict[str, Any]]
    provenance: dict[str, Any]
    error: str | None


# The per-run writes of a dispatcher pass as Core statements run once per batch (executemany):
# building an ORM statement per run cost more than the database's work.
RUN = Run.metadata.tables["run"]
ATTEMPT = RunAttempt.metadata.tables["runattempt"]
METRIC = RunMetric.metadata.tables["metricpoint"]
_THIS_ATTEMPT = (RUN.c.id == bindparam("b_run"), RUN.c.attempts == bindparam("b_attempt"))
_START_RUN = update(RUN).where(*_THIS_ATTEMPT).values(
    started_at=bindparam("v_started_at"), node_id=bindparam("v_node_id"),
    worker_id=bindparam("v_worker_id"), worker_pid=bindparam("v_worker_pid"))
_ATTEMPT_ROW = (ATTEMPT.c.run_id == bindparam("b_run"),
                ATTEMPT.c.attempt == bindparam("b_attempt"))
_START_ATTEMPT = update(ATTEMPT).where(*_ATTEMPT_ROW).values(
    node_id=bindparam("v_node_id"), worker_pid=bindparam("v_worker_pid"))
# (no IN: an expanding parameter cannot run once per batch)
_FINISH_RUN = update(RUN).where(*_THIS_ATTEMPT, or_(*(RUN.c.status == s for s in HELD))).values(
    status=bindparam("v_status"), metrics=bindparam("v_metrics"),
    diagnostics=bindparam("v_diagnostics"), warnings=bindparam("v_warnings"),
    provenance=bindparam("v_provenance"), error=bindparam("v_error"),
    finished_at=bindparam("v_finished_at"))
_END_ATTEMPT = update(ATTEMPT).where(*_ATTEMPT_ROW).values(
    outcome=bindparam("v_outcome"), error=bindparam("v_error"),
    finished_at=bindparam("v_finished_at"))


class RunStore:
    """Run state changes within one session; `commit()` makes them durable together."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._moves: defaultdict[int, Counter[RunStatus]] = defaultdict(Counter)
        self._touched: set[int] = set()
        # experiments a run of which failed in this transaction: their first-failures stop
        self._failed: set[int] = set()

    # -- bookkeeping ---------------------------------------------------------------------------
    def _moved(self, experiment_id: int, old: RunStatus, new: RunStatus, n: int = 1) -> None:
        if n and old != new:
            self._moves[experiment_id][old] -= n
            self._moves[experiment_id][new] += n
            if new == RunStatus.failed:
                self._failed.add(experiment_id)
        self._touched.add(experiment_id)

    def commit(self) -> None:
        """Apply the experiments' count changes, derive their statuses, commit."""
        self.flush_counts()
        self.session.commit()

    def flush_counts(self) -> None:
        for experiment_id in sorted(self._touched):
            moves = {count_column(s).key: count_column(s) + n
                     for s, n in self._moves.get(experiment_id, Counter()).items() if n}
            if moves:
                self.session.execute(update(Experiment).where(col(Experiment.id) == experiment_id)
                                     .values(**moves).execution_options(synchronize_session=False))
            if experiment_id in self._failed:
                self._stop_after_failures(experiment_id)
            self._refresh_status(experiment_id)
        self._moves.clear()
        self._touched.clear()
        self._failed.clear()

    def _stop_after_failures(self, experiment_id: int) -> None:
        """The first-failures stop (`failure_stop`), the one place it is decided: a run of the
        experiment just failed; when its first runs all failed, its queued runs end cancelled
        and the dispatcher is asked to cancel those no worker has started (runs a worker is
        running may finish), each with the reason as its error. An adaptive experiment's
        rounds end with it."""
        this = col(Experiment.id) == experiment_id
        read = self._read_counts(experiment_id, col(Experiment.cancel_requested))
        if read is None or read[0].cancel_requested:
            return
        counts = read[1]
        if not failure_stop(counts=counts, stop_after=1):
            return  # a run ended otherwise (the usual case): the spec is not read
        spec, adaptive = self.session.execute(
            select(col(Experiment.spec), col(Experiment.adaptive)).where(this)).one()
        stop_after = spec.get("stop_after_failures", STOP_AFTER_FAILURES_DEFAULT)
        if not isinstance(stop_after, int) or not failure_stop(counts=counts,
                                                               stop_after=stop_after):
            return
        errors = self.session.exec(
            select(col(Run.error)).where(col(Run.experiment_id) == experiment_id,
                                    col(Run.status) == RunStatus.failed)
            .order_by(col(Run.finished_at), col(Run.id)).limit(counts.failed)
        ).all()
        message = failure_stop_message(counts.failed, errors)
        error = storable_text(STOPPED_RUN_PREFIX + message)
        mine = col(Run.experiment_id) == experiment_id
        cancelled = changed(self.session.execute(
            update(Run).where(mine, col(Run.status) == RunStatus.queued)
            .values(status=RunStatus.cancelled, finished_at=utcnow(), error=error)
        ))
        flagged = changed(self.session.execute(
            update(Run).where(mine, col(Run.status) == RunStatus.pending,
                              col(Run.cancel_requested) == False)  # noqa: E712
            .values(cancel_requested=True, error=error)
        ))
        if not cancelled and not flagged:
            return
        values: dict[str, Any] = {
            "runs_queued": col(Experiment.runs_queued) - cancelled,
            "runs_cancelled": col(Experiment.runs_cancelled) + cancelled}
        if adaptive is not None:
            values |= {"deciding": False, "adaptive": {**adaptive, "stop_reason": message,
                                                       "significant": False}}
        self.session.execute(update(Experiment).where(this)
                             .values(**values).execution_options(synchronize_session=False))
        log.warning("experiment %s %s; %d queued runs cancelled, %d not yet started being "
                    "cancelled", experiment_id, message, cancelled, flagged)

    def _read_counts(self, experiment_id: int,
                     *columns: Any) -> tuple[Any, ExperimentCounts] | None:
        """The experiment's `columns` (a row) and its run counts, in one read; None when it is
        gone."""
        row = self.session.execute(
            select(*columns, *(count_column(s) for s in RunStatus))
            .where(col(Experiment.id) == experiment_id)
        ).first()
        if row is None:
            return None
        return row, ExperimentCounts(**{s.value: row[len(columns) + i]
                                        for i, s in enumerate(RunStatus)})

    def _refresh_status(self, experiment_id: int) -> None:
        read = self._read_counts(experiment_id, col(Experiment.n_runs),
                                 col(Experiment.cancel_requested),
                                 col(Experiment.finished_at), col(Experiment.deciding))
        if read is None:
            return
        row, counts = read
        status = experiment_status(cancel_requested=row.cancel_requested, n_runs=row.n_runs,
                                   counts=counts, deciding=row.deciding)
        values: dict[str, Any] = {"status": status}
        ended = status not in (ExperimentStatus.queued, ExperimentStatus.running)
        if ended and counts.active == 0 and row.finished_at is None:
            values["finished_at"] = utcnow()
        elif not ended and row.finished_at is not None:
            values["finished_at"] = None  # seeds were added to an ended experiment
        self.session.execute(update(Experiment).where(col(Experiment.id) == experiment_id)
                             .values(**values).execution_options(synchronize_session=False))

    def lock_experiments(self, experiment_ids: Iterable[int]) -> None:
        """Lock these experiments' rows, in id order, before any of their runs' rows: the API's
        cancel locks an experiment and then its runs, and taking them in the same order keeps
        the two from deadlocking on PostgreSQL. SQLite has one lock, the database's write
        lock, which pysqlite takes only at a transaction's first write (the reads before it run
        outside any transaction, and two add-seeds both read the same next seeds): a write
        that changes nothing takes it now, and what the caller reads next stays as it read it
        until it commits."""
        ids = sorted(set(experiment_ids))
        if not ids:
            return
        if self.session.get_bind().dialect.name == "postgresql":
            self.session.execute(
                select(col(Experiment.id)).where(col(Experiment.id).in_(ids))
                .order_by(col(Experiment.id)).with_for_update()
            )
        else:
            self.session.execute(
                update(Experiment).where(col(Experiment.id).in_(ids))
                .values(priority=col(Experiment.priority))
                .execution_options(synchronize_session=False))

    # -- creating and reading ------------------------------------------------------------------
    def create_runs(self, experiment: Experiment, rows: Sequence[dict[str, Any]],
                    shared: dict[str, Any]) -> None:
        """Insert an experiment's runs, all queued (the experiment was created with
        runs_queued = n_runs)."""
        defaults = {"status": RunStatus.queued, "attempts": 0, "cancel_requested": False,
                    "metrics": {}, "diagnostics": {}, "warnings": [], "provenance": {},
                    "experiment_id": experiment.id, "created_at": utcnow()}
        self.session.execute(insert(Run), [{**defaults, **shared, **row} for row in rows])

    def add_runs(self, experiment: Experiment, rows: Sequence[dict[str, Any]],
                 shared: dict[str, Any]) -> None:
        """More queued runs for an experiment that has some (seeds added by hand or by an
        adaptive round): its run total and queued count grow in the same transaction."""
        assert experiment.id is not None
        self.create_runs(experiment, rows, shared)
        self.session.execute(
            update(Experiment).where(col(Experiment.id) == experiment.id)
            .values(n_runs=col(Experiment.n_runs) + len(rows))
            .execution_options(synchronize_session=False))
        self._moves[experiment.id][RunStatus.queued] += len(rows)
        self._touched.add(experiment.id)

    def due_decisions(self) -> list[int]:
        """Adaptive experiments whose next look is due: deciding, with no run queued, pending
        or running (their cancel included: the look then records the stop)."""
        return ids(self.session.exec(
            select(col(Experiment.id)).where(
                col(Experiment.deciding) == True,  # noqa: E712
                count_column(RunStatus.queued) == 0, count_column(RunStatus.pending) == 0,
                count_column(RunStatus.running) == 0)
            .order_by(col(Experiment.id))
        ).all())

    def record_look(self, experiment_id: int, state: dict[str, Any], *, stopped: bool) -> None:
        """Store an adaptive experiment's record after a look; `stopped` ends its rounds (its
        status then follows from its runs like any experiment's)."""
        self.session.execute(
            update(Experiment).where(col(Experiment.id) == experiment_id)
            .values(adaptive=state, deciding=not stopped)
            .execution_options(synchronize_session=False))
        self._touched.add(experiment_id)

    def next_queued_experiments(self, limit: int) -> list[int]:
        """The experiments of the next `limit` queued runs in claim order."""
        runs = (select(col(Run.experiment_id)).where(col(Run.status) == RunStatus.queued)
                .order_by(col(Run.priority).desc(), col(Run.id))
                .limit(limit).subquery())
        return sorted(self.session.exec(select(runs.c.experiment_id).distinct()).all())

    def queued_runs(self) -> int:
        return self.session.exec(
            select(func.count()).select_from(Run).where(col(Run.status) == RunStatus.queued)
        ).one()

    def specs(self, experiment_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Each experiment's stored spec (its base config, how its runs seed their sources)."""
        rows = self.session.exec(
            select(col(Experiment.id), col(Experiment.spec))
            .where(col(Experiment.id).in_(sorted(experiment_ids)))
        ).all()
        return {i: spec for i, spec in rows if i is not None}

    def cancel_requested(self, run_ids: Iterable[int]) -> list[int]:
        """Of these runs, the ones a cancel was asked for."""
        return ids(self.session.exec(
            select(col(Run.id)).where(col(Run.id).in_(list(run_ids)),
                                 col(Run.cancel_requested) == True)  # noqa: E712
        ).all())

    # -- claiming ------------------------------------------------------------------------------
    def claim(self, limit: int, *,
              unschedulable: Callable[[float, float], str | None] | None = None,
              take: Callable[[list[QueuedRun]], list[QueuedRun]] | None = None
              ) -> list[ClaimedRun]:
        """Up to `limit` queued runs in claim order (priority first, then oldest) become
        pending (handed to Ray; `start` makes them running), each with a new attempt.
        `unschedulable(num_cpus, num_gpus)` says why no node can ever hold a run (it then fails
        now) or None. `take(rows)`, when given, keeps the rows (in claim order, each with the
        run's id, experiment_id, condition, num_cpus and num_gpus) that are claimed: the
        dispatcher keeps as many whole tasks as it has room for."""
        candidates = [QueuedRun(*row) for row in self.session.execute(
            sa_select(RUN.c.id, RUN.c.experiment_id, RUN.c.trainer, RUN.c.condition, RUN.c.seed,
                   RUN.c.num_cpus, RUN.c.num_gpus)
            .where(RUN.c.status == RunStatus.queued)
            .order_by(RUN.c.priority.desc(), RUN.c.id)
            .limit(limit)
        ).all()]
        self.lock_experiments(row.experiment_id for row in candidates)
        problems = {row.id: unschedulable(row.num_cpus, row.num_gpus) if unschedulable else None
                    for row in candidates}
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
        attempts: dict[int, int] = dict(self.session.execute(
            update(RUN).where(RUN.c.id.in_([row.id for row in schedulable]),
                              RUN.c.status == RunStatus.queued)
            .values(status=RunStatus.pending, attempts=RUN.c.attempts + 1,
                    cancel_requested=False)
            .returning(RUN.c.id, RUN.c.attempts)
        ).all())
        claimed = [ClaimedRun(id=row.id, experiment_id=row.experiment_id,
                              attempt=attempts[row.id], trainer=row.trainer,
                              condition=row.condition, seed=row.seed, num_cpus=row.num_cpus,
                              num_gpus=row.num_gpus)
                   for row in schedulable if row.id in attempts]
        if claimed:
            self.session.execute(insert(ATTEMPT), [
                {"run_id": run.id, "attempt": run.attempt, "started_at": utcnow()}
                for run in claimed])
        for run in claimed:
            self._moved(run.experiment_id, RunStatus.queued, RunStatus.pending)
        return claimed

    def _fail_unschedulable(self, run_id: int, experiment_id: int, problem: str) -> None:
        now = utcnow()
        attempt = self.session.execute(
            update(RUN).where(RUN.c.id == run_id, RUN.c.status == RunStatus.queued)
            .values(status=RunStatus.failed, attempts=RUN.c.attempts + 1, error=problem,
                    finished_at=now)
            .returning(RUN.c.attempts)
        ).scalar()
        if attempt is not None:
            self._moved(experiment_id, RunStatus.queued, RunStatus.failed)
            self.session.execute(insert(ATTEMPT), [{
                "run_id": run_id, "attempt": attempt, "outcome": AttemptOutcome.failed,
                "error": problem, "started_at": now, "finished_at": now}])

    # -- running attempts ----------------------------------------------------------------------
    def start(self, started: Sequence[StartedAttempt]) -> None:
        """Workers began these attempts: each pending run becomes running, and where it runs
        is recorded. A message of an attempt that is not the run's current one (lost and
        re-queued meanwhile) moves nothing."""
        if not started:
            return
        now = utcnow()
        rows = [{"b_run": s.key.run_id, "b_attempt": s.key.attempt, "v_node_id": s.node_id,
                 "v_worker_id": s.worker_id, "v_worker_pid": s.pid, "v_started_at": now}
                for s in started]
        held = self._held_attempts([s.key.run_id for s in started])
        starting = [s.key for s in started
                    if held.get(s.key.run_id) == (s.key.attempt, RunStatus.pending)]
        if starting:
            # The dispatcher holds these runs (its lock) and their experiments' rows: no other
            # writer moves them between the read above and this update.
            self.session.execute(
                update(RUN).where(RUN.c.id.in_([key.run_id for key in starting]),
                                  RUN.c.status == RunStatus.pending)
                .values(status=RunStatus.running))
        for key in starting:
            self._moved(key.experiment_id, RunStatus.pending, RunStatus.running)
        self.session.execute(_START_RUN, rows)
        self.session.execute(_START_ATTEMPT, rows)

    def record_points(self, rows: Sequence[dict[str, Any]]) -> None:
        """Metric points ({run_id, step, epoch, name, value}) streamed by running attempts."""
        if rows:
            self.session.execute(insert(METRIC), rows)

    def finish(self, finished: Sequence[FinishedAttempt]) -> None:
        """These attempts returned results: each run ends completed, stopped, failed or
        diverged, from running or from pending (a result read before its Started was stored).
        A result of an attempt that is not the run's current one (lost and re-queued
        meanwhile) changes nothing."""
        for f in finished:
            if f.status not in RESULT_STATUSES:
                raise ValueError(f"a result cannot end a run as {f.status}")
        held = self._held_attempts([f.key.run_id for f in finished])
        ending = [f for f in finished
                  if f.key.run_id in held and held[f.key.run_id][0] == f.key.attempt]
        if not ending:
            return
        now = utcnow()
        self.session.execute(_FINISH_RUN, [
            {"b_run": f.key.run_id, "b_attempt": f.key.attempt, "v_status": f.status,
             "v_metrics": f.metrics, "v_diagnostics": f.diagnostics, "v_warnings": f.warnings,
             "v_provenance": f.provenance, "v_error": f.error, "v_finished_at": now}
            for f in ending])
        self.session.execute(_END_ATTEMPT, [
            {"b_run": f.key.run_id, "b_attempt": f.key.attempt,
             "v_outcome": AttemptOutcome(f.status.value), "v_error": f.error,
             "v_finished_at": now}
            for f in ending])
        for f in ending:
            self._moved(f.key.experiment_id, held[f.key.run_id][1], f.status)

    def _held_attempts(self, run_ids: list[int]) -> dict[int, tuple[int, RunStatus]]:
        """Of these runs, the pending or running ones: the attempt each holds, and its status."""
        if not run_ids:
            return {}
        rows = self.session.execute(
            select(RUN.c.id, RUN.c.attempts, RUN.c.status)
            .where(RUN.c.id.in_(run_ids), RUN.c.status.in_(HELD))
        ).all()
        return {run_id: (attempt, RunStatus(status)) for run_id, attempt, status in rows}

    def end_cancelled(self, attempt: AttemptKey) -> None:
        """Ray reports the attempt's task cancelled (a cancel the dispatcher forwarded)."""
        self._end_held(attempt, RunStatus.cancelled, AttemptOutcome.cancelled, None,
                       cancelled=True)

    def fail(self, attempt: AttemptKey, reason: str) -> None:
        """The attempt's rows cannot be stored: the run fails, not retried (the same config
        would send the same rows again)."""
        self._end_held(attempt, RunStatus.failed, AttemptOutcome.failed, reason)

    def _end_held(self, attempt: AttemptKey, status: RunStatus, outcome: AttemptOutcome,
                  reason: str | None, *, cancelled: bool = False) -> None:
        """End the attempt's run, pending or running, as `status`; the run's error is `reason`,
        or for a cancel, whether the run had started."""
        for held in HELD:
            # a cancel keeps an error already set (the first-failures stop's reason)
            error = func.coalesce(col(Run.error), cancelled_error(held)) if cancelled else reason
            moved = changed(self.session.execute(
                update(Run).where(col(Run.id) == attempt.run_id, col(Run.status) == held,
                                  col(Run.attempts) == attempt.attempt)
                .values(status=status, finished_at=utcnow(), error=error)
            ))
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
        self._end_attempt(attempt, AttemptOutcome.lost if started else AttemptOutcome.interrupted,
                          reason)
        self._after_lost(run, reason)
        return run.status

    def _after_lost(self, run: Run, reason: str,
                    uncharged: dict[int, tuple[int, int]] | None = None) -> None:
        """Retry or fail `run` by `retry_decision`, its attempts counted from their rows
        (`uncharged`: `_uncharged_attempts` of it, when the caller has read it already)."""
        assert run.id is not None
        if uncharged is None:
            uncharged = self._uncharged_attempts([run.id])
        interrupted, unstarted = uncharged.get(run.id, (0, 0))
        status, error = retry_decision(cancel_requested=run.cancel_requested,
                                       charged_attempts=run.attempts - interrupted,
                                       max_retries=run.max_retries, reason=reason,
                                       unstarted_losses=unstarted)
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
                this_attempt = (col(Run.id) == attempt.run_id, col(Run.status) == held,
                                col(Run.attempts) == attempt.attempt)
                cancelled = changed(self.session.execute(
                    update(Run).where(*this_attempt, col(Run.cancel_requested) == True)  # noqa: E712
                    .values(status=RunStatus.cancelled, finished_at=utcnow(),
                            error=func.coalesce(col(Run.error), cancelled_error(held)))
                ))
                requeued = changed(self.session.execute(
                    update(Run).where(*this_attempt, col(Run.cancel_requested) == False)  # noqa: E712
                    .values(status=RunStatus.queued)
                ))
                self._moved(attempt.experiment_id, held, RunStatus.cancelled, cancelled)
                self._moved(attempt.experiment_id, held, RunStatus.queued, requeued)
            self.session.execute(delete(RunMetric).where(col(RunMetric.run_id) == attempt.run_id))
            self._end_attempt(attempt, AttemptOutcome.interrupted, reason)

    def requeue_orphans(self, kept: dict[int, int]) -> list[int]:
        """Runs pending or running that no live attempt of this dispatcher holds (`kept`: run id
        -> attempt it holds) were left by an earlier dispatcher: each is lost (retry or fail by
        `retry_decision`). An attempt no worker reported starting (it waited in Ray's queue
        when its dispatcher died) is recorded interrupted, not charged: a service that crashes
        a few times in a row must not fail runs that never ran. Returns the orphans' ids."""
        held = col(Run.status).in_(HELD)
        self.lock_experiments(self.session.exec(
            select(col(Run.experiment_id)).where(held).distinct()).all())
        running = self.session.exec(select(Run).where(held)).all()
        orphans = [run for run in running if kept.get(run.id or -1) != run.attempts]
        now = utcnow()
        for run in orphans:
            unfinished = (col(RunAttempt.run_id) == run.id, col(RunAttempt.finished_at).is_(None))
            self.session.execute(
                update(RunAttempt).where(*unfinished, col(RunAttempt.worker_pid).is_(None))
                .values(outcome=AttemptOutcome.interrupted, error=ORPHANED, finished_at=now))
            self.session.execute(
                update(RunAttempt).where(*unfinished)
                .values(outcome=AttemptOutcome.lost, error=ORPHANED, finished_at=now))
        uncharged = self._uncharged_attempts([run.id for run in orphans if run.id])
        for run in orphans:
            self._after_lost(run, ORPHANED, uncharged)
        return [run.id for run in orphans if run.id is not None]

    def _end_attempt(self, attempt: AttemptKey, outcome: AttemptOutcome,
                     error: str | None) -> None:
        self.session.execute(
            update(RunAttempt).where(col(RunAttempt.run_id) == attempt.run_id,
                                     col(RunAttempt.attempt) == attempt.attempt)
            .values(outcome=outcome, error=error, finished_at=utcnow())
        )

    def _uncharged_attempts(self, run_ids: list[int]) -> dict[int, tuple[int, int]]:
        """Per run, its attempts recorded interrupted (not charged: cut short by a dispatcher
        that stopped, or lost before a worker started them), and how many of those no worker
        had started."""
        if not run_ids:
            return {}
        rows = self.session.execute(
            select(col(RunAttempt.run_id), func.count(),
                   func.count(case((col(RunAttempt.worker_pid).is_(None), 1))))
            .where(col(RunAttempt.run_id).in_(run_ids),
                   col(RunAttempt.outcome) == AttemptOutcome.interrupted)
            .group_by(col(RunAttempt.run_id))
        ).all()
        return {run_id: (count, unstarted) for run_id, count, unstarted in rows}

    # -- cancelling an experiment --------------------------------------------------------------
    def cancel_experiment(self, experiment: Experiment, now: datetime | None = None) -> None:
        """Its queued runs end cancelled now; its pending and running ones are flagged for the
        dispatcher, which forwards the cancel to Ray (`end_cancelled` when Ray confirms: a
        pending run's task is dropped from Ray's queue, a running one's stops)."""
        assert experiment.id is not None
        self.lock_experiments([experiment.id])
        cancelled = changed(self.session.execute(
            update(Run).where(col(Run.experiment_id) == experiment.id,
                              col(Run.status) == RunStatus.queued)
            .values(status=RunStatus.cancelled, finished_at=now or utcnow(),
                    error="cancelled before start")
        ))
        self.session.execute(
            update(Run).where(col(Run.experiment_id) == experiment.id,
                              col(Run.status).in_(HELD))
            .values(cancel_requested=True)
        )
        self.session.execute(update(Experiment).where(col(Experiment.id) == experiment.id)
                             .values(cancel_requested=True)
                             .execution_options(synchronize_session=False))
        self._moved(experiment.id, RunStatus.queued, RunStatus.cancelled, cancelled)

    # -- deleting an ended experiment ----------------------------------------------------------
    def mark_deleted(self, experiment_id: int) -> None:
        """The experiment is deleted: from this commit on every read treats it as gone, and
        `purge_step` removes its rows afterwards (service.scheduling.purge). Its next look, were
        one due,
        is off. The caller has locked the experiment and checked that no run of it is queued,
        pending or running."""
        self.session.execute(update(Experiment).where(col(Experiment.id) == experiment_id)
                             .values(deleted=True, deciding=False)
                             .execution_options(synchronize_session=False))
        self._touched.discard(experiment_id)

    def purge_step(self, experiment_id: int, limit: int) -> bool:
        """Remove at most `limit` rows of a deleted experiment, children first (the foreign
        keys): its metric points, then attempts, then runs; once none is left, its stored
        statistics and comparisons with its row. True when its row is gone (the caller commits
        after each step: each is one short transaction)."""
        runs = select(col(Run.id)).where(col(Run.experiment_id) == experiment_id)
        tables: tuple[tuple[type[RunMetric | RunAttempt | Run], Any, Any], ...] = (
            (RunMetric, col(RunMetric.id), col(RunMetric.run_id).in_(runs)),
            (RunAttempt, col(RunAttempt.id), col(RunAttempt.run_id).in_(runs)),
            (Run, col(Run.id), col(Run.experiment_id) == experiment_id))
        for table, id_column, mine in tables:
            batch = sa_select(id_column).where(mine).limit(limit).scalar_subquery()
            if changed(self.session.execute(delete(table).where(id_column.in_(batch)))):
                return False
        self.session.execute(delete(StatsCache)
                             .where(col(StatsCache.experiment_id) == experiment_id))
        self.session.execute(delete(CompareCache).where(
            or_(col(CompareCache.a_id) == experiment_id, col(CompareCache.b_id) == experiment_id)))
        self.session.execute(delete(Experiment).where(col(Experiment.id) == experiment_id,
                                                      col(Experiment.deleted) == True))  # noqa: E712
        return True

    def deleted_experiments(self) -> list[int]:
        """The experiments marked deleted whose rows are not all removed yet."""
        return ids(self.session.exec(
            select(col(Experiment.id)).where(col(Experiment.deleted) == True)  # noqa: E712
            .order_by(col(Experiment.id))).all())


def recount(session: Session, experiment_id: int) -> ExperimentCounts:
    """An experiment's run counts counted from its runs (what the kept counts must equal)."""
    rows = session.exec(
        select(col(Run.status), func.count()).where(col(Run.experiment_id) == experiment_id)
        .group_by(col(Run.status))
    ).all()
    counts: Counter[str] = Counter({RunStatus(status).value: n for status, n in rows})
    return ExperimentCounts(**counts)
