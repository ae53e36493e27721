"""/experiments: submit, list (filtered), inspect, label, cancel, delete, runs, statistics, their
figures, the params table and export."""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from starlette.background import BackgroundTask

from api_schemas import (
    MAX_KEY_LENGTH,
    STORABLE_TEXT,
    AddSeeds,
    ExperimentCreated,
    ExperimentDetail,
    ExperimentLabels,
    ExperimentSpec,
    ExperimentStatus,
    ExperimentSummary,
    ExportFormat,
    ExportWhat,
    ParamsTable,
    RunCurves,
    RunOut,
    RunStatus,
    SeedsAdded,
    Stats,
)
from api_schemas.labels import MAX_TAGS
from api_schemas.pages import CURVE_POINTS, CURVE_RUNS, EXPERIMENTS_PAGE, RUNS_PAGE
from service import experiments as logic
from service.analysis import export, figures
from service.analysis.seed_warnings import submission_warnings
from service.analysis.stats import MAX_COMPARISONS_PER_PAGE
from service.analysis.stats_store import stats_json
from service.api.deps import (
    MAX_INT_COLUMN,
    ExperimentId,
    HeavyReadsDep,
    PreflightDep,
    SessionDep,
    SettingsDep,
)
from service.api.routes.errors import BODY_TOO_LARGE, HEAVY_READS, NO_EXPERIMENT, QUEUE_FULL, errors
from service.api.routes.paging import Offset, link_next
from service.scheduling.serving import waiting_note

OCTET_STREAM = "application/octet-stream"

# Runs per page of GET /experiments/{id}/runs.
MAX_RUNS_PAGE = RUNS_PAGE

router = APIRouter(prefix="/experiments", tags=["experiments"])


@router.post(
    "",
    status_code=201,
    response_model=ExperimentCreated,
    operation_id="submit_experiment",
    summary="Submit an experiment",
    description="Validates the spec (the trainer's config model checks `config` and "
    "every `grid` level), checks on a node of the cluster what would fail "
    "every run before it trains (the dataset's files, the device), "
    "expands the grid into conditions x seeds and queues one run per "
    "(condition, seed). Nothing is stored for a rejected spec; the 422 "
    "names the field.",
    responses=errors({413: BODY_TOO_LARGE, 429: QUEUE_FULL}),
)
def submit_experiment(
    spec: ExperimentSpec, session: SessionDep, settings: SettingsDep, preflight: PreflightDep
) -> ExperimentCreated:
    experiment = logic.create_experiment(
        session=session, spec=spec, settings=settings, preflight=preflight
    )
    assert experiment.id is not None
    return ExperimentCreated(
        id=experiment.id,
        name=experiment.name,
        status=ExperimentStatus(experiment.status),
        n_conditions=experiment.n_conditions,
        n_runs=experiment.n_runs,
        created_at=experiment.created_at,
        seed_warnings=submission_warnings(spec),
    )


@router.get(
    "",
    response_model=list[ExperimentSummary],
    operation_id="list_experiments",
    summary="List experiments, newest first",
    description="One page of experiments with their status and run counts; a "
    '`Link: rel="next"` header points at the next page while a page comes '
    "back full.",
)
def list_experiments(
    request: Request,
    response: Response,
    session: SessionDep,
    status: ExperimentStatus | None = None,
    name: Annotated[
        str | None,
        Query(
            max_length=MAX_KEY_LENGTH,
            pattern=STORABLE_TEXT,
            description="only experiments whose name contains this text (case-insensitive)",
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        Query(
            max_length=MAX_TAGS,
            description="only experiments with this tag; repeated, with every one of them",
        ),
    ] = None,
    trainer: Annotated[
        str | None,
        Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT, description="of this trainer"),
    ] = None,
    created_after: Annotated[
        datetime | None,
        Query(description="created at or after this ISO date or time (UTC unless it says)"),
    ] = None,
    created_before: Annotated[
        datetime | None,
        Query(description="created before this ISO date or time (UTC unless it says)"),
    ] = None,
    q: Annotated[
        str | None,
        Query(
            max_length=MAX_KEY_LENGTH,
            pattern=STORABLE_TEXT,
            description="only experiments with this text in their name, note, tags or "
            "trainer (case-insensitive)",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=EXPERIMENTS_PAGE)] = 50,
    offset: Offset = 0,
) -> list[ExperimentSummary]:
    only = logic.ExperimentFilter(
        status=status,
        name=name,
        tags=tuple(tag or ()),
        trainer=trainer,
        created_after=created_after,
        created_before=created_before,
        text=q,
    )
    page = logic.list_experiments(session=session, only=only, limit=limit, offset=offset)
    link_next(request, response, offset=offset, limit=limit, returned=len(page))
    return page


