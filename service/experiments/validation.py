"""A submitted spec checked against its trainer and the operator's limits, before anything is
stored: every problem found is listed, each naming its field."""

from __future__ import annotations

import math
from typing import Any

import pydantic

from api_schemas import (
    IMPORTED_TRAINER,
    SOURCE_FACTOR,
    SOURCE_LEVELS,
    ExperimentSpec,
    level_key,
)
from api_schemas.adaptive import NamedComparison
from service.errors import (
    MAX_ERRORS_SHOWN,
    SpecError,
    body_error,
)
from service.settings import Settings
from service.specs import (
    Refusals,
    condition_key,
    grid_conditions,
    merged_config,
    seeds_per_task,
    stats_grid,
    unknown_field,
    unknown_metric,
)
from trainers import REGISTRY, Trainer

# Where a trainer of a researcher's own code comes from: what to do when this service lacks it.
NOT_LOADED_HINT = (
    " (a trainer of your own code is loaded from its file: start the service with "
    "`seedgrid serve --trainers FILE`, or run it with `seedgrid run SPEC --trainers FILE`)"
)


def _config_errors(trainer: Trainer, config: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The errors of the spec's config, an unknown field's message made to guide, and how
    many unknown fields are left out past the MAX_ERRORS_SHOWN a response lists (a 0.99 MB
    config of 90,000 unknown keys took 6.9 s when each got its error, its fuzzy match over the
    fields and a place in a 25.7 MB answer)."""
    fields = trainer.Config.model_fields
    unknown = [key for key in config if key not in fields]
    errors = [
        body_error(["config", key], unknown_field(trainer, key), "extra_forbidden")
        for key in unknown[:MAX_ERRORS_SHOWN]
    ]
    try:  # the known fields' values, once the unknown ones are out of the way
        trainer.Config.model_validate({k: v for k, v in config.items() if k in fields})
    except pydantic.ValidationError as exc:
        errors += [
            body_error(["config", *err["loc"]], err["msg"], err["type"])
            for err in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
    return errors, max(0, len(unknown) - MAX_ERRORS_SHOWN)


def _named_comparison_errors(
    named: NamedComparison, grid: dict[str, list[Any]], loc: list[str]
) -> list[dict[str, Any]]:
    """A named comparison must be one /stats serves: two different levels of a grid factor,
    within levels of all the other factors or pooled over them."""
    if named.factor not in grid:
        return [
            body_error(
                [*loc, "factor"],
                f"{named.factor!r} is not a factor of the grid; its "
                f"factors: {', '.join(grid) or 'none'}",
            )
        ]
    errors = []
    levels = {level_key(v) for v in grid[named.factor]}
    for side in ("a", "b"):
        if level_key(getattr(named, side)) not in levels:
            errors.append(
                body_error(
                    [*loc, side],
                    f"{getattr(named, side)!r} is not a level of "
                    f"{named.factor!r}: {grid[named.factor]}",
                )
            )
    if level_key(named.a) == level_key(named.b):
        errors.append(body_error([*loc, "b"], "a and b must be different levels"))
    if named.within is not None:
        others = [f for f in grid if f != named.factor]
        if sorted(named.within) != sorted(others):
            errors.append(
                body_error(
                    [*loc, "within"],
                    f"within must give a level of each other "
                    f"factor ({', '.join(others) or 'none'}), or be null to pool "
                    "over them",
                )
            )
        else:
            errors += [
                body_error([*loc, "within", f], f"{v!r} is not a level of {f!r}: {grid[f]}")
                for f, v in named.within.items()
                if level_key(v) not in {level_key(x) for x in grid[f]}
            ]
    return errors


def validate_spec(
    spec: ExperimentSpec, *, settings: Settings
) -> tuple[Trainer, list[dict[str, Any]]]:
    """Check the spec against its trainer and the operator's limits; return the trainer and
    the conditions in grid order (each once per level of the reserved factor varying_source
    when the spec asks for a source decomposition: service.analysis.sources)."""
    if spec.trainer == IMPORTED_TRAINER or spec.imported is not None:
        raise SpecError(
            [
                body_error(
                    ["trainer" if spec.trainer == IMPORTED_TRAINER else "imported"],
                    f"trainer {IMPORTED_TRAINER!r} holds results imported from elsewhere and "
                    "runs nothing: import them with POST /experiments/import",
                )
            ]
        )
    trainer = REGISTRY.get(spec.trainer)
    if trainer is None:
        raise SpecError(
            [
                body_error(
                    ["trainer"],
                    f"unknown trainer {spec.trainer!r}; available: "
                    f"{', '.join(sorted(REGISTRY))}{NOT_LOADED_HINT}",
                )
            ]
        )
    fields = trainer.Config.model_fields
    errors, unlisted = _config_errors(trainer, spec.config)
    errors += _source_errors(spec)
    # Each level is checked with the config's known fields only: its unknown ones are reported
    # once above, not again per level.
    known = {k: v for k, v in spec.config.items() if k in fields}
    for field, levels in spec.grid.items():
        if field == SOURCE_FACTOR:
            continue  # refused by _source_errors
        if field not in fields:
            errors.append(
                body_error(["grid", field], unknown_field(trainer, field), "extra_forbidden")
            )
            continue
        for i, level in enumerate(levels):
            try:
                trainer.Config.model_validate({**known, field: level})
            except pydantic.ValidationError as exc:
                errors += [
                    body_error(["grid", field, i], e["msg"], e["type"])
                    for e in exc.errors(include_url=False, include_context=False)
                    if tuple(e["loc"][:1]) in {(field,), ()}
                ]
    if spec.metric is not None and (problem := unknown_metric(trainer, spec.metric)):
        errors.append(body_error(["metric"], problem))
    if spec.adaptive is not None:
        errors += _named_comparison_errors(
            spec.adaptive.comparison, stats_grid(spec), ["adaptive", "comparison"]
        )
    errors += _stop_check_errors(trainer, spec.stop_on_checks)
    errors += _seeds_per_task_errors(trainer, spec)
    if errors:
        raise SpecError(errors, unlisted)

    n_conditions = math.prod(len(v) for v in spec.grid.values())
    if spec.decompose_sources:
        n_conditions *= len(SOURCE_LEVELS)
    seeds = spec.adaptive.max_seeds if spec.adaptive else len(spec.seed_list())
    n_runs = n_conditions * seeds
    max_runs = settings.max_runs_per_experiment
    if n_runs > max_runs:
        where = ["adaptive", "max_seeds"] if spec.adaptive else ["grid"]
        at_most = " at most" if spec.adaptive else ""
        raise SpecError(
            [
                body_error(
                    where,
                    f"{n_conditions} conditions x{at_most} {seeds} seeds = "
                    f"{n_runs} runs, over the limit of {max_runs} "
                    "(SEEDGRID_MAX_RUNS_PER_EXPERIMENT)",
                )
            ]
        )
    conditions = grid_conditions(spec.grid)
    refusals = Refusals(spec)
    for condition in conditions:
        try:
            config = trainer.Config.model_validate(merged_config(spec.config, condition))
        except pydantic.ValidationError as exc:
            errors += [
                body_error(["grid"], f"condition {condition_key(condition)}: {e['msg']}")
                for e in exc.errors(include_url=False)
            ]
            continue
        _check_operator_limits(
            trainer, config, condition, settings, refusals, seeds_per_task(trainer, spec)
        )
    errors += refusals.errors()
    if errors:
        raise SpecError(errors)
    if spec.decompose_sources:
        conditions = grid_conditions(stats_grid(spec))
    return trainer, conditions


def _source_errors(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """What the spec's random-source fields cannot mean (service.analysis.sources)."""
    errors = []
    if SOURCE_FACTOR in spec.grid:
        errors.append(
            body_error(
                ["grid", SOURCE_FACTOR],
                f"{SOURCE_FACTOR!r} is reserved for the "
                "source decomposition: ask for it with decompose_sources: true",
            )
        )
    if spec.decompose_sources:
        if spec.seed_sources:
            errors.append(
                body_error(
                    ["seed_sources"],
                    "seed_sources cannot be combined with "
                    "decompose_sources: the decomposition pins the sources itself "
                    "(to the first seed)",
                )
            )
        if len(spec.seed_list()) < 2:
            errors.append(
                body_error(
                    ["seeds"],
                    "decompose_sources needs at least 2 seeds: a "
                    "source's variance over one seed is undefined",
                )
            )
    return errors


def _seeds_per_task_errors(trainer: Trainer, spec: ExperimentSpec) -> list[dict[str, Any]]:
    asked = spec.resources.seeds_per_task
    if asked is None or asked <= trainer.max_seeds_per_task:
        return []
    return [
        body_error(
            ["resources", "seeds_per_task"],
            f"trainer {trainer.name!r} runs at most "
            f"{trainer.max_seeds_per_task} seeds per task, not {asked}",
        )
    ]


def _stop_check_errors(trainer: Trainer, names: list[str]) -> list[dict[str, Any]]:
    """Each name in stop_on_checks that is not a check the trainer can stop on."""
    if not trainer.stop_checks:
        return [
            body_error(
                ["stop_on_checks", i],
                f"trainer {trainer.name!r} has no checks a run "
                "can stop on; leave stop_on_checks out",
            )
            for i in range(len(names))
        ]
    return [
        body_error(
            ["stop_on_checks", i],
            f"unknown check {name!r} of trainer "
            f"{trainer.name!r}; a run can stop on: {', '.join(trainer.stop_checks)}",
        )
        for i, name in enumerate(names)
        if name not in trainer.stop_checks
    ]


def _check_operator_limits(
    trainer: Trainer,
    config: Any,
    condition: dict[str, Any],
    settings: Settings,
    refusals: Refusals,
    per_task: int = 1,
) -> None:
    """What the operator allows a run: which data roots, downloads, memory, logged points.
    `per_task`: the seeds one task runs; they share its process, so its memory is theirs
    together (an upper bound: the data is loaded once)."""
    root = getattr(config, "data_root", None)
    if root is not None and root not in settings.data_root_names:
        configured = ", ".join(settings.data_root_names) or "none are configured"
        refusals.add(
            "data_root",
            "data_root",
            f"data root {root!r} is not one of this service's named data roots "
            f"(SEEDGRID_DATA_ROOTS: {configured}); leave data_root out for the default "
            "root",
            condition,
        )
    if getattr(config, "download", False) and not settings.allow_download:
        refusals.add(
            "download",
            "download",
            "download: true is refused: downloads are off on this service (the "
            "operator allows them with SEEDGRID_ALLOW_DOWNLOAD=true); the operator puts "
            "the dataset's files under the data root instead",
            condition,
        )
    estimate = trainer.estimate(config)
    limit_bytes = settings.max_run_memory_gb * 1e9
    if estimate.memory_bytes * per_task > limit_bytes:
        fields = ", ".join(estimate.memory_fields)
        what = (
            "one run needs"
            if per_task == 1
            else (f"one task of {per_task} seeds (resources.seeds_per_task) needs {per_task} x")
        )
        refusals.add(
            "memory",
            refusals.named(estimate.memory_fields),
            f"{what} about {estimate.memory_bytes / 1e9:,.1f} GB (estimated from "
            f"{fields}), over SEEDGRID_MAX_RUN_MEMORY_GB={settings.max_run_memory_gb:g}",
            condition,
        )
    if estimate.logged_points > settings.max_points_per_run:
        fields = ", ".join(estimate.points_fields)
        refusals.add(
            "points",
            refusals.named(estimate.points_fields),
            f"one run would log {estimate.logged_points:,} metric points (from "
            f"{fields}), over SEEDGRID_MAX_POINTS_PER_RUN="
            f"{settings.max_points_per_run:,}",
            condition,
        )
