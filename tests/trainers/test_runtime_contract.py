"""The loop contract every registered trainer honours (trainers.runtime): a cancel ends a long run
within about a second of its work, and how often a run evaluates or logs never changes what it
trains.

Each trainer has one entry in CASES: a config that runs far longer than the test waits, and two
configs of a short run that differ only in their evaluation or logging intervals."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

import pydantic
import pytest

from trainers import REGISTRY, get_trainer
from trainers.base import MemoryReporter, RunResult

# A cancelled run must return within this many CPU seconds of the request (the contract says
# about one second). CPU time, not wall time: on a machine busy with other work the run waits for
# a core, which its work does not grow with (a wall-clock bound was reached in e2e on a loaded CI
# machine: 4.0 s after the cancel).
CANCEL_BOUND_S = 2.0
# How many CPU seconds a long run trains before the test cancels it.
RUN_BEFORE_CANCEL_S = 0.7


def cpu_now() -> float:
    """This process's CPU seconds, every thread's: the clock of the cancel bounds. A run's
    threads count in full, so that a run computing on past its cancel in any thread shows."""
    return time.process_time()


# A tiny `ssl` run on digits: three epochs of about a second each on one CPU thread.
SSL_TINY = {
    "dataset": "digits",
    "image_size": 8,
    "backbone": "resnet_small",
    "proj_dim": 16,
    "pred_hidden": 8,
    "epochs": 3,
    "warmup_epochs": 1,
    "batch_size": 256,
    "knn_k": 20,
    "method": "byol",
    "device": "cpu",
}


@dataclass(frozen=True)
class Case:
    # A run that would take far longer than RUN_BEFORE_CANCEL_S + CANCEL_BOUND_S.
    long: dict[str, Any]
    # Two short runs that differ only in how often they evaluate or log; None for a trainer
    # whose config has no evaluation or logging interval to vary.
    frequent: dict[str, Any] | None = None
    rare: dict[str, Any] | None = None
    # A short run for the seed-batching contract; None: `frequent`.
    short: dict[str, Any] | None = None

    @property
    def batch(self) -> dict[str, Any]:
        config = self.short or self.frequent
        assert config is not None
        return config


FEEDBACK_SHORT = {
    "arch": "resmlp",
    "method": "fa",
    "dataset": "digits",
    "width": 16,
    "depth": 2,
    "epochs": 2,
    "batch_size": 256,
    "augment_strength": 0.5,
    "device": "cpu",
}
CFF_TINY = {
    "dataset": "digits",
    "image_size": 8,
    "width": 16,
    "depth": 2,
    "heads": 2,
    "patch": 4,
    "batch_size": 64,
    "train_size": 256,
    "test_size": 64,
}

CASES: dict[str, Case] = {
    "collapse": Case(
        long={"steps": 50_000_000, "n_samples": 64},
        frequent={"steps": 300, "log_every": 1},
        rare={"steps": 300, "log_every": 97},
    ),
    # ViT-Mini with BP, the slowest architecture and method. feedback audits and tests every
    # epoch (the protocol's per-epoch checks), so it has no interval to vary: the two short
    # runs differ in everything the audit computes instead.
    "feedback": Case(
        long={
            "arch": "vit_mini",
            "method": "bp",
            "dataset": "digits",
            "epochs": 100_000,
            "device": "cpu",
        },
        frequent={
            **FEEDBACK_SHORT,
            "eval_batch_size": 256,
            "cosine_pairing": "output",
            "ce_reduction": "mean",
        },
        rare={
            **FEEDBACK_SHORT,
            "eval_batch_size": 16,
            "cosine_pairing": "input",
            "ce_reduction": "sum",
        },
    ),
    # cff has no evaluation interval: it validates after every epoch of both stages under
    # select_by_validation, and never without it. With one epoch per stage the kept encoder and
    # head are the last either way, so the two runs differ only in whether validation runs.
    "cff": Case(
        long={**CFF_TINY, "epochs": 100_000},
        frequent={**CFF_TINY, "epochs": 1, "head_epochs": 1, "select_by_validation": True},
        rare={**CFF_TINY, "epochs": 1, "head_epochs": 1, "select_by_validation": False},
    ),
    "ssl": Case(
        long={**SSL_TINY, "epochs": 100_000, "batch_size": 64},
        frequent={**SSL_TINY, "eval_every": 1},
        rare={**SSL_TINY, "eval_every": 2},
        # the batching contract's run: the frequent one on 512 training and 256 test images
        # (two steps an epoch, about 0.7 s a run on one CPU thread against 2 s on all of
        # digits); ssl runs a task's seeds one after another, each exactly as alone
        short={**SSL_TINY, "eval_every": 1, "train_size": 512, "test_size": 256},
    ),
    # ssl_sim has no evaluation or logging interval: latent_class logs its norms after every
    # epoch and convergence logs once, at the end. Its long run is the convergence loop, which
    # would take about 96 * 1000^2 steps at this norm.
    "ssl_sim": Case(
        long={"simulation": "convergence", "initial_norm": 1000.0, "max_steps": 10_000_000},
        short={"simulation": "latent_class", "epochs": 3},
    ),
}

# How close a seed of a seed-batched task (run_seeds) must come to its solo run (trainer.run),
# relative, in every logged point, final metric and diagnostic: a trainer that runs the seeds
# one after another must be exact; a batched one reorders the sums of its stacked GEMMs (each
# trainer's own batching test states the tolerance and why).
# ssl_sim's case is its float32 latent_class simulation (its float64 convergence one is exact).
BATCH_TOLERANCE: dict[str, float] = {
    "collapse": 1e-9,
    "feedback": 1e-4,
    "cff": 1e-4,
    "ssl": 0.0,
    "ssl_sim": 1e-5,
}


class CancelAfter(MemoryReporter):
    """Cancels the run `delay_s` CPU seconds (cpu_now) after its first point or check:
    should_stop() answers True from then on. `requested` is that moment, not the check that
    first sees it, so that the time to the run's return counts its interval between checks as
    well as its way out, as a cancel from outside does."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.started: float | None = None
        self.requested: float | None = None
        self._lock = threading.Lock()

    def _clock(self) -> bool:
        now = cpu_now()
        with self._lock:
            if self.started is None:
                self.started = now
            if self.requested is None and now - self.started >= self.delay_s:
                self.requested = self.started + self.delay_s
            return self.requested is not None

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None:
        super().log(step, metrics, epoch)
        self._clock()

    def should_stop(self) -> bool:
        return self._clock()


