"""/runs: one run with its provenance, and its metric curves (paged)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import select
from sqlmodel import col

from api_schemas import MAX_KEY_LENGTH, STORABLE_TEXT, MetricPoint, RunDetail
from api_schemas.pages import POINTS_PAGE
from service import experiments as logic
from service.api.deps import MAX_INT_COLUMN, RunId, SessionDep
from service.api.routes.errors import errors
from service.api.routes.paging import Offset, link_next
from service.storage.db import RunMetric as MetricRow

router = APIRouter(prefix="/runs", tags=["runs"])

NO_RUN = "No run with this id"
# Metric points per page of GET /runs/{id}/metrics.
MAX_POINTS_PAGE = POINTS_PAGE


@router.get(
    "/{run_id}",
    response_model=RunDetail,
    operation_id="get_run",
    summary="One run with its config, provenance and attempts",
    description="The run as in an experiment's runs, plus the config it ran with, its "
    "provenance (seedgrid and torch versions, device, Ray node) and the "
    "history of its attempts.",
    responses=errors({404: NO_RUN}),
)
def get_run(run_id: RunId, session: SessionDep) -> RunDetail:
    return logic.run_detail(session=session, run_id=run_id)


@router.get(
    "/{run_id}/metrics",
    response_model=list[MetricPoint],
    operation_id="get_run_metrics",
    summary="One page of a run's metric curves",
    responses=errors({404: NO_RUN}),
)
def get_run_metrics(
    run_id: RunId,
    request: Request,
    session: SessionDep,
    name: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)] = None,
    since_step: Annotated[int | None, Query(ge=0, le=MAX_INT_COLUMN)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_POINTS_PAGE)] = MAX_POINTS_PAGE,
    offset: Offset = 0,
) -> Response:
    """One page of a run's points in step order (then in the order they were stored);
    `name` keeps one metric, `since_step` the points from that step on."""
    logic.get_run(session=session, run_id=run_id)
    query = select(
        col(MetricRow.step), col(MetricRow.epoch), col(MetricRow.name), col(MetricRow.value)
    ).where(col(MetricRow.run_id) == run_id)
    if name is not None:
        query = query.where(col(MetricRow.name) == name)
    if since_step is not None:
        query = query.where(col(MetricRow.step) >= since_step)
    rows = session.execute(
        query.order_by(col(MetricRow.step), col(MetricRow.id)).offset(offset).limit(limit)
    ).all()
    # Plain rows to JSON: building a model object per point cost most of the time of a page.
    body = json.dumps(
        [{"step": s, "epoch": e, "name": n, "value": v} for s, e, n, v in rows], allow_nan=False
    )
    response = Response(content=body, media_type="application/json")
    link_next(request, response, offset=offset, limit=limit, returned=len(rows))
    return response
