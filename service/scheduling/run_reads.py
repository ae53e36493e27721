"""The runs store's reads (service.scheduling.run_store): locking experiments, reading runs
and counts, and the tables and helpers its statements share. Nothing here moves a run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import case, func, update
from sqlalchemy.engine import CursorResult, Result
from sqlmodel import Session, col, select

from api_schemas import ExperimentCounts, RunStatus
from service.scheduling.run_rules import HELD
from service.storage.db import AttemptOutcome, Experiment, Run, RunAttempt, RunMetric

# The per-run writes of a dispatcher pass as Core statements run once per batch (executemany):
# building an ORM statement per run cost more than the database's work.
RUN = Run.metadata.tables["run"]
ATTEMPT = RunAttempt.metadata.tables["runattempt"]
METRIC = RunMetric.metadata.tables["metricpoint"]


def changed(result: Result[Any]) -> int:
    """How many rows the UPDATE or DELETE whose result this is changed."""
    if not isinstance(result, CursorResult):
        raise TypeError(f"not the result of an UPDATE or DELETE: {type(result).__name__}")
    return result.rowcount


def ids(rows: Iterable[int | None]) -> list[int]:
    """The ids read from a primary key column (typed nullable: never null once stored)."""
    return [i for i in rows if i is not None]


def of_trainers(column: Any, trainers: Collection[str] | None) -> list[Any]:
    """The WHERE clause that keeps rows of these trainers (none: every trainer's)."""
    return [] if trainers is None else [column.in_(sorted(trainers))]


def count_column(status: RunStatus) -> Any:
    """The experiment's column that counts its runs in `status`."""
    return getattr(Experiment, f"runs_{status.value}")


def experiment_counts(experiment: Experiment) -> ExperimentCounts:
    return ExperimentCounts(**{s.value: getattr(experiment, f"runs_{s.value}") for s in RunStatus})


def recount(session: Session, experiment_id: int) -> ExperimentCounts:
    """An experiment's run counts counted from its runs (what the kept counts must equal)."""
    rows = session.exec(
        select(col(Run.status), func.count())
        .where(col(Run.experiment_id) == experiment_id)
        .group_by(col(Run.status))
    ).all()
    counts: Counter[str] = Counter({RunStatus(status).value: n for status, n in rows})
    return ExperimentCounts(**counts)


class RunReads:
    """The store's reads and locks, on one session."""

    def __init__(self, session: Session) -> None:
        self.session = session

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
                select(col(Experiment.id))
                .where(col(Experiment.id).in_(ids))
                .order_by(col(Experiment.id))
                .with_for_update()
            )
        else:
            self.session.execute(
                update(Experiment)
                .where(col(Experiment.id).in_(ids))
                .values(priority=col(Experiment.priority))
                .execution_options(synchronize_session=False)
            )

    def _read_counts(
        self, experiment_id: int, *columns: Any
    ) -> tuple[Any, ExperimentCounts] | None:
        """The experiment's `columns` (a row) and its run counts, in one read; None when it is
        gone."""
        row = self.session.execute(
            select(*columns, *(count_column(s) for s in RunStatus)).where(
                col(Experiment.id) == experiment_id
            )
        ).first()
        if row is None:
            return None
        return row, ExperimentCounts(
            **{s.value: row[len(columns) + i] for i, s in enumerate(RunStatus)}
        )

    def due_decisions(self, trainers: Collection[str] | None = None) -> list[int]:
        """Adaptive experiments whose next look is due: deciding, with no run queued, pending
        or running (their cancel included: the look then records the stop); `trainers`, when
        given: only experiments of these trainers."""
        return ids(
            self.session.exec(
                select(col(Experiment.id))
                .where(
                    col(Experiment.deciding) == True,  # noqa: E712
                    count_column(RunStatus.queued) == 0,
                    count_column(RunStatus.pending) == 0,
                    count_column(RunStatus.running) == 0,
                    *of_trainers(col(Experiment.trainer), trainers),
                )
                .order_by(col(Experiment.id))
            ).all()
        )

    def next_queued_experiments(
        self, limit: int, trainers: Collection[str] | None = None
    ) -> list[int]:
        """The experiments of the next `limit` queued runs in claim order (of `trainers` only,
        when given)."""
        runs = (
            select(col(Run.experiment_id))
            .where(col(Run.status) == RunStatus.queued, *of_trainers(col(Run.trainer), trainers))
            .order_by(col(Run.priority).desc(), col(Run.id))
            .limit(limit)
            .subquery()
        )
        return sorted(self.session.exec(select(runs.c.experiment_id).distinct()).all())

    def queued_runs(self) -> int:
        return self.session.exec(
            select(func.count()).select_from(Run).where(col(Run.status) == RunStatus.queued)
        ).one()

    def specs(self, experiment_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Each experiment's stored spec (its base config, how its runs seed their sources)."""
        rows = self.session.exec(
            select(col(Experiment.id), col(Experiment.spec)).where(
                col(Experiment.id).in_(sorted(experiment_ids))
            )
        ).all()
        return {i: spec for i, spec in rows if i is not None}

    def cancel_requested(self, run_ids: Iterable[int]) -> list[int]:
        """Of these runs, the ones a cancel was asked for."""
        return ids(
            self.session.exec(
                select(col(Run.id)).where(
                    col(Run.id).in_(list(run_ids)),
                    col(Run.cancel_requested) == True,  # noqa: E712
                )
            ).all()
        )

    def _held_attempts(self, run_ids: list[int]) -> dict[int, tuple[int, RunStatus]]:
        """Of these runs, the pending or running ones: the attempt each holds, and its status."""
        if not run_ids:
            return {}
        rows = self.session.execute(
            select(RUN.c.id, RUN.c.attempts, RUN.c.status).where(
                RUN.c.id.in_(run_ids), RUN.c.status.in_(HELD)
            )
        ).all()
        return {run_id: (attempt, RunStatus(status)) for run_id, attempt, status in rows}

    def _uncharged_attempts(self, run_ids: list[int]) -> dict[int, tuple[int, int]]:
        """Per run, its attempts recorded interrupted (not charged: cut short by a dispatcher
        that stopped, or lost before a worker started them), and how many of those no worker
        had started."""
        if not run_ids:
            return {}
        rows = self.session.execute(
            select(
                col(RunAttempt.run_id),
                func.count(),
                func.count(case((col(RunAttempt.worker_pid).is_(None), 1))),
            )
            .where(
                col(RunAttempt.run_id).in_(run_ids),
                col(RunAttempt.outcome) == AttemptOutcome.interrupted,
            )
            .group_by(col(RunAttempt.run_id))
        ).all()
        return {run_id: (count, unstarted) for run_id, count, unstarted in rows}

    def deleted_experiments(self) -> list[int]:
        """The experiments marked deleted whose rows are not all removed yet."""
        return ids(
            self.session.exec(
                select(col(Experiment.id))
                .where(col(Experiment.deleted) == True)  # noqa: E712
                .order_by(col(Experiment.id))
            ).all()
        )
