"""The FastAPI app factories: engine, tables, routers, error handlers and the dispatcher."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.routes import compare, experiments, imports, planning, runs, system
from service.api.routes.reports import reports_router
from service.api.routes.ui import public_paths, ui_router
from service.api.security import (
    HeadAsGet,
    RequestGuard,
    capped_errors,
    declare_bearer_auth,
    is_loopback,
)
from service.errors import Conflict, NotFound, QueueFull, SpecError
from service.limits import Busy, HeavyPaths, HeavyReads, busy_response
from service.scheduling.dispatcher import Dispatcher
from service.scheduling.preflight import ClusterPreflight
from service.scheduling.purge import Purger
from service.settings import Settings, get_settings
from service.specs import with_key_hints
from service.storage.db import make_engine, upgrade_database
from trainers import REGISTRY
from trainers.runtime import seedgrid_version

log = logging.getLogger("seedgrid.api")

# How long an API request's statement waits for a database lock (or a pooled connection)
# before it is answered 503: a few seconds, where the dispatcher's writes wait 30 s (a write
# it retries later costs nobody; a client held half a minute, then answered 500, lost its
# cancel).
API_LOCK_WAIT_S = 5.0
# What a 503 for an unreachable or locked database asks the client to wait.
DATABASE_RETRY_AFTER_S = 5


# FastAPI's answer to a body that is JSON but that json.loads could not build.
UNPARSED_BODY = "There was an error parsing the body"


def unreadable_body(exc: Exception) -> dict[str, object]:
    """The 422 error of a JSON body that could not be built: an integer of more digits than
    Python converts (4,300), or nesting deeper than the parser recurses (it was an undocumented
    400 naming neither)."""
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        why = "the body is nested too deeply (lists or objects within each other)"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        why = "the body holds an integer of more than 4,300 digits"
    else:
        why = f"the body could not be read as JSON ({type(cause).__name__})"
    return {"type": "json_invalid", "loc": ["body"], "msg": why, "input": None}


def create_app(settings: Settings | None = None, *, dispatch: bool = True) -> FastAPI:
    """The API; with `dispatch`, the dispatcher runs in the same process (embedded mode)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upgrade_database(settings.database_url)
        # The API's sessions wait API_LOCK_WAIT_S for a lock; the dispatcher's, the default.
        engine = make_engine(settings.database_url, lock_wait_s=API_LOCK_WAIT_S)
        app.state.engine = engine
        app.state.settings = settings
        dispatcher_engine = make_engine(settings.database_url) if dispatch else None
        app.state.dispatcher = (
            Dispatcher(settings, dispatcher_engine) if dispatcher_engine is not None else None
        )
        app.state.preflight = ClusterPreflight(settings)
        if app.state.dispatcher is not None:
            app.state.dispatcher.start()  # the dispatcher's Ray connection serves the pre-flight
        else:
            app.state.preflight.join_cluster()
        app.state.purger = Purger(engine)  # deleted experiments' rows, in short batches
        app.state.purger.start()
        try:
            yield
        finally:
            if app.state.dispatcher is not None:
                app.state.dispatcher.stop()
            app.state.purger.stop()
            if dispatcher_engine is not None:
                dispatcher_engine.dispose()
            engine.dispose()

    app = FastAPI(
        title="seedgrid",
        version=seedgrid_version(),
        description="Condition x seed grids of training runs on Ray, with variance statistics.",
        lifespan=lifespan,
        # Served by service.api.routes.ui from local files, not FastAPI's CDN pages.
        docs_url=None,
        redoc_url=None,
        # An operation's id is its handler's name (submit_experiment, get_stats): what a
        # generated client names its functions, instead of FastAPI's path-and-method ids.
        generate_unique_id_function=lambda route: route.name,
    )
    app.include_router(imports.router)
    app.include_router(experiments.router)
    app.include_router(runs.router)
    app.include_router(system.router)
    app.include_router(planning.router)
    app.include_router(compare.router)
    app.include_router(reports_router(REGISTRY.values()))
    app.include_router(ui_router(app))

    # Open without the token: the health probe, the schema, and the docs and dashboard pages
    # (a browser cannot send the header when it loads them; they hold no data).
    public = {("GET", "/healthz"), ("HEAD", "/healthz")} | public_paths()
    if app.openapi_url:
        public.add(("GET", app.openapi_url))
    token = settings.api_token.get_secret_value()
    app.state.heavy_reads = HeavyReads(settings.max_heavy_reads)
    # Added last, so run first: a refused request takes no heavy-read slot.
    app.add_middleware(HeavyPaths, heavy=app.state.heavy_reads)
    app.add_middleware(
        RequestGuard,
        token=token,
        public=public,
        max_body_bytes=settings.max_request_body_bytes,
        loopback_only=is_loopback(settings.host),
    )
    # Outermost: a HEAD is checked and answered as the GET it stands for.
    app.add_middleware(HeadAsGet)
    if token:
        declare_bearer_auth(app, public)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        route = request.scope.get("route")
        body_field = getattr(route, "body_field", None)
        body = body_field.field_info.annotation if body_field is not None else None
        errors = with_key_hints(list(exc.errors()), body)
        return JSONResponse(status_code=422, content={"detail": capped_errors(errors)})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == UNPARSED_BODY:
            return JSONResponse(status_code=422, content={"detail": [unreadable_body(exc)]})
        return await http_exception_handler(request, exc)

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(
            status_code=422, content={"detail": capped_errors(exc.errors, exc.unlisted)}
        )

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(QueueFull)
    async def _queue_full(_: Request, exc: QueueFull) -> JSONResponse:
        return JSONResponse(
            status_code=429,
            content={"detail": str(exc)},
            headers={"Retry-After": str(QueueFull.RETRY_AFTER_S)},
        )

    @app.exception_handler(Busy)
    async def _busy(_: Request, exc: Busy) -> JSONResponse:
        return busy_response(exc)

    async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # Locked past API_LOCK_WAIT_S, unreachable, or out of pooled connections: the request's
        # transaction rolled back, and the client sends it again. The driver's words (a host, a
        # path) go to the log only.
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        log.warning(
            "%s %s: the database did not answer: %s",
            request.method,
            request.url.path,
            reason[0] if reason else type(exc).__name__,
        )
        return JSONResponse(
            status_code=503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
            content={
                "detail": f"the database is locked or unreachable (this request waited "
                f"up to {API_LOCK_WAIT_S:g} s for it): retry after "
                f"{DATABASE_RETRY_AFTER_S} s"
            },
        )

    for unavailable in (OperationalError, InterfaceError, PoolTimeout):
        app.add_exception_handler(unavailable, _database_unavailable)

    return app


def create_api_app() -> FastAPI:
    """The API without a dispatcher, settings from the environment: the factory uvicorn calls
    in each worker process of `seedgrid serve --no-dispatch --workers N`."""
    return create_app(get_settings(), dispatch=False)
