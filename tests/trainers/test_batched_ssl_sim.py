"""The ssl_sim trainer's seed-batched path (`train_seeds`) against its solo runs, for both
simulations: each seed of a task of four ends as the same seed run alone (curves, metrics,
diagnostics, trained values), including seeds that converge at different steps, reach
max_steps, or are cancelled while the others go on."""

from __future__ import annotations

import pytest
import torch

from api_schemas import Resources
from tests.trainers.solo_equivalence import assert_same_as_solo, run_both
from tests.trainers.test_runtime_contract import (
    CANCEL_BOUND_S,
    RUN_BEFORE_CANCEL_S,
    CancelAfter,
    cpu_now,
)
from trainers import get_trainer
from trainers.base import MemoryReporter
from trainers.losses.latent_class import attract_pairs_terms, pick_positives, same_class_pairs

TRAINER = get_trainer("ssl_sim")
SEEDS = [0, 1, 2, 3]
# Solo runs of seeds 0-3 converge after 164, 160, 158 and 159 steps.
CONVERGENCE = {"simulation": "convergence", "n_pairs": 50, "dim": 8, "initial_norm": 4.0}
# Batches of 64 and a last one of 44: every per-seed product of the MLP and the loss has at
# least 400 multiply-adds, so ATen's batched product calls a GEMM for each seed.
LATENT = {"simulation": "latent_class", "n_samples": 300, "epochs": 3, "batch_size": 64}
# Batches of 7 from 16 equally frequent classes: about one batch in five has no two samples
# of a class (no anchor to pick a positive for, and no draw), and most rows have none.
LATENT_SPARSE = {
    "simulation": "latent_class",
    "n_samples": 70,
    "epochs": 2,
    "batch_size": 7,
    "class_weights": [1.0] * 16,
}
# A last batch of 4 samples: its 4 x 4 similarities (160 multiply-adds) go through ATen's
# own batched loop instead.
LATENT_SHORT_LAST_BATCH = {
    "simulation": "latent_class",
    "n_samples": 100,
    "epochs": 2,
    "batch_size": 8,
    "class_weights": [1.0] * 12,
}
# latent_class is float32. A seed of a batched task sums its products in another order than its
# solo run wherever the batched product takes another kernel than the solo one: ATen's own loop
# for small products, and on some CPUs the batched GEMM itself (an AVX-512 AMD EPYC: 2.2e-7
# relative after 3 epochs at LATENT; the machine these tests were first written on gave the
# same bits). Float32 rounding that training carries on; the documented tolerance:
REL_FLOAT32 = 1e-5


