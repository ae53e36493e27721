"""/trainers, /healthz and /metrics."""

from __future__ import annotations

import ray
from fastapi import APIRouter, Request, Response
from sqlalchemy import text

from api_schemas import (
    DatabaseState,
    DispatcherState,
    Health,
    HealthStatus,
    RayState,
    ServingDispatcher,
    TrainerInfo,
)
from service.analysis.reports import report_names
from service.api.deps import SessionDep
from service.api.security import carries_token
from service.scheduling.metrics import CONTENT_TYPE, exposition
from service.scheduling.serving import dispatch_overview
from trainers import REGISTRY
from trainers.runtime import seedgrid_version

router = APIRouter(tags=["system"])


@router.get(
    "/trainers",
    response_model=list[TrainerInfo],
    operation_id="list_trainers",
    summary="The trainers, their config fields, metrics and reports",
    description="Each trainer's config schema (every field with its default and "
    "meaning), its final metrics and diagnostics, the primary metric a "
    "spec's `metric` defaults to, its cross-run reports and the checks "
    "`stop_on_checks` can name.",
)
def list_trainers() -> list[TrainerInfo]:
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
            seeds_per_task_default=t.seeds_per_task_default,
            max_seeds_per_task=t.max_seeds_per_task,
            batched=t.batched,
        )
        for t in REGISTRY.values()
    ]


@router.get(
    "/healthz",
    response_model=Health,
    operation_id="get_health",
    summary="Database, Ray and dispatcher status",
    description="Open without the token (a probe cannot send one). `status` is "
    "`degraded` when the database does not answer or this process's "
    "dispatcher stopped or its latest pass failed (`dispatcher_error`); "
    "`cluster_resources` are Ray's CPU, GPU and memory totals when this "
    "process is connected to Ray; `dispatchers` lists the dispatchers of the database "
    "(in any process) with the trainers each dispatches, and "
    "`queued_without_dispatcher` the queued runs per trainer that none of them has loaded: "
    "both only to a request with the token where the service has one (else empty).",
)
def get_health(request: Request, session: SessionDep) -> Health:
    database_error: str | None = None
    try:
        session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    except Exception as exc:  # reported, not raised: this endpoint describes failures
        database_error = type(exc).__name__
    dispatcher = request.app.state.dispatcher
    dispatchers: list[ServingDispatcher] = []
    unserved: dict[str, int] = {}
    token = request.app.state.settings.api_token.get_secret_value().encode()
    # hosts, processes and trainer names are the token's to see: /healthz is open to probes
    trusted = not token or carries_token(request.headers, token)
    if database_error is None and trusted:
        try:
            dispatchers, unserved = dispatch_overview(
                request.app.state.settings.database_url, session, dispatcher
            )
        except Exception:  # the lists stay empty: /healthz answers whatever the tables hold
            session.rollback()
    resources: dict[str, float] = {}
    if ray.is_initialized():
        ray_state = RayState.ok
        resources = {
            k: float(v)
            for k, v in ray.cluster_resources().items()
            if k in {"CPU", "GPU", "memory", "object_store_memory"}
        }
    else:
        ray_state = RayState.not_connected
    if dispatcher is not None and not dispatcher.alive:
        ray_state = RayState.dispatcher_stopped
    failing = dispatcher is not None and dispatcher.failing
    ok = database_error is None and ray_state is not RayState.dispatcher_stopped and not failing
    return Health(
        status=HealthStatus.ok if ok else HealthStatus.degraded,
        database=DatabaseState.ok if database_error is None else DatabaseState.error,
        database_error=database_error,
        ray=ray_state,
        cluster_resources=resources,
        version=seedgrid_version(),
        dispatcher=(DispatcherState.absent if dispatcher is None else dispatcher.state),
        dispatcher_step_errors=0 if dispatcher is None else dispatcher.step_errors,
        dispatcher_error=dispatcher.last_step_error if failing else None,
        dispatchers=dispatchers,
        queued_without_dispatcher=unserved,
    )


@router.head("/healthz", include_in_schema=False)
def head_health() -> Response:
    """A liveness probe's HEAD: the service answers (GET says how its parts are)."""
    return Response(status_code=200)


@router.get(
    "/metrics",
    response_class=Response,
    operation_id="get_metrics",
    summary="Prometheus metrics",
    description="Runs by status, queue depth, runs in flight, dispatch latency, run "
    "durations by trainer and worker losses, in Prometheus' text format "
    "(version 0.0.4). Needs the token like the rest of the API.",
    responses={
        200: {
            "description": "Prometheus' text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
def get_metrics(request: Request, session: SessionDep) -> Response:
    dispatcher = request.app.state.dispatcher
    body = exposition(
        session,
        None if dispatcher is None else dispatcher.metrics,
        None if dispatcher is None else len(dispatcher.in_flight),
    )
    return Response(content=body, media_type=CONTENT_TYPE)
