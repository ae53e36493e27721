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

The store is one class over modules: run_rules (the decisions, no database: the retry policy,
an experiment's status, the first-failures stop), run_records (what callers pass and get),
run_reads (locks and reads), run_moves (the moves of attempts: claim, start, finish, lose,
interrupt); RunStore here adds commit, the counts and statuses, the first-failures stop,
creating, cancelling and deleting. Every move is checked against RunStatus.moves() (the state
machine above as a table); one outside it raises IllegalRunMove before anything commits.

Concurrency: the dispatcher and the API's cancel both lock an experiment's row before its runs'
(`lock_experiments`), in id order, so the two never deadlock on PostgreSQL; SQLite locks the
whole database.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pydantic
from sqlalchemy import delete, insert, or_, update
from sqlalchemy import select as sa_select
from sqlmodel import col, select

from api_schemas import IMPORTED_TRAINER, ExperimentSpec, RunStatus, storable_text
from service.scheduling.run_moves import RunMoves
from service.scheduling.run_reads import changed, count_column, experiment_counts, recount
from service.scheduling.run_records import (
    AttemptKey,
    ClaimedRun,
    FinishedAttempt,
    QueuedRun,
    StartedAttempt,
)
from service.scheduling.run_rules import (
    HELD,
    STOPPED_RUN_PREFIX,
    UNSTARTED_LOSSES_ALLOWED,
    IllegalRunMove,
    check_move,
    experiment_status,
    failure_stop,
    failure_stop_message,
    retry_decision,
)
from service.storage.db import (
    CompareCache,
    ComparisonResult,
    Experiment,
    Run,
    RunAttempt,
    RunMetric,
    StatsCache,
    utcnow,
)

# The store's vocabulary, importable from here as before the store was split.
__all__ = [
    "UNSTARTED_LOSSES_ALLOWED",
    "AttemptKey",
    "ClaimedRun",
    "FinishedAttempt",
    "IllegalRunMove",
    "QueuedRun",
    "RunStore",
    "StartedAttempt",
    "experiment_counts",
    "experiment_status",
    "failure_stop",
    "recount",
    "retry_decision",
]

log = logging.getLogger("seedgrid.runs")


class RunStore(RunMoves):
    """Run state changes within one session; `commit()` makes them durable together."""

    # -- committing ---------------------------------------------------------------------------

    def commit(self) -> None:
        """Apply the experiments' count changes, derive their statuses, commit."""
        self.flush_counts()
        self.session.commit()

    def flush_counts(self) -> None:
        for experiment_id in sorted(self._touched):
            moves = {
                count_column(s).key: count_column(s) + n
                for s, n in self._moves.get(experiment_id, Counter()).items()
                if n
            }
            if moves:
                self.session.execute(
                    update(Experiment)
                    .where(col(Experiment.id) == experiment_id)
                    .values(**moves)
                    .execution_options(synchronize_session=False)
                )
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
            select(col(Experiment.spec), col(Experiment.adaptive)).where(this)
        ).one()
        try:
            stop_after = ExperimentSpec.stored(spec).stop_after_failures
        except pydantic.ValidationError:
            return  # a spec this version cannot read stops nothing
        if not failure_stop(counts=counts, stop_after=stop_after):
            return
        failures = self.session.execute(
            select(col(Run.error), col(Run.traceback))
            .where(col(Run.experiment_id) == experiment_id, col(Run.status) == RunStatus.failed)
            .order_by(col(Run.finished_at), col(Run.id))
            .limit(counts.failed)
        ).all()
        message = failure_stop_message(
            counts.failed, [f.error for f in failures], [f.traceback for f in failures]
        )
        error = storable_text(STOPPED_RUN_PREFIX + message)
        mine = col(Run.experiment_id) == experiment_id
        check_move(RunStatus.queued, RunStatus.cancelled)  # counted below, not by _moved
        cancelled = changed(
            self.session.execute(
                update(Run)
                .where(mine, col(Run.status) == RunStatus.queued)
                .values(status=RunStatus.cancelled, finished_at=utcnow(), error=error)
            )
        )
        flagged = changed(
            self.session.execute(
                update(Run)
                .where(
                    mine,
                    col(Run.status) == RunStatus.pending,
                    col(Run.cancel_requested) == False,  # noqa: E712
                )
                .values(cancel_requested=True, error=error)
            )
        )
        if not cancelled and not flagged:
            return
        values: dict[str, Any] = {
            "runs_queued": col(Experiment.runs_queued) - cancelled,
            "runs_cancelled": col(Experiment.runs_cancelled) + cancelled,
            # the message as its runs' errors carry it (storable_text may have shortened it)
            "stop_message": error.removeprefix(STOPPED_RUN_PREFIX),
        }
        if adaptive is not None:
            values |= {
                "deciding": False,
                "adaptive": {**adaptive, "stop_reason": message, "significant": False},
            }
        self.session.execute(
            update(Experiment)
            .where(this)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        log.warning(
            "experiment %s %s; %d queued runs cancelled, %d not yet started being cancelled",
            experiment_id,
            message,
            cancelled,
            flagged,
        )

    def _refresh_status(self, experiment_id: int) -> None:
        read = self._read_counts(
            experiment_id,
            col(Experiment.n_runs),
            col(Experiment.cancel_requested),
            col(Experiment.finished_at),
            col(Experiment.deciding),
        )
        if read is None:
            return
        row, counts = read
        status = experiment_status(
            cancel_requested=row.cancel_requested,
            n_runs=row.n_runs,
            counts=counts,
            deciding=row.deciding,
        )
        values: dict[str, Any] = {"status": status}
        ended = status.is_ended
        if ended and counts.active == 0 and row.finished_at is None:
            values["finished_at"] = utcnow()
        elif not ended and row.finished_at is not None:
            values["finished_at"] = None  # seeds were added to an ended experiment
        self.session.execute(
            update(Experiment)
            .where(col(Experiment.id) == experiment_id)
            .values(**values)
            .execution_options(synchronize_session=False)
        )

    # -- creating runs and looks ------------------------------------------------------------------

    def create_runs(
        self, experiment: Experiment, rows: Sequence[dict[str, Any]], shared: dict[str, Any]
    ) -> None:
        """Insert an experiment's runs, all queued (the experiment was created with
        runs_queued = n_runs)."""
        defaults = {
            "status": RunStatus.queued,
            "attempts": 0,
            "cancel_requested": False,
            "metrics": {},
            "diagnostics": {},
            "warnings": [],
            "provenance": {},
            "experiment_id": experiment.id,
            "created_at": utcnow(),
        }
        self.session.execute(insert(Run), [{**defaults, **shared, **row} for row in rows])

    def add_runs(
        self, experiment: Experiment, rows: Sequence[dict[str, Any]], shared: dict[str, Any]
    ) -> None:
        """More queued runs for an experiment that has some (seeds added by hand or by an
        adaptive round): its run total and queued count grow in the same transaction."""
        self._grow(experiment, rows, shared, RunStatus.queued)

    def add_imported_runs(self, experiment: Experiment, rows: Sequence[dict[str, Any]]) -> None:
        """Runs that ended elsewhere (POST /experiments/import), inserted `completed` with their
        final metrics: no attempt, no move of the state machine (nothing here ran them). The
        experiment's run total and completed count grow in the same transaction, so its
        status follows from its counts like any experiment's."""
        now = utcnow()
        ended = {"status": RunStatus.completed, "started_at": now, "finished_at": now}
        imported = [{**row, **ended} for row in rows]
        self._grow(experiment, imported, {"trainer": IMPORTED_TRAINER}, RunStatus.completed)

    def _grow(
        self,
        experiment: Experiment,
        rows: Sequence[dict[str, Any]],
        shared: dict[str, Any],
        status: RunStatus,
    ) -> None:
        """Insert `rows` (all in `status`); the experiment's run total and that status's count
        grow in the same transaction."""
        assert experiment.id is not None
        self.create_runs(experiment, rows, shared)
        self.session.execute(
            update(Experiment)
            .where(col(Experiment.id) == experiment.id)
            .values(n_runs=col(Experiment.n_runs) + len(rows))
            .execution_options(synchronize_session=False)
        )
        self._moves[experiment.id][status] += len(rows)
        self._touched.add(experiment.id)

    def record_look(self, experiment_id: int, state: dict[str, Any], *, stopped: bool) -> None:
        """Store an adaptive experiment's record after a look; `stopped` ends its rounds (its
        status then follows from its runs like any experiment's)."""
        self.session.execute(
            update(Experiment)
            .where(col(Experiment.id) == experiment_id)
            .values(adaptive=state, deciding=not stopped)
            .execution_options(synchronize_session=False)
        )
        self._touched.add(experiment_id)

    # -- cancelling an experiment --------------------------------------------------------------

    def cancel_experiment(self, experiment: Experiment, now: datetime | None = None) -> None:
        """Its queued runs end cancelled now; its pending and running ones are flagged for the
        dispatcher, which forwards the cancel to Ray (`end_cancelled` when Ray confirms: a
        pending run's task is dropped from Ray's queue, a running one's stops)."""
        assert experiment.id is not None
        self.lock_experiments([experiment.id])
        cancelled = changed(
            self.session.execute(
                update(Run)
                .where(col(Run.experiment_id) == experiment.id, col(Run.status) == RunStatus.queued)
                .values(
                    status=RunStatus.cancelled,
                    finished_at=now or utcnow(),
                    error="cancelled before start",
                )
            )
        )
        self.session.execute(
            update(Run)
            .where(col(Run.experiment_id) == experiment.id, col(Run.status).in_(HELD))
            .values(cancel_requested=True)
        )
        self.session.execute(
            update(Experiment)
            .where(col(Experiment.id) == experiment.id)
            .values(cancel_requested=True)
            .execution_options(synchronize_session=False)
        )
        self._moved(experiment.id, RunStatus.queued, RunStatus.cancelled, cancelled)

    # -- deleting an ended experiment ----------------------------------------------------------

    def mark_deleted(self, experiment_id: int) -> None:
        """The experiment is deleted: from this commit on every read treats it as gone, and
        `purge_step` removes its rows afterwards (service.scheduling.purge). Its next look, were
        one due,
        is off. The caller has locked the experiment and checked that no run of it is queued,
        pending or running."""
        self.session.execute(
            update(Experiment)
            .where(col(Experiment.id) == experiment_id)
            .values(deleted=True, deciding=False)
            .execution_options(synchronize_session=False)
        )
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
            (Run, col(Run.id), col(Run.experiment_id) == experiment_id),
        )
        for table, id_column, mine in tables:
            batch = sa_select(id_column).where(mine).limit(limit).scalar_subquery()
            if changed(self.session.execute(delete(table).where(id_column.in_(batch)))):
                return False
        self.session.execute(
            delete(StatsCache).where(col(StatsCache.experiment_id) == experiment_id)
        )
        self.session.execute(
            delete(ComparisonResult).where(col(ComparisonResult.experiment_id) == experiment_id)
        )
        self.session.execute(
            delete(CompareCache).where(
                or_(
                    col(CompareCache.a_id) == experiment_id, col(CompareCache.b_id) == experiment_id
                )
            )
        )
        self.session.execute(
            delete(Experiment).where(
                col(Experiment.id) == experiment_id,
                col(Experiment.deleted) == True,  # noqa: E712
            )
        )
        return True
