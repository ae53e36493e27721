"""Two experiments side by side (GET /compare): studies grow after the first look, and a
follow-up experiment (more seeds, a changed base config) is compared condition by condition
with the first, conditions matched by what they run (the values of every field either
experiment grids over, in the resolved run config: whatever grid keys or base config gave
them), the base-config fields that differ listed; with the same tests as /stats
(service.analysis.stats.compare): paired by seed where both ran the same seeds (seed s draws
the same random streams in both), the p-values raw (no family is adjusted here), and the
condition intervals within the metric's declared bounds.

Each page is stored like a page of /stats (service.analysis.stats_store), per (a, b, metric,
page) in `comparecache`, and computed again only when the number of completed runs of a or of
b changed since: a page of two 10,000-run experiments costs seconds to compute, and every API
replica then serves the same stored answer. Its rows go with either experiment
(service.scheduling.purge)."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from sqlalchemy import delete
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from api_schemas import (
    SOURCE_FACTOR,
    Comparison,
    ConditionStats,
    ConfigDifference,
    ExperimentComparison,
    ExperimentSpec,
    RunStatus,
    RunValue,
    SideBySide,
)
from api_schemas.pages import COMPARE_PAGE
from service.analysis.catalogue import experiment_catalogue
from service.analysis.conditions import condition_stats, metric_value
from service.analysis.stats import ScaleError, compare, on_scale
from service.analysis.stats_store import page_lock
from service.errors import SpecError
from service.limits import HeavyReads
from service.specs import run_config, unknown_metric
from service.storage.db import CompareCache, Experiment, Run, utcnow
from service.storage.lookup import get_experiment

log = logging.getLogger("seedgrid.compare")

# Conditions per response: each costs a permutation test and a bootstrap.
MAX_CONDITIONS_PER_PAGE = COMPARE_PAGE
# Bumped when the served comparison gains fields: pages stored by an earlier version are then
# computed again rather than served without them.
COMPARE_FORMAT = "v3"
# Stored pages kept per experiment `a` (the least recently computed go first).
MAX_STORED_PAGES = 64

# (run id, seed, value) of one completed run
Value = tuple[int, int, float]


def _values(
    session: Session, experiment: Experiment, metric: str, factors: set[str]
) -> tuple[dict[str, tuple[dict[str, Any], str, list[Value]]], int]:
    """resolved_condition -> (condition, condition_key, the metric of its completed runs in run
    order, each with its run id and seed); and how many completed runs were read."""
    out: dict[str, tuple[dict[str, Any], str, list[Value]]] = {}
    resolved: dict[str, str] = {}  # condition_key -> its resolved config
    spec = experiment.stored_spec
    rows = session.execute(
        sa_select(
            col(Run.id), col(Run.seed), col(Run.condition), col(Run.condition_key), col(Run.metrics)
        )
        .where(col(Run.experiment_id) == experiment.id, col(Run.status) == RunStatus.completed)
        .order_by(col(Run.id))
    ).all()
    for run_id, seed, condition, key, metrics in rows:
        value = metric_value(metrics, metric)
        if value is None:
            continue
        if key not in resolved:
            resolved[key] = resolved_condition(spec, condition, factors)
        out.setdefault(resolved[key], (condition, key, []))[2].append((run_id, seed, value))
    return out, len(rows)


def resolved_condition(spec: ExperimentSpec, condition: dict[str, Any], factors: set[str]) -> str:
    """What a condition of `spec` runs as, as text two experiments' conditions match on: the
    values of `factors` (the fields either experiment grids over) in the run config it trains
    with (the base config merged with its grid levels, defaults filled in), and its level of
    the reserved seed-source factor. The other fields are base config: a follow-up that
    changes one (more steps) still compares condition by condition, and config_differences
    names the change."""
    config = run_config(spec, condition)
    matched = {field: config.get(field) for field in sorted(factors)}
    return json.dumps([matched, condition.get(SOURCE_FACTOR)], sort_keys=True)


def config_differences(a: ExperimentSpec, b: ExperimentSpec) -> list[ConfigDifference]:
    """The base-config fields (defaults filled in) whose values differ between a and b, those
    either experiment grids over left out: their levels are in the conditions' keys."""
    base_a, base_b = run_config(a, {}), run_config(b, {})
    gridded = set(a.grid) | set(b.grid)
    return [
        ConfigDifference(
            field=field, a=json.dumps(base_a.get(field)), b=json.dumps(base_b.get(field))
        )
        for field in dict.fromkeys([*base_a, *base_b])
        if field not in gridded and base_a.get(field) != base_b.get(field)
    ]