def test_every_registered_trainer_has_a_contract_case() -> None:
    assert set(CASES) == set(REGISTRY)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_cancel_ends_a_long_run_within_the_bound(name: str) -> None:
    trainer = get_trainer(name)
    reporter = CancelAfter(RUN_BEFORE_CANCEL_S)
    result = trainer.run(trainer.Config(**CASES[name].long), 0, reporter, threads=1)
    ended = cpu_now()
    assert reporter.requested is not None, "the run ended before the cancel: make it longer"
    assert not result.finished
    assert ended - reporter.requested < CANCEL_BOUND_S, (
        f"{name} returned {ended - reporter.requested:.2f} CPU s after the cancel"
    )


@pytest.mark.parametrize("name", sorted(n for n, case in CASES.items() if case.frequent))
def test_how_often_a_run_evaluates_never_changes_what_it_trains(name: str) -> None:
    trainer = get_trainer(name)
    case = CASES[name]
    assert case.frequent is not None and case.rare is not None
    digests = []
    for config in (case.frequent, case.rare):
        result = trainer.run(trainer.Config(**config), 3, MemoryReporter(), threads=1)
        assert result.finished and not result.diverged
        digests.append(result.provenance["parameters_sha256"])
    assert digests[0] is not None
    assert digests[0] == digests[1]
    assert result.provenance["torch_threads"] == 1


# Diagnostics of the process rather than the run: wall-clock timings, and whether the dataset was
# decoded already. They differ between any two runs and are only checked to exist.
UNREPRODUCIBLE = {"train_time_s", "stage1_train_time_s", "stage1_images_per_s", "dataset_cached"}


