"""An experiment or a run by id, as every read and command finds it: a deleted experiment's rows
are not there any more, whatever the purger has removed yet."""

from __future__ import annotations

from sqlmodel import Session, select

from service.errors import (
    NotFound,
)
from service.storage.db import Experiment, Run


def get_experiment(*, session: Session, experiment_id: int) -> Experiment:
    """The experiment; NotFound when there is none or it was deleted (its rows may still be
    being removed: service.scheduling.purge)."""
    experiment = session.get(Experiment, experiment_id)
    if experiment is None or experiment.deleted:
        raise NotFound(f"experiment {experiment_id} not found")
    return experiment


def get_run(*, session: Session, run_id: int) -> Run:
    """The run; NotFound when there is none or its experiment was deleted."""
    run = session.get(Run, run_id)
    if (
        run is None
        or session.exec(
            select(Experiment.deleted).where(Experiment.id == run.experiment_id)
        ).first()
    ):
        raise NotFound(f"run {run_id} not found")
    return run
