"""Experiment logic: validate and expand a spec, store it, cancel it, read it back."""

from __future__ import annotations

import difflib
import itertools
import json
import math
from typing import TYPE_CHECKING, Any

import pydantic
from sqlalchemy import func, text
from sqlmodel import Session, col, select

from api_schemas import (
    MAX_SEED,
    SOURCE_FACTOR,
    SOURCE_LEVELS,
    AdaptiveState,
    AddSeeds,
    AttemptOut,
    ExperimentDetail,
    ExperimentSpec,
    ExperimentStatus,
    ExperimentSummary,
    RunDetail,
    RunOut,
    RunStatus,
    RunStop,
    SeedsAdded,
    level_key,
)
from api_schemas.adaptive import NamedComparison
from service.analysis.sources import config_condition, experiment_grid
from service.analysis.stats import metric_value
from service.api.security import MAX_ERRORS_SHOWN
from service.scheduling.run_store import STOPPED_RUN_PREFIX, RunStore, experiment_counts
from service.settings import Settings
from service.storage.db import Experiment, Run, RunAttempt
from trainers import REGISTRY, Trainer

if TYPE_CHECKING:
    from service.scheduling.preflight import ClusterPreflight

# Any fixed 64-bit number: the PostgreSQL advisory lock submissions take to count the queue.
SUBMIT_LOCK_KEY = 0x5EED_6121_D000_0003


class SpecError(Exception):
    """Invalid input the request model alone could not see; rendered as a 422 like pydantic's.
    `unlisted`: how many more problems there are than `errors` lists (counted, not built)."""

    def __init__(self, errors: list[dict[str, Any]], unlisted: int = 0) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
                         + (f"; and {unlisted} more" if unlisted else ""))
        self.errors = errors
        self.unlisted = unlisted

    @classmethod
    def query(cls, field: str, message: str) -> SpecError:
        """A 422 naming one query parameter."""
        return cls([{"loc": ["query", field], "msg": message, "type": "value_error"}])


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