@router.get(
    "/{experiment_id}",
    response_model=ExperimentDetail,
    operation_id="get_experiment",
    summary="One experiment: status, run counts and spec",
    description="Its status, its runs per status, the spec as stored (seeds as given, "
    "config without the trainer's defaults) and, for an adaptive "
    "experiment, its looks.",
    responses=errors({404: NO_EXPERIMENT}),
)
def get_experiment(
    experiment_id: ExperimentId, request: Request, session: SessionDep, settings: SettingsDep
) -> ExperimentDetail:
    detail = logic.experiment_detail(session=session, experiment_id=experiment_id)
    if not detail.counts.queued:
        return detail
    note = waiting_note(
        settings.database_url, session, request.app.state.dispatcher, detail.trainer
    )
    return detail.model_copy(update={"waiting_for": note})


@router.patch(
    "/{experiment_id}",
    response_model=ExperimentDetail,
    operation_id="label_experiment",
    summary="Change an experiment's tags or note",
    description="The fields given replace the stored ones; the others stay as they are. "
    '`tags: []` removes every tag, `note: null` or `""` the note.',
    responses=errors({404: NO_EXPERIMENT, 413: BODY_TOO_LARGE}),
)
def label_experiment(
    experiment_id: ExperimentId, labels: ExperimentLabels, session: SessionDep
) -> ExperimentDetail:
    logic.label_experiment(session=session, experiment_id=experiment_id, labels=labels)
    return logic.experiment_detail(session=session, experiment_id=experiment_id)


@router.delete(
    "/{experiment_id}",
    status_code=204,
    response_class=Response,
    operation_id="delete_experiment",
    summary="Delete an ended experiment and everything it stored",
    responses=errors(
        {
            404: NO_EXPERIMENT,
            409: "A run of the experiment is queued, pending or running: cancel it first",
        }
    ),
)
def delete(experiment_id: ExperimentId, request: Request, session: SessionDep) -> Response:
    """Delete an ended experiment with its runs, attempts, metric points and statistics: gone
    from every read when the answer comes; its rows are removed in the background, in short
    batches that never hold up another experiment's writes (service.scheduling.purge)."""
    logic.delete_experiment(session=session, experiment_id=experiment_id)
    request.app.state.purger.wake()
    return Response(status_code=204)


@router.post(
    "/{experiment_id}/cancel",
    status_code=202,
    response_model=ExperimentDetail,
    operation_id="cancel_experiment",
    summary="Cancel a queued or running experiment",
    description="Queued runs become `cancelled` at once; pending and running ones are "
    "cancelled in Ray and end `cancelled` within about a second.",
    responses=errors({404: NO_EXPERIMENT, 409: "The experiment ended or was cancelled already"}),
)
def cancel_experiment(experiment_id: ExperimentId, session: SessionDep) -> ExperimentDetail:
    logic.cancel_experiment(session=session, experiment_id=experiment_id)
    return logic.experiment_detail(session=session, experiment_id=experiment_id)


@router.post(
    "/{experiment_id}/seeds",
    status_code=201,
    response_model=SeedsAdded,
    operation_id="add_seeds",
    summary="Add seeds to every condition",
    description="More seeds for every condition; their runs join the experiment's statistics.",
    responses=errors(
        {
            404: NO_EXPERIMENT,
            409: "The experiment was cancelled, is adaptive (its rule decides its seeds), or "
            "ran a trainer whose code this service has not loaded",
            413: BODY_TOO_LARGE,
            429: QUEUE_FULL,
        }
    ),
)
def add_seeds(
    experiment_id: ExperimentId, request: AddSeeds, session: SessionDep, settings: SettingsDep
) -> SeedsAdded:
    return logic.add_seeds(
        session=session, experiment_id=experiment_id, request=request, settings=settings
    )


@router.get(
    "/{experiment_id}/runs",
    response_model=list[RunOut],
    operation_id="list_runs",
    summary="One page of an experiment's runs",
    description="Each run's condition, seed, status, final metrics, diagnostics "
    "summary and warnings, in run order; `status` keeps one status.",
    responses=errors({404: NO_EXPERIMENT}),
)
def list_runs(
    experiment_id: ExperimentId,
    request: Request,
    response: Response,
    session: SessionDep,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_RUNS_PAGE)] = MAX_RUNS_PAGE,
    offset: Offset = 0,
) -> list[RunOut]:
    page = logic.list_runs(
        session=session, experiment_id=experiment_id, status=status, limit=limit, offset=offset
    )
    link_next(request, response, offset=offset, limit=limit, returned=len(page))
    return page


