"""What the API shows of experiments and runs: stored rows mapped to the response models."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic
from sqlalchemy import Text, bindparam, case, cast, func, text
from sqlmodel import Session, col, select

from api_schemas import (
    AttemptOut,
    ExperimentDetail,
    ExperimentStatus,
    ExperimentSummary,
    RunDetail,
    RunOut,
    RunStatus,
    RunStop,
)
from api_schemas.labels import tag_problem
from api_schemas.pages import CURVE_POINTS
from api_schemas.tracebacks import innermost_frame
from service.analysis.conditions import metric_value
from service.analysis.seed_warnings import submission_warnings
from service.errors import SpecError
from service.scheduling.run_store import experiment_counts
from service.specs import (
    run_config,
)
from service.storage.db import Experiment, Run, RunAttempt, RunMetric
from service.storage.lookup import get_experiment, get_run


def experiment_summary(experiment: Experiment) -> ExperimentSummary:
    assert experiment.id is not None
    return ExperimentSummary(
        id=experiment.id,
        name=experiment.name,
        trainer=experiment.trainer,
        status=experiment.status,
        counts=experiment_counts(experiment),
        n_runs=experiment.n_runs,
        created_at=experiment.created_at,
        finished_at=experiment.finished_at,
        tags=list(experiment.tags or []),
        note=experiment.note,
    )


def experiment_detail(*, session: Session, experiment_id: int) -> ExperimentDetail:
    # Status and counts come from one row: one snapshot, never a status beside counts read
    # after a dispatcher commit.
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    summary = experiment_summary(experiment)
    return ExperimentDetail(
        **summary.model_dump(),
        # the spec as submitted, with the tags and note as they are now (their own columns)
        spec=experiment.stored_spec.model_copy(update={"tags": summary.tags, "note": summary.note}),
        n_conditions=experiment.n_conditions,
        adaptive=experiment.adaptive,
        message=stop_message(experiment),
        queue_position=queue_position(session=session, experiment=experiment),
        seed_warnings=submission_warnings(experiment.stored_spec),
        curve_metrics=logged_curves(session=session, experiment=experiment),
    )


def logged_curves(*, session: Session, experiment: Experiment) -> list[str]:
    """The names an experiment's runs logged as points: kept on the experiment, else (stored
    before migration 0014) read from its runs."""
    if experiment.curve_names is not None:
        return list(experiment.curve_names)
    assert experiment.id is not None
    return curve_metrics(session=session, experiment_id=experiment.id)


def queue_position(*, session: Session, experiment: Experiment) -> int | None:
    """Where a queued experiment waits, 1 = the next to start: the queued experiments ranked
    as the dispatcher claims their runs (highest priority, then lowest run id, first); None
    for an experiment that is not queued."""
    if experiment.status != ExperimentStatus.queued:
        return None
    first_runs = (
        select(
            col(Run.experiment_id),
            func.max(col(Run.priority)).label("priority"),
            func.min(col(Run.id)).label("first_run"),
        )
        .join(Experiment, col(Experiment.id) == col(Run.experiment_id))
        .where(
            col(Run.status) == RunStatus.queued,
            col(Experiment.status) == ExperimentStatus.queued,
            col(Experiment.deleted) == False,  # noqa: E712
        )
        .group_by(col(Run.experiment_id))
        .order_by(func.max(col(Run.priority)).desc(), func.min(col(Run.id)))
    )
    order = [row[0] for row in session.exec(first_runs).all()]
    return order.index(experiment.id) + 1 if experiment.id in order else None


# The distinct metric names of a set of runs' points, one index seek per (run, name) on
# ix_metric_run_name_step (a loose index scan), never a read of every point.
CURVE_NAMES_SQL = text(
    """
    WITH RECURSIVE names(run_id, name) AS (
        SELECT run.id, (SELECT MIN(name) FROM metricpoint WHERE run_id = run.id)
        FROM run WHERE run.id IN :run_ids
        UNION ALL
        SELECT names.run_id, (SELECT MIN(m.name) FROM metricpoint m
                              WHERE m.run_id = names.run_id AND m.name > names.name)
        FROM names WHERE names.name IS NOT NULL
    )
    SELECT DISTINCT name FROM names WHERE name IS NOT NULL
    """
).bindparams(bindparam("run_ids", expanding=True))


def curve_metrics(*, session: Session, experiment_id: int) -> list[str]:
    """The names of the metrics an experiment's runs logged as points, for an experiment stored
    before migration 0014 (newer ones keep them in Experiment.curve_names), from one started run
    per condition (its conditions may log different names: a deeper model, more layers), the
    first completed run where the condition has one, since it logged everything it ever will,
    else its first started run. The runs are picked by one aggregate in the database (loading
    every started run's row took 19 ms of a 20 ms GET /experiments/{id} at 10,000 runs)."""
    first_runs = session.execute(
        select(
            func.min(case((col(Run.status) == RunStatus.completed, col(Run.id)))),
            func.min(col(Run.id)),
        )
        .where(col(Run.experiment_id) == experiment_id, col(Run.started_at).is_not(None))
        .group_by(col(Run.condition_key))
    ).all()
    chosen = [completed if completed is not None else started for completed, started in first_runs]
    if not chosen:
        return []
    rows = session.execute(CURVE_NAMES_SQL, {"run_ids": chosen}).all()
    # sorted here: the database's collation may order "_" and digits otherwise
    return sorted(name for (name,) in rows)


def run_curves(*, session: Session, experiment_id: int, name: str, run_ids: list[int]) -> str:
    """The JSON text of api_schemas.RunCurves: metric `name`'s points of each of these runs
    of the experiment (each run once, in the order given), each cut at CURVE_POINTS. A run of
    another experiment is a 422 naming it."""
    wanted = list(dict.fromkeys(run_ids))
    found = set(
        session.exec(
            select(col(Run.id)).where(
                col(Run.experiment_id) == experiment_id, col(Run.id).in_(wanted)
            )
        ).all()
    )
    foreign = [run_id for run_id in wanted if run_id not in found]
    if foreign:
        raise SpecError.query("run", f"run {foreign[0]} is not a run of experiment {experiment_id}")
    curves: dict[str, list[tuple[int, float | None]]] = {}
    truncated = []
    for run_id in wanted:  # one index range each (ix_metric_run_name_step)
        rows = session.execute(
            select(col(RunMetric.step), col(RunMetric.value))
            .where(col(RunMetric.run_id) == run_id, col(RunMetric.name) == name)
            .order_by(col(RunMetric.step), col(RunMetric.id))
            .limit(CURVE_POINTS + 1)
        ).all()
        if len(rows) > CURVE_POINTS:
            truncated.append(run_id)
        curves[str(run_id)] = [(step, value) for step, value in rows[:CURVE_POINTS]]
    # Plain rows to JSON, as GET /runs/{id}/metrics does: a model object per point costs more.
    return json.dumps({"name": name, "curves": curves, "truncated": truncated}, allow_nan=False)


def stop_message(experiment: Experiment) -> str | None:
    """Why the experiment stopped before all its runs had run, or None: its adaptive rule
    stopped on a failed look (the rule's record says so), or its first runs all failed
    (service.scheduling.run_rules.failure_stop), which the runs store records as the
    experiment's stop_message."""
    adaptive = experiment.adaptive if isinstance(experiment.adaptive, dict) else {}
    if adaptive.get("error"):  # its rule stopped because a look failed
        return adaptive.get("stop_reason")
    return experiment.stop_message


@dataclass(frozen=True)
class ExperimentFilter:
    """Which experiments GET /experiments lists; every filter given must hold."""

    status: ExperimentStatus | None = None
    # the name contains it (case-insensitive)
    name: str | None = None
    # every one of these tags
    tags: tuple[str, ...] = ()
    trainer: str | None = None
    # created at or after, and before (a naive datetime is UTC)
    created_after: datetime | None = None
    created_before: datetime | None = None
    # in the name, note, tags or trainer (case-insensitive)
    text: str | None = None


def list_experiments(
    *,
    session: Session,
    limit: int,
    offset: int,
    only: ExperimentFilter = ExperimentFilter(),
) -> list[ExperimentSummary]:
    """One page of the experiments `only` keeps, newest first; a filter no experiment could
    pass (a malformed tag, an empty time range) is a SpecError naming its query parameter."""
    for problem in filter(None, map(tag_problem, only.tags)):
        raise SpecError.query("tag", problem)
    after = _utc("created_after", only.created_after)
    before = _utc("created_before", only.created_before)
    if after is not None and before is not None and before <= after:
        raise SpecError.query(
            "created_before",
            f"created_before ({before.isoformat()}) is not after created_after "
            f"({after.isoformat()}): no experiment could match",
        )
    query = (
        select(Experiment)
        .where(col(Experiment.deleted) == False)  # noqa: E712
        .order_by(col(Experiment.id).desc())
    )
    if only.status is not None:
        query = query.where(Experiment.status == only.status)
    if only.name:
        query = query.where(_contains(col(Experiment.name), only.name))
    for tag in only.tags:
        # tags hold no quote (api_schemas.labels): '"tag"' in the stored JSON list is that tag
        query = query.where(_contains(cast(col(Experiment.tags), Text), f'"{tag}"', fold=False))
    if only.trainer:
        query = query.where(Experiment.trainer == only.trainer)
    if after is not None:
        query = query.where(col(Experiment.created_at) >= after)
    if before is not None:
        query = query.where(col(Experiment.created_at) < before)
    if only.text:
        # in name, note, tag values or trainer, case-folded as the column is (storage.db)
        query = query.where(
            _contains(col(Experiment.search_text), only.text.casefold(), fold=False)
        )
    experiments = session.exec(query.offset(offset).limit(limit)).all()
    return [experiment_summary(experiment) for experiment in experiments]


def _contains(column: Any, text: str, *, fold: bool = True) -> Any:
    """`column` contains `text`, case-insensitive when `fold`; LIKE's own wildcards in the text
    are matched literally."""
    if fold:
        column, text = func.lower(column), text.lower()
    pattern = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return column.like(f"%{pattern}%", escape="\\")


def _utc(parameter: str, moment: datetime | None) -> datetime | None:
    """`moment` in UTC (a naive one is read as UTC); a SpecError naming `parameter` when UTC
    has no such time (year 1 or 9999 with an offset)."""
    if moment is None or moment.tzinfo is None:
        return None if moment is None else moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise SpecError.query(parameter, f"{moment.isoformat()} is out of range in UTC") from None


def run_out(run: Run) -> RunOut:
    assert run.id is not None
    return RunOut(
        id=run.id,
        experiment_id=run.experiment_id,
        condition=run.condition,
        condition_key=run.condition_key,
        seed=run.seed,
        status=run.status,
        attempts=run.attempts,
        # as the statistics read them: what is stored and is not a number is null
        metrics={name: metric_value(run.metrics, name) for name in run.metrics},
        diagnostics=run.diagnostics,
        warnings=run.warnings,
        error=run.error,
        started_at=run.started_at,
        finished_at=run.finished_at,
        stop=run_stop(run),
    )


def run_stop(run: Run) -> RunStop | None:
    """A stopped run's stop, which its worker stored in the diagnostics ("stop"); None for any
    other status, or when what is stored there is not a stop (read as it is, never a 500)."""
    if run.status != RunStatus.stopped:
        return None
    try:
        return RunStop.model_validate(run.diagnostics.get("stop"))
    except pydantic.ValidationError:
        return None


def list_runs(
    *,
    session: Session,
    experiment_id: int,
    status: RunStatus | None = None,
    limit: int,
    offset: int = 0,
) -> list[RunOut]:
    """One page of an experiment's runs in id order, optionally only those in `status`."""
    get_experiment(session=session, experiment_id=experiment_id)
    query = select(Run).where(Run.experiment_id == experiment_id)
    if status is not None:
        query = query.where(Run.status == status)
    runs = session.exec(query.order_by(col(Run.id)).offset(offset).limit(limit)).all()
    return [run_out(r) for r in runs]


def run_detail(*, session: Session, run_id: int) -> RunDetail:
    run = get_run(session=session, run_id=run_id)
    experiment = get_experiment(session=session, experiment_id=run.experiment_id)
    attempts = session.exec(
        select(RunAttempt).where(col(RunAttempt.run_id) == run_id).order_by(col(RunAttempt.attempt))
    ).all()
    provenance = {
        **run.provenance,
        "ray_node_id": run.node_id,
        "ray_worker_id": run.worker_id,
        "worker_pid": run.worker_pid,
    }
    frame = innermost_frame(run.traceback)
    return RunDetail(
        **run_out(run).model_dump(),
        traceback=run.traceback,
        failed_at=str(frame) if frame is not None else None,
        config=run_config(experiment.stored_spec, run.condition, run.provenance.get("config")),
        provenance=provenance,
        attempt_history=[AttemptOut.model_validate(a, from_attributes=True) for a in attempts],
    )
