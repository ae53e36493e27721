"""The metric catalogue a stored experiment is read with (service.specs.metric_catalogue), with
the database at hand for an experiment stored before its catalogue was recorded and whose
trainer's code is not loaded: the metrics its completed runs recorded."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from api_schemas import RunStatus
from service.specs import MetricCatalogue, metric_catalogue
from service.storage.db import Experiment, Run

# The completed runs whose final metrics name an old experiment's metrics: its runs all ran
# one trainer, so a few show them all.
RECORDED_RUNS = 50


def experiment_catalogue(session: Session, experiment: Experiment) -> MetricCatalogue:
    def recorded() -> list[str]:
        rows = session.exec(
            select(Run.metrics)
            .where(Run.experiment_id == experiment.id, col(Run.status) == RunStatus.completed)
            .order_by(col(Run.id))
            .limit(RECORDED_RUNS)
        ).all()
        names = {str(name) for metrics in rows for name in (metrics or {})}
        return [experiment.metric, *sorted(names - {experiment.metric})]

    return metric_catalogue(
        experiment.trainer, experiment.stored_spec, experiment.catalogue, recorded
    )


def test_set_sizes(
    catalogue: MetricCatalogue,
    diagnostics: dict[str, Any] | None,
    provenance: dict[str, Any] | None,
) -> dict[str, int]:
    """{metric: test examples it averages} of one completed run: as the dispatcher that stored
    it recorded them in its provenance (`test_set_sizes`, from its trainer's code), else as
    the catalogue's trainer computes them from its diagnostics (runs stored before that
    record; none when the trainer's code is not loaded)."""
    recorded = (provenance or {}).get("test_set_sizes")
    if isinstance(recorded, dict):
        return {
            str(m): n
            for m, n in recorded.items()
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1
        }
    return catalogue.test_set_sizes(diagnostics or {})