class CancelAfterChecks(MemoryReporter):
    """Answers should_stop() True from its `checks`-th question on."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks
        self.asked = 0

    def should_stop(self) -> bool:
        self.asked += 1
        return self.asked >= self.checks


class CancelAfterLogs(MemoryReporter):
    """Answers should_stop() True once it has logged `logs` points."""

    def __init__(self, logs: int) -> None:
        super().__init__()
        self.logs = logs

    def should_stop(self) -> bool:
        return len({step for step, *_ in self.points}) >= self.logs


def test_ssl_sim_batches_seeds_within_what_a_spec_may_ask() -> None:
    assert TRAINER.batched
    asked = Resources(seeds_per_task=TRAINER.max_seeds_per_task).seeds_per_task
    assert 1 < TRAINER.seeds_per_task_default <= asked == TRAINER.max_seeds_per_task


@pytest.mark.parametrize("power", [0.0, 1.0])
def test_convergence_seeds_end_at_their_own_steps_as_alone(power: float) -> None:
    config = TRAINER.Config(**CONVERGENCE, grad_scale_power=power)
    batched, solo = run_both(TRAINER, config, SEEDS)
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want)
        assert got[0].diagnostics["converged"]
    steps = [result.metrics["steps_to_converge"] for result, _ in batched]
    assert len(set(steps)) > 1, "the seeds must converge at different steps"


def test_convergence_seeds_that_reach_max_steps_stop_there() -> None:
    config = TRAINER.Config(**CONVERGENCE, max_steps=160)
    batched, solo = run_both(TRAINER, config, SEEDS)
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want)
    results = [result for result, _ in batched]
    assert [r.metrics["steps_to_converge"] for r in results] == [160.0, 160.0, 158.0, 159.0]
    assert [r.diagnostics["converged"] for r in results] == [False, True, True, True]


def test_a_cancelled_convergence_seed_stops_where_alone_and_the_others_converge() -> None:
    config = TRAINER.Config(**CONVERGENCE)

    def reporter(index: int) -> MemoryReporter:
        return CancelAfterChecks(50) if index == 2 else MemoryReporter()

    reporters = [reporter(i) for i in range(len(SEEDS))]
    results = TRAINER.run_seeds(config, SEEDS, reporters, threads=1)
    for index, (seed, result, seed_reporter) in enumerate(
        zip(SEEDS, results, reporters, strict=True)
    ):
        solo_reporter = reporter(index)
        solo = TRAINER.run(config, seed, solo_reporter, threads=1)
        assert not isinstance(result, Exception)
        assert_same_as_solo((result, seed_reporter), (solo, solo_reporter))
    cancelled = results[2]
    assert not isinstance(cancelled, Exception)
    assert not cancelled.finished and cancelled.metrics["steps_to_converge"] == 49.0
    assert reporters[2].points == []  # a cancelled run's step count is not logged
    assert all(r.finished for r in results if r is not cancelled and not isinstance(r, Exception))


@pytest.mark.parametrize(
    "config",
    [LATENT, LATENT_SPARSE, LATENT_SHORT_LAST_BATCH],
    ids=["batches_of_64", "sparse", "short_last_batch"],
)
def test_latent_class_seeds_equal_their_solo_runs_to_float32_rounding(config: dict) -> None:
    batched, solo = run_both(TRAINER, TRAINER.Config(**config), SEEDS)
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want, rel=REL_FLOAT32, same_bits=False)
        assert [epoch for _, epoch, name, _ in got[1].points if name == "norm_mean"] == list(
            range(config["epochs"] + 1)
        )
    assert len({result.metrics["norm_mean"] for result, _ in batched}) == len(SEEDS)


def test_a_cancelled_latent_class_seed_stops_and_the_others_finish_as_alone() -> None:
    config = TRAINER.Config(**LATENT)

    def reporter(index: int) -> MemoryReporter:
        return CancelAfterLogs(2) if index == 1 else MemoryReporter()

    reporters = [reporter(i) for i in range(len(SEEDS))]
    results = TRAINER.run_seeds(config, SEEDS, reporters, threads=1)
    for index, (seed, result, seed_reporter) in enumerate(
        zip(SEEDS, results, reporters, strict=True)
    ):
        solo_reporter = reporter(index)
        solo = TRAINER.run(config, seed, solo_reporter, threads=1)
        assert not isinstance(result, Exception)
        assert_same_as_solo(
            (result, seed_reporter), (solo, solo_reporter), rel=REL_FLOAT32, same_bits=False
        )
    assert [r.finished for r in results if not isinstance(r, Exception)] == [
        True,
        False,
        True,
        True,
    ]
    # it stopped at its second logged point, epoch 1
    assert [epoch for _, epoch, name, _ in reporters[1].points if name == "norm_mean"] == [0, 1]


def test_source_seeds_reach_each_seed_of_a_batched_latent_class_task() -> None:
    config = TRAINER.Config(**LATENT)
    pins = [{"data": 5}, None, {"data": 5, "augment": 8}, {"init": 6}]
    batched, solo = run_both(TRAINER, config, SEEDS, source_seeds=pins)
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want, rel=REL_FLOAT32, same_bits=False)
    results = [result for result, _ in batched]
    # seeds 0 and 2 share their data (class counts), not their init or picks
    assert results[0].diagnostics["class_counts"] == results[2].diagnostics["class_counts"]
    assert results[0].diagnostics["class_counts"] != results[1].diagnostics["class_counts"]
    assert results[0].metrics["norm_mean"] != results[2].metrics["norm_mean"]
    assert results[3].provenance["source_seeds"]["init"] == 6


@pytest.mark.parametrize(
    "long",
    [
        {"simulation": "convergence", "initial_norm": 1000.0, "max_steps": 10_000_000},
        {"simulation": "latent_class", "epochs": 100_000},
    ],
    ids=["convergence", "latent_class"],
)
def test_a_cancel_ends_every_seed_of_a_long_batched_task_within_the_bound(long: dict) -> None:
    reporters = [CancelAfter(RUN_BEFORE_CANCEL_S) for _ in SEEDS]
    results = TRAINER.run_seeds(TRAINER.Config(**long), SEEDS, reporters, threads=1)
    ended = cpu_now()
    requested = [reporter.requested for reporter in reporters]
    assert None not in requested, "the task ended before the cancel: make it longer"
    assert all(not result.finished for result in results if not isinstance(result, Exception))
    assert ended - max(r for r in requested if r is not None) < CANCEL_BOUND_S


def test_latent_class_loss_pieces_of_stacked_seeds_are_each_seeds_own() -> None:
    """same_class_pairs, pick_positives and attract_pairs_terms over a leading seed axis,
    slice by slice against the single-run calls (attract_pairs_infonce composes those, and
    test_ssl_losses checks it against a hand-written reference)."""
    generator = torch.Generator().manual_seed(0)
    s, n = 3, 12
    labels = torch.randint(0, 5, (s, n), generator=generator)
    labels[1] = torch.arange(n)  # a seed without two samples of a class: no positive
    z = torch.randn(s, n, 10, generator=generator)
    scores = torch.rand(s, n, n, generator=generator)
    same = same_class_pairs(labels)
    positive = pick_positives(same, scores)
    terms = attract_pairs_terms(z, positive, temperature=0.5)
    assert not positive[1].any()
    for i in range(s):
        alone = same_class_pairs(labels[i])
        assert torch.equal(same[i], alone)
        assert torch.equal(positive[i], pick_positives(alone, scores[i]))
        torch.testing.assert_close(
            terms[i], attract_pairs_terms(z[i], positive[i], 0.5), rtol=1e-6, atol=0.0
        )
