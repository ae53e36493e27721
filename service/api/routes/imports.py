"""/experiments/import: per-seed results from elsewhere stored as an ended experiment, and more
of them added to it (service.experiments.importing)."""

from __future__ import annotations

from fastapi import APIRouter

from api_schemas import ExperimentImport, ExperimentImported
from service import experiments as logic
from service.api.deps import ExperimentId, SessionDep, SettingsDep
from service.api.routes.errors import BODY_TOO_LARGE, NO_EXPERIMENT, errors

router = APIRouter(prefix="/experiments", tags=["experiments"])

FORMS = (
    "`runs` (JSON: each run's condition, seed and final metrics) or `csv` (the text of a run "
    "table, one row per run: a seed column, factor columns, metric columns; W&B's `config.*` / "
    "`summary.*` and MLflow's `params.*` / `metrics.*` exports are recognised, their other "
    "columns ignored)"
)
REFUSED = (
    "Every row is checked before anything is stored: a missing seed column, a repeated "
    "(condition, seed), a metric that is not a finite number, too many rows or a CSV that "
    "cannot be read is a 422 naming the row and column, and stores nothing."
)


@router.post(
    "/import",
    status_code=201,
    response_model=ExperimentImported,
    operation_id="import_experiment",
    summary="Import per-seed results as an ended experiment",
    description=f"Stores {FORMS} as an experiment of trainer `imported` whose runs are "
    "`completed`: /stats, /compare, the dashboard and export read it like a launched one. "
    "Factors with one value in every row become its config, the others its grid; the primary "
    f"metric is `metric`, else the first metric column. {REFUSED}",
    responses=errors({413: BODY_TOO_LARGE}),
)
def import_experiment(
    request: ExperimentImport, session: SessionDep, settings: SettingsDep
) -> ExperimentImported:
    return logic.import_results(session=session, request=request, settings=settings)


@router.post(
    "/{experiment_id}/import",
    status_code=201,
    response_model=ExperimentImported,
    operation_id="import_more",
    summary="Add imported runs to an imported experiment",
    description=f"Adds {FORMS} to an experiment an import created: the same factors and "
    "metrics, levels of its grid, (condition, seed) pairs it does not hold yet. "
    f"{REFUSED}",
    responses=errors(
        {404: NO_EXPERIMENT, 409: "The experiment was not imported", 413: BODY_TOO_LARGE}
    ),
)
def import_more(
    experiment_id: ExperimentId,
    request: ExperimentImport,
    session: SessionDep,
    settings: SettingsDep,
) -> ExperimentImported:
    return logic.import_results(
        session=session, request=request, settings=settings, experiment_id=experiment_id
    )