def _error(loc: list[Any], msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": kind}


def format_level(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def condition_key(condition: dict[str, Any]) -> str:
    """Canonical `field=value,field=value` string, fields sorted."""
    return ",".join(f"{k}={format_level(condition[k])}" for k in sorted(condition))


def unknown_metric(trainer: Trainer, metric: str) -> str | None:
    """Why `metric` is not one the statistics can compare, or None. A diagnostic is refused
    too: it is stored per run (GET /runs/{id}), not in the final metrics the statistics read,
    so asking for one would give empty tables."""
    if metric in trainer.metrics:
        return None
    known = f"known metrics: {', '.join(trainer.metrics)}"
    if metric in trainer.diagnostics:
        return (f"{metric!r} is a diagnostic of trainer {trainer.name!r} (shown per run, in "
                f"GET /runs/{{id}}), not a metric the statistics compare; {known}")
    close = difflib.get_close_matches(metric, trainer.metrics, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    only_diagnostics = [d for d in trainer.diagnostics if d not in trainer.metrics]
    diagnostics = (f"; diagnostics (per run, not compared): {', '.join(only_diagnostics)}"
                   if only_diagnostics else "")
    return f"unknown metric {metric!r} of trainer {trainer.name!r}{hint}; {known}{diagnostics}"


def unknown_field(trainer: Trainer, field: str) -> str:
    """The message for a config field the trainer does not have: the closest valid name (a
    typo is the usual cause) and every valid one."""
    fields = list(trainer.Config.model_fields)
    close = difflib.get_close_matches(field, fields, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"unknown config field {field!r} of trainer {trainer.name!r}{hint}; valid fields: "
            f"{', '.join(fields)}")


def _config_errors(trainer: Trainer, config: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The errors of the spec's config, an unknown field's message made to guide, and how
    many unknown fields are left out past the MAX_ERRORS_SHOWN a response lists (a 0.99 MB
    config of 90,000 unknown keys took 6.9 s when each got its error, its fuzzy match over the
    fields and a place in a 25.7 MB answer)."""
    fields = trainer.Config.model_fields
    unknown = [key for key in config if key not in fields]
    errors = [_error(["config", key], unknown_field(trainer, key), "extra_forbidden")
              for key in unknown[:MAX_ERRORS_SHOWN]]
    try:  # the known fields' values, once the unknown ones are out of the way
        trainer.Config.model_validate({k: v for k, v in config.items() if k in fields})
    except pydantic.ValidationError as exc:
        errors += [_error(["config", *err["loc"]], err["msg"], err["type"])
                   for err in exc.errors(include_url=False, include_context=False,
                                         include_input=False)]
    return errors, max(0, len(unknown) - MAX_ERRORS_SHOWN)


def _named_comparison_errors(named: NamedComparison, grid: dict[str, list[Any]],
                             loc: list[str]) -> list[dict[str, Any]]:
    """A named comparison must be one /stats serves: two different levels of a grid factor,
    within levels of all the other factors or pooled over them."""
    if named.factor not in grid:
        return [_error([*loc, "factor"], f"{named.factor!r} is not a factor of the grid; its "
                       f"factors: {', '.join(grid) or 'none'}")]
    errors = []
    levels = {level_key(v) for v in grid[named.factor]}
    for side in ("a", "b"):
        if level_key(getattr(named, side)) not in levels:
            errors.append(_error([*loc, side], f"{getattr(named, side)!r} is not a level of "
                                 f"{named.factor!r}: {grid[named.factor]}"))
    if level_key(named.a) == level_key(named.b):
        errors.append(_error([*loc, "b"], "a and b must be different levels"))
    if named.within is not None:
        others = [f for f in grid if f != named.factor]
        if sorted(named.within) != sorted(others):
            errors.append(_error([*loc, "within"], f"within must give a level of each other "
                                 f"factor ({', '.join(others) or 'none'}), or be null to pool "
                                 "over them"))
        else:
            errors += [_error([*loc, "within", f], f"{v!r} is not a level of {f!r}: {grid[f]}")
                       for f, v in named.within.items()
                       if level_key(v) not in {level_key(x) for x in grid[f]}]
    return errors


def grid_conditions(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The conditions of a grid, in grid order: the cartesian product of its levels."""
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())]


def validate_spec(
    spec: ExperimentSpec, *, settings: Settings
) -> tuple[Trainer, list[dict[str, Any]]]:
    """Check the spec against its trainer and the operator's limits; return the trainer and
    the conditions in grid order (each once per level of the reserved factor varying_source
    when the spec asks for a source decomposition: service.analysis.sources)."""
    trainer = REGISTRY.get(spec.trainer)
    if trainer is None:
        raise SpecError(
            [_error(["trainer"], f"unknown trainer {spec.trainer!r}; available: "
                    f"{', '.join(sorted(REGISTRY))}")]
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
            errors.append(_error(["grid", field], unknown_field(trainer, field),
                                 "extra_forbidden"))
            continue
        for i, level in enumerate(levels):
            try:
                trainer.Config.model_validate({**known, field: level})
            except pydantic.ValidationError as exc:
                errors += [
                    _error(["grid", field, i], e["msg"], e["type"])
                    for e in exc.errors(include_url=False, include_context=False)
                    if tuple(e["loc"][:1]) in {(field,), ()}
                ]
    if spec.metric is not None and (problem := unknown_metric(trainer, spec.metric)):
        errors.append(_error(["metric"], problem))
    if spec.adaptive is not None:
        errors += _named_comparison_errors(spec.adaptive.comparison, stats_grid(spec),
                                           ["adaptive", "comparison"])
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
        field = ["adaptive", "max_seeds"] if spec.adaptive else ["grid"]
        at_most = " at most" if spec.adaptive else ""
        raise SpecError([_error(field, f"{n_conditions} conditions x{at_most} {seeds} seeds = "
                                f"{n_runs} runs, over the limit of {max_runs} "
                                "(SEEDGRID_MAX_RUNS_PER_EXPERIMENT)")])
    conditions = grid_conditions(spec.grid)
    refusals = Refusals(spec)
    for condition in conditions:
        try:
            config = trainer.Config.model_validate({**spec.config, **condition})
        except pydantic.ValidationError as exc:
            errors += [_error(["grid"], f"condition {condition_key(condition)}: {e['msg']}")
                       for e in exc.errors(include_url=False)]
            continue
        _check_operator_limits(trainer, config, condition, settings, refusals,
                               seeds_per_task(trainer, spec))
    errors += refusals.errors()
    if errors:
        raise SpecError(errors)
    if spec.decompose_sources:
        conditions = grid_conditions(stats_grid(spec))
    return trainer, conditions


def stats_grid(spec: ExperimentSpec) -> dict[str, list[Any]]:
    """The grid as the runs and statistics see it: the spec's, and the reserved factor of a
    source decomposition last (service.analysis.sources)."""
    return experiment_grid({"grid": spec.grid, "decompose_sources": spec.decompose_sources})


def _source_errors(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """What the spec's random-source fields cannot mean (service.analysis.sources)."""
    errors = []
    if SOURCE_FACTOR in spec.grid:
        errors.append(_error(["grid", SOURCE_FACTOR], f"{SOURCE_FACTOR!r} is reserved for the "
                             "source decomposition: ask for it with decompose_sources: true"))
    if spec.decompose_sources:
        if spec.seed_sources:
            errors.append(_error(["seed_sources"], "seed_sources cannot be combined with "
                                 "decompose_sources: the decomposition pins the sources itself "
                                 "(to the first seed)"))
        if len(spec.seed_list()) < 2:
            errors.append(_error(["seeds"], "decompose_sources needs at least 2 seeds: a "
                                 "source's variance over one seed is undefined"))
    return errors


def seeds_per_task(trainer: Trainer, spec: ExperimentSpec | dict[str, Any]) -> int:
    """How many seeds of a condition one task runs: the spec's resources.seeds_per_task, else
    the trainer's default (a stored spec is a dict)."""
    if isinstance(spec, dict):
        asked = (spec.get("resources") or {}).get("seeds_per_task")
    else:
        asked = spec.resources.seeds_per_task
    return asked if asked is not None else trainer.seeds_per_task_default


def _seeds_per_task_errors(trainer: Trainer, spec: ExperimentSpec) -> list[dict[str, Any]]:
    asked = spec.resources.seeds_per_task
    if asked is None or asked <= trainer.max_seeds_per_task:
        return []
    return [_error(["resources", "seeds_per_task"], f"trainer {trainer.name!r} runs at most "
                   f"{trainer.max_seeds_per_task} seeds per task, not {asked}")]


def _stop_check_errors(trainer: Trainer, names: list[str]) -> list[dict[str, Any]]:
    """Each name in stop_on_checks that is not a check the trainer can stop on."""
    if not trainer.stop_checks:
        return [_error(["stop_on_checks", i], f"trainer {trainer.name!r} has no checks a run "
                       "can stop on; leave stop_on_checks out") for i in range(len(names))]
    return [_error(["stop_on_checks", i], f"unknown check {name!r} of trainer "
                   f"{trainer.name!r}; a run can stop on: {', '.join(trainer.stop_checks)}")
            for i, name in enumerate(names) if name not in trainer.stop_checks]


class Refusals:
    """Per kind of refusal, the field it names and the conditions it hit (the first few are
    listed in the message, the rest counted), so that a 10,000-condition grid gives one error
    per kind, not 10,000."""

    SHOWN = 3

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self.found: dict[tuple[str, str], tuple[str, list[str]]] = {}

    def named(self, fields: tuple[str, ...]) -> str:
        """The field a refusal is filed under: the first of `fields` that is a grid axis (what
        differs between the conditions), else the first."""
        return next((f for f in fields if f in self.spec.grid), fields[0])

    def add(self, kind: str, field: str, message: str, condition: dict[str, Any]) -> None:
        _, hit = self.found.setdefault((kind, field), (message, []))
        hit.append(condition_key(condition))

    def errors(self) -> list[dict[str, Any]]:
        out = []
        for (_, field), (message, hit) in self.found.items():
            where = ["grid", field] if field in self.spec.grid else ["config", field]
            if self.spec.grid:
                shown = "; ".join(hit[: self.SHOWN])
                more = f" and {len(hit) - self.SHOWN} more" if len(hit) > self.SHOWN else ""
                message = f"{message} (conditions: {shown}{more})"
            out.append(_error(where, message))
        return out


def _check_operator_limits(trainer: Trainer, config: Any, condition: dict[str, Any],
                           settings: Settings, refusals: Refusals, per_task: int = 1) -> None:
    """What the operator allows a run: which data roots, downloads, memory, logged points.
    `per_task`: the seeds one task runs; they share its process, so its memory is theirs
    together (an upper bound: the data is loaded once)."""
    root = getattr(config, "data_root", None)
    if root is not None and root not in settings.data_root_names:
        configured = ", ".join(settings.data_root_names) or "none are configured"
        refusals.add("data_root", "data_root",
                     f"data root {root!r} is not one of this service's named data roots "
                     f"(SEEDGRID_DATA_ROOTS: {configured}); leave data_root out for the default "
                     "root", condition)
    if getattr(config, "download", False) and not settings.allow_download:
        refusals.add("download", "download",
                     "download: true is refused: downloads are off on this service (the "
                     "operator allows them with SEEDGRID_ALLOW_DOWNLOAD=true); the operator puts "
                     "the dataset's files under the data root instead", condition)
    estimate = trainer.estimate(config)
    limit_bytes = settings.max_run_memory_gb * 1e9
    if estimate.memory_bytes * per_task > limit_bytes:
        fields = ", ".join(estimate.memory_fields)
        what = "one run needs" if per_task == 1 else (
            f"one task of {per_task} seeds (resources.seeds_per_task) needs {per_task} x")
        refusals.add("memory", refusals.named(estimate.memory_fields),
                     f"{what} about {estimate.memory_bytes / 1e9:,.1f} GB (estimated from "
                     f"{fields}), over SEEDGRID_MAX_RUN_MEMORY_GB={settings.max_run_memory_gb:g}",
                     condition)
    if estimate.logged_points > settings.max_points_per_run:
        fields = ", ".join(estimate.points_fields)
        refusals.add("points", refusals.named(estimate.points_fields),
                     f"one run would log {estimate.logged_points:,} metric points (from "
                     f"{fields}), over SEEDGRID_MAX_POINTS_PER_RUN="
                     f"{settings.max_points_per_run:,}", condition)


class QueueFull(Exception):
    """Accepting the spec would pass the cap on queued runs: a 429 with Retry-After."""

    RETRY_AFTER_S = 30

    def __init__(self, queued: int, adding: int, cap: int) -> None:
        super().__init__(
            f"the queue holds {queued:,} runs and this spec adds {adding:,}, over the cap of "
            f"{cap:,} queued runs (SEEDGRID_MAX_QUEUED_RUNS); retry when runs have ended")


def create_experiment(*, session: Session, spec: ExperimentSpec, settings: Settings,
                      preflight: ClusterPreflight | None = None) -> Experiment:
    """Validate, check on the cluster (`preflight`: what would fail every run before it
    trains), expand into condition x seed runs and store everything in one transaction.
    The spec's config is stored once, with the experiment; a run stores its condition."""
    trainer, conditions = validate_spec(spec, settings=settings)
    if preflight is not None and (errors := preflight.check(trainer, spec, conditions)):
        raise SpecError(errors)
    seeds = spec.seed_list()
    n_runs = len(conditions) * len(seeds)
    store = RunStore(session)
    queued = count_queue(session, store, n_runs, settings)
    experiment = Experiment(
        name=spec.name,
        trainer=trainer.name,
        spec=spec.model_dump(mode="json"),
        metric=spec.metric or trainer.primary_metric,
        priority=spec.priority,
        n_conditions=len(conditions),
        n_runs=n_runs,
        runs_queued=n_runs,
    )
    if spec.adaptive is not None:
        experiment.adaptive = AdaptiveState.start(spec.adaptive).model_dump(mode="json")
        experiment.deciding = True
    session.add(experiment)
    session.flush()
    store.create_runs(experiment, seed_runs(conditions, seeds), run_defaults(spec))
    recount_queue(session, store, queued, n_runs, settings)
    session.commit()
    session.refresh(experiment)
    return experiment


def seed_runs(conditions: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    return [{"condition_key": condition_key(condition), "condition": condition, "seed": seed}
            for condition in conditions for seed in seeds]


def run_defaults(spec: ExperimentSpec) -> dict[str, Any]:
    """What every run of the spec shares."""
    return {"trainer": spec.trainer, "priority": spec.priority, "max_retries": spec.max_retries,
            "num_cpus": spec.resources.num_cpus, "num_gpus": spec.resources.num_gpus}


def count_queue(session: Session, store: RunStore, adding: int, settings: Settings) -> int:
    """The queued runs now, or QueueFull when `adding` more would pass the cap: every way runs
    enter the queue (a submission, seeds added, an adaptive round) goes through it."""
    if session.get_bind().dialect.name == "postgresql":
        # Submissions count the queue one at a time, or two could each fit under the cap.
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SUBMIT_LOCK_KEY})
    queued = store.queued_runs()
    if queued + adding > settings.max_queued_runs:
        raise QueueFull(queued, adding, settings.max_queued_runs)
    return queued


def recount_queue(session: Session, store: RunStore, queued: int, adding: int,
                   settings: Settings) -> None:
    # On SQLite the insert holds the database's write lock: counted again now, the queue
    # includes every submission that committed meanwhile.
    if store.queued_runs() > settings.max_queued_runs:
        session.rollback()
        raise QueueFull(queued, adding, settings.max_queued_runs)


def add_seeds(*, session: Session, experiment_id: int, request: AddSeeds,
              settings: Settings) -> SeedsAdded:
    """More seeds for every condition of an experiment, queued now; their runs join its
    statistics as they complete. An ended experiment runs again; a cancelled one is a
    Conflict, and so is an adaptive one, stopped or not: its rule decides its seeds, and seeds
    added after its stop would be a look the rule did not count (its alpha would not hold)."""
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    store = RunStore(session)
    # Held until the commit: a concurrent add-seeds reads the seeds this one adds.
    store.lock_experiments([experiment_id])
    session.refresh(experiment)
    if experiment.deleted:
        raise NotFound(f"experiment {experiment_id} not found")
    if experiment.cancel_requested or experiment.status == ExperimentStatus.cancelled:
        raise Conflict(f"experiment {experiment_id} was cancelled: submit a new one")
    if experiment.adaptive is not None:
        raise Conflict(f"experiment {experiment_id} is adaptive: its rule decides its seeds "
                       "(experiment.adaptive), and seeds added by hand, even after it stopped, "
                       "would be a look the rule did not count, so its false-stop rate would "
                       "no longer be its alpha; submit a new experiment for more seeds")
    have = set(session.exec(select(Run.seed).where(Run.experiment_id == experiment_id)
                            .distinct()).all())
    if isinstance(request.seeds, int):
        start = max(have, default=-1) + 1
        seeds = list(range(start, start + request.seeds))
        if seeds[-1] > MAX_SEED:
            raise SpecError([_error(["seeds"], f"the next {request.seeds} seeds after "
                                    f"{start - 1} pass the largest seed, {MAX_SEED}")])
    else:
        seeds = list(request.seeds)
        repeated = sorted(have.intersection(seeds))
        if repeated:
            raise SpecError([_error(["seeds"], f"experiment {experiment_id} has seeds "
                                    f"{repeated[:10]} already")])
    spec = ExperimentSpec.stored(experiment.spec)
    conditions = grid_conditions(stats_grid(spec))
    adding = len(conditions) * len(seeds)
    if experiment.n_runs + adding > settings.max_runs_per_experiment:
        raise SpecError([_error(["seeds"], f"{experiment.n_runs} runs + {len(conditions)} "
                                f"conditions x {len(seeds)} seeds = {experiment.n_runs + adding} "
                                f"runs, over the limit of {settings.max_runs_per_experiment} "
                                "(SEEDGRID_MAX_RUNS_PER_EXPERIMENT)")])
    queued = count_queue(session, store, adding, settings)
    store.add_runs(experiment, seed_runs(conditions, seeds), run_defaults(spec))
    recount_queue(session, store, queued, adding, settings)
    store.commit()
    session.refresh(experiment)
    return SeedsAdded(experiment_id=experiment_id, seeds=seeds, runs_added=adding,
                      n_runs=experiment.n_runs)


def get_experiment(*, session: Session, experiment_id: int) -> Experiment:
    """The experiment; NotFound when there is none or it was deleted (its rows may still be
    being removed: service.scheduling.purge)."""
    experiment = session.get(Experiment, experiment_id)
    if experiment is None or experiment.deleted:
        raise NotFound(f"experiment {experiment_id} not found")
    return experiment


def get_run(*, session: Session, run_id: int) -> Run:
    """The run; NotFound when there is none or its experiment was deleted."""
    run = session.get(Run, run_id)
    if run is None or session.exec(
            select(Experiment.deleted).where(Experiment.id == run.experiment_id)).first():
        raise NotFound(f"run {run_id} not found")
    return run


def cancel_experiment(*, session: Session, experiment_id: int) -> Experiment:
    """Queued runs become cancelled now; pending and running ones are flagged for the
    dispatcher to cancel.

    One rule: only an experiment that is queued or running can be cancelled. One that ended
    (completed, partial, failed) or was cancelled already is a Conflict (409), so a client can tell
    whether its request changed anything.
    """
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    if experiment.cancel_requested or experiment.status == ExperimentStatus.cancelled:
        raise Conflict(f"experiment {experiment_id} was cancelled already")
    if experiment.status in {ExperimentStatus.completed, ExperimentStatus.partial,
                             ExperimentStatus.failed}:
        raise Conflict(f"experiment {experiment_id} has already ended ({experiment.status})")
    store = RunStore(session)
    store.cancel_experiment(experiment)
    store.commit()
    session.refresh(experiment)
    return experiment


def delete_experiment(*, session: Session, experiment_id: int) -> None:
    """Delete an ended experiment with its runs, attempts, metric points and statistics: it is
    marked deleted, gone for every read from this commit on, and its rows are removed in short
    batches afterwards (service.scheduling.purge: the caller wakes the purger). One with a run
    queued,
    pending or running is a Conflict (409): its dispatcher would write rows for runs that no
    longer exist; cancel it first."""
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    store = RunStore(session)
    store.lock_experiments([experiment_id])
    session.refresh(experiment)
    if experiment.deleted:  # another request deleted it meanwhile
        raise NotFound(f"experiment {experiment_id} not found")
    active = experiment_counts(experiment).active
    if active or experiment.status in {ExperimentStatus.queued, ExperimentStatus.running}:
        raise Conflict(f"experiment {experiment_id} is {experiment.status} ({active} runs queued, "
                       f"pending or running): cancel it (POST /experiments/{experiment_id}/cancel) "
                       "and delete it once its runs have ended")
    store.mark_deleted(experiment_id)
    store.commit()


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
    )


def experiment_detail(*, session: Session, experiment_id: int) -> ExperimentDetail:
    # Status and counts come from one row: one snapshot, never a status beside counts read
    # after a dispatcher commit.
    experiment = get_experiment(session=session, experiment_id=experiment_id)
    summary = experiment_summary(experiment)
    return ExperimentDetail(
        **summary.model_dump(),
        spec=ExperimentSpec.stored(experiment.spec),
        n_conditions=experiment.n_conditions,
        adaptive=experiment.adaptive,
        message=stop_message(session, experiment),
    )


def stop_message(session: Session, experiment: Experiment) -> str | None:
    """Why the experiment stopped before all its runs had run, or None: its adaptive rule
    stopped on a failed look (the rule's record says so), or its first runs all failed
    (service.scheduling.run_store.failure_stop), which stores the reason as the error of each run it
    cancels, so it is read back from one of them (only an experiment with a failed run can
    have one)."""
    adaptive = experiment.adaptive if isinstance(experiment.adaptive, dict) else {}
    if adaptive.get("error"):  # its rule stopped because a look failed
        return adaptive.get("stop_reason")
    if not experiment.runs_failed:
        return None
    error = session.exec(
        select(Run.error).where(Run.experiment_id == experiment.id,
                                col(Run.error).startswith(STOPPED_RUN_PREFIX, autoescape=True))
        .limit(1)
    ).first()
    return error.removeprefix(STOPPED_RUN_PREFIX) if error else None


def list_experiments(
    *, session: Session, status: ExperimentStatus | None, limit: int, offset: int,
    name: str | None = None,
) -> list[ExperimentSummary]:
    """One page of experiments, newest first, optionally only those in `status` and those
    whose name contains `name` (case-insensitive)."""
    query = (select(Experiment).where(Experiment.deleted == False)  # noqa: E712
             .order_by(Experiment.id.desc()))  # type: ignore[union-attr]
    if status is not None:
        query = query.where(Experiment.status == status)
    if name:
        # LIKE's own wildcards in the text are matched literally
        pattern = name.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(func.lower(Experiment.name).like(f"%{pattern}%", escape="\\"))
    experiments = session.exec(query.offset(offset).limit(limit)).all()
    return [experiment_summary(experiment) for experiment in experiments]


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
    *, session: Session, experiment_id: int, status: RunStatus | None = None, limit: int,
    offset: int = 0,
) -> list[RunOut]:
    """One page of an experiment's runs in id order, optionally only those in `status`."""
    get_experiment(session=session, experiment_id=experiment_id)
    query = select(Run).where(Run.experiment_id == experiment_id)
    if status is not None:
        query = query.where(Run.status == status)
    runs = session.exec(query.order_by(Run.id).offset(offset).limit(limit)).all()  # type: ignore[arg-type]
    return [run_out(r) for r in runs]


def run_config(trainer_name: str, base: dict[str, Any], condition: dict[str, Any],
               ran: Any = None) -> dict[str, Any]:
    """A run's full config, every field with the value a run of it uses (defaults filled in,
    and the null ones resolved by the trainer's `resolve_config`, the function its training
    runs with): the config its worker recorded running with (`ran`, from the provenance),
    else the experiment's base config with the run's condition; as stored when the trainer no
    longer accepts it (a retired field, say)."""
    merged = ran if isinstance(ran, dict) and ran else {**base, **config_condition(condition)}
    trainer = REGISTRY.get(trainer_name)
    if trainer is None:
        return merged
    try:
        config = trainer.Config.model_validate(merged)
    except pydantic.ValidationError:
        return merged
    return trainer.resolve_config(config).model_dump(mode="json")


def run_detail(*, session: Session, run_id: int) -> RunDetail:
    run = get_run(session=session, run_id=run_id)
    experiment = get_experiment(session=session, experiment_id=run.experiment_id)
    attempts = session.exec(
        select(RunAttempt).where(RunAttempt.run_id == run_id).order_by(RunAttempt.attempt)  # type: ignore[arg-type]
    ).all()
    provenance = {
        **run.provenance,
        "ray_node_id": run.node_id,
        "ray_worker_id": run.worker_id,
        "worker_pid": run.worker_pid,
    }
    return RunDetail(
        **run_out(run).model_dump(),
        config=run_config(run.trainer, experiment.spec.get("config", {}), run.condition,
                          run.provenance.get("config")),
        provenance=provenance,
        attempt_history=[AttemptOut.model_validate(a, from_attributes=True) for a in attempts],
    )
