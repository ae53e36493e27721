"""Seed-batched `feedback` (FeedbackTrainer.train_seeds): each seed of a batched task against its
solo run, the stacked network and step against one network in float64, and the seeds that stop
(diverged, stopped by a check or by their reporter, cancelled) leaving the stack while the
others go on."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.trainers.test_runtime_contract import CANCEL_BOUND_S, RUN_BEFORE_CANCEL_S, cpu_now
from trainers import MemoryReporter, get_trainer, stacked_ops
from trainers.base import RunResult
from trainers.feedback import FeedbackConfig, build_model, draw_feedback
from trainers.feedback import batched as batched_module
from trainers.feedback import trainer as trainer_module
from trainers.feedback.batched import stack_feedback
from trainers.feedback.models import ResidualNet, StackedNet
from trainers.feedback.trainer import audit_tensors, step_losses
from trainers.random_sources import derive_seed, random_sources

# float32: a stacked norm's parameter gradients (and a few losses) sum in another order than a
# solo run's, and training carries the rounding on. Measured over every logged point, final
# metric and diagnostic of the equivalence cases below (one thread, this CPU): the largest
# relative difference is 3.8e-5 (a cosine of -1.9e-4 after two epochs); most are below 1e-6.
REL_TOL = 1e-3
# BP's local loss is a sum of per-sample products that nearly cancel (|value| ~ 1e-7): it is
# known to an absolute 1.5e-8 (measured) only.
LOCAL_LOSS_ABS_TOL = 1e-7

STUDENT: dict[str, Any] = dict(
    arch="studentnet",
    width=16,
    depth=3,
    epochs=2,
    student_input_dim=12,
    student_train_size=256,
    student_test_size=64,
    eval_batch_size=64,
    batch_size=64,
    lr=1e-2,
    device="cpu",
)
DIGITS_MLP: dict[str, Any] = dict(
    arch="resmlp",
    dataset="digits",
    width=32,
    depth=2,
    epochs=2,
    batch_size=64,
    train_size=512,
    lr=1e-2,
    device="cpu",
)
DIGITS_VIT: dict[str, Any] = dict(
    arch="vit_mini",
    dataset="digits",
    width=16,
    depth=2,
    heads=2,
    patch=4,
    epochs=1,
    batch_size=128,
    train_size=512,
    lr=1e-2,
    device="cpu",
)
SEEDS = [0, 1, 2, 3]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread (two contend with other processes on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def assert_close(solo: Any, batched: Any, where: str = "") -> None:
    """Equal structure; floats within REL_TOL (a local loss: or LOCAL_LOSS_ABS_TOL), nan where
    nan; the rest equal."""
    if isinstance(solo, dict):
        assert isinstance(batched, dict) and solo.keys() == batched.keys(), where
        for key in solo:
            assert_close(solo[key], batched[key], f"{where}.{key}")
    elif isinstance(solo, (list, tuple)):
        assert type(solo) is type(batched) and len(solo) == len(batched), where
        for i, (a, b) in enumerate(zip(solo, batched, strict=True)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(solo, float) and not isinstance(batched, bool):
        assert isinstance(batched, (float, int)), where
        if math.isnan(solo) or math.isnan(batched):
            assert math.isnan(solo) and math.isnan(batched), (where, solo, batched)
        else:
            abs_tol = LOCAL_LOSS_ABS_TOL if where.endswith("local_loss") else 0.0
            assert math.isclose(solo, batched, rel_tol=REL_TOL, abs_tol=abs_tol), (
                where,
                solo,
                batched,
            )
    else:
        assert solo == batched, (where, solo, batched)


def assert_same_run(
    solo: RunResult, solo_points: list[Any], batched: RunResult, batched_points: list[Any]
) -> None:
    """A batched seed is its solo run: curves, metrics, diagnostics, warnings, outcome."""
    assert [p[:3] for p in batched_points] == [p[:3] for p in solo_points]  # step, epoch, name
    for (step, epoch, name, value), point in zip(solo_points, batched_points, strict=True):
        assert_close(value, point[3], f"points[step {step}, epoch {epoch}].{name}")
    assert_close(solo.metrics, batched.metrics, "metrics")
    timing = "train_time_s"
    assert_close(
        {k: v for k, v in solo.diagnostics.items() if k != timing},
        {k: v for k, v in batched.diagnostics.items() if k != timing},
        "diagnostics",
    )
    assert_close([vars(w) for w in solo.warnings], [vars(w) for w in batched.warnings], "warnings")
    assert (batched.finished, batched.diverged, batched.diverged_at_step) == (
        solo.finished,
        solo.diverged,
        solo.diverged_at_step,
    )
    assert (batched.stop is None) == (solo.stop is None)
    if solo.stop is not None and batched.stop is not None:
        assert (batched.stop.checks, batched.stop.epoch, batched.stop.step) == (
            solo.stop.checks,
            solo.stop.epoch,
            solo.stop.step,
        )
        # the reason ends in the check's value to 4 digits, which rounding may move
        assert batched.stop.reason.split(":")[0] == solo.stop.reason.split(":")[0]
    for key in ("seed", "source_seeds", "config"):
        assert batched.provenance[key] == solo.provenance[key], key


def solo_and_batched(
    config: FeedbackConfig,
    seeds: list[int],
    reporters: list[MemoryReporter] | None = None,
    solo_reporters: list[MemoryReporter] | None = None,
    **kwargs: Any,
) -> tuple[list[RunResult], list[MemoryReporter], list[RunResult], list[MemoryReporter]]:
    trainer = get_trainer("feedback")
    reporters = reporters or [MemoryReporter() for _ in seeds]
    outcomes = trainer.run_seeds(config, seeds, reporters, threads=1, **kwargs)
    batched = [o for o in outcomes if isinstance(o, RunResult)]
    assert len(batched) == len(seeds), outcomes
    solo_reporters = solo_reporters or [MemoryReporter() for _ in seeds]
    stop_on = kwargs.get("stop_on_checks", ())
    solo = [
        trainer.run(config, seed, reporter, threads=1, stop_on_checks=stop_on)
        for seed, reporter in zip(seeds, solo_reporters, strict=True)
    ]
    return solo, solo_reporters, batched, reporters


# ---------------------------------------------------------------------------------------------
# each seed of a batched task is its solo run


@pytest.mark.parametrize(
    "base, overrides",
    [
        pytest.param(
            STUDENT, {"method": "bp", "optimizer": "sgd", "lr": 0.1}, id="studentnet-bp-sgd"
        ),
        pytest.param(STUDENT, {"method": "fa", "fa_skip": True}, id="studentnet-fa-skip"),
        pytest.param(
            STUDENT,
            {"method": "dfa", "embed_credit": "none", "penalty": 1e-2},
            id="studentnet-dfa-penalty",
        ),
        pytest.param(
            DIGITS_MLP, {"method": "bp", "augment_strength": 0.5}, id="resmlp-bp-augmented"
        ),
        pytest.param(DIGITS_MLP, {"method": "fa"}, id="resmlp-fa-through-norm"),
        pytest.param(
            DIGITS_MLP,
            {"method": "dfa", "frozen_blocks": True, "weight_decay": 1e-3},
            id="resmlp-frozen-blocks",
        ),
        pytest.param(DIGITS_MLP, {"method": "dfa", "cosine_pairing": "input"}, id="resmlp-dfa"),
        pytest.param(DIGITS_VIT, {"method": "bp"}, id="vit-bp"),
        pytest.param(
            DIGITS_VIT,
            {"method": "fa", "vit_credit_tokens": "cls", "fa_top_credit": "direct"},
            id="vit-fa-cls",
        ),
        pytest.param(DIGITS_VIT, {"method": "dfa", "embed_credit": "next"}, id="vit-dfa"),
    ],
)
def test_each_seed_of_a_batched_task_is_its_solo_run(
    base: dict[str, Any], overrides: dict[str, Any]
) -> None:
    config = FeedbackConfig(**{**base, **overrides})
    solo, solo_reporters, batched, reporters = solo_and_batched(config, SEEDS)
    for s, b, sr, br in zip(solo, batched, solo_reporters, reporters, strict=True):
        assert s.finished and s.stop is None and not s.diverged
        assert_same_run(s, sr.points, b, br.points)
    # seeds differ (their own init, feedback matrices and batches), so the match is not trivial
    assert len({r.metrics["loss"] for r in batched}) == len(SEEDS)
    if config.method != "bp" and not config.frozen_blocks:
        digests = [r.diagnostics["feedback_matrices"]["sha256"] for r in batched]
        assert digests == [r.diagnostics["feedback_matrices"]["sha256"] for r in solo]
        assert len(set(digests)) == len(SEEDS)


def test_seeds_with_training_sets_of_different_sizes_each_match_their_solo_run() -> None:
    """With a validation split and class imbalance each seed keeps its own number of training
    images, so its epochs have other batches: such seeds train as separate stacks."""
    config = FeedbackConfig(
        **{
            **DIGITS_MLP,
            "method": "dfa",
            "epochs": 1,
            "train_size": None,
            "val_fraction": 0.2,
            "imbalance_ratio": 3.0,
        }
    )
    solo, solo_reporters, batched, reporters = solo_and_batched(config, SEEDS)
    assert len({r.diagnostics["n_train"] for r in solo}) > 1
    for s, b, sr, br in zip(solo, batched, solo_reporters, reporters, strict=True):
        assert_same_run(s, sr.points, b, br.points)


# ---------------------------------------------------------------------------------------------
# seeds that stop leave the stack; the others go on


def test_a_seed_that_diverges_leaves_the_stack_and_the_others_are_their_solo_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 2's network starts with an infinite head bias: its first training loss is
    non-finite, its parameters are nan within the stack for a whole epoch, and it diverges at
    the end of epoch 1 while the other three train on."""
    diverging = 2

    def poisoned(
        config: FeedbackConfig,
        input_shape: tuple[int, ...],
        num_classes: int,
        generator: torch.Generator,
    ) -> ResidualNet:
        model = build_model(config, input_shape, num_classes, generator)
        if generator.initial_seed() == derive_seed(diverging, "init"):
            with torch.no_grad():
                model.head.bias.fill_(math.inf)
        return model

    monkeypatch.setattr(trainer_module, "build_model", poisoned)
    monkeypatch.setattr(batched_module, "build_model", poisoned)
    config = FeedbackConfig(**{**STUDENT, "method": "dfa", "epochs": 3})
    solo, solo_reporters, batched, reporters = solo_and_batched(config, SEEDS)
    steps_per_epoch = config.student_train_size // config.batch_size
    for i, seed in enumerate(SEEDS):
        assert_same_run(solo[i], solo_reporters[i].points, batched[i], reporters[i].points)
        if seed == diverging:
            assert batched[i].diverged and batched[i].diverged_at_step == steps_per_epoch
            assert max(s for s, _, _, _ in reporters[i].points) == steps_per_epoch
        else:
            assert not batched[i].diverged and batched[i].diagnostics["epochs_run"] == 3