@router.get(
    "/{experiment_id}/stats",
    response_model=Stats,
    operation_id="get_stats",
    summary="Per-condition summaries and variance comparisons",
    description="Of `metric` (default: the spec's), over the completed runs: every "
    "condition's summary with its values, their runs and seeds, and one page "
    "of the comparisons (pooled over the other factors, and within each "
    "combination of them). Stored and served again until another run of "
    "the experiment completes.",
    responses=errors({404: NO_EXPERIMENT, 503: HEAVY_READS}),
)
def get_stats(
    experiment_id: ExperimentId,
    session: SessionDep,
    heavy: HeavyReadsDep,
    metric: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)] = None,
    factor: Annotated[
        str | None,
        Query(
            max_length=MAX_KEY_LENGTH,
            pattern=STORABLE_TEXT,
            description="only this factor's comparisons",
        ),
    ] = None,
    limit: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_COMPARISONS_PER_PAGE,
            description="comparisons in this page (default: all, if there are at most "
            f"{MAX_COMPARISONS_PER_PAGE})",
        ),
    ] = None,
    offset: Offset = 0,
    scale: Annotated[
        Literal["raw", "log"] | None,
        Query(
            description="raw: compare variances of the metric; log: of its logarithm (relative "
            "spreads, for a positive metric). Default: the spec's analysis.scale"
        ),
    ] = None,
    pooled: Annotated[
        bool,
        Query(
            description="only the pooled comparisons (each pair of levels over every level of "
            "the other factors: the headlines), counted and paged among themselves"
        ),
    ] = False,
) -> Response:
    experiment = logic.get_experiment(session=session, experiment_id=experiment_id)
    payload = stats_json(
        session=session,
        experiment=experiment,
        metric=metric,
        factor=factor,
        offset=offset,
        limit=limit,
        scale=scale,
        heavy=heavy,
        pooled=pooled,
    )
    # The stored JSON as it is: parsing it only to write it again would cost more than the rest
    return Response(content=payload, media_type="application/json")


@router.get(
    "/{experiment_id}/figure",
    response_class=Response,
    operation_id="get_figure",
    summary="A paper-ready figure of the statistics, as an SVG or PNG file",
    description="forest: each comparison's variance ratio with its primary 95% interval on a "
    "log axis and its Holm p (the pooled comparisons first, at most "
    f"{figures.MAX_FOREST_ROWS}); distribution: every completed seed's value per condition on "
    "the analysis scale; curves: the metric over training per condition, mean +- one sd across "
    f"seeds (at most {figures.MAX_CURVE_RUNS_PER_CONDITION} each). Drawn from what GET /stats "
    "serves (the same metric and scale), as `seedgrid figure` draws them.",
    responses={
        200: {
            "description": "The figure",
            # a file's bytes; application/octet-stream when the request accepts only that
            # (a generated client reads the body as bytes)
            "content": {
                media: {"schema": {"type": "string", "format": "binary"}}
                for media in [*figures.MEDIA_TYPES.values(), OCTET_STREAM]
            },
        },
        **errors({404: NO_EXPERIMENT, 503: HEAVY_READS}),
    },
)
def get_figure(
    experiment_id: ExperimentId,
    request: Request,
    session: SessionDep,
    heavy: HeavyReadsDep,
    name: Annotated[
        Literal["forest", "distribution", "curves"], Query(description="which figure")
    ] = "forest",
    format: Annotated[Literal["svg", "png"], Query(description="svg or png")] = "svg",
    metric: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)] = None,
    scale: Annotated[
        Literal["raw", "log"] | None,
        Query(description="raw or log; default: the spec's analysis.scale"),
    ] = None,
) -> Response:
    experiment = logic.get_experiment(session=session, experiment_id=experiment_id)
    payload = stats_json(
        session=session,
        experiment=experiment,
        metric=metric,
        factor=None,
        offset=0,
        limit=MAX_COMPARISONS_PER_PAGE,
        scale=scale,
        heavy=heavy,
    )
    stats = json.loads(payload)
    curve = None
    if name == "curves":
        if stats["metric"] not in logic.logged_curves(session=session, experiment=experiment):
            raise logic.SpecError.query(
                "name", f"the runs logged no points of {stats['metric']}: no curves to draw"
            )

        def fetch(metric_name: str, run_ids: list[int]) -> dict[int, figures.Points]:
            answer = json.loads(
                logic.run_curves(
                    session=session, experiment_id=experiment_id, name=metric_name, run_ids=run_ids
                )
            )
            return {int(k): v for k, v in answer["curves"].items()}

        curve = (stats["metric"], figures.fetch_curves(stats, stats["metric"], fetch))
    body = figures.render(name, stats, format, curve)
    filename = figures.filename(experiment_id, name, format)
    accepted = request.headers.get("accept", "")
    media_type = figures.MEDIA_TYPES[format]
    if OCTET_STREAM in accepted and media_type not in accepted and "image/" not in accepted:
        media_type = OCTET_STREAM
    return Response(
        content=body,
        media_type=media_type,
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.get(
    "/{experiment_id}/curves",
    response_model=RunCurves,
    operation_id="get_curves",
    summary="One metric's curves of several runs in one answer",
    description=f"The points of metric `name` of each run given (`run`, repeated: at most "
    f"{CURVE_RUNS} runs of this experiment), each in step order and cut at {CURVE_POINTS:,} "
    "points (`truncated` lists the runs cut): the dashboard's curves of a running experiment "
    "in one request per refresh rather than one per run.",
    responses=errors({404: NO_EXPERIMENT}),
)
def get_curves(
    experiment_id: ExperimentId,
    session: SessionDep,
    name: Annotated[str, Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)],
    run: Annotated[list[int], Query(description="a run of the experiment")],
) -> Response:
    logic.get_experiment(session=session, experiment_id=experiment_id)
    if not 1 <= len(set(run)) <= CURVE_RUNS:
        raise logic.SpecError.query(
            "run", f"give 1 to {CURVE_RUNS} runs (run=ID, repeated); {len(set(run))} given"
        )
    if not all(1 <= run_id <= MAX_INT_COLUMN for run_id in run):
        raise logic.SpecError.query("run", f"a run id is 1 to {MAX_INT_COLUMN}")
    payload = logic.run_curves(session=session, experiment_id=experiment_id, name=name, run_ids=run)
    return Response(content=payload, media_type="application/json")


