"""`cff`'s seed-batched tasks: K seeds as one stacked computation give each seed its solo run's
curves, metrics, diagnostics and warnings (to float32 rounding), a stopped seed is masked while
the others go on, and a cancel ends every seed.

Measured on a CPU: the largest relative difference between a batched seed's logged values and
its solo run's (the batched matrix products sum in another order) was 2.2e-7 over the points of
K = 4 seeds of TINY, and 2.2e-6 over 5 + 4 epochs of a larger batch (it grows as training
amplifies rounding); REL allows ten times the latter."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from trainers import MemoryReporter, RunResult, get_trainer, stacked_ops
from trainers.cff import CFFConfig, CFFTrainer
from trainers.cff import batched as cff_batched
from trainers.cff.model import Block, CFFLayer, Embedding
from trainers.cff.stacked import SeedStack
from trainers.data import ImageSplits, load_for
from trainers.random_sources import derive_seed
from trainers.runtime import RunContext, warm_up

TINY = dict(
    dataset="digits",
    image_size=8,
    width=16,
    depth=2,
    heads=2,
    patch=4,
    epochs=2,
    head_epochs=2,
    batch_size=32,
    train_size=128,
    test_size=64,
    val_fraction=0.05,
    head_lr=2e-2,
    device="cpu",
)
REL = 2e-5
# Diagnostics of the process, not of the run: wall-clock figures differ between any two runs, and
# whether the dataset was already decoded depends on what the process ran before.
OF_THE_PROCESS = {"stage1_train_time_s", "stage1_images_per_s", "dataset_cached"}


@pytest.fixture(scope="module", autouse=True)
def warm_process() -> None:
    """What the first run of a process pays (torch's deterministic-mode import, decoding the
    digits) is paid here, outside the tests' own time."""
    warm_up()
    load_for(config())


@pytest.fixture(autouse=True)
def trained(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[nn.Module]]]:
    """(seed, the modules its run tracks) of every run in the test, in order: their values at
    the end are the run's final parameters (those its parameters_sha256 hashes)."""
    runs: list[tuple[int, list[nn.Module]]] = []
    track = RunContext.track

    def tracking(self: RunContext, *items: Any) -> None:
        runs.append((self.seed, list(items)))
        track(self, *items)

    monkeypatch.setattr(RunContext, "track", tracking)
    return runs


def assert_same_parameters(trained: list[tuple[int, list[nn.Module]]], seeds: list[int]) -> None:
    """Each of `seeds` ran twice (batched and solo): their final layers and heads agree to
    float32 rounding.

    The key part of each attention bias is left out: softmax ignores what it adds to a row of
    scores, so its gradient is zero in exact arithmetic and rounding noise in float32, which
    AdamW's normalisation turns into steps of about lr, differently in any two computations."""
    for seed in seeds:
        first, second = [modules for s, modules in trained if s == seed]
        for a, b in zip(first, second, strict=True):
            for (name, x), (_, y) in zip(
                a.state_dict().items(), b.state_dict().items(), strict=True
            ):
                if name.endswith("attn.qkv.bias"):
                    width = len(x) // 3
                    x, y = (
                        torch.cat([x[:width], x[2 * width :]]),
                        torch.cat([y[:width], y[2 * width :]]),
                    )
                torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def config(**overrides: object) -> CFFConfig:
    return CFFConfig(**{**TINY, **overrides})


def solo(cfg: CFFConfig, seed: int, reporter: MemoryReporter) -> RunResult:
    return get_trainer("cff").run(cfg, seed, reporter, threads=1)


def batched(cfg: CFFConfig, seeds: list[int], reporters: list[MemoryReporter]) -> list[RunResult]:
    outcomes = get_trainer("cff").run_seeds(cfg, seeds, reporters, threads=1)
    assert all(isinstance(o, RunResult) for o in outcomes)
    return outcomes  # type: ignore[return-value]


