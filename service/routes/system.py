"""/trainers, /healthz and /metrics."""

from __future__ import annotations

import ray
from fastapi import APIRouter, Request, Response
from sqlalchemy import text

from api_schemas import Health, TrainerInfo
from service.deps import SessionDep
from service.metrics import CONTENT_TYPE, exposition
from service.reports import report_names
from trainers import REGISTRY
from trainers.runtime import seedgrid_version

router = APIRouter(tags=["system"])


@router.get("/trainers", response_model=list[TrainerInfo])
def trainers() -> list[TrainerInfo]:
    return [
        TrainerInfo(
            name=t.name,
            description=t.description,
            paper=t.paper,
            config_schema=t.Config.model_json_schema(),
            metrics=list(t.metrics),
            diagnostics=list(t.diagnostics),
            primary_metric=t.primary_metric,
            reports=report_names(t),
            stop_checks=list(t.stop_checks),
        )
        for t in REGISTRY.values()
    ]


@router.get("/healthz", response_model=Health)
def healthz(request: Request, session: SessionDep) -> Health:
    try:
        session.exec(text("SELECT 1"))  # type: ignore[call-overload]
        database = "ok"
    except Exception as exc:  # reported, not raised: this endpoint describes failures
        database = f"error: {type(exc).__name__}"
    resources: dict[str, float] = {}
    if ray.is_initialized():
        ray_status = "ok"
        resources = {k: float(v) for k, v in ray.cluster_resources().items()
                     if k in {"CPU", "GPU", "memory", "object_store_memory"}}
    else:
        ray_status = "not connected"
    dispatcher = request.app.state.dispatcher
    if dispatcher is not None and not dispatcher.alive:
        ray_status = "dispatcher stopped"
    ok = database == "ok" and ray_status in {"ok", "not connected"}
    return Health(status="ok" if ok else "degraded", database=database, ray=ray_status,
                  cluster_resources=resources, version=seedgrid_version(),
                  dispatcher="absent" if dispatcher is None else dispatcher.state)


@router.get("/metrics", response_class=Response, responses={200: {
    "description": "Prometheus' text exposition format (version 0.0.4)",
    "content": {"text/plain": {"schema": {"type": "string"}}}}})
def metrics(request: Request, session: SessionDep) -> Response:
    dispatcher = request.app.state.dispatcher
    body = exposition(session, None if dispatcher is None else dispatcher.metrics,
                      None if dispatcher is None else len(dispatcher.in_flight))
    return Response(content=body, media_type=CONTENT_TYPE)
