"""/runs: one run with its provenance, and its metric curves."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import select

from api_schemas import MAX_KEY_LENGTH, STORABLE_TEXT, MetricPoint, RunDetail
from service import experiments as logic
from service.db import MetricPoint as MetricRow
from service.deps import MAX_DB_INT, RunId, SessionDep

router = APIRouter(prefix="/runs", tags=["runs"])


@router.get("/{run_id}", response_model=RunDetail)
def detail(run_id: RunId, session: SessionDep) -> RunDetail:
    return logic.run_detail(session=session, run_id=run_id)


@router.get("/{run_id}/metrics", response_model=list[MetricPoint])
def metrics(
    run_id: RunId,
    session: SessionDep,
    name: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)] = None,
    since_step: Annotated[int | None, Query(ge=0, le=MAX_DB_INT)] = None,
    limit: Annotated[int, Query(ge=1, le=1_000_000)] = 100_000,
) -> list[MetricPoint]:
    logic.run_detail(session=session, run_id=run_id)
    query = select(MetricRow).where(MetricRow.run_id == run_id)
    if name is not None:
        query = query.where(MetricRow.name == name)
    if since_step is not None:
        query = query.where(MetricRow.step >= since_step)
    rows = session.exec(query.order_by(MetricRow.step, MetricRow.id).limit(limit)).all()  # type: ignore[arg-type]
    return [MetricPoint(step=r.step, epoch=r.epoch, name=r.name, value=r.value) for r in rows]
