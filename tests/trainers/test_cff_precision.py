"""`cff`'s cheap GPU fixes on a CPU: patchify by reshape is F.unfold's, fp32 is today's path bit
for bit, tf32 touches only a GPU (and restores the process's setting), bf16 runs and stays
close, and the dataset keeps one copy per device."""

from __future__ import annotations

import pydantic
import pytest
import torch
import torch.nn.functional as F

import trainers.cff.model
import trainers.cff.trainer
from trainers import MemoryReporter, RunResult, get_trainer
from trainers.cff import CFFConfig, patchify
from trainers.cff.model import Attention, explicit_attention
from trainers.data import load_for
from trainers.precision import precision_scope
from trainers.runtime import warm_up

TINY = dict(
    dataset="digits",
    image_size=8,
    width=16,
    depth=2,
    heads=2,
    patch=4,
    epochs=2,
    head_epochs=2,
    batch_size=64,
    train_size=256,
    test_size=128,
    head_lr=2e-2,
    device="cpu",
)
CPU = torch.device("cpu")

# Seed 0 of TINY before patchify and the precision field existed (F.unfold, no scope), one
# torch thread: the stage-1 loss and head_loss curves and the test accuracy.
BEFORE_LOSS = [(4, 8.975328922271729), (8, 8.424411296844482)]
BEFORE_HEAD_LOSS = [(12, 2.3670955300331116), (16, 2.332451045513153)]
BEFORE_TEST_ACCURACY = 0.2109375


@pytest.fixture(scope="module", autouse=True)
def warm_process() -> None:
    """What the first run of a process pays (torch's deterministic-mode import, decoding the
    digits) is paid here, outside the tests' own time."""
    warm_up()
    load_for(CFFConfig(**TINY))


def run_cff(seed: int = 0, **overrides: object) -> tuple[RunResult, MemoryReporter]:
    reporter = MemoryReporter()
    result = get_trainer("cff").run(CFFConfig(**{**TINY, **overrides}), seed, reporter, threads=1)
    return result, reporter


def unfold_patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    return F.unfold(x, kernel_size=patch, stride=patch).transpose(1, 2)


@pytest.mark.parametrize(
    ("shape", "patch"),
    [
        ((3, 3, 8, 8), 4),
        ((2, 1, 12, 8), 2),
        ((2, 3, 32, 32), 4),
        ((1, 2, 5, 5), 5),
        ((2, 3, 6, 6), 1),
    ],
)
def test_patchify_equals_unfold_exactly(shape: tuple[int, ...], patch: int) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(patchify(x, patch), unfold_patchify(x, patch))
    channels_last = x.contiguous(memory_format=torch.channels_last)
    assert torch.equal(patchify(channels_last, patch), unfold_patchify(x, patch))


def test_fp32_is_the_unfold_path_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    result, reporter = run_cff()
    monkeypatch.setattr(trainers.cff.model, "patchify", unfold_patchify)
    monkeypatch.setattr(trainers.cff.trainer, "patchify", unfold_patchify)
    before, before_reporter = run_cff()
    assert reporter.points == before_reporter.points
    assert result.provenance["parameters_sha256"] == before.provenance["parameters_sha256"]
    # the values the code gave before the change, to a tolerance for another CPU's float32
    # kernels (bf16 moves the head loss by about 3e-4)
    for name, expected in (("loss", BEFORE_LOSS), ("head_loss", BEFORE_HEAD_LOSS)):
        curve = reporter.curve(name)
        assert [step for step, _ in curve] == [step for step, _ in expected]
        assert [v for _, v in curve] == pytest.approx([v for _, v in expected], rel=1e-5)
    assert result.metrics["test_accuracy"] == BEFORE_TEST_ACCURACY


def test_tf32_acts_only_on_a_gpu_and_restores_the_setting() -> None:
    fp32, fp32_reporter = run_cff()
    tf32, tf32_reporter = run_cff(precision="tf32")
    assert tf32_reporter.points == fp32_reporter.points  # a CPU has no TF32
    assert tf32.provenance["parameters_sha256"] == fp32.provenance["parameters_sha256"]
    assert torch.get_float32_matmul_precision() == "highest"
    torch.set_float32_matmul_precision("medium")
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with precision_scope("tf32", CPU):
                assert torch.get_float32_matmul_precision() == "high"
                assert torch.backends.cuda.matmul.allow_tf32
                assert torch.backends.cudnn.allow_tf32
                raise RuntimeError("inside")
        assert torch.get_float32_matmul_precision() == "medium"  # restored, even on an error
    finally:
        torch.set_float32_matmul_precision("highest")


