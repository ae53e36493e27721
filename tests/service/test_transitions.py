"""The runs store's state machine is RunStatus.moves(): every move the store makes is in the
table, every move in the table is one the store makes, and a move outside it raises before
anything commits."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlmodel import Session

from api_schemas import ExperimentCounts, RunStatus
from service.scheduling import run_moves, run_store
from service.scheduling.run_rules import IllegalRunMove, check_move
from service.scheduling.run_store import AttemptKey, RunStore, StartedAttempt
from service.storage.db import Run
from tests.service.test_run_store import assert_counts_kept, finished, new_experiment

Move = tuple[RunStatus, RunStatus]


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[Move]]:
    """Every (from, to) the store checks: each counted move (`_moved`) and the first-failures
    stop's (which counts its own)."""
    seen: set[Move] = set()

    def recording(
        check: Callable[[RunStatus, RunStatus], None],
    ) -> Callable[[RunStatus, RunStatus], None]:
        def record(old: RunStatus, new: RunStatus) -> None:
            seen.add((old, new))
            check(old, new)

        return record

    monkeypatch.setattr(run_moves, "check_move", recording(run_moves.check_move))
    monkeypatch.setattr(run_store, "check_move", recording(run_store.check_move))
    yield seen


def table() -> set[Move]:
    return {(old, new) for old, targets in RunStatus.moves().items() for new in targets}


def keys_of(store: RunStore, experiment_id: int, n: int) -> list[AttemptKey]:
    return [
        AttemptKey(run_id=c.id, experiment_id=experiment_id, attempt=c.attempt)
        for c in store.claim(n)
    ]


def start(store: RunStore, keys: list[AttemptKey]) -> None:
    store.start([StartedAttempt(key=k, node_id="n", worker_id="w", pid=1) for k in keys])


def test_the_table_is_the_moves_the_store_makes(session: Session, moves: set[Move]) -> None:
    # no first-failures stop here: this experiment's runs fail in every way there is
    experiment_id = new_experiment(session, seeds=40, max_retries=5, stop_after_failures=0)
    store = RunStore(session)
    results = sorted(RunStatus.ended() - {RunStatus.cancelled})
    # queued -> failed: no node can hold it
    store.claim(1, unschedulable=lambda cpus, gpus: "no node can hold it")
    # queued -> pending; pending -> each result, and running -> each result
    keys = keys_of(store, experiment_id, 2 * len(results))
    start(store, keys[len(results) :])
    store.finish([finished(k, status) for k, status in zip(keys, results * 2, strict=True)])
    store.commit()
    # pending or running -> cancelled (Ray confirms a cancel), failed (rows not storable),
    # queued (lost and retried)
    for end in (
        store.end_cancelled,
        lambda k: store.fail(k, "unstorable"),
        lambda k: store.lose(k, "node died"),
    ):
        pending, running = keys_of(store, experiment_id, 2)
        start(store, [running])
        end(pending)
        end(running)
        store.commit()
    # pending or running -> queued or cancelled: the dispatcher stops
    pending, running, flagged_pending, flagged_running = keys_of(store, experiment_id, 4)
    start(store, [running, flagged_running])
    for key in (flagged_pending, flagged_running):
        run = session.get(Run, key.run_id)
        assert run is not None
        run.cancel_requested = True
        session.add(run)
    session.flush()
    store.interrupt([pending, running, flagged_pending, flagged_running], "stopping")
    store.commit()
    # queued -> cancelled: the experiment is cancelled
    experiment = assert_counts_kept(session, experiment_id)
    store.cancel_experiment(experiment)
    store.commit()
    assert_counts_kept(session, experiment_id)
    # queued -> cancelled: the first-failures stop
    stopping_id = new_experiment(session, seeds=3, stop_after_failures=1)
    (first,) = keys_of(store, stopping_id, 1)
    store.fail(first, "boom")
    store.commit()
    assert assert_counts_kept(session, stopping_id).runs_cancelled == 2

    assert moves == table()


def test_the_table_ends_where_the_enums_say() -> None:
    assert {s for s, targets in RunStatus.moves().items() if not targets} == RunStatus.ended()
    assert set(RunStatus.moves()) == set(RunStatus)
    assert all(
        RunStatus.queued not in RunStatus.moves()[s] or s in RunStatus.active() for s in RunStatus
    )


def test_an_end_is_a_success_something_gone_wrong_or_a_cancel() -> None:
    succeeded, wrong = RunStatus.succeeded(), set(RunStatus.went_wrong())
    assert succeeded | wrong | {RunStatus.cancelled} == RunStatus.ended()
    assert not succeeded & wrong and RunStatus.cancelled not in succeeded | wrong
    assert list(RunStatus.went_wrong()) == [s for s in RunStatus if s in wrong]
    counts = ExperimentCounts(completed=2, stopped=1, failed=4, diverged=8, cancelled=16)
    assert (counts.succeeded, counts.went_wrong, counts.ended) == (3, 12, 31)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (RunStatus.completed, RunStatus.queued),
        (RunStatus.queued, RunStatus.running),
        (RunStatus.running, RunStatus.pending),
        (RunStatus.cancelled, RunStatus.cancelled),
    ],
)
def test_an_illegal_move_is_an_internal_error_naming_it(old: RunStatus, new: RunStatus) -> None:
    with pytest.raises(IllegalRunMove, match=f"from {old.value} to {new.value}"):
        check_move(old, new)


def test_the_store_refuses_an_illegal_move_before_it_commits(session: Session) -> None:
    experiment_id = new_experiment(session, seeds=1)
    store = RunStore(session)
    (key,) = keys_of(store, experiment_id, 1)
    store.finish([finished(key, RunStatus.completed)])
    store.commit()
    with pytest.raises(IllegalRunMove, match="from completed to queued"):
        store._moved(experiment_id, RunStatus.completed, RunStatus.queued)
    session.rollback()
    assert assert_counts_kept(session, experiment_id).runs_completed == 1
