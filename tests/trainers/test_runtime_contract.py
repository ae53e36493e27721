"""The loop contract every registered trainer honours (trainers.runtime): a cancel ends a long run
within about a second, and how often a run evaluates or logs never changes what it trains.

Each trainer has one entry in CASES: a config that runs far longer than the test waits, and two
configs of a short run that differ only in their evaluation or logging intervals."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from trainers import REGISTRY, get_trainer
from trainers.base import MemoryReporter

# A cancelled run must return within this long of the request (the contract says about one
# second; the margin absorbs a busy 2-core CI machine).
CANCEL_BOUND_S = 2.0
# How long a long run trains before the test cancels it.
RUN_BEFORE_CANCEL_S = 0.7


# A tiny `ssl` run on digits: three epochs of about a second each on one CPU thread.
SSL_TINY = {"dataset": "digits", "image_size": 8, "backbone": "resnet_small", "proj_dim": 16,
            "pred_hidden": 8, "epochs": 3, "warmup_epochs": 1, "batch_size": 256, "knn_k": 20,
            "method": "byol", "device": "cpu"}


@dataclass(frozen=True)
class Case:
    # A run that would take far longer than RUN_BEFORE_CANCEL_S + CANCEL_BOUND_S.
    long: dict[str, Any]
    # Two short runs that differ only in how often they evaluate or log; None for a trainer
    # whose config has no evaluation or logging interval to vary.
    frequent: dict[str, Any] | None = None
    rare: dict[str, Any] | None = None


FEEDBACK_SHORT = {"arch": "resmlp", "method": "fa", "dataset": "digits", "width": 16,
                  "depth": 2, "epochs": 2, "batch_size": 256, "augment_strength": 0.5,
                  "device": "cpu"}
CFF_TINY = {"dataset": "digits", "image_size": 8, "width": 16, "depth": 2, "heads": 2,
            "patch": 4, "batch_size": 64, "train_size": 256, "test_size": 64}

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
        long={"arch": "vit_mini", "method": "bp", "dataset": "digits", "epochs": 100_000,
              "device": "cpu"},
        frequent={**FEEDBACK_SHORT, "eval_batch_size": 256, "cosine_pairing": "output",
                  "ce_reduction": "mean"},
        rare={**FEEDBACK_SHORT, "eval_batch_size": 16, "cosine_pairing": "input",
              "ce_reduction": "sum"},
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
    ),
    # ssl_sim has no evaluation or logging interval: latent_class logs its norms after every
    # epoch and convergence logs once, at the end. Its long run is the convergence loop, which
    # would take about 96 * 1000^2 steps at this norm.
    "ssl_sim": Case(
        long={"simulation": "convergence", "initial_norm": 1000.0, "max_steps": 10_000_000},
    ),
}


class CancelAfter(MemoryReporter):
    """Answers should_stop() from `delay_s` after the run's first point or check."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.started: float | None = None
        self.requested: float | None = None
        self._lock = threading.Lock()

    def _clock(self) -> bool:
        now = time.perf_counter()
        with self._lock:
            if self.started is None:
                self.started = now
            if self.requested is None and now - self.started >= self.delay_s:
                self.requested = now
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
    ended = time.perf_counter()
    assert reporter.requested is not None, "the run ended before the cancel: make it longer"
    assert not result.finished
    assert ended - reporter.requested < CANCEL_BOUND_S, (
        f"{name} returned {ended - reporter.requested:.2f} s after the cancel")


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
