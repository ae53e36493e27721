"""/experiments/{id}/protocol: the feedback-alignment audit of every run (D1, D2, D3, verdict)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlmodel import select

from api_schemas import ProtocolReport
from service import experiments as logic
from service.db import Run
from service.deps import ExperimentId, SessionDep
from service.protocol import protocol_report
from trainers import REGISTRY

router = APIRouter(prefix="/experiments", tags=["protocol"])


@router.get("/{experiment_id}/protocol", response_model=ProtocolReport)
def protocol(experiment_id: ExperimentId, session: SessionDep) -> ProtocolReport:
    experiment = logic.get_experiment(session=session, experiment_id=experiment_id)
    trainer = REGISTRY[experiment.trainer]
    if "protocol" not in trainer.diagnostics:
        raise logic.NotFound(
            f"experiment {experiment_id} ran trainer {trainer.name!r}, which has no audit "
            "protocol (the protocol report is for trainers that store 'protocol' diagnostics, "
            "such as 'feedback')")
    runs = session.exec(
        select(Run).where(Run.experiment_id == experiment_id).order_by(Run.id)  # type: ignore[arg-type]
    ).all()
    return protocol_report(experiment=experiment, runs=runs,
                           baseline_ignores=getattr(trainer, "baseline_ignores", ()))