def close(a: Any, b: Any) -> bool:
    """Equal, or floats equal to REL (NaN equal to NaN), at any depth."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=REL, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_same_run(
    got: RunResult,
    got_points: MemoryReporter,
    want: RunResult,
    want_points: MemoryReporter,
    n_test: int,
) -> None:
    """A batched seed against its solo run: every logged point (step, epoch, name and value),
    the final metrics and diagnostics, the warnings and the run's status."""
    assert [p[:3] for p in got_points.points] == [p[:3] for p in want_points.points]
    for g, w in zip(got_points.points, want_points.points, strict=True):
        assert close(g[3], w[3]), (g, w)
    assert (got.finished, got.diverged, got.diverged_at_step) == (
        want.finished,
        want.diverged,
        want.diverged_at_step,
    )
    accuracies = {"test_accuracy", "test_accuracy_noise_floor"}
    assert close(
        {k: v for k, v in got.metrics.items() if k not in accuracies},
        {k: v for k, v in want.metrics.items() if k not in accuracies},
    )
    # an argmax may flip on a rounding difference: at most one test image
    assert got.metrics.keys() >= accuracies & want.metrics.keys()
    if "test_accuracy" in want.metrics:
        assert abs(got.metrics["test_accuracy"] - want.metrics["test_accuracy"]) <= 1 / n_test
    assert close(
        {k: v for k, v in got.diagnostics.items() if k not in OF_THE_PROCESS},
        {k: v for k, v in want.diagnostics.items() if k not in OF_THE_PROCESS},
    )
    assert [(w.diagnostic, w.message) for w in got.warnings] == [
        (w.diagnostic, w.message) for w in want.warnings
    ]


def test_cff_declares_itself_batched() -> None:
    assert CFFTrainer.batched is True


def test_four_batched_seeds_equal_four_solo_runs(trained: list) -> None:
    cfg = config()
    seeds = [0, 1, 2, 3]
    reporters = [MemoryReporter() for _ in seeds]
    results = batched(cfg, seeds, reporters)
    for seed, result, reporter in zip(seeds, results, reporters, strict=True):
        solo_reporter = MemoryReporter()
        want = solo(cfg, seed, solo_reporter)
        assert want.finished and "test_accuracy" in want.metrics
        assert_same_run(result, reporter, want, solo_reporter, n_test=64)
        assert result.provenance["seed"] == seed
        assert result.provenance["parameters_sha256"] is not None
    assert_same_parameters(trained, seeds)
    # each seed trained its own model from its own generators
    assert len({r.provenance["parameters_sha256"] for r in results}) == 4
    assert len({r.metrics["loss"] for r in results}) == 4


