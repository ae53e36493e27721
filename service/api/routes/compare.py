"""/compare: two experiments of one trainer side by side, condition by condition."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response

from api_schemas import MAX_KEY_LENGTH, STORABLE_TEXT, ExperimentComparison
from service.analysis import compare as logic
from service.analysis.compare import MAX_CONDITIONS_PER_PAGE
from service.api.deps import MAX_INT_COLUMN, HeavyReadsDep, SessionDep
from service.api.routes.errors import HEAVY_READS, errors
from service.api.routes.paging import Offset

router = APIRouter(tags=["experiments"])

IdQuery = Annotated[int, Query(ge=1, le=MAX_INT_COLUMN, description="an experiment id")]


@router.get(
    "/compare",
    response_model=ExperimentComparison,
    operation_id="compare_experiments",
    summary="Two experiments of one trainer, condition by condition",
    description="The conditions experiments `a` and `b` both completed runs of, side by "
    "side, each pair tested as in /stats (the factor is `experiment`); the "
    "conditions only one of them ran are listed by key. Stored and served "
    "again until another run of either experiment completes.",
    responses=errors({404: "No experiment with one of these ids", 503: HEAVY_READS}),
)
def compare_experiments(
    a: IdQuery,
    b: IdQuery,
    session: SessionDep,
    heavy: HeavyReadsDep,
    metric: Annotated[str | None, Query(max_length=MAX_KEY_LENGTH, pattern=STORABLE_TEXT)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_CONDITIONS_PER_PAGE)] = 50,
    offset: Offset = 0,
    scale: Annotated[
        Literal["raw", "log"] | None,
        Query(
            description="raw: test the metric's variances and means; log: its logarithm's "
            "(relative spreads, for a positive metric). Default: the experiments' "
            "analysis.scale when both specs name the same one, else raw"
        ),
    ] = None,
) -> Response:
    payload = logic.compare_json(
        session=session,
        a_id=a,
        b_id=b,
        metric=metric,
        offset=offset,
        limit=limit,
        heavy=heavy,
        scale=scale,
    )
    # the stored JSON as it is, like /stats
    return Response(content=payload, media_type="application/json")
