"""The collapse trainer's seed-batched path (`train_seeds`) against its solo runs: each seed of
a task of four logs the same curve and ends with the same metrics, diagnostics, warnings and
trained values as the same seed run alone, including a seed that diverges or is cancelled
while the others go on."""

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
from trainers.losses.collapse_pair import mse_gradients, pair_loss

TRAINER = get_trainer("collapse")
SEEDS = [0, 1, 2, 3]
# Small enough for a second per test, large enough that every per-seed matrix product has at
# least 400 multiply-adds (the batched products then call the same GEMM as the solo run's).
SMALL = {"n_samples": 40, "steps": 150, "log_every": 10, "input_dim": 16, "input_noise": 0.3}
# Teacher-student runs at lr 2 with noisy 4-d inputs: stability depends on each seed's inputs.
# In its solo run, seed 5 of SEEDS_ONE_DIVERGES diverges at step 290; 3, 4 and 7 finish.
DIVERGING = {
    "model": "teacher_student",
    "n_samples": 16,
    "input_dim": 4,
    "input_noise": 1.0,
    "lr": 2.0,
    "steps": 320,
    "log_every": 10,
}
SEEDS_ONE_DIVERGES = [3, 4, 5, 7]


class CancelAfterLogs(MemoryReporter):
    """Answers should_stop() once it has logged `logs` points; counts the answers after."""

    def __init__(self, logs: int) -> None:
        super().__init__()
        self.logs = logs
        self.asked_after_stop = 0

    def should_stop(self) -> bool:
        stop = len({step for step, *_ in self.points}) >= self.logs
        self.asked_after_stop += stop
        return stop


def test_collapse_batches_seeds_within_what_a_spec_may_ask() -> None:
    assert TRAINER.batched
    asked = Resources(seeds_per_task=TRAINER.max_seeds_per_task).seeds_per_task
    assert 1 < TRAINER.seeds_per_task_default <= asked == TRAINER.max_seeds_per_task


@pytest.mark.parametrize("stop_gradient", [False, True])
@pytest.mark.parametrize("loss", ["mse", "cosine"])
@pytest.mark.parametrize("model", ["embedding", "teacher_student"])
def test_each_seed_of_a_batched_task_equals_its_solo_run(
    model: str, loss: str, stop_gradient: bool
) -> None:
    config = TRAINER.Config(model=model, loss=loss, stop_gradient=stop_gradient, **SMALL)
    batched, solo = run_both(TRAINER, config, SEEDS)
    # Bit for bit where a step is the mse closed form or the embedding model's; the cosine
    # loss through the teacher-student's per-seed products runs autograd through a batched
    # GEMM, which on some CPUs is another kernel than the solo run's (an AVX-512 AMD EPYC:
    # 2.8e-13 relative after 150 steps): float64 rounding then.
    same_bits = not (model == "teacher_student" and loss == "cosine")
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want, same_bits=same_bits)
        assert got[0].finished and not got[0].diverged
        assert got[1].curve("loss")[-1][0] == 150
    # the seeds differ: equal results would not show that each seed kept its own draws
    assert len({result.metrics["loss"] for result, _ in batched}) == len(SEEDS)


def test_a_diverging_seed_stops_where_its_solo_run_stops_and_the_others_go_on() -> None:
    config = TRAINER.Config(**DIVERGING)
    batched, solo = run_both(TRAINER, config, SEEDS_ONE_DIVERGES)
    assert [result.diverged_at_step for result, _ in solo] == [None, None, 290, None]
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want)
    diverged, _ = batched[2]
    assert diverged.diverged and diverged.diagnostics["last_finite_step"] == 280
    assert batched[2][1].curve("loss")[-1][0] == 290  # no point after the divergence
    for result, reporter in (batched[i] for i in (0, 1, 3)):
        assert not result.diverged and reporter.curve("loss")[-1][0] == 320


def test_source_seeds_reach_each_seed_of_a_batched_task() -> None:
    config = TRAINER.Config(model="teacher_student", **SMALL)
    pins = [{"data": 7}, None, {"init": 9}, {"data": 7}]
    batched, solo = run_both(TRAINER, config, SEEDS, source_seeds=pins)
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want)
    results = [result for result, _ in batched]
    assert results[0].provenance["source_seeds"]["data"] == 7
    assert results[2].provenance["source_seeds"]["init"] == 9
    # seeds 0 and 3 share their data (frustrated samples, teacher inputs), not their init
    assert results[0].diagnostics["eig_m"] == results[3].diagnostics["eig_m"]
    assert results[0].diagnostics["eig_m"] != results[1].diagnostics["eig_m"]
    assert results[0].metrics["loss"] != results[3].metrics["loss"]
    # seed 2 with init pinned to 9 trains seed 9's init on seed 2's data
    nine = TRAINER.run(config, 9, MemoryReporter(), source_seeds={"data": 2}, threads=1)
    assert nine.provenance["parameters_sha256"] == results[2].provenance["parameters_sha256"]


