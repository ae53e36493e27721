"""Imported per-seed results stored as an experiment (POST /experiments/import), or added to one
an earlier import made (POST /experiments/{id}/import), in one transaction through the runs
store: every row is checked first, and a refusal stores nothing.

A new experiment's factors that hold one value in every row are its base config (as a spec's
`config`), the others its grid (levels in the order they first appear); its spec records the
metrics (`imported`), the primary one (`metric`) and the seeds. A later import adds runs of
the experiment's conditions: the same factors and metrics, levels of its grid, its config's
values, and (condition, seed) pairs it does not hold yet.
"""

from __future__ import annotations

from typing import Any

import pydantic
from sqlmodel import Session, col, select

from api_schemas import (
    IMPORTED_TRAINER,
    MAX_GRID_AXES,
    MAX_GRID_LEVELS,
    ExperimentImport,
    ExperimentImported,
    ExperimentSpec,
    ImportedResults,
    level_key,
)
from service.errors import Conflict, NotFound, SpecError, body_error
from service.experiments.import_tables import ImportedRow, ImportTable, Problems, read_import
from service.scheduling.run_store import RunStore
from service.settings import Settings
from service.specs import condition_key
from service.storage.db import Experiment, Run
from service.storage.lookup import get_experiment


def import_results(
    *,
    session: Session,
    request: ExperimentImport,
    settings: Settings,
    experiment_id: int | None = None,
) -> ExperimentImported:
    """Store the import as a new ended experiment, or (`experiment_id`) add its runs to an
    imported experiment; SpecError (422) naming the row and column of every problem, Conflict
    (409) for an experiment a trainer ran, NotFound (404) for none."""
    store = RunStore(session)
    existing: Experiment | None = None
    if experiment_id is not None:
        existing = get_experiment(session=session, experiment_id=experiment_id)
        # Held until the commit: a concurrent import reads the runs this one adds.
        store.lock_experiments([experiment_id])
        session.refresh(existing)
        if existing.deleted:
            raise NotFound(f"experiment {experiment_id} not found")
        if existing.trainer != IMPORTED_TRAINER:
            raise Conflict(
                f"experiment {experiment_id} ran trainer {existing.trainer!r}: only an "
                "imported experiment takes imported runs (add seeds to this one with POST "
                f"/experiments/{experiment_id}/seeds)"
            )
    elif request.name is None:
        raise SpecError([body_error(["name"], "a new experiment needs a name")])
    table = read_import(request)
    if existing is None:
        spec = _new_spec(request, table)
        held: dict[tuple[str, int], str] = {}
        conditions: set[str] = set()
    else:
        spec = _checked_against(existing, request, table)
        held = _held_runs(session, existing)
        conditions = {key for key, _ in held}
    rows = _runs(table, spec, held)
    total = (existing.n_runs if existing is not None else 0) + len(rows)
    if total > settings.max_runs_per_experiment:
        raise SpecError(
            [
                body_error(
                    ["runs" if request.runs is not None else "csv"],
                    f"{total:,} runs, over the limit of {settings.max_runs_per_experiment:,} "
                    "runs per experiment (SEEDGRID_MAX_RUNS_PER_EXPERIMENT)",
                )
            ]
        )
    seeds = sorted({row["seed"] for row in rows})
    spec.seeds = sorted(set(spec.seed_list() if existing is not None else []) | set(seeds))
    n_conditions = len(conditions | {row["condition_key"] for row in rows})
    if existing is None:
        experiment = Experiment(
            name=spec.name,
            trainer=IMPORTED_TRAINER,
            spec=spec.model_dump(mode="json"),
            metric=table.metric,
            n_conditions=n_conditions,
            curve_names=[],  # imported results carry no curves
            n_runs=0,
        )
        session.add(experiment)
        session.flush()
    else:
        experiment = existing
        experiment.spec = spec.model_dump(mode="json")
        experiment.n_conditions = n_conditions
        session.flush()
    store.add_imported_runs(experiment, rows)
    store.commit()
    session.refresh(experiment)
    assert experiment.id is not None and spec.imported is not None
    return ExperimentImported(
        id=experiment.id,
        name=experiment.name,
        trainer=experiment.trainer,
        status=experiment.status,
        n_conditions=experiment.n_conditions,
        n_runs=experiment.n_runs,
        runs_added=len(rows),
        seeds=seeds,
        source=table.source,
        factors=list(spec.grid),
        metrics=list(spec.imported.metrics),
        metric=experiment.metric,
        ignored_columns=table.ignored,
    )


