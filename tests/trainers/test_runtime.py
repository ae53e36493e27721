"""trainers.runtime: the loop contract's divergence and cancel, and provenance that identifies
the code that ran."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tests.e2e.toy_trainer import ToyTrainer
from trainers.base import CheckStop, MemoryReporter, NullReporter
from trainers.random_sources import SOURCES, random_sources
from trainers.runtime import RunContext, TrainOutput, git_commit, seedgrid_version, source_sha256

ROOT = Path(__file__).resolve().parents[2]


def context(
    reporter: object, metric: str | None = "loss", stop_on_checks: tuple[str, ...] = ()
) -> RunContext:
    return RunContext(
        config=ToyTrainer.Config(),
        seed=0,
        reporter=reporter,  # type: ignore[arg-type]
        device=torch.device("cpu"),
        sources=random_sources(0),
        divergence_metric=metric,
        stop_on_checks=stop_on_checks,
    )


def test_divergence_is_the_declared_metric_turning_non_finite_once() -> None:
    reporter = MemoryReporter()
    run = context(reporter)
    assert not run.log(0, {"loss": 1.0, "acc": float("nan")})  # another metric's NaN: no
    assert run.log(1, {"loss": float("inf"), "acc": 0.5})
    assert run.log(2, {"loss": 3.0})  # stays stopped; the first step is kept
    assert run.diverged_at_step == 1 and run.last_finite_step == 0
    assert math.isnan(run.last_finite["acc"]) and run.last_finite["loss"] == 1.0
    assert len(reporter.points) == 5  # every point still reaches the reporter
    assert not run.cancelled


def test_a_trainer_without_a_divergence_metric_never_diverges() -> None:
    run = context(NullReporter(), metric=None)
    assert not run.log(0, {"loss": float("nan")}) and run.diverged_at_step is None


def test_a_cancel_is_seen_by_should_stop_and_log() -> None:
    class Cancelled(MemoryReporter):
        def should_stop(self) -> bool:
            return True

    run = context(Cancelled())
    assert run.should_stop() and run.cancelled and run.log(0, {"loss": 1.0})


def test_a_fired_check_stops_the_run_only_when_the_spec_asked_for_it() -> None:
    run = context(NullReporter(), stop_on_checks=("D2",))
    assert not run.checks_fired({"D1": "D1 fired"}, step=10, epoch=1)  # not asked for
    assert not run.should_stop() and run.stopped_by is None
    assert run.checks_fired({"D1": "D1 fired", "D2": "D2 fired"}, step=20, epoch=2)
    assert run.should_stop() and run.log(21, {"loss": 1.0}) and not run.cancelled
    assert run.stopped_by == CheckStop(checks=("D2",), epoch=2, step=20, reason="D2 fired")
    run.checks_fired({"D2": "again"}, step=30, epoch=3)  # the first stop is the one kept
    assert run.stopped_by.epoch == 2  # type: ignore[union-attr]
    both = context(NullReporter(), stop_on_checks=("D1", "D2"))
    assert both.checks_fired({"D1": "a", "D2": "b"}, step=0, epoch=0)
    assert both.stopped_by == CheckStop(checks=("D1", "D2"), epoch=0, step=0, reason="a; b")


def test_a_cancelled_or_diverged_run_is_not_stopped_by_a_check() -> None:
    class Cancelled(MemoryReporter):
        def should_stop(self) -> bool:
            return True

    cancelled = context(Cancelled(), stop_on_checks=("D1",))
    assert cancelled.should_stop()
    cancelled.checks_fired({"D1": "fired"}, step=1, epoch=1)
    assert cancelled.stopped_by is None
    diverged = context(NullReporter(), stop_on_checks=("D1",))
    assert diverged.log(0, {"loss": float("nan")})
    diverged.checks_fired({"D1": "fired"}, step=0, epoch=0)
    assert diverged.stopped_by is None


def test_stop_on_checks_the_trainer_does_not_declare_are_refused() -> None:
    trainer = ToyTrainer()
    with pytest.raises(
        ValueError, match="stop_on_checks: trainer 'toy' has no check 'D1'; it can stop on: none"
    ):
        trainer.run(trainer.Config(steps=5), 0, NullReporter(), stop_on_checks=["D1"])
    assert trainer.run(trainer.Config(steps=5), 0, NullReporter()).stop is None


def test_a_run_that_diverges_returns_its_last_finite_metrics() -> None:
    trainer = ToyTrainer()
    result = trainer.run(trainer.Config(steps=5000, lr=2.0, log_every=1), 0, MemoryReporter())
    assert result.diverged and result.finished
    step = result.diverged_at_step
    assert step is not None and result.diagnostics["last_finite_step"] == step - 1
    assert math.isfinite(result.metrics["loss"])


def test_provenance_identifies_the_code_and_the_platform() -> None:
    trainer = ToyTrainer()
    result = trainer.run(trainer.Config(steps=10), 1, NullReporter(), threads=1)
    provenance = result.provenance
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert provenance["seedgrid_version"] == seedgrid_version() == version
    assert provenance["trainer_source_sha256"] == source_sha256(
        ROOT / "tests" / "e2e" / "toy_trainer.py"
    )
    assert provenance["torch_threads"] == 1 and provenance["seed"] == 1
    assert provenance["config"] == {
        "steps": 10,
        "lr": 0.1,
        "log_every": 10,
        "fail_at_step": None,
        "stall_at_step": None,
        "stall_s": 0.0,
        "stall_spins": False,
    }
    again = trainer.run(trainer.Config(steps=10), 1, NullReporter(), threads=1)
    assert again.provenance["parameters_sha256"] == provenance["parameters_sha256"]
    other_seed = trainer.run(trainer.Config(steps=10), 2, NullReporter(), threads=1)
    assert other_seed.provenance["parameters_sha256"] != provenance["parameters_sha256"]


def test_the_git_commit_is_the_checkouts_head() -> None:
    if not (ROOT / ".git").exists():
        pytest.fail("run the tests from a git checkout (the clean clone CI makes is one)")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_commit() == head


def test_a_changed_line_changes_the_source_hash(tmp_path: Path) -> None:
    package = tmp_path / "mytrainer"
    package.mkdir()
    (package / "model.py").write_text("WIDTH = 64\n")
    (package / "train.py").write_text("STEPS = 10\n")
    before = source_sha256(package)
    source_sha256.cache_clear()
    (package / "train.py").write_text("STEPS = 11\n")
    assert source_sha256(package) != before


# A fresh interpreter: the warm-up's import has not happened yet. Ray's cancel is
# KeyboardInterrupt in the main thread; interrupt_main delivers the same. It is delivered from
# inside the import, at the warm-up thread's Nth import statement (an audit hook), not after a
# delay: on a loaded machine a 0.02 s timer fired after the whole import had finished. The
# process takes Python's SIGINT handler first, as a worker's task does (workers.interrupts): a
# test run started in the background passes SIGINT ignored, and interrupt_main does nothing then.
INTERRUPTED_WARM_UP = """
import _thread, sys, threading
import torch
from trainers.runtime import warm_up
from workers.interrupts import accept_cancels
accept_cancels()
at, seen = int(sys.argv[1]), 0
def interrupt_inside_the_import(event, args):
    global seen
    if event == "import" and threading.current_thread().name == "seedgrid-warm-up":
        seen += 1
        if seen == at:
            _thread.interrupt_main()
