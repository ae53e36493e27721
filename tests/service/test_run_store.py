"""The runs store: the one retry policy, every state change keeping the experiment's counts
equal to a count of its runs, messages from an older attempt changing nothing, and no other
module of the service assigning a run's status."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, select

from api_schemas import ExperimentSpec, ExperimentStatus, RunStatus
from service.db import AttemptOutcome, Experiment, Run, RunAttempt, make_engine, upgrade_database
from service.experiments import create_experiment
from service.run_store import (
    AttemptKey,
    FinishedAttempt,
    RunStore,
    StartedAttempt,
    experiment_counts,
    recount,
    retry_decision,
)
from service.settings import Settings

SERVICE = Path(__file__).resolve().parents[2] / "service"


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    with Session(engine) as session:
        yield session
    engine.dispose()


def new_experiment(session: Session, seeds: int, max_retries: int = 1) -> int:
    spec = ExperimentSpec.model_validate({"name": "store", "trainer": "collapse",
                                          "config": {"steps": 5}, "grid": {}, "seeds": seeds,
                                          "max_retries": max_retries})
    experiment = create_experiment(session=session, spec=spec,
                                   settings=Settings(database_url="sqlite://"))
    assert experiment.id is not None
    return experiment.id


def finished(key: AttemptKey, status: RunStatus, metrics: dict[str, float] | None = None,
             error: str | None = None) -> FinishedAttempt:
    return FinishedAttempt(key=key, status=status, metrics=metrics or {}, diagnostics={},
                           warnings=[], provenance={}, error=error)


def assert_counts_kept(session: Session, experiment_id: int) -> Experiment:
    session.expire_all()
    experiment = session.get(Experiment, experiment_id)
    assert experiment is not None
    assert experiment_counts(experiment) == recount(session, experiment_id)
    return experiment


@pytest.mark.parametrize(("cancel", "charged", "expected"), [
    (False, 1, RunStatus.queued), (False, 2, RunStatus.queued), (False, 3, RunStatus.failed),
    (True, 1, RunStatus.cancelled), (True, 3, RunStatus.cancelled),
])
def test_retry_decision(cancel: bool, charged: int, expected: RunStatus) -> None:
    status, error = retry_decision(cancel_requested=cancel, charged_attempts=charged,
                                   max_retries=2, reason="node died")
    assert status == expected
    if expected == RunStatus.failed:
        assert error == "lost on each of 3 attempts; last: node died"


def test_every_state_change_keeps_the_experiment_counts(session: Session) -> None:
    experiment_id = new_experiment(session, seeds=6, max_retries=1)
    store = RunStore(session)
    claimed = store.claim(4)
    store.commit()
    assert [c.id for c in claimed] == [1, 2, 3, 4] and all(c.attempt == 1 for c in claimed)
    experiment = assert_counts_kept(session, experiment_id)
    assert experiment.status == ExperimentStatus.running and experiment.runs_running == 4
    keys = [AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt)
            for c in claimed]
    store.finish([finished(keys[0], RunStatus.completed, {"min_l2": 1.0}),
                  finished(keys[1], RunStatus.diverged, error="non-finite loss at step 3")])
    assert store.lose(keys[2], "node died") == RunStatus.queued  # retried: 1 <= max_retries
    store.fail(keys[3], "its results could not be stored")
    store.commit()
    assert_counts_kept(session, experiment_id)
    done, diverged = session.get(Run, 1), session.get(Run, 2)
    assert done is not None and diverged is not None
    assert (done.status, done.metrics, done.error) == (RunStatus.completed, {"min_l2": 1.0}, None)
    assert done.finished_at is not None
    assert (diverged.status, diverged.error) == (RunStatus.diverged, "non-finite loss at step 3")
    outcomes = dict(session.exec(select(RunAttempt.run_id, RunAttempt.outcome)
                                 .where(RunAttempt.attempt == 1)).all())
    assert outcomes == {1: AttemptOutcome.completed, 2: AttemptOutcome.diverged,
                        3: AttemptOutcome.lost, 4: AttemptOutcome.failed}
    # a late message from the lost attempt changes nothing
    store.finish([finished(keys[2], RunStatus.completed)])
    store.commit()
    assert session.get(Run, 3).status == RunStatus.queued  # type: ignore[union-attr]
    retried = store.claim(10)
    store.commit()
    assert {c.id: c.attempt for c in retried} == {3: 2, 5: 1, 6: 1}
    third = AttemptKey(run_id=3, experiment_id=experiment_id, attempt=2)
    assert store.lose(third, "node died again") == RunStatus.failed  # 2 > max_retries
    store.interrupt([AttemptKey(run_id=5, experiment_id=experiment_id, attempt=1)],
                    "the dispatcher stopped")
    store.commit()
    assert session.get(Run, 5).status == RunStatus.queued  # type: ignore[union-attr]
    experiment = assert_counts_kept(session, experiment_id)
    store.cancel_experiment(experiment)
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert experiment.status == ExperimentStatus.cancelled
    assert experiment.runs_cancelled == 1 and experiment.runs_running == 1  # run 6 is flagged
    assert store.cancel_requested([6]) == [6]
    store.end_cancelled(AttemptKey(run_id=6, experiment_id=experiment_id, attempt=1))
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert experiment.finished_at is not None
    assert experiment_counts(experiment).model_dump() == {
        "queued": 0, "running": 0, "completed": 1, "failed": 2, "diverged": 1, "cancelled": 2}


def test_orphans_are_lost_and_unstarted_attempts_are_not_charged(session: Session) -> None:
    experiment_id = new_experiment(session, seeds=2, max_retries=0)
    store = RunStore(session)
    claimed = store.claim(2)
    store.commit()
    started = AttemptKey(run_id=claimed[0].id, experiment_id=experiment_id, attempt=1)
    store.start([StartedAttempt(key=started, node_id="n", worker_id="w", pid=42)])
    store.commit()
    assert sorted(store.requeue_orphans({})) == [1, 2]
    store.commit()
    # the started attempt is charged (max_retries 0: it fails); the other waited in Ray's queue
    assert session.get(Run, 1).status == RunStatus.failed  # type: ignore[union-attr]
    assert session.get(Run, 2).status == RunStatus.queued  # type: ignore[union-attr]
    assert_counts_kept(session, experiment_id)


def test_only_the_runs_store_assigns_a_run_status() -> None:
    """(Migrations transform stored rows in SQL; they are the one other writer, by design.)"""
    assignment = re.compile(r"\bstatus\s*=\s*RunStatus\.|\.status\s*=(?!=)|"
                            r"\.values\([^)]*\bstatus\s*=")
    offenders = [f"{path.relative_to(SERVICE.parent)}:{n}"
                 for path in sorted(SERVICE.rglob("*.py"))
                 if path.name != "run_store.py" and "migrations" not in path.parts
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if assignment.search(line)]
    assert offenders == []
