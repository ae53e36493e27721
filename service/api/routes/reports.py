"""/experiments/{id}/reports/{name}: the cross-run reports the registered trainers declare
(trainers.reports), one route per report name, typed by the report's response model."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from functools import reduce
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel

from service.analysis.reports import experiment_report, reports_by_name
from service.api.deps import ExperimentId, SessionDep
from service.api.routes.errors import errors
from trainers import Trainer
from trainers.reports import REPORT_NAME, CrossRunReport

# The protocol report's address before trainers declared reports; clients still use it.
EARLIER_ADDRESSES = {"protocol": "/{experiment_id}/protocol"}

ReportName = Annotated[str, Path(pattern=REPORT_NAME.pattern)]


def reports_router(trainers: Iterable[Trainer]) -> APIRouter:
    """A route for every report name the trainers declare, then one that answers any other
    name with a 404 naming the experiment's reports."""
    router = APIRouter(prefix="/experiments", tags=["reports"])
    for name, reports in reports_by_name(trainers).items():
        _add_report_route(
            router,
            f"/{{experiment_id}}/reports/{name}",
            name,
            reports,
            operation_id=f"get_{name}_report",
        )
        if name in EARLIER_ADDRESSES:
            _add_report_route(
                router, EARLIER_ADDRESSES[name], name, reports, operation_id=f"get_{name}"
            )

    @router.get(
        "/{experiment_id}/reports/{report_name}",
        name="undeclared_report",
        response_model=None,
        operation_id="get_report",
        summary="Any other report name: a 404 naming the experiment's reports",
        description="A report name no registered trainer declares: the answer is a "
        "404 that lists the reports the experiment's trainer has.",
        responses=errors(
            {404: "No experiment with this id, or its trainer declares no report of this name"}
        ),
    )
    def undeclared_report(
        experiment_id: ExperimentId, report_name: ReportName, session: SessionDep
    ) -> BaseModel:
        return experiment_report(session=session, experiment_id=experiment_id, name=report_name)

    return router


def _add_report_route(
    router: APIRouter,
    path: str,
    name: str,
    reports: list[CrossRunReport[Any]],
    *,
    operation_id: str,
) -> None:
    # Trainers that share a report name may answer with different models: the route's is
    # their union, which pydantic resolves by the model instance the build returns.
    models = list(dict.fromkeys(r.response_model for r in reports))

    def serve_report(experiment_id: ExperimentId, session: SessionDep) -> BaseModel:
        return experiment_report(session=session, experiment_id=experiment_id, name=name)

    router.add_api_route(
        path,
        serve_report,
        methods=["GET"],
        response_model=reduce(operator.or_, models),
        name=name,
        operation_id=operation_id,
        summary=f"The {name!r} report of an experiment",
        responses=errors(
            {404: f"No experiment with this id, or its trainer has no {name!r} report"}
        ),
        description=" ".join(dict.fromkeys(r.description for r in reports)),
    )
