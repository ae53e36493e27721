"""seedgrid trainers: pure PyTorch, runnable with no Ray and no database.

    from trainers import get_trainer
    trainer = get_trainer("collapse")
    result = trainer.run(trainer.Config(r=0.1), seed=0, reporter=NullReporter())

An operator adds trainers of their own without changing seedgrid: SEEDGRID_TRAINER_MODULES
names modules (comma-separated, importable on the service and on every worker) that each
define `TRAINERS`, a sequence of trainer instances; they join the registry on import. Only the
operator's environment can name them, never a spec.
"""

from __future__ import annotations

import importlib

from api_schemas import environment
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
    """Add a trainer to the registry; a name already taken by another trainer is an error."""
    existing = REGISTRY.get(trainer.name)
    if existing is not None and type(existing) is not type(trainer):
        raise ValueError(f"trainer name {trainer.name!r} is taken by {type(existing).__name__}")
    REGISTRY[trainer.name] = trainer


def load_trainer_modules(names: str) -> None:
    """Import the operator's trainer modules (SEEDGRID_TRAINER_MODULES) and register theirs."""
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"{TRAINER_MODULES_ENV}: cannot import {name!r}: {exc}") from exc
        declared = getattr(module, "TRAINERS", None)
        if declared is None:
            raise ImportError(f"{TRAINER_MODULES_ENV}: module {name!r} defines no TRAINERS")
        for trainer in declared:
            register(trainer)


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
    "UnknownTrainerError",
    "get_trainer",
    "load_trainer_modules",
    "register",
]
