"""seedgrid trainers: pure PyTorch, runnable with no Ray and no database.

    from trainers import get_trainer
    trainer = get_trainer("collapse")
    result = trainer.run(trainer.Config(r=0.1), seed=0, reporter=NullReporter())

An operator adds trainers of their own without changing seedgrid: SEEDGRID_TRAINER_MODULES
(or `seedgrid serve --trainers`) names modules, comma-separated: importable module names, or
paths of .py files or package folders (`load_trainer_modules`). Each module defines `TRAINERS`,
a sequence of trainer instances, or functions decorated with `@trainer` (trainers.functional);
they join the registry on import. Only the operator's environment or command line can name
them, never a spec: naming code is running it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from api_schemas import IMPORTED_TRAINER, environment
from api_schemas.system_metrics import PREFIX as SYSTEM_PREFIX
from api_schemas.system_metrics import is_system_metric
from trainers.base import (
    MemoryReporter,
    NullReporter,
    Reporter,
    ResourceEstimate,
    RunResult,
    RunWarning,
    TrainerConfig,
)
from trainers.cff import CFFTrainer
from trainers.collapse import CollapseTrainer
from trainers.feedback import FeedbackTrainer
from trainers.functional import FunctionTrainer, trainer
from trainers.runtime import TrainerBase
from trainers.ssl import SSLTrainer
from trainers.ssl_sim import SSLSimTrainer

# The one trainer interface: every trainer is a TrainerBase (trainers/runtime.py), whose class
# attributes and methods are what the service and the workers call.
Trainer = TrainerBase

REGISTRY: dict[str, Trainer] = {
    t.name: t
    for t in (CollapseTrainer(), CFFTrainer(), SSLTrainer(), SSLSimTrainer(), FeedbackTrainer())
}


TRAINER_MODULES_ENV = environment.TRAINER_MODULES


class UnknownTrainerError(KeyError):
    pass


def register(trainer: Trainer) -> None:
    """Add a trainer to the registry; a name already taken by another trainer, the name of
    imported results (api_schemas.IMPORTED_TRAINER), or a metric named like a system series
    (api_schemas.system_metrics), is an error."""
    if trainer.name == IMPORTED_TRAINER:
        raise ValueError(f"trainer name {trainer.name!r} is reserved for imported results")
    for name in (*trainer.metrics, *trainer.diagnostics):
        if is_system_metric(name):
            raise ValueError(
                f"trainer {trainer.name!r} declares {name!r}: names starting with "
                f"{SYSTEM_PREFIX!r} are the workers' system metrics (docs/system-metrics.md)"
            )
    existing = REGISTRY.get(trainer.name)
    if existing is not None and type(existing) is not type(trainer):
        raise ValueError(f"trainer name {trainer.name!r} is taken by {type(existing).__name__}")
    REGISTRY[trainer.name] = trainer


@dataclass(frozen=True)
class TrainerModule:
    """One entry of SEEDGRID_TRAINER_MODULES: the module's import name and, for an entry given
    as a path, the file or package folder (what Ray ships to the workers: py_modules)."""

    name: str
    path: Path | None = None


# Every module load_trainer_modules imported in this process, in order: what the service ships
# to Ray's workers (service.scheduling.ray_helpers.worker_runtime_env).
LOADED_MODULES: list[TrainerModule] = []


def trainer_modules(entries: str, source: str = TRAINER_MODULES_ENV) -> list[TrainerModule]:
    """The entries of a SEEDGRID_TRAINER_MODULES value: a path (it has a / or ends in .py) is
    a file or package folder, imported under its file's stem or folder's name."""
    found = []
    for entry in (e.strip() for e in entries.split(",")):
        if not entry:
            continue
        if "/" in entry or entry.endswith(".py"):
            path = Path(entry).expanduser().resolve()
            if (
                not (path.is_file() and path.suffix == ".py")
                and not (path / "__init__.py").is_file()
            ):
                raise ImportError(
                    f"{source}: {entry!r} is neither a .py file nor a package "
                    "folder (one with an __init__.py)"
                )
            found.append(TrainerModule(path.stem if path.is_file() else path.name, path))
        else:
            found.append(TrainerModule(entry))
    return found


def _import(module: TrainerModule) -> ModuleType:
    if module.path is None or module.name in sys.modules:
        return importlib.import_module(module.name)
    location = module.path if module.path.is_file() else module.path / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        module.name,
        location,
        submodule_search_locations=None if module.path.is_file() else [str(module.path)],
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {location}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module.name] = loaded
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[module.name]
        raise
    return loaded


def load_trainer_modules(entries: str, source: str = TRAINER_MODULES_ENV) -> list[TrainerModule]:
    """Import the operator's trainer modules (SEEDGRID_TRAINER_MODULES) and register their
    trainers; the modules, in order. `source`: where the entries come from, for errors (the
    variable, or the command's option). An error names the entry and says what went wrong (a
    module that raises on import gives its exception's type and message, and the line)."""
    modules = trainer_modules(entries, source)
    for module in modules:
        try:
            loaded = _import(module)
        except Exception as exc:  # noqa: BLE001 - any import failure is the operator's to fix
            frames = traceback.extract_tb(exc.__traceback__)
            where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
            raise ImportError(
                f"{source}: cannot import {module.name!r}"
                f"{f' from {module.path}' if module.path else ''}: "
                f"{type(exc).__name__}: {exc}{where}"
            ) from exc
        declared = getattr(loaded, "TRAINERS", None)
        if declared is None:
            declared = [v for v in vars(loaded).values() if isinstance(v, FunctionTrainer)]
        if not declared:
            raise ImportError(
                f"{source}: module {module.name!r} defines no TRAINERS and no @trainer function"
            )
        for declared_trainer in declared:
            register(declared_trainer)
        if module not in LOADED_MODULES:
            LOADED_MODULES.append(module)
    return modules


def get_trainer(name: str) -> Trainer:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownTrainerError(
            f"unknown trainer {name!r}; available: {', '.join(sorted(REGISTRY))}"
        ) from None


load_trainer_modules(environment.text(TRAINER_MODULES_ENV))

__all__ = [
    "REGISTRY",
    "MemoryReporter",
    "NullReporter",
    "Reporter",
    "ResourceEstimate",
    "RunResult",
    "RunWarning",
    "Trainer",
    "TrainerConfig",
    "LOADED_MODULES",
    "FunctionTrainer",
    "TrainerModule",
    "UnknownTrainerError",
    "get_trainer",
    "load_trainer_modules",
    "register",
    "trainer",
    "trainer_modules",
]
