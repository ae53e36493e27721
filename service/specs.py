"""What a spec means, shared by every part of the service that reads one: conditions and their
keys, the grid the statistics see, the seeds a task runs, the config a run trains with, and the
messages that name what a spec gets wrong."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic

from api_schemas import IMPORTED_TRAINER, SOURCE_FACTOR, SOURCE_LEVELS, ExperimentSpec
from api_schemas.levels import format_level
from api_schemas.system_metrics import is_system_metric
from service.errors import body_error
from trainers import REGISTRY, Trainer


def condition_key(condition: dict[str, Any]) -> str:
    """Canonical `field=value,field=value` string, fields sorted."""
    return ",".join(f"{k}={format_level(condition[k])}" for k in sorted(condition))


class MetricCatalogue(Protocol):
    """What the statistics read of an experiment's trainer: its metrics and diagnostics, their
    declared bounds and test-set sizes. A registered trainer is one; so is ImportedMetrics."""

    @property
    def name(self) -> str: ...
    @property
    def metrics(self) -> Sequence[str]: ...
    @property
    def diagnostics(self) -> Sequence[str]: ...
    @property
    def metric_bounds(self) -> Mapping[str, tuple[float, float]]: ...
    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]: ...


@dataclass(frozen=True)
class ImportedMetrics:
    """The metric catalogue of imported results (trainer `imported`): the metrics its spec
    recorded, no diagnostics, no declared bounds or test sets (nothing is known of them)."""

    metrics: tuple[str, ...]
    name: str = IMPORTED_TRAINER
    diagnostics: tuple[str, ...] = ()
    metric_bounds: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]:
        return {}


@dataclass(frozen=True)
class StoredCatalogue:
    """The metric catalogue of an experiment whose trainer's code this process has not loaded
    (a service started without the `--trainers` file that ran it): as its submission recorded
    it (Experiment.catalogue, `catalogue_record`), or, for an experiment stored before that
    record, the metrics its completed runs recorded (no diagnostics or bounds known). A run's
    test-set sizes come from its provenance, where the dispatcher that stored it recorded them
    (service.scheduling.harvesting), not from this."""

    name: str
    metrics: tuple[str, ...]
    diagnostics: tuple[str, ...] = ()
    metric_bounds: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]:
        return {}

    @classmethod
    def from_record(cls, name: str, record: Mapping[str, Any]) -> StoredCatalogue:
        bounds = record.get("metric_bounds") or {}
        return cls(
            name=name,
            metrics=tuple(str(m) for m in record.get("metrics") or ()),
            diagnostics=tuple(str(d) for d in record.get("diagnostics") or ()),
            metric_bounds={str(m): (float(lo), float(hi)) for m, (lo, hi) in bounds.items()},
        )


def catalogue_record(trainer: Trainer) -> dict[str, Any]:
    """What an experiment stores of its trainer's catalogue at submission (its `catalogue`
    column): read back by StoredCatalogue.from_record when the code is not loaded."""
    return {
        "metrics": list(trainer.metrics),
        "diagnostics": list(trainer.diagnostics),
        "metric_bounds": {m: [lo, hi] for m, (lo, hi) in trainer.metric_bounds.items()},
    }


def metric_catalogue(
    trainer: str,
    spec: ExperimentSpec,
    stored: Mapping[str, Any] | None = None,
    recorded: Callable[[], Sequence[str]] | None = None,
) -> MetricCatalogue:
    """The catalogue an experiment of `trainer` with `spec` is read with: its imported metrics
    (trainer `imported`), else the registered trainer's, else, when that trainer's code is not
    loaded here, the catalogue it `stored` at submission, else the metrics its completed runs
    `recorded` (a call: read only then). Stored results stay readable whatever code is
    loaded."""
    if trainer == IMPORTED_TRAINER and spec.imported is not None:
        return ImportedMetrics(metrics=tuple(spec.imported.metrics))
    registered = REGISTRY.get(trainer)
    if registered is not None:
        return registered
    if stored:
        return StoredCatalogue.from_record(trainer, stored)
    return StoredCatalogue(name=trainer, metrics=tuple(recorded() if recorded else ()))


def unknown_metric(trainer: MetricCatalogue, metric: str) -> str | None:
    """Why `metric` is not one the statistics can compare, or None. A diagnostic is refused
    too: it is stored per run (GET /runs/{id}), not in the final metrics the statistics read,
    so asking for one would give empty tables."""
    if metric in trainer.metrics:
        return None
    known = f"known metrics: {', '.join(trainer.metrics)}"
    if is_system_metric(metric):
        return (
            f"{metric!r} is a system series (what the worker's hardware did, per run in "
            f"GET /runs/{{id}}/metrics), not a metric the statistics compare; {known}"
        )
    if metric in trainer.diagnostics:
        return (
            f"{metric!r} is a diagnostic of trainer {trainer.name!r} (shown per run, in "
            f"GET /runs/{{id}}), not a metric the statistics compare; {known}"
        )
    close = difflib.get_close_matches(metric, list(trainer.metrics), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    only_diagnostics = [d for d in trainer.diagnostics if d not in trainer.metrics]
    diagnostics = (
        f"; diagnostics (per run, not compared): {', '.join(only_diagnostics)}"
        if only_diagnostics
        else ""
    )
    return f"unknown metric {metric!r} of trainer {trainer.name!r}{hint}; {known}{diagnostics}"


def unknown_field(trainer: Trainer, field: str) -> str:
    """The message for a config field the trainer does not have: the closest valid name (a
    typo is the usual cause) and every valid one."""
    fields = list(trainer.Config.model_fields)
    close = difflib.get_close_matches(field, fields, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"unknown config field {field!r} of trainer {trainer.name!r}{hint}; valid fields: "
        f"{', '.join(fields)}"
    )


def grid_conditions(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The conditions of a grid, in grid order: the cartesian product of its levels."""
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())]


