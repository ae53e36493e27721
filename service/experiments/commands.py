"""What changes an experiment: submit, add seeds, cancel, delete. Each is one transaction
through the runs store (service.scheduling.run_store)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlmodel import Session, select

from api_schemas import (
    IMPORTED_TRAINER,
    MAX_SEED,
    AdaptiveState,
    AddSeeds,
    ExperimentLabels,
    ExperimentSpec,
    ExperimentStatus,
    SeedsAdded,
)
from api_schemas.labels import MAX_TAGS
from service.errors import (
    Conflict,
    NotFound,
    SpecError,
    body_error,
)
from service.experiments.validation import validate_spec
from service.scheduling import wakeups
from service.scheduling.admission import count_queue, recount_queue
from service.scheduling.run_store import RunStore, experiment_counts
from service.settings import Settings
from service.specs import (
    catalogue_record,
    grid_conditions,
    run_defaults,
    seed_runs,
    stats_grid,
)
from service.storage.db import Experiment, Run
from service.storage.lookup import get_experiment
from trainers import REGISTRY

# The spec's fields stored in the experiment's own columns rather than in its stored spec.
LABELS = {"tags", "note"}

if TYPE_CHECKING:
    from service.scheduling.preflight import ClusterPreflight


def create_experiment(
    *,
    session: Session,
    spec: ExperimentSpec,
    settings: Settings,
    preflight: ClusterPreflight | None = None,
) -> Experiment:
    """Validate, check on the cluster (`preflight`: what would fail every run before it
    trains), expand into condition x seed runs and store everything in one transaction.
    The spec's config is stored once, with the experiment; a run stores its condition."""
    trainer, conditions = validate_spec(spec, settings=settings)
    if preflight is not None and (errors := preflight.check(trainer, spec, conditions)):
        raise SpecError(errors)
    seeds = spec.seed_list()
    n_runs = len(conditions) * len(seeds)
    store = RunStore(session)
    queued = count_queue(session, store, n_runs, settings)
    experiment = Experiment(
        name=spec.name,
        trainer=trainer.name,
        # the tags and note live in their own columns, which PATCH changes: not twice
        spec=spec.model_dump(mode="json", exclude=LABELS),
        tags=spec.tags,
        note=spec.note or None,
        metric=spec.metric or trainer.primary_metric,
        # read when the trainer's code is not loaded: stored results stay readable
        catalogue=catalogue_record(trainer),
        curve_names=[],  # none logged yet: kept as its points are stored
        priority=spec.priority,
        n_conditions=len(conditions),
        n_runs=n_runs,
        runs_queued=n_runs,
    )
    if spec.adaptive is not None:
        experiment.adaptive = AdaptiveState.start(spec.adaptive).model_dump(mode="json")
        experiment.deciding = True
    session.add(experiment)
    session.flush()
    store.create_runs(experiment, seed_runs(conditions, seeds), run_defaults(spec))
    recount_queue(session, store, queued, n_runs, settings)
    session.commit()
    wakeups.work_changed()
    session.refresh(experiment)
    return experiment


def label_experiment(
    *, session: Session, experiment_id: int, labels: ExperimentLabels
) -> Experiment:
    """Replace the tags and the note of an experiment with those `labels` gives (a field left
    out stays as it is; an empty note removes it), or add and remove tags on those stored."""
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    if "tags" in labels.model_fields_set:
        experiment.tags = list(labels.tags or [])
    if labels.add_tags or labels.remove_tags:
        # Held until the commit: a concurrent edit reads the tags this one writes (six
        # concurrent `seedgrid tag` left five tags when each read, added and wrote them all).
        RunStore(session).lock_experiments([experiment_id])
        session.refresh(experiment)
        if experiment.deleted:
            raise NotFound(f"experiment {experiment_id} not found")
        removed = set(labels.remove_tags or ())
        kept = [tag for tag in experiment.tags if tag not in removed]
        merged = kept + [tag for tag in labels.add_tags or () if tag not in kept]
        if len(merged) > MAX_TAGS:
            raise SpecError(
                [
                    body_error(
                        ["add_tags"],
                        f"the experiment would have {len(merged)} tags, over the {MAX_TAGS} "
                        "it may have",
                    )
                ]
            )
        experiment.tags = merged
    if "note" in labels.model_fields_set:
        experiment.note = labels.note or None
    session.add(experiment)
    session.commit()
    session.refresh(experiment)
    return experiment