# DFA on the tiny StudentNet with D1's threshold lowered to 1.55: measured rho per epoch (0-4)
# seed 13: 1.005 1.122 1.404 1.853 2.452, so it fires at epoch 3; seeds 2, 3 and 7 stay below
# (largest 1.462, 1.503 and 1.355 at epoch 4).
STUDENT_D1_ONE_SEED: dict[str, Any] = {
    **STUDENT,
    "method": "dfa",
    "epochs": 4,
    "scale_growth_threshold": 1.55,
}


def test_a_check_stops_one_seed_only_and_the_others_train_on() -> None:
    config = FeedbackConfig(**STUDENT_D1_ONE_SEED)
    seeds = [2, 13, 3, 7]
    solo, solo_reporters, batched, reporters = solo_and_batched(
        config, seeds, stop_on_checks=["D1"]
    )
    for s, b, sr, br in zip(solo, batched, solo_reporters, reporters, strict=True):
        assert_same_run(s, sr.points, b, br.points)
    stopped = [b.stop for b in batched]
    assert stopped[0] is None and stopped[2] is None and stopped[3] is None
    assert stopped[1] is not None and (stopped[1].checks, stopped[1].epoch) == (("D1",), 3)
    assert batched[1].diagnostics["epochs_run"] == 3
    assert [b.diagnostics["epochs_run"] for b in batched] == [4, 3, 4, 4]
    assert {e for _, e, _, _ in reporters[1].points} == {0, 1, 2, 3}