def poison_after_first_epoch(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> Callable[[MemoryReporter], None]:
    """From the first point its reporter holds on, the seed's augmented images are NaN: its
    loss turns non-finite in its second epoch, in a solo run and in a batched one alike.
    Returns the function that names the reporter to watch."""
    watched: dict[str, MemoryReporter] = {}
    augment_seed = derive_seed(seed, "augment")
    images = ImageSplits.images

    def poisoned(
        self: ImageSplits, split: Any, positions: Any = None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = images(self, split, positions, **kwargs)
        generator = kwargs.get("augment_generator")
        if (
            generator is not None
            and generator.initial_seed() == augment_seed
            and watched["reporter"].points
        ):
            x = x * math.nan
        return x, y

    stacked = cff_batched.stacked_images

    def poisoned_stack(
        seeds: Any, split: Any, positions: Any, generators: Any = None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batched path's images of all the seeds at once: the seed's slice poisoned."""
        x, y = stacked(seeds, split, positions, generators, **kwargs)
        for k, generator in enumerate(generators or []):
            if generator.initial_seed() == augment_seed and watched["reporter"].points:
                x = x.index_fill(0, torch.tensor([k], device=x.device), math.nan)
        return x, y

    monkeypatch.setattr(ImageSplits, "images", poisoned)
    monkeypatch.setattr(cff_batched, "stacked_images", poisoned_stack)
    return lambda reporter: watched.update(reporter=reporter)


def test_a_diverging_seed_is_masked_and_the_others_equal_their_solo_runs(
    monkeypatch: pytest.MonkeyPatch, trained: list
) -> None:
    cfg = config(epochs=3)
    seeds = [4, 5, 6]
    watch = poison_after_first_epoch(monkeypatch, seed=5)
    want = []
    for seed in seeds:
        reporter = MemoryReporter()
        watch(reporter)
        want.append((solo(cfg, seed, reporter), reporter))
    assert want[1][0].diverged and not want[0][0].diverged
    reporters = [MemoryReporter() for _ in seeds]
    watch(reporters[1])
    results = batched(cfg, seeds, reporters)
    for result, reporter, (want_result, want_reporter) in zip(
        results, reporters, want, strict=True
    ):
        assert_same_run(result, reporter, want_result, want_reporter, n_test=64)
    # the diverged seed ends with its best (first) epoch's layers and its initial head
    assert_same_parameters(trained, seeds)
    diverged = results[1]
    assert diverged.diverged and diverged.finished
    assert [e for _, e, name, _ in reporters[1].points if name == "loss"] == [0, 1]
    assert "test_accuracy" not in diverged.metrics  # its last finite epoch's metrics
    assert not any(name == "head_loss" for _, _, name, _ in reporters[1].points)
    for other in (0, 2):
        assert results[other].metrics["test_accuracy"] >= 0.0
        assert [e for _, e, name, _ in reporters[other].points if name == "loss"] == [0, 1, 2]


class StopAfter(MemoryReporter):
    """Answers should_stop() once `rule(self)` holds; counts its should_stop() calls."""

    def __init__(self, rule: Callable[[StopAfter], bool]) -> None:
        super().__init__()
        self.rule = rule
        self.calls = 0
        self.calls_at_first_point: int | None = None

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None:
        if self.calls_at_first_point is None:
            self.calls_at_first_point = self.calls
        super().log(step, metrics, epoch)

    def should_stop(self) -> bool:
        self.calls += 1
        return self.rule(self)


def never(_: StopAfter) -> bool:
    return False


def after_first_point(reporter: StopAfter) -> bool:
    return bool(reporter.points)


def inside_the_second_epoch(reporter: StopAfter) -> bool:
    """True from the second step of the second stage-1 epoch on (a part of an epoch)."""
    first = reporter.calls_at_first_point
    return first is not None and reporter.calls - first >= 3


def after_first_head_epoch(reporter: StopAfter) -> bool:
    return any(name == "head_loss" for _, _, name, _ in reporter.points)


def test_a_cancel_ends_every_seed(trained: list) -> None:
    cfg = config(epochs=50)
    seeds = [0, 1, 2]
    reporters = [StopAfter(after_first_point) for _ in seeds]
    results = batched(cfg, seeds, reporters)
    for seed, result, reporter in zip(seeds, results, reporters, strict=True):
        assert not result.finished
        assert {epoch for _, epoch, _, _ in reporter.points} == {0}
        assert result.diagnostics["stage1_images"] == 128  # one epoch, then the loop ended
        assert "test_accuracy" not in result.metrics
        solo_reporter = StopAfter(after_first_point)
        assert_same_run(result, reporter, solo(cfg, seed, solo_reporter), solo_reporter, n_test=64)
    assert_same_parameters(trained, seeds)


@pytest.mark.parametrize("rule", [inside_the_second_epoch, after_first_head_epoch])
def test_a_seed_stopped_alone_keeps_its_solo_result_while_the_others_go_on(
    rule: Callable[[StopAfter], bool], trained: list
) -> None:
    cfg = config(head_epochs=3)
    seeds = [7, 8, 9]
    rules = [never, rule, never]
    reporters = [StopAfter(r) for r in rules]
    results = batched(cfg, seeds, reporters)
    for seed, r, result, reporter in zip(seeds, rules, results, reporters, strict=True):
        solo_reporter = StopAfter(r)
        want = solo(cfg, seed, solo_reporter)
        assert_same_run(result, reporter, want, solo_reporter, n_test=64)
        assert reporter.calls == solo_reporter.calls  # asked as often as its solo run asks
    assert_same_parameters(trained, seeds)
    assert not results[1].finished
    assert results[0].finished and results[2].finished
    assert "test_accuracy" in results[0].metrics and "test_accuracy" not in results[1].metrics


def test_an_imbalanced_config_runs_its_seeds_on_the_solo_path() -> None:
    cfg = config(imbalance_ratio=4.0, epochs=1, head_epochs=1, train_size=None, batch_size=256)
    reporters = [MemoryReporter(), MemoryReporter()]
    results = batched(cfg, [0, 1], reporters)
    for seed, result, reporter in zip((0, 1), results, reporters, strict=True):
        solo_reporter = MemoryReporter()
        want = solo(cfg, seed, solo_reporter)
        assert reporter.points == solo_reporter.points  # bit for bit
        assert result.provenance["parameters_sha256"] == want.provenance["parameters_sha256"]
    assert results[0].diagnostics["n_train"] != results[1].diagnostics["n_train"]


def test_adamw_on_a_stack_is_each_seeds_adamw_exactly_and_dropping_keeps_its_state() -> None:
    generator = torch.Generator().manual_seed(0)
    modules = [nn.Sequential(nn.LayerNorm(37), nn.Linear(37, 19)) for _ in range(4)]
    for module in modules:
        for p in module.parameters():
            p.data.normal_(generator=generator)
    alone = [copy.deepcopy(m) for m in modules]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01) for m in alone]
    stack = SeedStack(modules, lr=1e-2, weight_decay=0.01)
    alive = [0, 1, 2, 3]
    for step in range(6):
        if step == 3:
            alive = [0, 2, 3]
            stack.keep([0, 2, 3])
        for k in alive:
            for p in alone[k].parameters():
                p.grad = torch.randn(p.shape, generator=generator)
        for name, p in stack.params.items():
            p.grad = torch.stack([alone[k].get_parameter(name).grad for k in alive])
        stack.step()
        for k in alive:
            optimizers[k].step()
        for position, k in enumerate(alive):
            for name, value in alone[k].state_dict().items():
                assert torch.equal(stack.state(position)[name], value), (step, k, name)
    assert len(stack) == 3


def test_a_stack_runs_each_seeds_module_and_norms_each_seeds_gradient() -> None:
    generator = torch.Generator().manual_seed(2)
    modules = [nn.Sequential(nn.Linear(6, 5), nn.GELU(), nn.Linear(5, 3)) for _ in range(3)]
    stack = SeedStack(modules, lr=1e-3)
    x = torch.randn(3, 4, 6, generator=generator)
    out = stack(x)
    shared = stack(x[0], shared=True)
    out.square().sum().backward()
    norms = stack.grad_norms()
    for k, module in enumerate(modules):
        torch.testing.assert_close(out[k], module(x[k]), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(shared[k], module(x[0]), rtol=1e-6, atol=1e-6)
        module(x[k]).square().sum().backward()
        want = torch.nn.utils.get_total_norm([p.grad for p in module.parameters()])
        torch.testing.assert_close(norms[k], want, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("fused_norm", [False, True], ids=["layer-norm", "fused-group-norm"])
@pytest.mark.parametrize("first", [True, False], ids=["layer-0", "later-layer"])
def test_a_stack_of_cff_layers_is_each_seeds_layer_in_float64(
    fused_norm: bool, first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cff's layers run on their stacked parameters without vmap (trainers.stacked_ops): each
    seed's slice of the output and of every parameter's gradient is its own layer's, to float64
    rounding (1e-12 of the gradient's largest entry), on the seeds' own inputs and on one
    shared input, with the layer norm as a CPU runs it and as a GPU does (one group norm)."""
    monkeypatch.setitem(stacked_ops.FUSED_NORM, "cpu", fused_norm)
    generator = torch.Generator().manual_seed(3)
    layers = []
    for _ in range(3):
        embedding = Embedding(48, 16, 32) if first else None
        layer = CFFLayer(Block(32, 4, 2), embedding).double()
        for p in layer.parameters():
            p.data.normal_(generator=generator)
        layers.append(layer)
    stack = SeedStack(layers, lr=1e-3)
    x = torch.randn(3, 5, 16, 48 if first else 32, generator=generator, dtype=torch.float64)
    out = stack(x)
    out.square().sum().backward()
    shared = stack(x[0], shared=True)
    for k, layer in enumerate(layers):
        own = layer(x[k])
        torch.testing.assert_close(out[k], own, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(shared[k], layer(x[0]), rtol=1e-12, atol=1e-12)
        own.square().sum().backward()
        for name, p in layer.named_parameters():
            assert p.grad is not None and stack.params[name].grad is not None, name
            scale = float(p.grad.abs().max())  # gradients of N(0, 1) weights reach 1e6
            torch.testing.assert_close(
                stack.params[name].grad[k], p.grad, rtol=0, atol=1e-12 * scale, msg=name
            )
