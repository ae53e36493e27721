"""A plain function as a trainer: `@trainer` turns `def train(config, run)` into a TrainerBase.

    from trainers import trainer

    @trainer(metrics=("accuracy", "loss"), defaults={"hidden": 64, "lr": 0.1, "epochs": 20})
    def mlp_digits(config, run):
        ...                                  # config.hidden, config.lr, config.epochs
        for step in range(steps):
            ...
            if run.log(step, {"loss": loss}):   # True: cancelled or diverged, return now
                break
        return {"accuracy": accuracy, "loss": loss}

The config is a pydantic model (`config=MyConfig`) or a dict of defaults whose types are
inferred from the values (bool, int, float, str, None, lists of them); `descriptions` adds a
line per field, shown by GET /trainers. Unknown fields and wrong types are refused as for every
trainer. The function returns its final metrics (a dict of numbers, or a TrainOutput for
diagnostics and warnings too) and logs its curves with `run.log`; everything else is the
runtime's (trainers.runtime): cancellation, divergence of `divergence_metric` ("loss" when it
is one of the metrics), provenance (the hash of the function's source file), seed-batched tasks
(the seeds of a task one after another), /stats and the dashboard. A trainer that needs more
(batched seeds, reports, pre-flight checks of its own) subclasses TrainerBase.

Randomness: draw from the run's generators, `run.sources.init` / `.data` / `.augment` /
`.evaluate` (torch) and `.init_np` / `.data_np` / `.augment_np` (numpy). Those are what a spec's
`seed_sources` and `decompose_sources` pin and vary. Code that uses the global generators
instead (`torch.randn(...)` without a generator, `np.random.*`, `random.*`, a DataLoader's
default shuffle) would depend on what ran before it in the worker process; the runtime seeds
the three global generators from the run's seed before the function starts and restores them
after, so such code is reproducible per seed, but a source decomposition cannot separate what
it draws. Calling `torch.manual_seed` (or np.random.seed) inside the function re-seeds the
global generators with the same number for every seed: the seeds then differ only through
`run.sources`. Nondeterministic GPU kernels and thread timing are not covered by any seed.
"""

from __future__ import annotations

import inspect
import random
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Union

import numpy as np
import pydantic
import torch

from trainers.base import ResourceEstimate, TrainerConfig
from trainers.runtime import RunContext, TrainerBase, TrainOutput

TrainFunction = Callable[[Any, RunContext], Any]
# A config field's type, from its default's (and a list field's, from its elements').
_SCALARS: dict[type, Any] = {bool: bool, int: int, float: float, str: str}
_LISTS: dict[type, Any] = {bool: list[bool], int: list[int], float: list[float], str: list[str]}


def _field_type(name: str, default: Any) -> Any:
    """The type of a defaults-dict field: its value's (an int field takes ints only: write
    `0.0` for a float); None allows any JSON scalar; a list, lists of its elements' type."""
    kind = type(default)
    if kind in _SCALARS:
        return _SCALARS[kind]
    if default is None:
        return Union[bool, int, float, str, None]  # noqa: UP007 - a runtime type object
    if isinstance(default, list | tuple):
        inner = {type(v) for v in default}
        if len(inner) == 1 and (element := inner.pop()) in _SCALARS:
            return _LISTS[element]
        return list[Union[bool, int, float, str, None]]  # noqa: UP007
    raise TypeError(
        f"defaults[{name!r}]: a {kind.__name__} default cannot be a config field (use bool, "
        "int, float, str, None or a list of them, or give a pydantic model as config=)"
    )


def config_model(
    name: str,
    defaults: Mapping[str, Any],
    descriptions: Mapping[str, str] | None = None,
) -> type[TrainerConfig]:
    """A trainer Config (strict, frozen, unknown fields refused) from a dict of defaults."""
    descriptions = dict(descriptions or {})
    unknown = sorted(set(descriptions) - set(defaults))
    if unknown:
        raise ValueError(f"descriptions name fields with no default: {', '.join(unknown)}")
    fields: dict[str, Any] = {}
    for field_name, default in defaults.items():
        if not field_name.isidentifier() or field_name.startswith("_"):
            raise ValueError(f"defaults: {field_name!r} is not a config field name")
        value = list(default) if isinstance(default, tuple) else default
        fields[field_name] = (
            _field_type(field_name, default),
            pydantic.Field(value, description=descriptions.get(field_name)),
        )
    model: type[TrainerConfig] = pydantic.create_model(
        f"{name.title().replace('_', '')}Config", __base__=TrainerConfig, **fields
    )
    return model


def _as_config_model(config: type[pydantic.BaseModel]) -> type[pydantic.BaseModel]:
    """The user's model, refusing unknown fields as every trainer config does."""
    if issubclass(config, TrainerConfig) or config.model_config.get("extra") == "forbid":
        return config
    settings = pydantic.ConfigDict(**{**config.model_config, "extra": "forbid"})
    return type(
        config.__name__, (config,), {"model_config": settings, "__module__": config.__module__}
    )


