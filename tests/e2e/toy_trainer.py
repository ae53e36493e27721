"""A fifth trainer written the way a user would add one: gradient descent on ||w||^2 from a
random start. With lr > 1 each step multiplies w by |1 - 2 lr| > 1, so the loss overflows to
inf: a run that diverges on demand; `fail_at_step` makes one that fails on demand (the trainer
raises, as a bug would: nothing a pre-flight can see), `stall_at_step` one whose step ignores a
cancel for `stall_s` seconds (asleep, or computing with `stall_spins`). Registered on the
workers through SEEDGRID_TRAINER_MODULES (see tests/conftest.py) and in the test's own process
by the test."""

from __future__ import annotations

import time
from typing import ClassVar

import torch
from pydantic import Field

from trainers.base import ResourceEstimate, TrainerConfig
from trainers.runtime import RunContext, TrainerBase, TrainOutput


class ToyConfig(TrainerConfig):
    steps: int = Field(100, ge=1, le=10**10, description="Gradient steps")
    lr: float = Field(0.1, gt=0, description="Step size; above 1 the run diverges")
    log_every: int = Field(10, ge=1, description="Steps between logged points")
    fail_at_step: int | None = Field(None, ge=0, description="Raise RuntimeError at this step")
    stall_at_step: int | None = Field(
        None,
        ge=0,
        description=(
            "At this step, sleep stall_s seconds without checking for a cancel (a step that "
            "outlasts the worker's grace)"
        ),
    )
    stall_s: float = Field(0.0, ge=0, le=600, description="How long the stall lasts")
    stall_spins: bool = Field(
        False, description="The stall computes (a busy loop, a core's worth) instead of sleeping"
    )


class ToyTrainer(TrainerBase):
    name: ClassVar[str] = "toy"
    description: ClassVar[str] = "Gradient descent on ||w||^2 (a test trainer)."
    paper: ClassVar[str] = "none"
    Config: ClassVar[type[ToyConfig]] = ToyConfig
    metrics: ClassVar[tuple[str, ...]] = ("loss",)
    diagnostics: ClassVar[tuple[str, ...]] = ()
    primary_metric: ClassVar[str] = "loss"
    divergence_metric: ClassVar[str] = "loss"

    def estimate(self, config: ToyConfig) -> ResourceEstimate:
        return ResourceEstimate(1024, (), config.steps // config.log_every + 2, ("steps",))

    def train(self, config: ToyConfig, run: RunContext) -> TrainOutput:
        w = torch.randn(4, generator=run.sources.init, dtype=torch.float64)
        run.track(w)
        loss = float(w @ w)
        for step in range(config.steps):
            if step == config.fail_at_step:
                raise RuntimeError(f"toy asked to fail at step {step}")
            if step == config.stall_at_step:
                _stall(config.stall_s, spin=config.stall_spins)
            w -= config.lr * 2 * w
            loss = float(w @ w)
            if step % config.log_every == 0 and run.log(step, {"loss": loss}):
                break
            if run.should_stop():
                break
        return TrainOutput(metrics={"loss": loss})


def _stall(seconds: float, *, spin: bool) -> None:
    if not spin:
        time.sleep(seconds)
        return
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass


TRAINERS = (ToyTrainer(),)