def add_seeds(
    *, session: Session, experiment_id: int, request: AddSeeds, settings: Settings
) -> SeedsAdded:
    """More seeds for every condition of an experiment, queued now; their runs join its
    statistics as they complete. An ended experiment runs again; a cancelled one is a
    Conflict, and so is an adaptive one, stopped or not: its rule decides its seeds, and seeds
    added after its stop would be a look the rule did not count (its alpha would not hold)."""
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    store = RunStore(session)
    # Held until the commit: a concurrent add-seeds reads the seeds this one adds.
    store.lock_experiments([experiment_id])
    session.refresh(experiment)
    if experiment.deleted:
        raise NotFound(f"experiment {experiment_id} not found")
    if experiment.cancel_requested or experiment.status == ExperimentStatus.cancelled:
        raise Conflict(f"experiment {experiment_id} was cancelled: submit a new one")
    if experiment.adaptive is not None:
        raise Conflict(
            f"experiment {experiment_id} is adaptive: its rule decides its seeds "
            "(experiment.adaptive), and seeds added by hand, even after it stopped, "
            "would be a look the rule did not count, so its false-stop rate would "
            "no longer be its alpha; submit a new experiment for more seeds"
        )
    if experiment.trainer != IMPORTED_TRAINER and experiment.trainer not in REGISTRY:
        raise Conflict(
            f"experiment {experiment_id} ran trainer {experiment.trainer!r}, whose code this "
            "service has not loaded, so no run of it can be queued here; its stored results "
            f"stay readable. To add seeds, start the service with the trainer's file: "
            f"`seedgrid serve --trainers FILE`"
        )
    if experiment.trainer == IMPORTED_TRAINER:
        raise Conflict(
            f"experiment {experiment_id} holds imported results (trainer "
            f"{IMPORTED_TRAINER!r}): no trainer here can run its seeds; add runs to it with "
            f"POST /experiments/{experiment_id}/import"
        )
    have = set(
        session.exec(select(Run.seed).where(Run.experiment_id == experiment_id).distinct()).all()
    )
    if isinstance(request.seeds, int):
        start = max(have, default=-1) + 1
        seeds = list(range(start, start + request.seeds))
        if seeds[-1] > MAX_SEED:
            raise SpecError(
                [
                    body_error(
                        ["seeds"],
                        f"the next {request.seeds} seeds after "
                        f"{start - 1} pass the largest seed, {MAX_SEED}",
                    )
                ]
            )
    else:
        seeds = list(request.seeds)
        repeated = sorted(have.intersection(seeds))
        if repeated:
            raise SpecError(
                [
                    body_error(
                        ["seeds"], f"experiment {experiment_id} has seeds {repeated[:10]} already"
                    )
                ]
            )
    spec = experiment.stored_spec
    conditions = grid_conditions(stats_grid(spec))
    adding = len(conditions) * len(seeds)
    if experiment.n_runs + adding > settings.max_runs_per_experiment:
        raise SpecError(
            [
                body_error(
                    ["seeds"],
                    f"{experiment.n_runs} runs + {len(conditions)} "
                    f"conditions x {len(seeds)} seeds = {experiment.n_runs + adding} "
                    f"runs, over the limit of {settings.max_runs_per_experiment} "
                    "(SEEDGRID_MAX_RUNS_PER_EXPERIMENT)",
                )
            ]
        )
    queued = count_queue(session, store, adding, settings)
    store.add_runs(experiment, seed_runs(conditions, seeds), run_defaults(spec))
    recount_queue(session, store, queued, adding, settings)
    store.commit()
    wakeups.work_changed()
    session.refresh(experiment)
    return SeedsAdded(
        experiment_id=experiment_id, seeds=seeds, runs_added=adding, n_runs=experiment.n_runs
    )


def cancel_experiment(*, session: Session, experiment_id: int) -> Experiment:
    """Queued runs become cancelled now; pending and running ones are flagged for the
    dispatcher to cancel.

    One rule: only an experiment that is queued or running can be cancelled. One that ended
    (completed, partial, failed) or was cancelled already is a Conflict (409), so a client can tell
    whether its request changed anything.
    """
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    store = RunStore(session)
    # Checked under the experiment's lock, held until the commit: two cancels at once both
    # read "not cancelled" before either wrote, and both got 202 (8 of 15 rounds on PostgreSQL).
    store.lock_experiments([experiment_id])
    session.refresh(experiment)
    if experiment.deleted:
        raise NotFound(f"experiment {experiment_id} not found")
    if experiment.cancel_requested or experiment.status in (
        ExperimentStatus.cancelled,
        ExperimentStatus.cancelling,
    ):
        raise Conflict(f"experiment {experiment_id} was cancelled already")
    if experiment.status in ExperimentStatus.ended():
        raise Conflict(f"experiment {experiment_id} has already ended ({experiment.status})")
    store.cancel_experiment(experiment)
    store.commit()
    wakeups.work_changed()
    session.refresh(experiment)
    return experiment


def delete_experiment(*, session: Session, experiment_id: int) -> None:
    """Delete an ended experiment with its runs, attempts, metric points and statistics: it is
    marked deleted, gone for every read from this commit on, and its rows are removed in short
    batches afterwards (service.scheduling.purge: the caller wakes the purger). One with a run
    queued,
    pending or running is a Conflict (409): its dispatcher would write rows for runs that no
    longer exist; cancel it first."""
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    store = RunStore(session)
    store.lock_experiments([experiment_id])
    session.refresh(experiment)
    if experiment.deleted:  # another request deleted it meanwhile
        raise NotFound(f"experiment {experiment_id} not found")
    active = experiment_counts(experiment).active
    if active or experiment.status in ExperimentStatus.active():
        raise Conflict(
            f"experiment {experiment_id} is {experiment.status} ({active} runs queued, "
            f"pending or running): cancel it (POST /experiments/{experiment_id}/cancel) "
            "and delete it once its runs have ended"
        )
    store.mark_deleted(experiment_id)
    store.commit()