def test_a_cancelled_seed_stops_and_the_others_finish_as_alone() -> None:
    config = TRAINER.Config(**SMALL)
    cancelled_at = 4  # logs: steps 0, 10, 20, 30

    def reporters() -> list[MemoryReporter]:
        return [MemoryReporter(), CancelAfterLogs(cancelled_at), MemoryReporter(), MemoryReporter()]

    batch_reporters = reporters()
    results = TRAINER.run_seeds(config, SEEDS, batch_reporters, threads=1)
    for index, (seed, result, reporter) in enumerate(
        zip(SEEDS, results, batch_reporters, strict=True)
    ):
        solo_reporter = reporters()[index]
        solo = TRAINER.run(config, seed, solo_reporter, threads=1)
        assert not isinstance(result, Exception)
        assert_same_as_solo((result, reporter), (solo, solo_reporter))
    assert [r.finished for r in results if not isinstance(r, Exception)] == [
        True,
        False,
        True,
        True,
    ]
    assert batch_reporters[1].curve("loss")[-1][0] == 30
    assert batch_reporters[1].asked_after_stop == 1  # it stopped at the answer


def test_a_cancel_of_every_seed_ends_the_batched_loop_at_once() -> None:
    config = TRAINER.Config(steps=50_000_000, n_samples=64, log_every=100)
    batched, solo = run_both(TRAINER, config, SEEDS, reporter=lambda: CancelAfterLogs(3))
    for got, want in zip(batched, solo, strict=True):
        assert_same_as_solo(got, want)
        result, reporter = got
        assert not result.finished and not result.diverged
        assert reporter.curve("loss")[-1][0] == 200
        assert isinstance(reporter, CancelAfterLogs) and reporter.asked_after_stop == 1


def test_a_cancel_ends_every_seed_of_a_long_batched_task_within_the_bound() -> None:
    config = TRAINER.Config(steps=50_000_000, n_samples=64)
    reporters = [CancelAfter(RUN_BEFORE_CANCEL_S) for _ in SEEDS]
    results = TRAINER.run_seeds(config, SEEDS, reporters, threads=1)
    ended = cpu_now()
    requested = [reporter.requested for reporter in reporters]
    assert None not in requested, "the task ended before the cancel: make it longer"
    assert all(not result.finished for result in results if not isinstance(result, Exception))
    assert ended - max(r for r in requested if r is not None) < CANCEL_BOUND_S


@pytest.mark.parametrize("head", [False, True])
@pytest.mark.parametrize("teacher", [False, True])
def test_pair_loss_and_mse_gradients_of_stacked_seeds_are_each_seeds_own(
    head: bool, teacher: bool
) -> None:
    """The losses module's broadcasting over a leading seed axis, slice by slice against the
    single-run calls (which test_losses_collapse_pair checks against hand-written float64)."""
    generator = torch.Generator().manual_seed(0)
    s, n, k, d, inputs_dim = 3, 30, 4, 8, 16

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(s, *shape, generator=generator, dtype=torch.float64)

    p = torch.softmax(draw(n, k), dim=-1)
    x, y = draw(d, inputs_dim) if teacher else draw(n, d), draw(k, d)
    w = draw(d, d) if head else None
    inputs = draw(n, inputs_dim) if teacher else None
    stacked = mse_gradients(x, y, w, p, inputs)
    for i in range(s):
        alone = mse_gradients(
            x[i], y[i], None if w is None else w[i], p[i], None if inputs is None else inputs[i]
        )
        for got, want in zip(stacked, alone, strict=True):
            torch.testing.assert_close(got[i], want, rtol=1e-12, atol=0.0)
    for kind in ("mse", "cosine"):
        losses = pair_loss(x if not teacher else inputs @ x.mT, y, p, kind)
        assert losses.shape == (s,)
        for i in range(s):
            emb = x[i] if not teacher else inputs[i] @ x[i].T
            torch.testing.assert_close(
                losses[i], pair_loss(emb, y[i], p[i], kind), rtol=1e-12, atol=0.0
            )