def test_a_seed_whose_reporter_stops_keeps_its_initial_network_and_the_others_go_on() -> None:
    """Its result is its solo run's under the same stop, bit for bit (it never trained)."""

    class StopAtOnce(MemoryReporter):
        def should_stop(self) -> bool:
            return True

    config = FeedbackConfig(**{**DIGITS_MLP, "method": "fa", "epochs": 1})
    reporters = [MemoryReporter(), StopAtOnce(), MemoryReporter(), MemoryReporter()]
    solo_reporters = [MemoryReporter(), StopAtOnce(), MemoryReporter(), MemoryReporter()]
    solo, _, batched, _ = solo_and_batched(config, SEEDS, reporters, solo_reporters)
    for s, b, sr, br in zip(solo, batched, solo_reporters, reporters, strict=True):
        assert_same_run(s, sr.points, b, br.points)
    assert not batched[1].finished and batched[1].diagnostics["optimizer_steps"] == 0
    assert reporters[1].points == []
    assert batched[1].provenance["parameters_sha256"] == solo[1].provenance["parameters_sha256"]
    assert all(
        b.finished and b.diagnostics["optimizer_steps"] > 0 for i, b in enumerate(batched) if i != 1
    )
    assert len({b.provenance["parameters_sha256"] for b in batched}) == len(SEEDS)


