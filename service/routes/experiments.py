"""/experiments: submit, list, inspect, cancel, runs and statistics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import select

from api_schemas import (
    MAX_KEY_LENGTH,
    ExperimentCreated,
    ExperimentDetail,
    ExperimentSpec,
    ExperimentStatus,
    ExperimentSummary,
    RunOut,
    RunStatus,
    Stats,
)
from service import experiments as logic
from service.db import Run
from service.deps import MAX_DB_INT, ExperimentId, SessionDep, SettingsDep
from service.stats import experiment_stats
from trainers import REGISTRY

router = APIRouter(prefix="/experiments", tags=["experiments"])


@router.post("", status_code=201, response_model=ExperimentCreated)
def submit(spec: ExperimentSpec, session: SessionDep, settings: SettingsDep) -> ExperimentCreated:
    experiment = logic.create_experiment(
        session=session, spec=spec, max_runs=settings.max_runs_per_experiment
    )
    assert experiment.id is not None
    return ExperimentCreated(
        id=experiment.id,
        name=experiment.name,
        status=ExperimentStatus(experiment.status),
        n_conditions=experiment.n_conditions,
        n_runs=experiment.n_runs,
        created_at=experiment.created_at,
    )


@router.get("", response_model=list[ExperimentSummary])
def list_all(
    session: SessionDep,
    status: ExperimentStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_DB_INT)] = 0,
) -> list[ExperimentSummary]:
    return logic.list_experiments(session=session, status=status, limit=limit, offset=offset)


@router.get("/{experiment_id}", response_model=ExperimentDetail)
def detail(experiment_id: ExperimentId, session: SessionDep) -> ExperimentDetail:
    return logic.experiment_detail(session=session, experiment_id=experiment_id)


@router.post("/{experiment_id}/cancel", status_code=202, response_model=ExperimentDetail)
def cancel(experiment_id: ExperimentId, session: SessionDep) -> ExperimentDetail:
    logic.cancel_experiment(session=session, experiment_id=experiment_id)
    return logic.experiment_detail(session=session, experiment_id=experiment_id)


@router.get("/{experiment_id}/runs", response_model=list[RunOut])
def runs(experiment_id: ExperimentId, session: SessionDep) -> list[RunOut]:
    return logic.list_runs(session=session, experiment_id=experiment_id)


@router.get("/{experiment_id}/stats", response_model=Stats)
def stats(
    experiment_id: ExperimentId,
    session: SessionDep,
    metric: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH)] = None,
) -> Stats:
    experiment = logic.get_experiment(session=session, experiment_id=experiment_id)
    metric = metric or experiment.metric
    trainer = REGISTRY[experiment.trainer]
    if metric not in {*trainer.metrics, *trainer.diagnostics}:
        raise logic.SpecError([{
            "loc": ["query", "metric"],
            "msg": f"unknown metric {metric!r} of trainer {trainer.name!r}",
            "type": "value_error",
        }])
    completed = session.exec(
        select(Run).where(Run.experiment_id == experiment_id,
                          Run.status == RunStatus.completed.value)
        .order_by(Run.id)  # type: ignore[arg-type]
    ).all()
    values = [(r.condition, r.condition_key, float(r.metrics[metric])) for r in completed
              if isinstance(r.metrics.get(metric), int | float)]
    return experiment_stats(metric=metric, grid=experiment.spec["grid"], runs=values)
