"""The params table of an experiment: every condition's resolved config side by side, the fields
that differ between conditions first, each condition with its summary of the metric as /stats
serves it (the same stored page: the numbers cannot disagree)."""

from __future__ import annotations

import json
from typing import Any

from sqlmodel import Session, col, func, select

from api_schemas import ConditionParams, ParamsTable, RunStatus, Stats
from service.analysis.stats import MAX_COMPARISONS_PER_PAGE, ComparisonPlan
from service.analysis.stats_store import stats_json
from service.limits import HeavyReads
from service.specs import condition_key, grid_conditions, run_config, stats_grid
from service.storage.db import Experiment, Run
from trainers import REGISTRY


def params_table(
    *,
    session: Session,
    experiment: Experiment,
    metric: str | None,
    heavy: HeavyReads | None = None,
) -> ParamsTable:
    """Every condition of `experiment`, in grid order, with the config its runs train with
    (service.specs.run_config) and its n, mean and std of `metric` (default: the spec's) over
    its completed runs."""
    spec = experiment.stored_spec
    # The page the dashboard reads when it fits in one, else the smallest: only its
    # conditions are read here, which every page carries.
    limit = None if ComparisonPlan(stats_grid(spec)).total <= MAX_COMPARISONS_PER_PAGE else 1
    stats = Stats.model_validate_json(
        stats_json(
            session=session,
            experiment=experiment,
            metric=metric,
            factor=None,
            offset=0,
            limit=limit,
            heavy=heavy,
        )
    )
    summaries = {c.condition_key: c for c in stats.conditions}
    conditions = grid_conditions(stats_grid(spec))
    ran = {} if spec.trainer in REGISTRY else _recorded_configs(session, experiment)
    configs = [
        run_config(spec, condition, ran.get(condition_key(condition))) for condition in conditions
    ]
    fields = list(dict.fromkeys(field for config in configs for field in config))
    varying = [f for f in fields if len({_comparable(c.get(f)) for c in configs}) > 1]
    rows = []
    for condition, config in zip(conditions, configs, strict=True):
        key = condition_key(condition)
        summary = summaries.get(key)  # none before a run of it completed
        rows.append(
            ConditionParams(
                condition=condition,
                condition_key=key,
                config=config,
                n=summary.n if summary else 0,
                mean=summary.mean if summary else None,
                std=summary.std if summary else None,
            )
        )
    return ParamsTable(
        metric=stats.metric,
        fields=varying + [f for f in fields if f not in varying],
        varying=varying,
        conditions=rows,
    )


def _recorded_configs(session: Session, experiment: Experiment) -> dict[str, Any]:
    """{condition key: the config a completed run of it recorded training with (its
    provenance)}: what the params table shows when the trainer's code, which fills in a
    spec's defaults, is not loaded here. One run per condition, the first completed."""
    first = (
        select(func.min(col(Run.id)))
        .where(col(Run.experiment_id) == experiment.id, col(Run.status) == RunStatus.completed)
        .group_by(col(Run.condition_key))
    )
    rows = session.exec(
        select(Run.condition_key, Run.provenance).where(col(Run.id).in_(first))
    ).all()
    return {key: (provenance or {}).get("config") for key, provenance in rows}


def _comparable(value: Any) -> str:
    """A config value as text that tells apart values Python finds equal (1 and True) and
    compares nested ones by content."""
    return json.dumps(value, sort_keys=True)