@router.get(
    "/{experiment_id}/params",
    response_model=ParamsTable,
    operation_id="get_params",
    summary="Every condition's config side by side, with its summary",
    description="Each condition of the grid with the config its runs train with (the "
    "trainer's defaults filled in) and its n, mean and std of `metric` (default: the spec's) "
    "over its completed runs, as /stats serves them; `fields` lists the config fields, "
    "those that differ between conditions (`varying`) first.",
    responses=errors({404: NO_EXPERIMENT, 503: HEAVY_READS}),
)
def get_params(
    experiment_id: ExperimentId,
    session: SessionDep,
    heavy: HeavyReadsDep,
    metric: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)] = None,
) -> ParamsTable:
    experiment = logic.get_experiment(session=session, experiment_id=experiment_id)
    return logic.params_table(session=session, experiment=experiment, metric=metric, heavy=heavy)


@router.get(
    "/{experiment_id}/export",
    response_class=Response,
    operation_id="export_experiment",
    summary="An experiment's runs or metric curves as a CSV or Parquet file",
    responses={
        200: {
            "description": "The file (CSV or Parquet)",
            "content": {"text/csv": {}, "application/vnd.apache.parquet": {}},
        },
        **errors({404: NO_EXPERIMENT, 503: HEAVY_READS}),
    },
)
def export_file(
    experiment_id: ExperimentId,
    request: Request,
    format: Annotated[ExportFormat, Query(description="csv or parquet")] = ExportFormat.csv,
    what: Annotated[
        ExportWhat,
        Query(
            description="runs: a row per run (condition, seed, status, final metrics); curves: a "
            "row per logged metric point"
        ),
    ] = ExportWhat.runs,
) -> Response:
    """An experiment's runs or metric curves as one file, read a page at a time from one
    snapshot (service.analysis.export)."""
    table = export.export_table(request.app.state.engine, experiment_id, what)
    filename = export.filename(experiment_id, what, format)
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if format == ExportFormat.csv:
        return StreamingResponse(
            export.csv_chunks(table), headers=headers, media_type=export.MEDIA_TYPES[format]
        )
    try:
        path = export.parquet_file(table)
    except export.ExportTypeError as exc:
        raise logic.SpecError.query("format", str(exc)) from None
    return FileResponse(
        path,
        headers=headers,
        media_type=export.MEDIA_TYPES[format],
        background=BackgroundTask(os.unlink, path),
    )
