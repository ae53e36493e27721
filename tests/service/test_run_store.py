"""The runs store: the one retry policy, every state change keeping the experiment's counts
equal to a count of its runs, messages from an older attempt changing nothing, and no other
module of the service assigning a run's status."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from sqlmodel import Session, select

from api_schemas import ExperimentCounts, ExperimentSpec, ExperimentStatus, RunStatus
from service.experiments import (
    Conflict,
    NotFound,
    cancel_experiment,
    create_experiment,
    delete_experiment,
    experiment_detail,
    get_experiment,
)
from service.scheduling.purge import purge_deleted
from service.scheduling.run_store import (
    UNSTARTED_LOSSES_ALLOWED,
    AttemptKey,
    FinishedAttempt,
    RunStore,
    StartedAttempt,
    experiment_counts,
    experiment_status,
    failure_stop,
    recount,
    retry_decision,
)
from service.settings import Settings
from service.storage.db import AttemptOutcome, Experiment, Run, RunAttempt

SERVICE = Path(__file__).resolve().parents[2] / "service"


def new_experiment(session: Session, seeds: int, max_retries: int = 1, **spec: object) -> int:
    spec = ExperimentSpec.model_validate(
        {
            "name": "store",
            "trainer": "collapse",
            "config": {"steps": 5},
            "grid": {},
            "seeds": seeds,
            "max_retries": max_retries,
            **spec,
        }
    )
    experiment = create_experiment(
        session=session, spec=spec, settings=Settings(database_url="sqlite://")
    )
    assert experiment.id is not None
    return experiment.id


def finished(
    key: AttemptKey,
    status: RunStatus,
    metrics: dict[str, float] | None = None,
    error: str | None = None,
) -> FinishedAttempt:
    return FinishedAttempt(
        key=key,
        status=status,
        metrics=metrics or {},
        diagnostics={},
        warnings=[],
        provenance={},
        error=error,
    )


def assert_counts_kept(session: Session, experiment_id: int) -> Experiment:
    session.expire_all()
    experiment = session.get(Experiment, experiment_id)
    assert experiment is not None
    assert experiment_counts(experiment) == recount(session, experiment_id)
    return experiment


@pytest.mark.parametrize(
    ("cancel", "charged", "expected"),
    [
        (False, 1, RunStatus.queued),
        (False, 2, RunStatus.queued),
        (False, 3, RunStatus.failed),
        (True, 1, RunStatus.cancelled),
        (True, 3, RunStatus.cancelled),
    ],
)
def test_retry_decision(cancel: bool, charged: int, expected: RunStatus) -> None:
    status, error = retry_decision(
        cancel_requested=cancel, charged_attempts=charged, max_retries=2, reason="node died"
    )
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
    assert experiment.status == ExperimentStatus.running and experiment.runs_pending == 4
    keys = [
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt) for c in claimed
    ]
    store.finish(
        [
            finished(keys[0], RunStatus.completed, {"min_l2": 1.0}),
            finished(keys[1], RunStatus.diverged, error="non-finite loss at step 3"),
        ]
    )
    store.start([StartedAttempt(key=keys[2], node_id="n", worker_id="w", pid=1)])
    assert store.lose(keys[2], "node died") == RunStatus.queued  # retried: 1 <= max_retries
    store.fail(keys[3], "its results could not be stored")
    store.commit()
    assert_counts_kept(session, experiment_id)
    done, diverged = session.get(Run, 1), session.get(Run, 2)
    assert done is not None and diverged is not None
    assert (done.status, done.metrics, done.error) == (RunStatus.completed, {"min_l2": 1.0}, None)
    assert done.finished_at is not None
    assert (diverged.status, diverged.error) == (RunStatus.diverged, "non-finite loss at step 3")
    outcomes = dict(
        session.exec(
            select(RunAttempt.run_id, RunAttempt.outcome).where(RunAttempt.attempt == 1)
        ).all()
    )
    assert outcomes == {
        1: AttemptOutcome.completed,
        2: AttemptOutcome.diverged,
        3: AttemptOutcome.lost,
        4: AttemptOutcome.failed,
    }
    # a late message from the lost attempt changes nothing
    store.finish([finished(keys[2], RunStatus.completed)])
    store.commit()
    assert session.get(Run, 3).status == RunStatus.queued  # type: ignore[union-attr]
    retried = store.claim(10)
    store.commit()
    assert {c.id: c.attempt for c in retried} == {3: 2, 5: 1, 6: 1}
    third = AttemptKey(run_id=3, experiment_id=experiment_id, attempt=2)
    store.start([StartedAttempt(key=third, node_id="n", worker_id="w", pid=1)])
    assert store.lose(third, "node died again") == RunStatus.failed  # 2 > max_retries
    store.interrupt(
        [AttemptKey(run_id=5, experiment_id=experiment_id, attempt=1)], "the dispatcher stopped"
    )
    store.commit()
    assert session.get(Run, 5).status == RunStatus.queued  # type: ignore[union-attr]
    experiment = assert_counts_kept(session, experiment_id)
    store.cancel_experiment(experiment)
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    # cancelling while run 6 is pending; cancelled once it ended
    assert experiment.status == ExperimentStatus.cancelling
    assert experiment.runs_cancelled == 1 and experiment.runs_pending == 1  # run 6 is flagged
    assert store.cancel_requested([6]) == [6]
    store.end_cancelled(AttemptKey(run_id=6, experiment_id=experiment_id, attempt=1))
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert experiment.status == ExperimentStatus.cancelled
    assert experiment.finished_at is not None
    assert experiment_counts(experiment).model_dump() == {
        "queued": 0,
        "pending": 0,
        "running": 0,
        "completed": 1,
        "failed": 2,
        "diverged": 1,
        "cancelled": 2,
        "stopped": 0,
    }


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


def run_of(session: Session, run_id: int) -> Run:
    session.expire_all()
    run = session.get(Run, run_id)
    assert run is not None
    return run


def test_a_claimed_run_is_pending_until_its_worker_starts_it(session: Session) -> None:
    """claim -> pending (handed to Ray; the attempt is charged), the worker's Started ->
    running; a result can end a run from either, and a Started of an older attempt, or one for
    a run that ended, moves nothing."""
    experiment_id = new_experiment(session, seeds=3)
    store = RunStore(session)
    keys = [
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt)
        for c in store.claim(3)
    ]
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_pending, experiment.runs_running) == (3, 0)
    # handed to Ray is enough for the experiment to be running
    assert experiment.status == ExperimentStatus.running
    assert [run_of(session, k.run_id).attempts for k in keys] == [1, 1, 1]
    assert run_of(session, keys[0].run_id).started_at is None

    store.start(
        [
            StartedAttempt(key=keys[0], node_id="n", worker_id="w", pid=42),
            StartedAttempt(key=replace(keys[1], attempt=0), node_id="n", worker_id="w", pid=43),
        ]
    )
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_pending, experiment.runs_running) == (2, 1)
    started = run_of(session, keys[0].run_id)
    assert (started.status, started.worker_pid) == (RunStatus.running, 42)
    assert started.started_at is not None
    assert run_of(session, keys[1].run_id).status == RunStatus.pending  # an older attempt's

    # a result read before its Started was stored ends a pending run
    store.finish(
        [
            finished(keys[0], RunStatus.completed, {"min_l2": 1.0}),
            finished(keys[1], RunStatus.completed, {"min_l2": 2.0}),
        ]
    )
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_pending, experiment.runs_running, experiment.runs_completed) == (
        1,
        0,
        2,
    )
    assert run_of(session, keys[1].run_id).metrics == {"min_l2": 2.0}
    store.start([StartedAttempt(key=keys[1], node_id="n", worker_id="w", pid=43)])
    store.commit()
    assert run_of(session, keys[1].run_id).status == RunStatus.completed
    assert_counts_kept(session, experiment_id)


def test_a_pending_run_is_lost_interrupted_failed_or_orphaned_like_a_running_one(
    session: Session,
) -> None:
    experiment_id = new_experiment(session, seeds=4, max_retries=0)
    store = RunStore(session)
    lost, interrupted, failed, orphan = (
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt)
        for c in store.claim(4)
    )
    store.commit()
    # its task failed in Ray's queue before any worker started it: not charged (whatever
    # killed it, it was not this run), so even with max_retries 0 it goes back in the queue
    assert store.lose(lost, "the task ended without a result") == RunStatus.queued
    store.interrupt([interrupted], "the dispatcher stopped")  # not charged: back in the queue
    store.fail(failed, "its results could not be stored")
    store.commit()
    assert_counts_kept(session, experiment_id)
    assert [run_of(session, k.run_id).status for k in (lost, interrupted, failed, orphan)] == [
        RunStatus.queued,
        RunStatus.queued,
        RunStatus.failed,
        RunStatus.pending,
    ]
    assert run_of(session, failed.run_id).error == "its results could not be stored"
    # a pending run no live attempt holds was left by an earlier dispatcher: re-queued, and
    # its attempt (no worker had started it) recorded interrupted, not charged
    assert store.requeue_orphans({}) == [orphan.run_id]
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert run_of(session, orphan.run_id).status == RunStatus.queued
    assert experiment.runs_queued == 3 and experiment.runs_pending == 0
    outcomes = dict(session.exec(select(RunAttempt.run_id, RunAttempt.outcome)).all())
    assert outcomes == {
        lost.run_id: AttemptOutcome.interrupted,
        interrupted.run_id: AttemptOutcome.interrupted,
        failed.run_id: AttemptOutcome.failed,
        orphan.run_id: AttemptOutcome.interrupted,
    }


def test_only_a_started_attempt_is_charged_and_unstarted_losses_are_bounded(
    session: Session,
) -> None:
    """A lost task charges the runs a worker had started (running) and not those still pending
    (a sequential task's later seeds, a task in Ray's queue); a run lost unstarted again and
    again fails after max_retries + 1 + UNSTARTED_LOSSES_ALLOWED such losses, not never."""
    experiment_id = new_experiment(session, seeds=2, max_retries=1)
    store = RunStore(session)

    def claim_and_lose(run_id: int, *, start: bool) -> RunStatus | None:
        (claimed,) = store.claim(1)  # in id order: run 1 until it fails, then run 2
        assert claimed.id == run_id
        key = AttemptKey(run_id=run_id, experiment_id=experiment_id, attempt=claimed.attempt)
        if start:
            store.start([StartedAttempt(key=key, node_id="n", worker_id="w", pid=7)])
        status = store.lose(key, "worker died" if start else "never starts")
        store.commit()
        return status

    # max_retries 1: the started run's second charged loss fails it
    assert claim_and_lose(1, start=True) == RunStatus.queued
    assert claim_and_lose(1, start=True) == RunStatus.failed
    assert run_of(session, 1).error == "lost on each of 2 attempts; last: worker died"
    allowed = 1 + 1 + UNSTARTED_LOSSES_ALLOWED
    statuses = [claim_and_lose(2, start=False) for _ in range(allowed + 1)]
    assert statuses == [RunStatus.queued] * allowed + [RunStatus.failed]
    unstarted = run_of(session, 2)
    assert unstarted.error == (
        f"lost before any worker started it on each of {allowed + 1} attempts; last: never starts"
    )
    outcomes = session.exec(select(RunAttempt.outcome).where(RunAttempt.run_id == 2)).all()
    assert set(outcomes) == {AttemptOutcome.interrupted}
    assert_counts_kept(session, experiment_id)


def test_a_cancel_reaches_pending_runs_and_delete_waits_for_them(session: Session) -> None:
    """A pending run is flagged for the dispatcher (its task is cancelled in Ray) and ends
    cancelled before start; the experiment cannot be deleted while a run is pending."""
    experiment_id = new_experiment(session, seeds=3)
    store = RunStore(session)
    pending, running = (
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt)
        for c in store.claim(2)
    )
    store.start([StartedAttempt(key=running, node_id="n", worker_id="w", pid=42)])
    store.commit()
    cancel_experiment(session=session, experiment_id=experiment_id)
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_cancelled, experiment.runs_pending, experiment.runs_running) == (
        1,
        1,
        1,
    )
    assert sorted(store.cancel_requested([pending.run_id, running.run_id])) == [
        pending.run_id,
        running.run_id,
    ]
    with pytest.raises(Conflict, match="2 runs queued, pending or running"):
        delete_experiment(session=session, experiment_id=experiment_id)
    store.end_cancelled(running)
    store.commit()
    with pytest.raises(Conflict, match="1 runs queued, pending or running"):
        delete_experiment(session=session, experiment_id=experiment_id)
    store.end_cancelled(pending)
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert experiment.runs_cancelled == 3 and experiment.finished_at is not None
    assert run_of(session, pending.run_id).error == "cancelled before start"
    assert run_of(session, running.run_id).error == "cancelled while running"
    delete_experiment(session=session, experiment_id=experiment_id)
    with pytest.raises(NotFound):  # gone at once; its rows are removed in batches
        get_experiment(session=session, experiment_id=experiment_id)
    assert purge_deleted(session.get_bind()) == [experiment_id]
    session.expunge_all()
    assert session.get(Experiment, experiment_id) is None


def stopping_experiment(session: Session, seeds: int) -> int:
    """A feedback experiment whose runs stop on D2 (the store does not run them)."""
    spec = ExperimentSpec.model_validate(
        {
            "name": "stops",
            "trainer": "feedback",
            "seeds": seeds,
            "stop_on_checks": ["D2"],
            "config": {"arch": "studentnet", "width": 8, "depth": 1, "epochs": 1},
        }
    )
    experiment = create_experiment(
        session=session, spec=spec, settings=Settings(database_url="sqlite://")
    )
    assert experiment.id is not None
    return experiment.id


STOP = {
    "checks": ["D2"],
    "epoch": 3,
    "step": 30,
    "reason": "D2 reference validity fired at epoch 3: ref_grad_norm 4e-08 < 1e-07",
}


def test_a_stopped_run_is_counted_ended_and_its_experiment_completes(
    backend_session: Session,
) -> None:
    session = backend_session
    experiment_id = stopping_experiment(session, seeds=3)
    assert session.get(Experiment, experiment_id).spec["stop_on_checks"] == ["D2"]  # type: ignore[union-attr]
    store = RunStore(session)
    assert store.specs([experiment_id])[experiment_id]["stop_on_checks"] == ["D2"]
    keys = [
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt)
        for c in store.claim(3)
    ]
    store.commit()
    stopped = FinishedAttempt(
        key=keys[0],
        status=RunStatus.stopped,
        metrics={"test_accuracy": 0.5},
        diagnostics={"stop": STOP, "protocol": {"verdict": "FAIL(D2)"}},
        warnings=[],
        provenance={},
        error=None,
    )
    store.finish([stopped, finished(keys[1], RunStatus.completed, {"test_accuracy": 0.9})])
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_stopped, experiment.runs_completed, experiment.runs_pending) == (
        1,
        1,
        1,
    )
    assert experiment.status == ExperimentStatus.running and experiment.finished_at is None
    store.finish([replace(stopped, key=keys[2])])
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert experiment_counts(experiment).model_dump() == {
        "queued": 0,
        "pending": 0,
        "running": 0,
        "completed": 1,
        "failed": 0,
        "diverged": 0,
        "cancelled": 0,
        "stopped": 2,
    }
    # the runs ended as the spec asked: completed, not partial
    assert experiment.status == ExperimentStatus.completed and experiment.finished_at is not None
    run = session.get(Run, keys[0].run_id)
    assert run is not None and run.status == RunStatus.stopped and run.error is None
    assert run.diagnostics["stop"] == STOP and run.metrics == {"test_accuracy": 0.5}
    outcomes = dict(session.exec(select(RunAttempt.run_id, RunAttempt.outcome)).all())
    assert outcomes == {
        keys[0].run_id: AttemptOutcome.stopped,
        keys[1].run_id: AttemptOutcome.completed,
        keys[2].run_id: AttemptOutcome.stopped,
    }
    # an ended experiment cannot be cancelled
    with pytest.raises(Conflict, match="already ended"):
        cancel_experiment(session=session, experiment_id=experiment_id)


def test_stopped_beside_a_failed_run_is_partial(backend_session: Session) -> None:
    session = backend_session
    experiment_id = stopping_experiment(session, seeds=2)
    store = RunStore(session)
    first, second = (
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt)
        for c in store.claim(2)
    )
    store.finish(
        [
            FinishedAttempt(
                key=first,
                status=RunStatus.stopped,
                metrics={},
                diagnostics={"stop": STOP},
                warnings=[],
                provenance={},
                error=None,
            )
        ]
    )
    store.fail(second, "its results could not be stored")
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_stopped, experiment.runs_failed) == (1, 1)
    assert experiment.status == ExperimentStatus.partial


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"completed": 2, "stopped": 2}, ExperimentStatus.completed),
        ({"stopped": 4}, ExperimentStatus.completed),
        ({"completed": 2, "stopped": 1, "diverged": 1}, ExperimentStatus.partial),
        ({"completed": 1, "failed": 3}, ExperimentStatus.partial),
        ({"failed": 3, "diverged": 1}, ExperimentStatus.failed),
        ({"failed": 2, "cancelled": 2}, ExperimentStatus.failed),
        ({"cancelled": 4}, ExperimentStatus.partial),
        ({"stopped": 1, "queued": 3}, ExperimentStatus.running),
        ({"pending": 1, "queued": 3}, ExperimentStatus.running),
        ({"completed": 3, "pending": 1}, ExperimentStatus.running),
        ({"queued": 4}, ExperimentStatus.queued),
    ],
)
def test_experiment_status_counts_stopped_runs_as_ended_as_asked(
    counts: dict[str, int], expected: ExperimentStatus
) -> None:
    assert (
        experiment_status(cancel_requested=False, n_runs=4, counts=ExperimentCounts(**counts))
        == expected
    )


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"cancelled": 2, "running": 1}, ExperimentStatus.cancelling),
        ({"cancelled": 2, "pending": 1}, ExperimentStatus.cancelling),
        ({"cancelled": 3, "completed": 1}, ExperimentStatus.cancelled),
    ],
)
def test_a_cancelled_experiment_is_cancelling_while_a_run_still_trains(
    counts: dict[str, int], expected: ExperimentStatus
) -> None:
    # on 674b730 it said cancelled while a run still ran
    status = experiment_status(cancel_requested=True, n_runs=4, counts=ExperimentCounts(**counts))
    assert status == expected and status.is_ended == (expected == ExperimentStatus.cancelled)


@pytest.mark.parametrize(
    ("counts", "stop_after", "expected"),
    [
        ({"failed": 3, "queued": 5}, 3, True),
        ({"failed": 3, "running": 1}, 3, True),
        ({"failed": 4, "queued": 5}, 3, True),  # four failures stored in one pass
        ({"failed": 2, "queued": 5}, 3, False),
        ({"failed": 3}, 3, False),  # nothing left to stop
        ({"failed": 3, "completed": 1, "queued": 5}, 3, False),
        ({"failed": 3, "stopped": 1, "queued": 5}, 3, False),
        ({"failed": 3, "diverged": 1, "queued": 5}, 3, False),  # diverged is not failed
        ({"failed": 3, "cancelled": 2, "queued": 5}, 3, False),  # stopped (or cancelled) already
        ({"failed": 1, "queued": 5}, 1, True),
        ({"failed": 50, "queued": 5}, 0, False),  # 0: never
    ],
)
def test_failure_stop_when_the_first_ended_runs_all_failed(
    counts: dict[str, int], stop_after: int, expected: bool
) -> None:
    assert failure_stop(counts=ExperimentCounts(**counts), stop_after=stop_after) is expected


def test_the_first_failures_stop_their_experiment_alone(backend_session: Session) -> None:
    """Three failures of three ended runs: the queued runs end cancelled and the pending one (no
    worker has started it) is flagged for the dispatcher to cancel, each with the reason; the run a
    worker is running goes on; another experiment is untouched; a lost attempt is no failure."""
    session = backend_session
    experiment_id = new_experiment(session, seeds=8, max_retries=1)
    other_id = new_experiment(session, seeds=2)
    store = RunStore(session)
    claimed = store.claim(5)
    store.commit()
    keys = [
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt) for c in claimed
    ]
    store.start([StartedAttempt(key=keys[3], node_id="n", worker_id="w", pid=42)])
    assert store.lose(keys[0], "node died") == RunStatus.queued  # a retry, not a failure
    boom = "DatasetUnavailable: dataset 'cifar10' not found under /data\nmore lines"
    store.finish([finished(k, RunStatus.failed, error=boom) for k in keys[1:3]])
    store.commit()
    assert assert_counts_kept(session, experiment_id).runs_queued == 4  # two failures: goes on
    (retried,) = [c for c in store.claim(1)]
    store.commit()
    store.finish(
        [
            finished(
                AttemptKey(run_id=retried.id, experiment_id=experiment_id, attempt=retried.attempt),
                RunStatus.failed,
                error=boom,
            )
        ]
    )
    store.commit()

    experiment = assert_counts_kept(session, experiment_id)
    assert experiment_counts(experiment).model_dump() == {
        "queued": 0,
        "pending": 1,
        "running": 1,
        "completed": 0,
        "failed": 3,
        "diverged": 0,
        "cancelled": 3,
        "stopped": 0,
    }
    reason = (
        "stopped after its first 3 runs failed: DatasetUnavailable: dataset 'cifar10' "
        "not found under /data"
    )
    runs = {
        run.id: run
        for run in session.exec(select(Run).where(Run.experiment_id == experiment_id)).all()
    }
    assert {i for i, r in runs.items() if r.status == RunStatus.cancelled} == {6, 7, 8}
    assert all(runs[i].error == f"cancelled: the experiment {reason}" for i in (5, 6, 7, 8))
    assert experiment.stop_message == reason  # the experiment's own record of it
    assert runs[5].cancel_requested and runs[5].status == RunStatus.pending  # not started
    assert not runs[4].cancel_requested and runs[4].error is None  # a worker runs it
    assert experiment_detail(session=session, experiment_id=experiment_id).message == reason
    other = assert_counts_kept(session, other_id)
    assert (
        other.runs_queued == 2
        and experiment_detail(session=session, experiment_id=other_id).message is None
    )

    # Ray confirms the cancel: the run keeps the reason; the started run fails too
    store.end_cancelled(keys[4])
    store.finish([finished(keys[3], RunStatus.failed, error="RuntimeError: boom")])
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_cancelled, experiment.runs_failed) == (4, 4)
    assert experiment.status == ExperimentStatus.failed
    assert session.get(Run, 5).error == f"cancelled: the experiment {reason}"  # type: ignore[union-attr]
    assert experiment_detail(session=session, experiment_id=experiment_id).message == reason


def test_the_first_failures_stop_also_ends_an_adaptive_experiments_rounds(session: Session) -> None:
    experiment_id = new_experiment(
        session,
        seeds=4,
        grid={"stop_gradient": [False, True]},
        adaptive={"comparison": {"factor": "stop_gradient", "a": False, "b": True}},
    )
    store = RunStore(session)
    for claimed in store.claim(3):
        store.fail(
            AttemptKey(run_id=claimed.id, experiment_id=experiment_id, attempt=claimed.attempt),
            "RuntimeError: boom",
        )
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_cancelled, experiment.deciding) == (5, False)
    assert experiment.status == ExperimentStatus.failed  # no next round is due
    reason = "stopped after its first 3 runs failed: RuntimeError: boom"
    assert experiment.adaptive is not None and experiment.adaptive["stop_reason"] == reason
    assert experiment_detail(session=session, experiment_id=experiment_id).message == reason


def test_stop_after_failures_zero_runs_every_run(session: Session) -> None:
    experiment_id = new_experiment(session, seeds=5, stop_after_failures=0)
    store = RunStore(session)
    for claimed in store.claim(4):
        store.fail(
            AttemptKey(run_id=claimed.id, experiment_id=experiment_id, attempt=claimed.attempt),
            "RuntimeError: boom",
        )
    store.commit()
    experiment = assert_counts_kept(session, experiment_id)
    assert (experiment.runs_failed, experiment.runs_queued) == (4, 1)
    assert experiment_detail(session=session, experiment_id=experiment_id).message is None


# The runs store's modules that move runs (service/scheduling/run_store.py and its moves).
RUNS_STORE_MOVES = {"scheduling/run_store.py", "scheduling/run_moves.py"}


def test_only_the_runs_store_assigns_a_run_status() -> None:
    """(Migrations transform stored rows in SQL; they are the one other writer, by design.)"""
    assignment = re.compile(
        r"\bstatus\s*=\s*RunStatus\.|\.status\s*=(?!=)|"
        r"\.values\([^)]*\bstatus\s*="
    )
    offenders = [
        f"{path.relative_to(SERVICE.parent)}:{n}"
        for path in sorted(SERVICE.rglob("*.py"))
        if path.relative_to(SERVICE).as_posix() not in RUNS_STORE_MOVES
        and "migrations" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if assignment.search(line)
    ]
    assert offenders == []
