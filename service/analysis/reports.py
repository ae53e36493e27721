"""An experiment's cross-run reports (trainers.reports): the report its trainer declares under
a name, built from the experiment's stored runs, which the service hands over as plain records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel
from sqlmodel import Session, col, select

from api_schemas import IMPORTED_TRAINER, RunStatus
from service.errors import NotFound
from service.specs import merged_config, stats_grid
from service.storage.db import Experiment, Run
from service.storage.lookup import get_experiment
from trainers import REGISTRY, Trainer
from trainers.reports import CrossRunReport, ExperimentRecord, RunRecord


def experiment_report(*, session: Session, experiment_id: int, name: str) -> BaseModel:
    """The report `name` of the experiment, as its trainer's declared report builds it from
    the experiment and all its runs (in id order)."""
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    report = declared_report(experiment, name)
    runs = session.exec(
        select(Run).where(col(Run.experiment_id) == experiment_id).order_by(col(Run.id))
    ).all()
    record = experiment_record(experiment)
    return report.build(record, [run_record(r, base_config=record.config) for r in runs])


def declared_report(experiment: Experiment, name: str) -> CrossRunReport[Any]:
    """The report `name` that the experiment's trainer declares; NotFound naming the trainer's
    reports, and the trainers that have one so named, when it declares none."""
    trainer = REGISTRY.get(experiment.trainer)
    reports = {r.name: r for r in trainer.reports} if trainer is not None else {}
    if name in reports:
        return reports[name]
    owners = [t.name for t in REGISTRY.values() if name in report_names(t)]
    where = (
        f"; {name!r} is a report of {'trainer' if len(owners) == 1 else 'trainers'} "
        f"{', '.join(map(repr, owners))}"
        if owners
        else f"; no trainer has a {name!r} report"
    )
    if experiment.trainer == IMPORTED_TRAINER:
        raise NotFound(
            f"experiment {experiment.id} holds imported results, which have no reports{where}"
        )
    if trainer is None:
        raise NotFound(
            f"experiment {experiment.id} ran trainer {experiment.trainer!r}, which "
            f"this seedgrid does not have{where}"
        )
    raise NotFound(
        f"experiment {experiment.id} ran trainer {trainer.name!r}, which has no "
        f"{name!r} report (its reports: {', '.join(reports) or 'none'}){where}"
    )


def report_names(trainer: Trainer) -> list[str]:
    return [r.name for r in trainer.reports]


def reports_by_name(trainers: Iterable[Trainer]) -> dict[str, list[CrossRunReport[Any]]]:
    """Every report the trainers declare, grouped by name (trainers may share a name)."""
    grouped: dict[str, list[CrossRunReport[Any]]] = {}
    for trainer in trainers:
        for report in trainer.reports:
            grouped.setdefault(report.name, []).append(report)
    return grouped


def experiment_record(experiment: Experiment) -> ExperimentRecord:
    assert experiment.id is not None
    spec = experiment.stored_spec
    return ExperimentRecord(
        id=experiment.id,
        name=experiment.name,
        trainer=experiment.trainer,
        config=spec.config,
        grid=stats_grid(spec),
    )


def run_record(run: Run, *, base_config: Mapping[str, Any]) -> RunRecord:
    """The run as a report sees it; its config is the experiment's base config with the
    run's condition (a run row does not repeat the base)."""
    assert run.id is not None
    return RunRecord(
        id=run.id,
        condition=run.condition,
        condition_key=run.condition_key,
        seed=run.seed,
        status=RunStatus(run.status),
        config=merged_config(base_config, run.condition),
        metrics=run.metrics,
        diagnostics=run.diagnostics,
    )