class SharedCancel(MemoryReporter):
    """One seed's reporter; every seed's answers should_stop() once the task is cancelled."""

    def __init__(self, cancelled: threading.Event) -> None:
        super().__init__()
        self.cancelled = cancelled

    def should_stop(self) -> bool:
        return self.cancelled.is_set()


def test_a_cancel_ends_every_seed_within_the_bound() -> None:
    config = FeedbackConfig(**{**STUDENT, "width": 128, "depth": 4, "epochs": 100_000})
    cancelled, requested = threading.Event(), []

    def cancel() -> None:
        requested.append(cpu_now())
        cancelled.set()

    # from another thread, as Ray's cancel comes; its delay is wall time, the bound CPU time
    timer = threading.Timer(RUN_BEFORE_CANCEL_S, cancel)
    timer.start()
    try:
        outcomes = get_trainer("feedback").run_seeds(
            config, SEEDS, [SharedCancel(cancelled) for _ in SEEDS], threads=1
        )
    finally:
        timer.cancel()
    ended = cpu_now()
    assert requested, "the task ended before the cancel: make it longer"
    assert ended - requested[0] < CANCEL_BOUND_S
    results = [o for o in outcomes if isinstance(o, RunResult)]
    assert len(results) == len(SEEDS)
    assert all(not r.finished and r.diagnostics["optimizer_steps"] > 0 for r in results)
    # the seeds stepped together until the cancel ended them all at one step
    assert len({r.diagnostics["optimizer_steps"] for r in results}) == 1


# ---------------------------------------------------------------------------------------------
# the stacked network and step in float64, against one network at a time


