"""An adaptive experiment through the store, without Ray: its looks read each completed run's
seed (so shared seeds make a paired test), its /stats are marked interim until it stops (and
the interim page is not served after), and seeds by hand are refused, before and after its
stop."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session

from api_schemas import AddSeeds, ExperimentSpec, RunStatus
from service.analysis.resampling import PAIRED_MIXED_TEST, UNPAIRED_TEST
from service.analysis.stats_store import INTERIM_NOTE, stats_json
from service.experiments import Conflict, add_seeds, create_experiment
from service.scheduling.adaptive import decide_due
from service.scheduling.run_store import AttemptKey, FinishedAttempt, RunStore
from service.settings import Settings
from service.storage.db import Experiment

SETTINGS = Settings(database_url="sqlite://")


def complete_queued(session: Session) -> int:
    """Every queued run completes; seed s gives min_l2 = s + 1 without stop_gradient and 10
    times that with it (the same seed's streams in both: a variance ratio of 1/100)."""
    store = RunStore(session)
    claimed = store.claim(1000)
    store.finish(
        [
            FinishedAttempt(
                key=AttemptKey(run_id=run.id, experiment_id=run.experiment_id, attempt=run.attempt),
                status=RunStatus.completed,
                metrics={
                    "min_l2": (run.seed + 1) * (10.0 if run.condition["stop_gradient"] else 1.0)
                },
                diagnostics={},
                warnings=[],
                provenance={},
                error=None,
            )
            for run in claimed
        ]
    )
    store.commit()
    return len(claimed)


def served(session: Session, experiment_id: int) -> dict:
    session.expire_all()
    experiment = session.get(Experiment, experiment_id)
    assert experiment is not None
    return json.loads(
        stats_json(
            session=session, experiment=experiment, metric=None, factor=None, offset=0, limit=None
        )
    )


def test_an_adaptive_experiment_pairs_its_seeds_marks_interim_stats_and_refuses_seeds(
    session: Session,
) -> None:
    spec = ExperimentSpec.model_validate(
        {
            "name": "adaptive",
            "trainer": "collapse",
            "config": {"steps": 5},
            "grid": {"stop_gradient": [False, True]},
            "adaptive": {
                "comparison": {"factor": "stop_gradient", "a": False, "b": True},
                "min_seeds": 4,
                "step": 4,
                "max_seeds": 8,
            },
        }
    )
    experiment_id = create_experiment(session=session, spec=spec, settings=SETTINGS).id
    assert experiment_id is not None
    assert complete_queued(session) == 8

    interim = served(session, experiment_id)
    assert interim["interim"] is True and interim["interim_note"] == INTERIM_NOTE
    with pytest.raises(Conflict, match="is adaptive: its rule decides its seeds"):
        add_seeds(
            session=session,
            experiment_id=experiment_id,
            request=AddSeeds(seeds=1),
            settings=SETTINGS,
        )

    # Look 1, 4 seeds: 16 sign flips are too few, so the unpaired test, whose 20 splits (a
    # 4-seed cell's structural tie left out) cannot reach 0.05 / 2 looks: the interval is
    # [0, inf] and round 2 is queued.
    assert decide_due(session, settings=SETTINGS) == 1
    assert complete_queued(session) == 8
    # Look 2, 8 shared seeds: the sign-flip test; every seed's values are 10 times apart, so
    # the only ratio it does not reject is 1/100.
    assert decide_due(session, settings=SETTINGS) == 1
    session.expire_all()
    experiment = session.get(Experiment, experiment_id)
    assert experiment is not None and experiment.adaptive is not None
    first, second = experiment.adaptive["looks"]
    assert (first["test"], first["interval"], first["excludes_null"]) == (
        UNPAIRED_TEST,
        [0.0, None],
        False,
    )
    assert "20 re-assignments are too few" in first["note"]
    assert second["test"] == PAIRED_MIXED_TEST and second["note"] is None
    assert second["interval"] == pytest.approx([0.01, 0.01], rel=1e-9)
    assert second["estimate"] == pytest.approx(0.01, rel=1e-12)
    assert experiment.adaptive["significant"] is True and not experiment.deciding

    # Stopped with no run completed since the interim page: that page is not served again.
    final = served(session, experiment_id)
    assert final["n_completed"] == 16 and interim["n_completed"] == 8
    assert final["interim"] is False and final["interim_note"] is None
    with pytest.raises(Conflict, match="even after it stopped.*submit a new experiment"):
        add_seeds(
            session=session,
            experiment_id=experiment_id,
            request=AddSeeds(seeds=1),
            settings=SETTINGS,
        )


def test_the_interim_page_of_a_stopped_experiment_is_computed_again(session: Session) -> None:
    spec = ExperimentSpec.model_validate(
        {
            "name": "adaptive",
            "trainer": "collapse",
            "config": {"steps": 5},
            "grid": {"stop_gradient": [False, True]},
            "adaptive": {
                "comparison": {"factor": "stop_gradient", "a": False, "b": True},
                "min_seeds": 2,
                "max_seeds": 2,
            },
        }
    )
    experiment_id = create_experiment(session=session, spec=spec, settings=SETTINGS).id
    assert experiment_id is not None
    complete_queued(session)
    assert served(session, experiment_id)["interim"] is True
    # the only look: max_seeds reached, no run added
    assert decide_due(session, settings=SETTINGS) == 1
    after = served(session, experiment_id)
    assert after["n_completed"] == 4 and after["interim"] is False


def adaptive_spec(**rule: object) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "name": "adaptive",
            "trainer": "collapse",
            "config": {"steps": 5},
            "grid": {"stop_gradient": [False, True]},
            "adaptive": {
                "comparison": {"factor": "stop_gradient", "a": False, "b": True},
                "min_seeds": 4,
                "step": 4,
                "max_seeds": 12,
                **rule,
            },
        }
    )


