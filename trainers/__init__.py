"""seedgrid trainers: pure PyTorch, runnable with no Ray and no database.

    from trainers import get_trainer
    trainer = get_trainer("collapse")
    result = trainer.run(trainer.Config(r=0.1), seed=0, reporter=NullReporter())
"""

from __future__ import annotations

from trainers.base import (
    MemoryReporter,
    NullReporter,
    Reporter,
    ResourceEstimate,
    RunResult,
    RunWarning,
    Trainer,
    TrainerConfig,
)
from trainers.cff import CFFTrainer
from trainers.collapse import CollapseTrainer
from trainers.feedback import FeedbackTrainer
from trainers.ssl import SSLTrainer
from trainers.ssl_sim import SSLSimTrainer

REGISTRY: dict[str, Trainer] = {
    t.name: t for t in (CollapseTrainer(), CFFTrainer(), SSLTrainer(), SSLSimTrainer(),
                        FeedbackTrainer())
}


class UnknownTrainerError(KeyError):
    pass


def get_trainer(name: str) -> Trainer:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownTrainerError(
            f"unknown trainer {name!r}; available: {', '.join(sorted(REGISTRY))}"
        ) from None


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
]