def config_condition(condition: Mapping[str, Any]) -> dict[str, Any]:
    """A run's condition without the reserved factor: the part that is trainer config."""
    return {k: v for k, v in condition.items() if k != SOURCE_FACTOR}


def first_seed(seeds: int | list[int]) -> int:
    """The first seed of a spec's `seeds` (n means 0..n-1)."""
    return 0 if isinstance(seeds, int) else seeds[0]


def stats_grid(spec: ExperimentSpec) -> dict[str, list[Any]]:
    """The grid as the runs and statistics see it: the spec's, and the reserved factor of a
    source decomposition last (service.analysis.sources)."""
    grid = dict(spec.grid)
    if spec.decompose_sources:
        grid[SOURCE_FACTOR] = list(SOURCE_LEVELS)
    return grid


def seeds_per_task(trainer: Trainer, spec: ExperimentSpec) -> int:
    """How many seeds of a condition one task runs: the spec's resources.seeds_per_task, else
    the trainer's default."""
    asked = spec.resources.seeds_per_task
    return asked if asked is not None else trainer.seeds_per_task_default


def seed_runs(conditions: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    return [
        {"condition_key": condition_key(condition), "condition": condition, "seed": seed}
        for condition in conditions
        for seed in seeds
    ]


def run_defaults(spec: ExperimentSpec) -> dict[str, Any]:
    """What every run of the spec shares."""
    return {
        "trainer": spec.trainer,
        "priority": spec.priority,
        "max_retries": spec.max_retries,
        "num_cpus": spec.resources.num_cpus,
        "num_gpus": spec.resources.num_gpus,
    }


def merged_config(base: Mapping[str, Any], condition: Mapping[str, Any]) -> dict[str, Any]:
    """The config one run of `condition` trains with, as given: the experiment's base config
    with the condition's fields over it (the reserved factor is not config). The one place a
    base config and a condition are merged."""
    return {**base, **config_condition(condition)}


def run_config(
    spec: ExperimentSpec, condition: Mapping[str, Any], ran: Any = None
) -> dict[str, Any]:
    """A run's full config, every field with the value a run of it uses (defaults filled in,
    and the null ones resolved by the trainer's `resolve_config`, the function its training
    runs with): the config its worker recorded running with (`ran`, from the provenance),
    else the spec's base config with the run's condition; as stored when the trainer no
    longer accepts it (a retired field, say)."""
    merged = ran if isinstance(ran, dict) and ran else merged_config(spec.config, condition)
    trainer = REGISTRY.get(spec.trainer)
    if trainer is None:
        return merged
    try:
        config = trainer.Config.model_validate(merged)
    except pydantic.ValidationError:
        return merged
    return trainer.resolve_config(config).model_dump(mode="json")


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
            out.append(body_error(where, message))
        return out


def with_key_hints(errors: list[dict[str, Any]], body: Any) -> list[dict[str, Any]]:
    """A request's validation errors, each unknown key of its body model `body` (at any level
    of the spec: a top-level `seed`, an `analysis.scal`) named with the closest valid key and
    every valid one, as config fields and grid keys are."""
    hinted = []
    for error in errors:
        loc = list(error.get("loc", ()))
        if error.get("type") == "extra_forbidden" and loc[:1] == ["body"] and len(loc) > 1:
            fields = _fields_at(body, loc[1:-1])
            if fields:
                key = str(loc[-1])
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                error = {
                    **error,
                    "msg": f"unknown field {key!r}{hint}; valid fields: {', '.join(fields)}",
                }
        hinted.append(error)
    return hinted


def _models(annotation: Any) -> list[type[pydantic.BaseModel]]:
    """The pydantic models an annotation holds (itself, or inside lists, unions, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models(arg)]


def _fields_at(annotation: Any, path: list[Any]) -> list[str]:
    """The fields of the model at `path` (a validation error's location) inside
    `annotation`; a list index, a dict key or a union's tag keeps the annotation."""
    for step in path:
        owner = next((m for m in _models(annotation) if step in m.model_fields), None)
        if owner is not None:
            annotation = owner.model_fields[step].annotation
    models = _models(annotation)
    return list(models[0].model_fields) if models else []
