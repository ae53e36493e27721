"""The benchmark scripts: seed_batching.py compares a seed-batched task with solo runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}",
                                                  ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def seed_batching() -> ModuleType:
    return load_script("seed_batching")


def test_seed_batching_prints_both_trainers_ratios_and_their_agreement(
        seed_batching: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    threads = torch.get_num_threads()
    try:
        seed_batching.main(["--k", "2", "--steps", "10", "--epochs", "1"])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert printed.count("median ratio task/solo") == 4  # two trainers x two clocks
    # Same seeds, same config: each seed's task result equals its solo run's.
    assert printed.count("parameters_sha256 equal for 2 of 2 seeds") == 2
    assert "seed-batched task / solo runs, seeds per second (wall clock): collapse " in printed


def test_largest_relative_difference_of_final_metrics(seed_batching: ModuleType) -> None:
    from trainers import RunResult

    def result(**metrics: float) -> RunResult:
        return RunResult(metrics=metrics, diagnostics={}, warnings=[], provenance={})

    a = [result(loss=2.0, acc=0.5), result(loss=0.0)]
    assert seed_batching.largest_relative_difference(a, a) == 0.0
    b = [result(loss=2.0, acc=0.4), result(loss=0.0)]
    assert seed_batching.largest_relative_difference(a, b) == pytest.approx(0.1 / 0.5)
    c = [result(loss=2.0, acc=0.5), result(loss=float("nan"))]
    assert seed_batching.largest_relative_difference(a, c) == float("inf")