class FunctionTrainer(TrainerBase):
    """A trainer made by `@trainer` from a function; its class attributes are the decorator's
    arguments (one subclass per function, so that the registry tells them apart)."""

    function: ClassVar[TrainFunction]
    estimate_function: ClassVar[Callable[[Any], ResourceEstimate] | None] = None
    description: ClassVar[str] = ""
    paper: ClassVar[str] = "none (a function trainer)"
    diagnostics: ClassVar[tuple[str, ...]] = ()

    def __call__(self, config: Any, run: RunContext) -> Any:
        return type(self).function(config, run)

    def estimate(self, config: Any) -> ResourceEstimate:
        """The function's estimate when the decorator was given one; else none: only the
        operator's own limits bound the run (its memory is not known before it runs)."""
        estimate = type(self).estimate_function
        if estimate is not None:
            return estimate(config)
        return ResourceEstimate(0, (), 0, ())

    def train(self, config: Any, run: RunContext) -> TrainOutput:
        with _global_generators_seeded(run.seed):
            returned = type(self).function(config, run)
        return _train_output(self.name, returned)


def _train_output(name: str, returned: Any) -> TrainOutput:
    if isinstance(returned, TrainOutput):
        return returned
    if not isinstance(returned, Mapping):
        raise TypeError(
            f"trainer {name!r} returned {type(returned).__name__}: return its final metrics "
            "as a dict of numbers (or a trainers.runtime.TrainOutput)"
        )
    metrics = {}
    for key, value in returned.items():
        try:
            metrics[str(key)] = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"trainer {name!r} returned metric {key!r} = {value!r}, which is not a number"
            ) from None
    return TrainOutput(metrics=metrics)


class _global_generators_seeded:
    """torch's, numpy's and Python's global generators seeded from the run's seed for the
    function's call, and put back as they were after it (the worker process runs other runs)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self.saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        torch.manual_seed(self.seed)
        np.random.seed(self.seed % 2**32)
        random.seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch_state, numpy_state, python_state = self.saved
        torch.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def trainer(
    function: TrainFunction | None = None,
    *,
    name: str | None = None,
    metrics: Sequence[str] = ("loss",),
    primary_metric: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    config: type[pydantic.BaseModel] | None = None,
    descriptions: Mapping[str, str] | None = None,
    description: str | None = None,
    divergence_metric: str | None = "loss",
    metric_bounds: Mapping[str, tuple[float, float]] | None = None,
    estimate: Callable[[Any], ResourceEstimate] | None = None,
    max_seeds_per_task: int = 16,
) -> Any:
    """Make `function(config, run)` a trainer (see the module's docstring): used bare
    (`@trainer`) or with arguments. `metrics`: the final metrics it returns that the statistics
    can compare, `primary_metric` the one they compare by default (the first). `defaults` or
    `config`: its config (neither: a config with no fields). `divergence_metric`: the metric
    whose non-finite value ends a run as diverged (None: none; ignored unless it is one of
    `metrics`). `metric_bounds`: known ranges, say {"accuracy": (0, 1)}. `estimate(config)`:
    its ResourceEstimate, when it can work one out from the config alone."""

    def make(fn: TrainFunction) -> FunctionTrainer:
        trainer_name = name or fn.__name__
        names = tuple(metrics)
        if not callable(fn) or len(inspect.signature(fn).parameters) != 2:
            raise TypeError(f"@trainer: {trainer_name!r} must be a function of (config, run)")
        if not names or len(set(names)) != len(names):
            raise ValueError(
                f"@trainer {trainer_name!r}: metrics must name at least one metric, once each"
            )
        primary = primary_metric or names[0]
        if primary not in names:
            raise ValueError(
                f"@trainer {trainer_name!r}: primary_metric {primary!r} is not in {names}"
            )
        if defaults is not None and config is not None:
            raise ValueError(f"@trainer {trainer_name!r}: give defaults= or config=, not both")
        model = (
            _as_config_model(config)
            if config is not None
            else config_model(trainer_name, defaults or {}, descriptions)
        )
        attributes = {
            "__module__": fn.__module__,
            "__doc__": fn.__doc__,
            "name": trainer_name,
            "description": description or inspect.getdoc(fn) or f"the function {fn.__qualname__}",
            "Config": model,
            "metrics": names,
            "primary_metric": primary,
            "divergence_metric": divergence_metric if divergence_metric in names else None,
            "metric_bounds": dict(metric_bounds or {}),
            "max_seeds_per_task": max_seeds_per_task,
            "function": staticmethod(fn),
            "estimate_function": staticmethod(estimate) if estimate is not None else None,
        }
        cls = types.new_class(
            f"{trainer_name.title().replace('_', '')}Trainer",
            (FunctionTrainer,),
            exec_body=lambda namespace: namespace.update(attributes),
        )
        if fn.__module__ not in sys.modules:
            raise TypeError(
                f"@trainer {trainer_name!r}: its module {fn.__module__!r} is not imported"
            )
        return cls()

    return make(function) if function is not None else make
