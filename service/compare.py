"""Two experiments side by side (GET /compare): studies grow after the first look, and a
follow-up experiment (more seeds, a changed base config) is compared condition by condition
with the first, with the same tests as /stats (service.stats.compare): paired by seed where
both ran the same seeds (seed s draws the same random streams in both), the p-values raw (no
family is adjusted here), and the condition intervals within the metric's declared bounds."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, select

from api_schemas import (
    Comparison,
    ConditionStats,
    ExperimentComparison,
    RunStatus,
    RunValue,
    SideBySide,
)
from service.db import Experiment, Run
from service.experiments import SpecError, get_experiment, unknown_metric
from service.stats import compare, condition_stats, metric_value
from trainers import REGISTRY

# Conditions per response: each costs a permutation test and a bootstrap.
MAX_CONDITIONS_PER_PAGE = 200


def _values(session: Session, experiment: Experiment,
            metric: str) -> dict[str, tuple[dict[str, Any], list[RunValue]]]:
    """condition_key -> (condition, the metric of its completed runs in run order, each with
    its run id and seed)."""
    out: dict[str, tuple[dict[str, Any], list[RunValue]]] = {}
    rows = session.exec(
        select(Run.id, Run.seed, Run.condition, Run.condition_key, Run.metrics)
        .where(Run.experiment_id == experiment.id, Run.status == RunStatus.completed)
        .order_by(Run.id)  # type: ignore[arg-type]
    ).all()
    for run_id, seed, condition, key, metrics in rows:
        value = metric_value(metrics, metric)
        if value is not None:
            out.setdefault(key, (condition, []))[1].append(
                RunValue(run_id=run_id, seed=seed, value=value))
    return out


def _side(condition: dict[str, Any], key: str, runs: list[RunValue],
          bounds: tuple[float, float] | None) -> ConditionStats:
    stats = condition_stats(condition, key, [r.value for r in runs], bounds=bounds)
    stats.runs = runs
    return stats


def compare_experiments(*, session: Session, a_id: int, b_id: int, metric: str | None,
                        offset: int, limit: int) -> ExperimentComparison:
    """The conditions both experiments ran (keys in a's first-completed order), from `offset`,
    at most `limit`; a 422 naming the query field for experiments of different trainers, an
    unknown metric, or the same experiment twice."""
    if a_id == b_id:
        raise SpecError.query("b", "compare two different experiments")
    a = get_experiment(session=session, experiment_id=a_id)
    b = get_experiment(session=session, experiment_id=b_id)
    if a.trainer != b.trainer:
        raise SpecError.query("b", f"experiment {b_id} ran trainer {b.trainer!r} and experiment "
                                f"{a_id} ran {a.trainer!r}: only runs of one trainer compare")
    metric = metric or a.metric
    trainer = REGISTRY[a.trainer]
    bounds = trainer.metric_bounds.get(metric)
    problem = unknown_metric(trainer, metric)
    if problem:
        raise SpecError.query("metric", problem)
    values_a, values_b = _values(session, a, metric), _values(session, b, metric)
    shared = [key for key in values_a if key in values_b]
    if offset > len(shared):
        raise SpecError.query("offset", f"offset {offset} is past the {len(shared)} shared "
                                     "conditions")
    sides = []
    for key in shared[offset:offset + limit]:
        condition, runs_a = values_a[key]
        runs_b = values_b[key][1]
        sides.append(SideBySide(
            condition=condition, condition_key=key,
            a=_side(condition, key, runs_a, bounds), b=_side(condition, key, runs_b, bounds),
            comparison=Comparison(factor="experiment", a=a_id, b=b_id, within=condition,
                                  **compare([r.value for r in runs_a], [r.value for r in runs_b],
                                            [r.seed for r in runs_a],
                                            [r.seed for r in runs_b]))))
    end = offset + len(sides)
    return ExperimentComparison(
        a=a_id, b=b_id, trainer=a.trainer, metric=metric, conditions=sides,
        total_conditions=len(shared), offset=offset,
        next_offset=end if end < len(shared) else None,
        only_in_a=[k for k in values_a if k not in values_b],
        only_in_b=[k for k in values_b if k not in values_a])
