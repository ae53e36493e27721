"""An experiment's status and its run counts are read from one snapshot, on SQLite and on
PostgreSQL: a dispatcher that commits in the middle of a read can not make the API answer
`running` beside counts in which every run has ended (the race behind a failed CI run)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event
from sqlmodel import Session

from api_schemas import ExperimentSpec, ExperimentStatus, RunStatus
from service.experiments import create_experiment, experiment_detail, list_experiments
from service.scheduling.run_store import AttemptKey, FinishedAttempt, RunStore
from service.settings import Settings
from service.storage.db import Experiment, make_engine


def _running_experiment(url: str) -> int:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            spec = ExperimentSpec.model_validate(
                {
                    "name": "race",
                    "trainer": "collapse",
                    "config": {"steps": 10},
                    "grid": {"stop_gradient": [False, True]},
                    "seeds": 2,
                }
            )
            experiment = create_experiment(
                session=session, spec=spec, settings=Settings(database_url=url)
            )
            assert experiment.id is not None
            store = RunStore(session)
            assert len(store.claim(10)) == 4
            store.commit()
            return experiment.id
    finally:
        engine.dispose()


def _finish_all_runs(url: str, experiment_id: int) -> None:
    """What the dispatcher does when the last results arrive: one transaction, from elsewhere."""
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            store = RunStore(session)
            store.finish(
                [
                    FinishedAttempt(
                        key=AttemptKey(run_id=run_id, experiment_id=experiment_id, attempt=1),
                        status=RunStatus.completed,
                        metrics={},
                        diagnostics={},
                        warnings=[],
                        provenance={},
                        error=None,
                    )
                    for run_id in range(1, 5)
                ]
            )
            store.commit()
    finally:
        engine.dispose()


def _commit_after_first_experiment_read(engine: Any, url: str, experiment_id: int) -> list[int]:
    """The other writer commits right after the reader's first statement that reads `experiment`."""
    fired: list[int] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if (
            not fired
            and statement.lstrip().upper().startswith("SELECT")
            and ("FROM experiment" in statement)
        ):
            fired.append(1)
            _finish_all_runs(url, experiment_id)

    event.listen(engine, "after_cursor_execute", after)
    return fired


def _consistent(status: ExperimentStatus, counts: Any) -> bool:
    ended = counts.queued == counts.pending == counts.running == 0
    return (status == ExperimentStatus.completed) == ended


@pytest.mark.parametrize("read", ["detail", "list"])
def test_status_and_counts_come_from_one_snapshot(database_url: str, read: str) -> None:
    experiment_id = _running_experiment(database_url)
    engine = make_engine(database_url)
    try:
        fired = _commit_after_first_experiment_read(engine, database_url, experiment_id)
        with Session(engine) as session:
            if read == "detail":
                summary: Any = experiment_detail(session=session, experiment_id=experiment_id)
            else:
                (summary,) = list_experiments(session=session, limit=10, offset=0)
        assert fired, "the concurrent commit did not happen during the read"
        assert _consistent(summary.status, summary.counts), (summary.status, summary.counts)
        # and the commit really landed: a fresh read sees the experiment ended
        with Session(engine) as session:
            after = experiment_detail(session=session, experiment_id=experiment_id)
            assert after.status == ExperimentStatus.completed and after.counts.completed == 4
            assert session.get(Experiment, experiment_id) is not None
    finally:
        engine.dispose()