def queued_runs(session: Session) -> int:
    return RunStore(session).queued_runs()


def test_an_adaptive_round_waits_for_room_under_the_queue_cap(backend_session: Session) -> None:
    """Rounds enter the queue like submissions: with SEEDGRID_MAX_QUEUED_RUNS 50, a round of
    40 runs waits while 20 other runs are queued (its look recorded once, with why it waits),
    and is queued at the first look after there is room; the queue never passes the cap."""
    session = backend_session
    capped = Settings(database_url="sqlite://", max_queued_runs=50)
    experiment_id = create_experiment(
        session=session, spec=adaptive_spec(step=20, max_seeds=44), settings=capped
    ).id
    assert complete_queued(session) == 8
    other = ExperimentSpec.model_validate(
        {"name": "other", "trainer": "collapse", "config": {"steps": 5}, "seeds": 20}
    )
    create_experiment(session=session, spec=other, settings=capped)
    assert decide_due(session, settings=capped) == 1  # the look is taken; its round waits
    assert queued_runs(session) == 20
    assert decide_due(session, settings=capped) == 0  # no second look while it waits
    session.expire_all()
    experiment = session.get(Experiment, experiment_id)
    assert experiment is not None and experiment.deciding
    state = experiment.adaptive
    assert state is not None and len(state["looks"]) == 1 and state["next_round"] == [4, 24]
    assert state["waiting"] == (
        "the round to 24 seeds per condition (40 runs) waits for room in the queue: it would "
        "pass the cap of 50 queued runs (SEEDGRID_MAX_QUEUED_RUNS)"
    )
    assert experiment.status == "running" and experiment.n_runs == 8

    store = RunStore(session)  # the other experiment's runs leave the queue
    store.claim(20)
    store.commit()
    assert decide_due(session, settings=capped) == 0  # the round is queued, no new look
    assert queued_runs(session) == 40
    session.expire_all()
    experiment = session.get(Experiment, experiment_id)
    assert experiment is not None and experiment.n_runs == 48
    assert experiment.adaptive is not None
    assert (experiment.adaptive["next_round"], experiment.adaptive["waiting"]) == (None, None)
    assert len(experiment.adaptive["looks"]) == 1


def test_a_look_that_fails_stops_its_own_experiment_and_no_other(backend_session: Session) -> None:
    """A look that raises (here: an adaptive record this version cannot read, written behind
    the API's back) stops that experiment's rule with the error, keeps its runs, and the other
    adaptive experiment's look is taken in the same pass."""
    session = backend_session
    poisoned = create_experiment(session=session, spec=adaptive_spec(), settings=SETTINGS).id
    healthy = create_experiment(session=session, spec=adaptive_spec(), settings=SETTINGS).id
    complete_queued(session)
    experiment = session.get(Experiment, poisoned)
    assert experiment is not None and experiment.adaptive is not None
    experiment.adaptive = {**experiment.adaptive, "looks": [{"look": "one"}]}
    session.add(experiment)
    session.commit()
    assert decide_due(session, settings=SETTINGS) == 1  # the healthy one's look
    session.expire_all()
    bad, good = session.get(Experiment, poisoned), session.get(Experiment, healthy)
    assert bad is not None and good is not None and bad.adaptive is not None
    assert not bad.deciding and bad.status == "completed" and bad.runs_completed == 8
    assert bad.adaptive["error"].startswith("ValidationError: ")
    assert bad.adaptive["stop_reason"].startswith("stopped at look 1 of 3: the look failed")
    assert good.deciding and good.n_runs == 16 and good.adaptive is not None
    assert len(good.adaptive["looks"]) == 1
    from service.experiments import experiment_detail

    detail = experiment_detail(session=session, experiment_id=poisoned)
    assert detail.message == bad.adaptive["stop_reason"]
    assert detail.adaptive is not None and detail.adaptive.error == bad.adaptive["error"]


def test_a_spec_stored_before_a_check_was_added_stays_readable() -> None:
    """alpha 5e-324 and num_cpus 1e-5 are refused at submission (422 naming the field), and a
    spec an older version stored with them is still read back (its experiment's page)."""
    rule = {"comparison": {"factor": "stop_gradient", "a": False, "b": True}, "alpha": 5e-324}
    spec = {
        "name": "x",
        "trainer": "collapse",
        "grid": {"stop_gradient": [False, True]},
        "adaptive": rule,
        "resources": {"num_cpus": 1e-5},
    }
    with pytest.raises(ValueError) as refused:
        ExperimentSpec.model_validate(spec)
    assert {e["loc"] for e in refused.value.errors()} == {  # type: ignore[attr-defined]
        ("adaptive", "alpha"),
        ("resources", "num_cpus"),
    }
    stored = ExperimentSpec.stored(spec)
    assert stored.adaptive is not None and stored.adaptive.alpha == 5e-324
    assert stored.resources.num_cpus == 1e-5