def test_fp32_turns_tf32_off_everywhere_cudnn_included_and_restores_the_settings() -> None:
    """torch lets cuDNN convolve in TF32 by default (and a process may allow TF32 matmuls):
    inside an fp32 scope neither is allowed; afterwards both are as they were."""
    cudnn_before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        with precision_scope("fp32", CPU):
            assert not torch.backends.cudnn.allow_tf32
            assert torch.get_float32_matmul_precision() == "highest"
            assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn_before
        torch.set_float32_matmul_precision("highest")


def test_only_bf16_autocasts_and_float32_blocks_are_full_float32() -> None:
    linear = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    for precision in ("fp32", "tf32"):
        with precision_scope(precision, CPU) as scope, scope.autocast():
            assert linear(x).dtype == torch.float32
            assert not torch.is_autocast_enabled("cpu")
    with precision_scope("bf16", CPU) as scope:
        assert torch.get_float32_matmul_precision() == "highest"
        assert linear(x).dtype == torch.float32  # only what the trainer puts under autocast
        with scope.autocast():
            assert linear(x).dtype == torch.bfloat16
            with scope.float32():  # what must stay exact, say the cosines of the loss
                assert linear(x).dtype == torch.float32
            assert linear(x).dtype == torch.bfloat16
    with precision_scope("tf32", CPU) as scope:
        with scope.float32():
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "high"


def test_bf16_runs_and_stays_close_to_fp32() -> None:
    fp32, fp32_reporter = run_cff()
    bf16, bf16_reporter = run_cff(precision="bf16")
    assert bf16.finished and not bf16.diverged
    assert bf16_reporter.points != fp32_reporter.points  # the forward passes did change
    names = [name for _, _, name, _ in fp32_reporter.points]
    assert [name for _, _, name, _ in bf16_reporter.points] == names
    for (_, _, name, a), (_, _, _, b) in zip(
        fp32_reporter.points, bf16_reporter.points, strict=True
    ):
        # the loss is computed in float32 from bf16 features: a few bf16 ulps (2^-8) at most
        assert b == pytest.approx(a, rel=0.02, abs=0.01), name
    assert abs(bf16.metrics["test_accuracy"] - fp32.metrics["test_accuracy"]) <= 0.1


def test_explicit_attention_matches_the_fused_kernel_and_its_gradient() -> None:
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=generator, requires_grad=True) for _ in range(3))
    fused = F.scaled_dot_product_attention(q, k, v)
    explicit = explicit_attention(q, k, v)
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-6)
    fused_grads = torch.autograd.grad(fused.square().sum(), (q, k, v))
    explicit_grads = torch.autograd.grad(explicit.square().sum(), (q, k, v))
    for a, b in zip(explicit_grads, fused_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    attention = Attention(8, 2)
    x = torch.randn(2, 5, 8, generator=generator)
    expected = attention(x)
    attention.fused = False
    torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-6)


def test_an_unknown_precision_is_refused_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="precision"):
        CFFConfig(**{**TINY, "precision": "fp16"})
    with pytest.raises(ValueError, match="precision"):
        with precision_scope("fp16", CPU):  # type: ignore[arg-type]
            pass
    assert CFFConfig(**TINY).precision == "fp32"


def test_the_dataset_keeps_one_copy_per_device_and_none_on_the_cpu() -> None:
    data = load_for(CFFConfig(**TINY))
    assert all(a is b for a, b in zip(data.on(CPU), data.on("cpu"), strict=True))
    # "meta" stands in for a GPU here: a copy made once, then reused
    copies = data.on("meta")
    assert [t.device.type for t in copies] == ["meta"] * 4
    assert [t.shape for t in copies] == [t.shape for t in data.on("cpu")]
    assert all(a is b for a, b in zip(data.on("meta"), copies, strict=True))
