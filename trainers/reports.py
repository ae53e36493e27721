"""Cross-run reports: what a trainer computes over the stored runs of a whole experiment.

Some results need more than one run: feedback's depth utility compares each run with the
frozen-block run of the same condition and seed. A trainer declares such a report in its
`reports` (a `CrossRunReport`: a name, a response model and a `build` function), and the
service serves every declared report at GET /experiments/{id}/reports/{name} with no
knowledge of the trainer. Trainers know nothing of SQL: the service hands `build` the
experiment and its runs as the plain records below.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pydantic

from api_schemas import GridValue, RunStatus

# A report's name is one URL segment: /experiments/{id}/reports/{name}.
REPORT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

ReportModel = TypeVar("ReportModel", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class ExperimentRecord:
    """An experiment as a report sees it."""

    id: int
    name: str
    trainer: str
    # The spec's base config (what the trainer's Config completes) and its grid.
    config: Mapping[str, Any]
    grid: Mapping[str, Sequence[GridValue]]


@dataclass(frozen=True)
class RunRecord:
    """One run of the experiment as a report sees it, in any status."""

    id: int
    condition: Mapping[str, GridValue]
    condition_key: str
    seed: int
    status: RunStatus
    # The experiment's base config with this run's condition (the trainer's defaults not
    # filled in: a field neither sets is absent).
    config: Mapping[str, Any]
    metrics: Mapping[str, Any]
    diagnostics: Mapping[str, Any]


@dataclass(frozen=True)
class CrossRunReport(Generic[ReportModel]):
    """A report over every run of an experiment, served at /experiments/{id}/reports/{name}."""

    name: str
    # One line for the API documentation: what the report says about the experiment.
    description: str
    response_model: type[ReportModel]
    # The report from the experiment and all its runs (in id order); runs of any status.
    build: Callable[[ExperimentRecord, Sequence[RunRecord]], ReportModel]

    def __post_init__(self) -> None:
        if not REPORT_NAME.match(self.name):
            raise ValueError(
                f"report name {self.name!r} is not a URL segment matching {REPORT_NAME.pattern}"
            )