def _new_spec(request: ExperimentImport, table: ImportTable) -> ExperimentSpec:
    """The spec of a new imported experiment: factors with one value in every row as its
    config, the others as its grid."""
    problems = Problems()
    levels: dict[str, dict[str, Any]] = {f: {} for f in table.factors}
    for row in table.rows:
        for factor, value in row.factors.items():
            levels[factor].setdefault(level_key(value), value)
    config = {f: next(iter(seen.values())) for f, seen in levels.items() if len(seen) == 1}
    grid = {f: list(seen.values()) for f, seen in levels.items() if len(seen) > 1}
    if len(grid) > MAX_GRID_AXES:
        problems.add(
            _where(request, "header"),
            f"{len(grid)} factors vary ({', '.join(list(grid)[:10])} ...), over {MAX_GRID_AXES}",
        )
    for factor, values in grid.items():
        if len(values) > MAX_GRID_LEVELS:
            problems.add(
                _where(request, table.column(factor)),
                f"column {table.column(factor)!r} has {len(values):,} levels, over "
                f"{MAX_GRID_LEVELS:,}",
            )
    problems.raise_any()
    try:
        return ExperimentSpec(
            name=request.name or "",
            trainer=IMPORTED_TRAINER,
            config=config,
            grid=grid,
            seeds=sorted({row.seed for row in table.rows}),
            metric=table.metric,
            imported=ImportedResults(metrics=table.metrics, source=table.source),
        )
    except pydantic.ValidationError as exc:
        raise SpecError(
            [
                body_error(_where(request, *map(str, e["loc"])), e["msg"], e["type"])
                for e in exc.errors(include_url=False, include_context=False)[:20]
            ]
        ) from None


def _checked_against(
    experiment: Experiment, request: ExperimentImport, table: ImportTable
) -> ExperimentSpec:
    """The experiment's spec, after checking that the import's factors, levels and metrics
    are the experiment's."""
    spec = experiment.stored_spec
    assert spec.imported is not None
    problems = Problems()
    if request.name is not None and request.name != experiment.name:
        problems.add(
            ["name"],
            f"experiment {experiment.id} is named {experiment.name!r}; leave name out to add "
            "runs to it",
        )
    if request.metric is not None and request.metric != experiment.metric:
        problems.add(
            ["metric"],
            f"experiment {experiment.id}'s primary metric is {experiment.metric!r}; it stays",
        )
    known = [*spec.grid, *spec.config]
    for name, have, want in (
        ("factor", table.factors, known),
        ("metric", table.metrics, spec.imported.metrics),
    ):
        for missing in [n for n in want if n not in have]:
            problems.add(
                _where(request, "header"),
                f"no {name} {missing!r}: experiment {experiment.id} has the {name}s "
                f"{', '.join(want) or 'none'}",
            )
        for extra in [n for n in have if n not in want]:
            problems.add(
                _where(request, table.column(extra)),
                f"{name} {extra!r} is not one of experiment {experiment.id}'s {name}s "
                f"({', '.join(want) or 'none'})",
            )
    problems.raise_any()
    grid_levels = {f: {level_key(v) for v in levels} for f, levels in spec.grid.items()}
    for row in table.rows:
        for factor, value in row.factors.items():
            column = table.column(factor)
            if factor in spec.config and level_key(value) != level_key(spec.config[factor]):
                problems.add(
                    [*row.loc, column],
                    f"{row.label}, column {column!r}: {value!r}, but every run of experiment "
                    f"{experiment.id} has {spec.config[factor]!r}; an import adds seeds to "
                    "the experiment's conditions",
                )
            elif factor in grid_levels and level_key(value) not in grid_levels[factor]:
                problems.add(
                    [*row.loc, column],
                    f"{row.label}, column {column!r}: {value!r} is not one of experiment "
                    f"{experiment.id}'s levels {spec.grid[factor]}; an import adds seeds to "
                    "the experiment's conditions",
                )
    problems.raise_any()
    return spec


def _held_runs(session: Session, experiment: Experiment) -> dict[tuple[str, int], str]:
    pairs = session.exec(
        select(col(Run.condition_key), col(Run.seed)).where(col(Run.experiment_id) == experiment.id)
    ).all()
    return {(key, seed): f"experiment {experiment.id}" for key, seed in pairs}


def _runs(
    table: ImportTable, spec: ExperimentSpec, held: dict[tuple[str, int], str]
) -> list[dict[str, Any]]:
    """The rows to insert, each (condition, seed) once: one the experiment holds already, or
    one an earlier row of this import gave, is refused naming both."""
    problems = Problems()
    seen = dict(held)
    rows = []
    for row in table.rows:
        condition = {f: row.factors[f] for f in spec.grid}
        key = condition_key(condition)
        if (key, row.seed) in seen:
            problems.add(
                [*row.loc, table.seed_column],
                f"{row.label}, column {table.seed_column!r}: condition "
                f"{key or '(the only one)'} seed {row.seed} is in "
                f"{seen[(key, row.seed)]} already; each (condition, seed) is one run",
            )
            continue
        seen[(key, row.seed)] = row.label
        rows.append(_run_row(row, key, condition, spec))
    problems.raise_any()
    return rows


def _run_row(
    row: ImportedRow, key: str, condition: dict[str, Any], spec: ExperimentSpec
) -> dict[str, Any]:
    assert spec.imported is not None
    return {
        "condition_key": key,
        "condition": condition,
        "seed": row.seed,
        "metrics": row.metrics,
        "provenance": {"imported": {"source": spec.imported.source, "from": row.label}},
    }


def _where(request: ExperimentImport, *rest: str) -> list[Any]:
    return ["runs" if request.runs is not None else "csv", *rest]