def assert_close(actual: Any, expected: Any, rel: float, where: str = "") -> None:
    """`actual` equals `expected` at any depth, floats to `rel` relative (NaN equals NaN);
    the keys of UNREPRODUCIBLE are only checked to exist."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), where
        for key in set(expected) - UNREPRODUCIBLE:
            assert_close(actual[key], expected[key], rel, f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, rel, f"{where}[{i}]")
    elif isinstance(expected, float) and isinstance(actual, float):
        assert (math.isnan(actual) and math.isnan(expected)) or math.isclose(
            actual, expected, rel_tol=rel, abs_tol=rel * 1e-6
        ), (where, actual, expected)
    else:
        assert actual == expected, (where, actual, expected)


# Config fields whose null is itself the value a run uses (DataConfig: the operator's default
# data root, the whole training split, the whole test set), not one resolve_config works out.
NULL_IS_THE_VALUE = {"data_root", "train_size", "test_size"}


def configs_to_resolve(trainer: Any) -> list[Any]:
    """The trainer's default config, its contract cases, and the default with each value of
    every Literal or bool field (the branches a null default is worked out on: collapse's
    stop_gradient, ssl's method, ssl_sim's simulation, the dataset)."""
    case = CASES[trainer.name]
    given = [{}, *(c for c in (case.long, case.frequent, case.rare, case.short) if c)]
    for name, field in trainer.Config.model_fields.items():
        values = (False, True) if field.annotation is bool else get_args(field.annotation)
        if get_origin(field.annotation) is Literal or field.annotation is bool:
            given += [{name: value} for value in values]
    configs = []
    for values in given:
        try:
            configs.append(trainer.Config(**values))
        except pydantic.ValidationError:  # a value the default's other fields refuse
            continue
    return configs


@pytest.mark.parametrize("name", sorted(CASES))
def test_resolve_config_leaves_no_null_where_a_run_uses_a_value(name: str) -> None:
    """What a run's stored config shows for a null default is the value the run uses: filled
    in, valid for its field, left alone where the spec gave one, and stable."""
    trainer = get_trainer(name)
    configs = configs_to_resolve(trainer)
    assert len(configs) > 1
    for config in configs:
        resolved = trainer.resolve_config(config)
        assert type(resolved) is type(config)
        shown = resolved.model_dump()
        assert [f for f, v in shown.items() if v is None and f not in NULL_IS_THE_VALUE] == [], (
            config
        )
        given = {f: v for f, v in config.model_dump().items() if v is not None}
        assert {f: shown[f] for f in given} == given
        assert trainer.Config.model_validate(resolved.model_dump()) == resolved
        assert trainer.resolve_config(resolved) == resolved


def test_resolve_config_fills_the_defaults_the_trainers_document() -> None:
    collapse, ssl, ssl_sim, cff = (get_trainer(n) for n in ("collapse", "ssl", "ssl_sim", "cff"))
    schedule = {"lr", "steps", "log_every"}
    assert collapse.resolve_config(collapse.Config()).model_dump(include=schedule) == {
        "lr": 0.5,
        "steps": 4000,
        "log_every": 20,
    }
    assert collapse.resolve_config(collapse.Config(stop_gradient=True)).model_dump(
        include=schedule
    ) == {"lr": 0.2, "steps": 20_000, "log_every": 100}
    assert ssl.resolve_config(ssl.Config(method="simsiam")).model_dump(
        include={"lr", "weight_decay", "temperature", "proj_dim"}
    ) == {"lr": 0.2, "weight_decay": 5e-4, "temperature": 1.0, "proj_dim": 2048}
    assert ssl_sim.resolve_config(ssl_sim.Config(simulation="latent_class")).lr == 0.01
    assert cff.resolve_config(cff.Config(margin_start=0.2)).margin_end == 0.05
    # the dataset's own side, and its reference padding at that side (CIFAR-10: 12/32)
    digits = get_trainer("feedback").resolve_config(get_trainer("feedback").Config())
    assert (digits.image_size, digits.crop_padding) == (8, 1)
    cifar = cff.resolve_config(cff.Config(dataset="cifar10", image_size=None))
    assert (cifar.image_size, cifar.crop_padding) == (32, 12)


def test_every_registered_trainer_has_a_batch_tolerance() -> None:
    assert set(BATCH_TOLERANCE) == set(REGISTRY)
    for name, tolerance in BATCH_TOLERANCE.items():
        assert get_trainer(name).batched or tolerance == 0.0, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_seed_batched_task_gives_each_seed_its_solo_run(name: str) -> None:
    trainer = get_trainer(name)
    config = trainer.Config(**CASES[name].batch)
    seeds = [0, 1, 2, 3]
    reporters = [MemoryReporter() for _ in seeds]
    heard: list[int] = []
    outcomes = trainer.run_seeds(
        config, seeds, reporters, threads=1, on_done=lambda index, _: heard.append(index)
    )
    assert sorted(heard) == [0, 1, 2, 3]
    tolerance = BATCH_TOLERANCE[name]
    for seed, reporter, outcome in zip(seeds, reporters, outcomes, strict=True):
        assert isinstance(outcome, RunResult), outcome
        alone = MemoryReporter()
        solo = trainer.run(config, seed, alone, threads=1)
        assert outcome.provenance["seed"] == seed and outcome.finished == solo.finished
        # each run records the config it trained with: resolve_config's, the one the service
        # shows as the run's
        assert (
            outcome.provenance["config"]
            == solo.provenance["config"]
            == trainer.resolve_config(config).model_dump(mode="json")
        )
        assert (outcome.diverged, outcome.diverged_at_step) == (
            solo.diverged,
            solo.diverged_at_step,
        )
        assert [p[:3] for p in reporter.points] == [p[:3] for p in alone.points], seed
        assert_close(
            [p[3] for p in reporter.points],
            [p[3] for p in alone.points],
            tolerance,
            f"seed {seed} curve",
        )
        assert_close(outcome.metrics, solo.metrics, tolerance, f"seed {seed} metrics")
        assert_close(outcome.diagnostics, solo.diagnostics, tolerance, f"seed {seed} diagnostics")
        assert [w.diagnostic for w in outcome.warnings] == [w.diagnostic for w in solo.warnings]
        if tolerance == 0.0:
            assert outcome.provenance["parameters_sha256"] == solo.provenance["parameters_sha256"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_cancel_ends_a_long_seed_batched_task_within_the_bound(name: str) -> None:
    trainer = get_trainer(name)
    stop = CancelAfter(RUN_BEFORE_CANCEL_S)
    outcomes = trainer.run_seeds(
        trainer.Config(**CASES[name].long), [0, 1], [stop, stop], threads=1
    )
    ended = cpu_now()
    assert stop.requested is not None, "the task ended before the cancel: make it longer"
    assert ended - stop.requested < CANCEL_BOUND_S, (
        f"{name} returned {ended - stop.requested:.2f} CPU s after the cancel"
    )
    assert all(isinstance(o, RunResult) and not o.finished for o in outcomes[:1]), outcomes