def _side(
    condition: dict[str, Any], key: str, runs: list[Value], bounds: tuple[float, float] | None
) -> ConditionStats:
    stats = condition_stats(condition, key, [value for _, _, value in runs], bounds=bounds)
    stats.runs = [RunValue(run_id=run_id, seed=seed, value=value) for run_id, seed, value in runs]
    return stats


def _checked(
    session: Session, a_id: int, b_id: int, metric: str | None
) -> tuple[Experiment, Experiment, str]:
    """Both experiments (404 when either is gone) and the metric; a 422 naming the query field
    for experiments of different trainers, an unknown metric, or the same experiment twice."""
    if a_id == b_id:
        raise SpecError.query("b", "compare two different experiments")
    a = get_experiment(session=session, experiment_id=a_id)
    b = get_experiment(session=session, experiment_id=b_id)
    if a.trainer != b.trainer:
        raise SpecError.query(
            "b",
            f"experiment {b_id} ran trainer {b.trainer!r} and experiment "
            f"{a_id} ran {a.trainer!r}: only runs of one trainer compare",
        )
    metric = metric or a.metric
    for side in (a, b):
        problem = unknown_metric(experiment_catalogue(session, side), metric)
        if problem:
            raise SpecError.query("metric", problem)
    return a, b, metric


def compare_json(
    *,
    session: Session,
    a_id: int,
    b_id: int,
    metric: str | None,
    offset: int,
    limit: int,
    heavy: HeavyReads | None = None,
    scale: str | None = None,
) -> str:
    """The page as the JSON text of `api_schemas.ExperimentComparison`: stored, or computed
    and stored when either experiment completed runs since (the computation in one of
    `heavy`'s slots: service.limits.Busy, a 503, when none is free). `scale`: see
    analysis_scale."""
    a, b, metric = _checked(session, a_id, b_id, metric)
    scale, scale_note = analysis_scale(a.stored_spec, b.stored_spec, scale)
    page = f"{COMPARE_FORMAT}|{offset}|{limit}|{scale}"
    stored = _stored(session, a, b, metric, page)
    if stored is not None:
        return stored
    # one computation per page in this process, keyed apart from a's /stats pages
    with page_lock(a_id, metric, f"compare|{b_id}|{page}"):
        stored = _stored(session, a, b, metric, page)  # another viewer computed it
        if stored is not None:
            return stored
        with heavy.slot() if heavy is not None else contextlib.nullcontext():
            comparison, n_a, n_b = _comparison(session, a, b, metric, offset, limit, scale)
        comparison.scale_note = scale_note
        payload = comparison.model_dump_json()
        try:
            _store(session, a_id, b_id, metric, page, n_a, n_b, payload)
        except Exception:  # the answer stands; the next request computes it again
            session.rollback()
            log.exception("could not store the comparison of experiments %s and %s", a_id, b_id)
        return payload


def analysis_scale(
    a: ExperimentSpec, b: ExperimentSpec, asked: str | None
) -> tuple[str, str | None]:
    """The scale two experiments are compared on, and a note when their specs disagree: the
    one asked for; else the scale both specs' analysis.scale name (a log-scaled metric compared
    on its raw values would weigh its largest seeds alone); else raw, saying so."""
    if asked is not None:
        return asked, None
    scale_a, scale_b = a.analysis.scale, b.analysis.scale
    if scale_a == scale_b:
        return scale_a, None
    return "raw", (
        f"the specs analyse on different scales (a: {scale_a}, b: {scale_b}): compared raw; "
        "?scale= chooses"
    )


