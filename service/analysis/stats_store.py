"""The variance statistics of an experiment as the API serves them: one page at a time, stored
in the database per experiment, metric and page, and recomputed only when the number of
completed runs changed since they were stored (docs/architecture.md, data flow). Every API replica
then serves the same stored result, and it survives restarts.

What every page shares, the raw p-values of the Holm families
(service.analysis.stats.family_p_values,
up to 20,000 comparisons analysed), is stored the same way as a row of its own, so that another
page of the same runs computes only its own comparisons. A page computed cold takes one of the
process's heavy-read slots (service.limits), unless its experiment is small (LIGHT_*); a stored
page never does.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Row, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col

from api_schemas import SOURCE_FACTOR, RunStatus, RunValue, Stats
from service.analysis.catalogue import experiment_catalogue, test_set_sizes
from service.analysis.conditions import metric_value
from service.analysis.confounds import attach_confounds
from service.analysis.multiplicity import FamilyPValues
from service.analysis.sources import source_decomposition
from service.analysis.stats import (
    MAX_COMPARISONS_PER_PAGE,
    ComparisonPlan,
    RunValues,
    ScaleError,
    experiment_stats,
    family_p_values,
    run_values,
)
from service.errors import SpecError
from service.limits import HeavyReads
from service.specs import stats_grid, unknown_metric
from service.storage.db import ComparisonResult, Experiment, Run, StatsCache, utcnow

log = logging.getLogger("seedgrid.stats")

# Stored pages kept per experiment (a client asking for many different pages cannot grow the
# table without bound; the least recently computed go first).
MAX_STORED_PAGES = 64


# Bumped when the served statistics gain fields: pages stored by an earlier version are then
# computed again rather than served without them.
STATS_FORMAT = "v8"
# An experiment of at most this many comparisons and completed runs has its pages computed in
# milliseconds: they take no heavy-read slot (many small experiments ending at once, as in the
# load test, are not turned away).
LIGHT_COMPARISONS = 100
LIGHT_RUNS = 1000
# The stored row of an experiment's Holm families, per metric and scale, beside its pages (kept
# out of MAX_STORED_PAGES: every page needs it).
FAMILIES_PAGE = f"{STATS_FORMAT}|families|"

# Comparison results stored by digest (ComparisonResult) read and written this many at a time
# (one statement's bound parameters stay well under SQLite's limit).
RESULTS_BATCH = 500

# One lock per page being computed in this process: two viewers of a page that is not stored
# yet wait for one computation instead of both computing it.
_computing: dict[tuple[int, str, str], threading.Lock] = {}
_computing_guard = threading.Lock()


def page_lock(experiment_id: int, metric: str, page: str) -> threading.Lock:
    """The lock of one page of `experiment_id` being computed in this process
    (service.analysis.compare
    takes them too, for its pages: their `page` says so)."""
    with _computing_guard:
        if len(_computing) > 1024:  # forget the locks of pages nobody is computing
            for key in [k for k, lock in _computing.items() if not lock.locked()]:
                del _computing[key]
        return _computing.setdefault((experiment_id, metric, page), threading.Lock())


INTERIM_NOTE = (
    "an interim look at an adaptive experiment still adding seeds: these p-values "
    "are not adjusted for its looks; its rule decides at alpha/K per look "
    "(experiment.adaptive)"
)


def stats_json(
    *,
    session: Session,
    experiment: Experiment,
    metric: str | None,
    factor: str | None,
    offset: int,
    limit: int | None,
    scale: str | None = None,
    heavy: HeavyReads | None = None,
    pooled: bool = False,
) -> str:
    """The statistics page as the JSON text of `api_schemas.Stats`.

    Refuses (SpecError, a 422 naming the query field) an unknown metric or factor, an offset
    past the last comparison, and a request for more comparisons than one response carries
    (MAX_COMPARISONS_PER_PAGE) without paging. A page not stored yet of an experiment past
    LIGHT_COMPARISONS or LIGHT_RUNS is computed in one of `heavy`'s slots (service.limits.Busy
    when none is free; None: no limit).
    """
    assert experiment.id is not None
    metric = metric or experiment.metric
    spec = experiment.stored_spec
    problem = unknown_metric(experiment_catalogue(session, experiment), metric)
    if problem:
        raise SpecError.query("metric", problem)
    grid = stats_grid(spec)
    if factor is not None and factor not in grid:
        raise SpecError.query(
            "factor",
            f"{factor!r} is not a factor of experiment "
            f"{experiment.id}; its factors: {', '.join(grid) or 'none'}",
        )
    plan = ComparisonPlan(grid, factor, pooled)
    total = plan.total
    if limit is None and total > MAX_COMPARISONS_PER_PAGE:
        counts = ", ".join(f"{f} {plan.count(f):,}" for f in plan.factors)
        hint = "" if factor is not None else " or ask for one factor with ?factor="
        raise SpecError.query(
            "limit",
            f"experiment {experiment.id} has {total:,} comparisons ({counts}), more "
            f"than the {MAX_COMPARISONS_PER_PAGE:,} one response carries: page them "
            f"with ?limit= (at most {MAX_COMPARISONS_PER_PAGE:,}) and ?offset={hint}",
        )
    if offset > total:
        raise SpecError.query(
            "offset", f"offset {offset:,} is past the last of the {total:,} comparisons"
        )
    if offset == 0 and limit is not None and limit >= total:
        limit = None  # every comparison: the page asked for without a limit, stored once
    scale = scale or spec.analysis.scale
    page = f"{STATS_FORMAT}|{factor or ''}|{offset}|{'all' if limit is None else limit}|{scale}"
    if pooled:
        page += "|pooled"
    # An adaptive experiment that has not stopped: its page is stored apart, so that once it
    # stops (its last look adds no completed run) the interim page is not served as final.
    if experiment.deciding:
        page += "|interim"
    stored = _stored(session, experiment, metric, page)
    if stored is not None:
        return stored
    with page_lock(experiment.id, metric, page):
        stored = _stored(session, experiment, metric, page)  # another viewer computed it
        if stored is not None:
            return stored
        light = is_light(grid, experiment.runs_completed)
        with heavy.slot() if heavy is not None and not light else contextlib.nullcontext():
            return _compute(
                session=session,
                experiment=experiment,
                metric=metric,
                factor=factor,
                offset=offset,
                limit=limit,
                pooled=pooled,
                grid=grid,
                page=page,
                scale=scale,
                target_ratio=spec.analysis.target_ratio,
            )


def is_light(grid: dict[str, list[Any]], n_completed: int) -> bool:
    """Whether an experiment's pages are computed in milliseconds (LIGHT_COMPARISONS,
    LIGHT_RUNS): no heavy-read slot, no stored Holm families."""
    return ComparisonPlan(grid).total <= LIGHT_COMPARISONS and n_completed <= LIGHT_RUNS


def _stored(
    session: Session, experiment: Experiment, metric: str, page: str, n_completed: int | None = None
) -> str | None:
    """The stored page, if it was computed from as many completed runs as there are now (or
    as `n_completed`, the runs a computation read)."""
    if n_completed is None:
        session.expire(experiment, ["runs_completed"])
        # kept by the runs store with every status change: one row, not a count over the runs
        n_completed = experiment.runs_completed
    stored = session.execute(
        select(col(StatsCache.n_completed), col(StatsCache.payload)).where(
            col(StatsCache.experiment_id) == experiment.id,
            col(StatsCache.metric) == metric,
            col(StatsCache.page) == page,
        )
    ).first()
    if stored is not None and stored.n_completed == n_completed:
        return str(stored.payload)
    return None


def _compute(
    *,
    session: Session,
    experiment: Experiment,
    metric: str,
    factor: str | None,
    offset: int,
    limit: int | None,
    pooled: bool,
    grid: dict[str, list[Any]],
    page: str,
    scale: str,
    target_ratio: float,
) -> str:
    assert experiment.id is not None
    trainer = experiment_catalogue(session, experiment)

    # Completed runs only: a stopped run's (stop_on_checks) final metric comes from the epoch
    # it stopped at, not comparable with a run trained to the end.
    rows = session.execute(
        select(
            col(Run.id),
            col(Run.seed),
            col(Run.condition),
            col(Run.condition_key),
            col(Run.metrics),
            col(Run.diagnostics),
            col(Run.provenance),
        )
        .where(col(Run.experiment_id) == experiment.id, col(Run.status) == RunStatus.completed)
        .order_by(col(Run.id))
    ).all()
    kept = [
        (row, value) for row in rows if (value := metric_value(row.metrics, metric)) is not None
    ]
    values = [(row.condition, row.condition_key, value) for row, value in kept]
    sizes = [
        test_set_sizes(trainer, row.diagnostics, row.provenance).get(metric) for row, _ in kept
    ]
    seeds = [row.seed for row, _ in kept]
    store = (
        None if is_light(grid, len(rows)) else StoredResults(session, experiment.id, metric, scale)
    )
    try:
        scaled = run_values(grid, values, seeds, scale)  # once, for the families and the page
        family_p = _family_p_values(
            session=session,
            experiment=experiment,
            metric=metric,
            grid=grid,
            runs=values,
            seeds=seeds,
            scale=scale,
            target_ratio=target_ratio,
            n_completed=len(rows),
            store=store,
            values=scaled,
        )
        stats = experiment_stats(
            metric=metric,
            grid=grid,
            runs=values,
            seeds=seeds,
            factor=factor,
            offset=offset,
            limit=limit,
            pooled=pooled,
            bounds=trainer.metric_bounds.get(metric),
            test_set_sizes=sizes if any(s is not None for s in sizes) else None,
            scale=scale,
            target_ratio=target_ratio,
            family_p=family_p,
            store=store,
            values=scaled,
        )
    except ScaleError as error:
        raise SpecError.query("scale", f"metric {metric!r}: {error}") from None
    _attach_runs(stats, kept)
    _warn_of_mixed_task_sizes(stats, kept)
    attach_confounds(experiment.stored_spec, grid, stats.comparisons)
    if SOURCE_FACTOR in grid:
        stats.source_decomposition = source_decomposition(grid, values)
    stats.n_completed = len(rows)
    interim = bool(experiment.deciding)
    stats.interim, stats.interim_note = interim, INTERIM_NOTE if interim else None
    stats.computed_at = utcnow()
    payload = stats.model_dump_json()
    try:
        if store is not None:
            store.flush(prune=False)
        _store(session, experiment.id, metric, page, len(rows), payload)
    except Exception:  # the answer stands; the next request computes it again
        session.rollback()
        log.exception("could not store the statistics of experiment %s", experiment.id)
    return payload


def _family_p_values(
    *,
    session: Session,
    experiment: Experiment,
    metric: str,
    grid: dict[str, list[Any]],
    runs: list[tuple[Any, str, float]],
    seeds: list[int],
    scale: str,
    target_ratio: float,
    n_completed: int,
    store: StoredResults | None,
    values: RunValues,
) -> FamilyPValues:
    """The stored Holm families of these runs (`n_completed` of them), or computed (by one
    viewer of this process at a time) and stored; a light experiment's (LIGHT_*), computed in
    milliseconds, are not stored (a second row written and read for every page of a small
    experiment cost the load test a fifth of its throughput)."""
    assert experiment.id is not None
    if is_light(grid, n_completed):
        return family_p_values(
            grid=grid,
            runs=runs,
            seeds=seeds,
            scale=scale,
            target_ratio=target_ratio,
            values=values,
        )
    page = f"{FAMILIES_PAGE}{scale}"
    stored = _stored(session, experiment, metric, page, n_completed)
    if stored is None:
        with page_lock(experiment.id, metric, page):
            stored = _stored(session, experiment, metric, page, n_completed)
            if stored is None:
                family_p = family_p_values(
                    grid=grid,
                    runs=runs,
                    seeds=seeds,
                    scale=scale,
                    target_ratio=target_ratio,
                    store=store,
                    values=values,
                )
                try:
                    if store is not None:  # every analysed comparison: prune the rest
                        store.flush(prune=True)
                    _store(
                        session,
                        experiment.id,
                        metric,
                        page,
                        n_completed,
                        _encode_families(family_p),
                    )
                except Exception:  # the page stands; the next one computes them again
                    session.rollback()
                    log.exception(
                        "could not store the Holm families of experiment %s", experiment.id
                    )
                return family_p
    return _decode_families(stored)


class StoredResults:
    """The database as service.analysis.variance's ResultStore for one experiment, metric and
    scale: comparison results that this process does not hold (a restart, another replica)
    are read from ComparisonResult instead of computed, and every result a computation used
    that is not stored yet is written there on flush(), so that one more completed run costs
    only the comparisons whose cells it joined. Only experiments past LIGHT_* use it (a small
    one computes in milliseconds)."""

    def __init__(self, session: Session, experiment_id: int, metric: str, scale: str) -> None:
        self.session = session
        self.experiment_id = experiment_id
        # STATS_FORMAT: results of an earlier version of the statistics are not served
        self.prefix = f"{STATS_FORMAT}|{scale}|{metric}|"
        self.used: set[bytes] = set()
        self.pending: dict[bytes, dict[str, Any]] = {}
        self._stored: set[bytes] | None = None

    def _mine(self) -> Any:
        return col(ComparisonResult.experiment_id) == self.experiment_id

    def stored(self) -> set[bytes]:
        """The digests stored for this experiment, metric and scale (read once)."""
        if self._stored is None:
            self._stored = {
                bytes.fromhex(digest[len(self.prefix) :])
                for (digest,) in self.session.execute(
                    select(col(ComparisonResult.digest)).where(
                        self._mine(),
                        col(ComparisonResult.digest).startswith(self.prefix, autoescape=True),
                    )
                )
            }
        return self._stored

    def load(self, keys: Sequence[bytes]) -> dict[bytes, dict[str, Any]]:
        stored = self.stored()
        wanted = [self.prefix + k.hex() for k in keys if k in stored]
        found: dict[bytes, dict[str, Any]] = {}
        for start in range(0, len(wanted), RESULTS_BATCH):
            rows = self.session.execute(
                select(col(ComparisonResult.digest), col(ComparisonResult.payload)).where(
                    self._mine(),
                    col(ComparisonResult.digest).in_(wanted[start : start + RESULTS_BATCH]),
                )
            ).all()
            for digest, payload in rows:
                found[bytes.fromhex(digest[len(self.prefix) :])] = json.loads(payload)
        return found

    def keep(self, results: dict[bytes, dict[str, Any]]) -> None:
        self.used.update(results)
        stored = self.stored()
        self.pending.update((k, r) for k, r in results.items() if k not in stored)

    def flush(self, prune: bool) -> None:
        """Write the results used since the last flush that are not stored (another replica
        may have written some meanwhile: those stay), in the caller's transaction. `prune`:
        the computation used every comparison of the experiment's analysed families, so the
        stored results of this metric and scale it did not use (their cells changed since)
        are removed, with any of an earlier format."""
        rows = [
            {
                "experiment_id": self.experiment_id,
                "digest": self.prefix + k.hex(),
                "payload": _json(r),
            }
            for k, r in self.pending.items()
        ]
        dialect = postgresql if self.session.get_bind().dialect.name == "postgresql" else sqlite
        for start in range(0, len(rows), RESULTS_BATCH):
            self.session.execute(
                dialect.insert(ComparisonResult)
                .values(rows[start : start + RESULTS_BATCH])
                .on_conflict_do_nothing(index_elements=["experiment_id", "digest"])
            )
        stored = self.stored()
        stored.update(self.pending)
        self.pending = {}
        if not prune:
            return
        unused = stored - self.used
        stale = [self.prefix + k.hex() for k in unused]
        for start in range(0, len(stale), RESULTS_BATCH):
            self.session.execute(
                delete(ComparisonResult).where(
                    self._mine(),
                    col(ComparisonResult.digest).in_(stale[start : start + RESULTS_BATCH]),
                )
            )
        stored -= unused
        self.session.execute(
            delete(ComparisonResult).where(
                self._mine(),
                ~col(ComparisonResult.digest).startswith(f"{STATS_FORMAT}|", autoescape=True),
            )
        )


def _json(result: dict[str, Any]) -> str:
    """A comparison result as JSON (numpy scalars as Python numbers)."""
    return json.dumps(result, default=lambda v: v.item() if isinstance(v, np.generic) else v)


def _encode_families(family_p: FamilyPValues) -> str:
    # float64 bytes in base64: exact, and about half the size of the numbers as JSON text
    return json.dumps(
        {
            f: {
                test: base64.b64encode(p.astype("<f8").tobytes()).decode("ascii")
                for test, p in tests.items()
            }
            for f, tests in family_p.items()
        }
    )


def _decode_families(payload: str) -> FamilyPValues:
    return {
        f: {
            test: np.frombuffer(base64.b64decode(p), dtype="<f8").copy()
            for test, p in tests.items()
        }
        for f, tests in json.loads(payload).items()
    }


def _attach_runs(stats: Stats, kept: Sequence[tuple[Row[Any], float]]) -> None:
    """Each condition's values again with the run id and seed behind each one, in the order of
    `values` (both follow the runs' order), so that a client can tell which seed gave what."""
    by_key: dict[str, list[RunValue]] = {}
    for row, value in kept:
        by_key.setdefault(row.condition_key, []).append(
            RunValue(run_id=row.id, seed=row.seed, value=value)
        )
    for condition in stats.conditions:
        condition.runs = by_key.get(condition.condition_key, [])


def task_size_note(sizes: set[int]) -> str:
    """The warning of values that came from seed-batched tasks of different sizes."""
    listed = ", ".join(str(k) for k in sorted(sizes))
    return (
        f"pools runs from tasks of {listed} seeds (resources.seeds_per_task and the last, "
        "smaller task): a seed's value depends on its task's size as it does on its thread "
        "count (another valid draw of the seed, from the same distribution: docs/design-notes.md, "
        '"seed-batched tasks and float32 rounding"), so one seed may differ between such runs'
    )


def _warn_of_mixed_task_sizes(stats: Stats, kept: Sequence[tuple[Row[Any], float]]) -> None:
    """Say where a condition's values, or a comparison's two sides, come from seed-batched
    tasks of more than one size (each run's provenance `task_size`; a run without one, say an
    imported run, is left out)."""
    sizes: dict[str, set[int]] = {}
    for row, _ in kept:
        size = (row.provenance or {}).get("task_size")
        if isinstance(size, int) and not isinstance(size, bool):
            sizes.setdefault(row.condition_key, set()).add(size)
    if len({k for each in sizes.values() for k in each}) < 2:
        return
    for condition in stats.conditions:
        mine = sizes.get(condition.condition_key, set())
        if len(mine) > 1:
            condition.warnings.append(task_size_note(mine))
    for comparison in stats.comparisons:
        within = comparison.within or {}
        sides: set[int] = set()
        for condition in stats.conditions:
            values = condition.condition
            if values.get(comparison.factor) in (comparison.a, comparison.b) and all(
                values.get(f) == v for f, v in within.items()
            ):
                sides |= sizes.get(condition.condition_key, set())
        if len(sides) > 1:
            comparison.warnings.append(task_size_note(sides))


def _store(
    session: Session, experiment_id: int, metric: str, page: str, n_completed: int, payload: str
) -> None:
    """Insert or replace the stored page (two replicas may compute it at once), then drop the
    experiment's least recently computed pages past MAX_STORED_PAGES."""
    values = {
        "experiment_id": experiment_id,
        "metric": metric,
        "page": page,
        "n_completed": n_completed,
        "payload": payload,
        "computed_at": utcnow(),
    }
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(StatsCache).values(**values)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["experiment_id", "metric", "page"],
            set_={k: statement.excluded[k] for k in ("n_completed", "payload", "computed_at")},
        )
    )
    families = col(StatsCache.page).startswith(FAMILIES_PAGE)
    keep = (
        select(col(StatsCache.id))
        .where(col(StatsCache.experiment_id) == experiment_id, ~families)
        .order_by(col(StatsCache.computed_at).desc(), col(StatsCache.id).desc())
        .limit(MAX_STORED_PAGES)
    )
    session.execute(
        delete(StatsCache).where(
            col(StatsCache.experiment_id) == experiment_id,
            ~families,
            col(StatsCache.id).not_in(keep.scalar_subquery()),
        )
    )
    session.commit()