@pytest.fixture(params=[False, True], ids=["layer-norm", "fused-group-norm"])
def norm_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stacked layer norms as a CPU runs them, and as a GPU does (one fused group norm)."""
    monkeypatch.setitem(stacked_ops.FUSED_NORM, "cpu", request.param)


def stacked_models(
    arch: str, method: str, **overrides: Any
) -> tuple[FeedbackConfig, list[ResidualNet], list[Any], tuple[int, ...]]:
    config = FeedbackConfig(
        **{
            **STUDENT,
            "arch": arch,
            "image_size": 8,
            "patch": 4,
            "heads": 2,
            "method": method,
            **overrides,
        }
    )
    shape = (12,) if arch == "studentnet" else (3, 8, 8)
    models, matrices = [], []
    for seed in range(3):
        init = random_sources(seed).init
        models.append(build_model(config, shape, 5, init).double())
        drawn = draw_feedback(method, config.depth, config.width, 5, init)
        if drawn is not None:
            drawn.layers = [b.double() for b in drawn.layers]
            drawn.top = None if drawn.top is None else drawn.top.double()
        matrices.append(drawn)
    return config, models, matrices, shape


@pytest.mark.parametrize("arch", ["studentnet", "resmlp", "vit_mini"])
def test_the_stacked_network_computes_each_networks_states(arch: str, norm_form: None) -> None:
    _, models, _, shape = stacked_models(arch, "bp")
    net = StackedNet.stack(models, sample_dims=len(shape))
    g = torch.Generator().manual_seed(4)
    own = torch.randn(3, 6, *shape, generator=g, dtype=torch.float64)
    shared = torch.randn(6, *shape, generator=g, dtype=torch.float64)
    own_states, shared_states = net.states(own), net.states(shared)
    for k, model in enumerate(models):
        for stacked, reference in (
            (own_states, model.states(own[k])),
            (shared_states, model.states(shared)),
        ):
            for h, h_ref in zip(stacked, reference, strict=True):
                torch.testing.assert_close(h[k], h_ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(net(own)[k], model(own[k]), rtol=1e-12, atol=1e-14)
        assert len(net.network_tensors(k)) == len(model.state_dict())
        for ours, theirs in zip(net.network_tensors(k), model.state_dict().values(), strict=True):
            assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    "arch, method, overrides",
    [
        ("studentnet", "bp", {"penalty": 0.1}),
        ("studentnet", "fa", {"fa_skip": True}),
        ("resmlp", "fa", {}),
        ("resmlp", "dfa", {"embed_credit": "next", "penalty": 0.1}),
        ("vit_mini", "bp", {}),
        ("vit_mini", "fa", {"vit_credit_tokens": "cls"}),
        ("vit_mini", "dfa", {}),
    ],
)
def test_a_stacked_step_gives_each_network_its_own_losses_and_gradients(
    arch: str, method: str, overrides: dict[str, Any], norm_form: None
) -> None:
    config, models, matrices, shape = stacked_models(arch, method, **overrides)
    net = StackedNet.stack(models, sample_dims=len(shape))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (3, 7), generator=g)
    losses = step_losses(net, x, y, method, stack_feedback(matrices), config)
    assert losses.total.shape == (3,)
    losses.total.sum().backward()
    for k, model in enumerate(models):
        solo = step_losses(model, x[k], y[k], method, matrices[k], config)
        for name in ("total", "ce", "local", "penalty"):
            torch.testing.assert_close(
                getattr(losses, name).expand(3)[k], getattr(solo, name), rtol=1e-12, atol=1e-15
            )
        solo.total.backward()
        for name, p in model.named_parameters():
            stacked_grad = net.params[name].grad
            assert stacked_grad is not None and p.grad is not None, name
            torch.testing.assert_close(stacked_grad[k], p.grad, rtol=1e-10, atol=1e-14, msg=name)


@pytest.mark.parametrize("method", ["bp", "fa", "dfa"])
def test_the_stacked_audit_gives_each_network_its_own_gradients_and_credits(
    method: str, norm_form: None
) -> None:
    config, models, matrices, shape = stacked_models("resmlp", method, ce_reduction="mean")
    net = StackedNet.stack(models, sample_dims=len(shape))
    g = torch.Generator().manual_seed(6)
    x = torch.randn(9, *shape, generator=g, dtype=torch.float64)  # shared by the networks
    y = torch.randint(0, 5, (9,), generator=g)
    stacked = audit_tensors(net, x, y.expand(3, -1), method, stack_feedback(matrices), config)
    for k, model in enumerate(models):
        solo = audit_tensors(model, x, y, method, matrices[k], config)
        for ours, theirs in zip(stacked, solo, strict=True):
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(a[k], b, rtol=1e-10, atol=1e-14)


def test_feedback_declares_batched_tasks() -> None:
    trainer = get_trainer("feedback")
    assert trainer.batched
    assert (trainer.seeds_per_task_default, trainer.max_seeds_per_task) == (8, 64)