def _comparison(
    session: Session,
    a: Experiment,
    b: Experiment,
    metric: str,
    offset: int,
    limit: int,
    scale: str = "raw",
) -> tuple[ExperimentComparison, int, int]:
    """The page, and how many completed runs of a and of b it was computed from; the tests on
    `scale` (a 422 naming `scale` when "log" meets a value at or below 0)."""
    assert a.id is not None and b.id is not None
    bounds = experiment_catalogue(session, a).metric_bounds.get(metric)
    factors = (set(a.stored_spec.grid) | set(b.stored_spec.grid)) - {SOURCE_FACTOR}
    values_a, n_a = _values(session, a, metric, factors)
    values_b, n_b = _values(session, b, metric, factors)
    shared = [resolved for resolved in values_a if resolved in values_b]
    if offset > len(shared):
        raise SpecError.query(
            "offset", f"offset {offset} is past the {len(shared)} shared conditions"
        )
    sides = []
    for resolved in shared[offset : offset + limit]:
        condition, key, runs_a = values_a[resolved]
        condition_b, key_b, runs_b = values_b[resolved]
        sides.append(
            SideBySide(
                condition=condition,
                condition_key=key,
                condition_b=condition_b,
                condition_key_b=key_b,
                a=_side(condition, key, runs_a, bounds),
                b=_side(condition_b, key_b, runs_b, bounds),
                comparison=Comparison(
                    factor="experiment",
                    a=a.id,
                    b=b.id,
                    within=condition,
                    **compare(
                        _scaled(runs_a, scale, metric),
                        _scaled(runs_b, scale, metric),
                        [s for _, s, _ in runs_a],
                        [s for _, s, _ in runs_b],
                    ),
                ),
            )
        )
    end = offset + len(sides)
    return (
        ExperimentComparison(
            a=a.id,
            b=b.id,
            trainer=a.trainer,
            metric=metric,
            conditions=sides,
            total_conditions=len(shared),
            offset=offset,
            next_offset=end if end < len(shared) else None,
            only_in_a=[side[1] for r, side in values_a.items() if r not in values_b],
            only_in_b=[side[1] for r, side in values_b.items() if r not in values_a],
            config_differences=config_differences(a.stored_spec, b.stored_spec),
            scale=scale,
        ),
        n_a,
        n_b,
    )


def _scaled(runs: list[Value], scale: str, metric: str) -> list[float]:
    try:
        return on_scale([value for _, _, value in runs], scale)
    except ScaleError as error:
        raise SpecError.query("scale", f"metric {metric!r}: {error}") from None


def _stored(session: Session, a: Experiment, b: Experiment, metric: str, page: str) -> str | None:
    """The stored page, if it was computed from as many completed runs of each as there are
    now (kept by the runs store on the experiments' rows: two rows, not a count of runs)."""
    session.expire(a, ["runs_completed"])
    session.expire(b, ["runs_completed"])
    stored = session.execute(
        select(CompareCache.n_completed_a, CompareCache.n_completed_b, CompareCache.payload).where(
            CompareCache.a_id == a.id,
            CompareCache.b_id == b.id,
            CompareCache.metric == metric,
            CompareCache.page == page,
        )
    ).first()
    if stored is not None and (stored.n_completed_a, stored.n_completed_b) == (
        a.runs_completed,
        b.runs_completed,
    ):
        return str(stored.payload)
    return None


def _store(
    session: Session, a_id: int, b_id: int, metric: str, page: str, n_a: int, n_b: int, payload: str
) -> None:
    """Insert or replace the stored page (two replicas may compute it at once), then drop a's
    least recently computed pages past MAX_STORED_PAGES."""
    values = {
        "a_id": a_id,
        "b_id": b_id,
        "metric": metric,
        "page": page,
        "n_completed_a": n_a,
        "n_completed_b": n_b,
        "payload": payload,
        "computed_at": utcnow(),
    }
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(CompareCache).values(**values)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["a_id", "b_id", "metric", "page"],
            set_={
                k: statement.excluded[k]
                for k in ("n_completed_a", "n_completed_b", "payload", "computed_at")
            },
        )
    )
    keep = (
        select(col(CompareCache.id))
        .where(col(CompareCache.a_id) == a_id)
        .order_by(col(CompareCache.computed_at).desc(), col(CompareCache.id).desc())
        .limit(MAX_STORED_PAGES)
    )
    session.execute(
        delete(CompareCache).where(
            col(CompareCache.a_id) == a_id, col(CompareCache.id).not_in(keep.scalar_subquery())
        )
    )
    session.commit()