sys.addaudithook(interrupt_inside_the_import)
try:
    warm_up()
    print("finished first")
except KeyboardInterrupt:
    print("interrupted")
print("imports", seen)
torch.use_deterministic_algorithms(True)
print("torch works")
"""
# The warm-up's first import, and one halfway through (this torch's warm-up makes about 850).
INTERRUPT_AT_IMPORTS = (1, 400)


def test_a_cancel_during_the_warm_up_is_raised_and_leaves_torch_whole() -> None:
    """Regression: a cancel inside the warm-up's import left torch half imported, and every later
    run of that worker process was lost with an AttributeError (CI, tests/e2e/test_probes.py)."""
    for at in INTERRUPT_AT_IMPORTS:
        done = subprocess.run(
            [sys.executable, "-c", INTERRUPTED_WARM_UP, str(at)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.split()
        assert lines[0] == "interrupted" and lines[-2:] == ["torch", "works"], (at, done.stdout)
        assert int(lines[2]) > at, (at, done.stdout)  # the import went on past the interrupt


class DrawsTrainer(ToyTrainer):
    """Reports what a run drew from each source: a data order (a permutation from `data`), an
    initial weight (from `init`), an augmentation draw and an evaluation draw."""

    name: ClassVar[str] = "draws"

    def train(self, config: Any, run: RunContext) -> TrainOutput:
        sources = run.sources
        return TrainOutput(
            metrics={"loss": 0.0},
            diagnostics={
                "data_order": torch.randperm(50, generator=sources.data).tolist(),
                "init": torch.randn(8, generator=sources.init, dtype=torch.float64).tolist(),
                "augment": torch.rand(8, generator=sources.augment, dtype=torch.float64).tolist(),
                "evaluate": torch.rand(8, generator=sources.evaluate, dtype=torch.float64).tolist(),
            },
        )


def test_pinning_data_gives_two_seeds_one_data_order_and_their_own_init() -> None:
    trainer = DrawsTrainer()
    config = trainer.Config()
    pinned = [
        trainer.run(config, seed, NullReporter(), source_seeds={"data": 0}) for seed in (1, 2)
    ]
    free = [trainer.run(config, seed, NullReporter()) for seed in (0, 1, 2)]
    one, two = (r.diagnostics for r in pinned)
    assert one["data_order"] == two["data_order"] == free[0].diagnostics["data_order"]
    assert one["init"] != two["init"]
    assert one["augment"] != two["augment"] and one["evaluate"] != two["evaluate"]
    # every other source follows the run's own seed, exactly as without the pin
    for run, plain in zip(pinned, free[1:], strict=True):
        for source in ("init", "augment", "evaluate"):
            assert run.diagnostics[source] == plain.diagnostics[source]
    assert free[1].diagnostics["data_order"] != free[2].diagnostics["data_order"]
    assert pinned[1].provenance["source_seeds"] == {
        "init": 2,
        "data": 0,
        "augment": 2,
        "evaluate": 2,
    }
    assert free[1].provenance["source_seeds"] == dict.fromkeys(SOURCES, 1)


def test_every_source_pinned_makes_two_seeds_one_run() -> None:
    trainer = DrawsTrainer()
    everything = dict.fromkeys(SOURCES, 5)
    one, two = (
        trainer.run(trainer.Config(), seed, NullReporter(), source_seeds=everything)
        for seed in (1, 2)
    )
    assert one.diagnostics == two.diagnostics


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"weights": 0}, "unknown random sources ['weights']"),
        ({"data": -1}, "the seed of random source 'data' must be an int"),
        ({"data": 2**31}, "the seed of random source 'data' must be an int"),
        ({"data": True}, "the seed of random source 'data' must be an int"),
        ({"data": 1.0}, "the seed of random source 'data' must be an int"),
        ({"data": "0"}, "the seed of random source 'data' must be an int"),
        ([("data", 0)], "source seeds must be a dict"),
    ],
)
def test_source_seeds_that_are_not_a_source_and_a_seed_are_refused(
    overrides: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        random_sources(0, overrides)
