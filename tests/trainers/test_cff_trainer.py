"""The `cff` trainer on tiny CPU configs: curves, determinism, subtract == no margin, errors."""

from __future__ import annotations

import math
from pathlib import Path

import pydantic
import pytest
import torch

import trainers.cff.trainer
from trainers import MemoryReporter, Reporter, RunResult, get_trainer
from trainers.cff import CFFConfig
from trainers.data import DatasetUnavailable
from trainers.losses.supcon_margin import supcon_margin_loss_from_similarities

TINY = dict(
    dataset="digits",
    image_size=8,
    width=16,
    depth=2,
    heads=2,
    patch=4,
    epochs=2,
    head_epochs=2,
    batch_size=128,
    head_lr=2e-2,
)


def tiny(**overrides: object) -> CFFConfig:
    return CFFConfig(**{**TINY, **overrides})


def run_cff(config: CFFConfig, seed: int, reporter: Reporter | None = None) -> RunResult:
    return get_trainer("cff").run(config, seed, reporter or MemoryReporter())


def test_a_tiny_run_learns_and_logs_per_layer_diagnostics_every_epoch() -> None:
    reporter = MemoryReporter()
    result = run_cff(tiny(epochs=4, head_epochs=4), seed=0, reporter=reporter)
    m = result.metrics
    assert m["test_accuracy"] > 0.4  # chance is 0.1
    n_test = result.diagnostics["n_test"]
    assert m["test_accuracy_noise_floor"] == pytest.approx(
        m["test_accuracy"] * (1 - m["test_accuracy"]) / n_test
    )
    for layer in (0, 1):
        for name in ("car_layer", "grad_norm_layer", "loss_layer", "val_loss_layer"):
            curve = reporter.curve(f"{name}{layer}")
            assert len(curve) == 4, name
            assert all(v >= 0 for _, v in curve)
        assert 0.0 <= m[f"car_layer{layer}"] <= 1.0
    assert 0.0 <= m["car_layer0_early"] <= 1.0
    assert len(result.diagnostics["final_grad_norms"]) == 2
    assert result.diagnostics["margins"] == pytest.approx([0.4, 0.1])
    # steps are optimizer steps: strictly increasing over stage 1 then stage 2
    steps = [s for s, _ in reporter.curve("car_layer0")] + [
        s for s, _ in reporter.curve("head_loss")
    ]
    assert steps == sorted(set(steps))
    assert "test_top5_accuracy" not in m  # ten classes: top-1 only


def test_same_config_and_seed_give_identical_curves() -> None:
    a, b = MemoryReporter(), MemoryReporter()
    run_cff(tiny(), seed=3, reporter=a)
    run_cff(tiny(), seed=3, reporter=b)
    assert a.points == b.points
    c = MemoryReporter()
    run_cff(tiny(), seed=4, reporter=c)
    assert c.points != a.points


def test_subtract_and_no_margin_train_identical_parameters() -> None:
    subtract = run_cff(tiny(margin_mode="subtract"), seed=1)
    none = run_cff(tiny(margin_mode="none"), seed=1)
    clamp = run_cff(tiny(margin_mode="clamp"), seed=1)
    # the hash covers every parameter and buffer of the layers and the head, bit for bit
    assert subtract.provenance["parameters_sha256"] == none.provenance["parameters_sha256"]
    assert subtract.metrics["test_accuracy"] == none.metrics["test_accuracy"]
    # the reported layer losses differ by exactly the layer's margin (to float32 rounding)
    for layer, margin in enumerate((0.4, 0.1)):
        diff = subtract.metrics[f"loss_layer{layer}"] - none.metrics[f"loss_layer{layer}"]
        assert diff == pytest.approx(margin, abs=1e-5)
    assert clamp.provenance["parameters_sha256"] != none.provenance["parameters_sha256"]


def test_clamp_truncates_layer0_gradients_on_digits() -> None:
    clamp = run_cff(tiny(margin_mode="clamp", epochs=3), seed=0)
    subtract = run_cff(tiny(margin_mode="subtract", epochs=3), seed=0)
    # the mechanism of paper 000: saturated positives -> smaller layer-0 gradients under clamp
    assert clamp.metrics["car_layer0_early"] > 0.5
    assert clamp.metrics["grad_norm_layer0"] < subtract.metrics["grad_norm_layer0"]
    assert any(w.diagnostic == "car_layer0_early" for w in clamp.warnings)
    assert not subtract.warnings


def test_top5_is_reported_with_twenty_or_more_classes() -> None:
    config = tiny(
        dataset="synthetic",
        image_size=None,
        synthetic_classes=20,
        synthetic_train_per_class=12,
        synthetic_test_per_class=5,
        epochs=1,
        head_epochs=1,
    )
    m = run_cff(config, seed=0).metrics
    assert m["test_top5_accuracy"] >= m["test_accuracy"]


def test_missing_dataset_fails_before_any_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEEDGRID_DATA_ROOTS", f"empty={tmp_path}")
    reporter = MemoryReporter()
    with pytest.raises(DatasetUnavailable, match="'cifar10' not found under") as info:
        get_trainer("cff").run(
            tiny(dataset="cifar10", image_size=None, data_root="empty"), 0, reporter
        )
    # the root by its operator's name and the files relative to it, never its absolute path
    assert "under data root 'empty'" in str(info.value)
    assert "cifar-10-batches-py/data_batch_1" in str(info.value)
    assert str(tmp_path) not in str(info.value)
    assert reporter.points == []


def test_stop_request_ends_the_run_early() -> None:
    class StopAfterFirstEpoch(MemoryReporter):
        def should_stop(self) -> bool:
            return bool(self.points)

    reporter = StopAfterFirstEpoch()
    result = run_cff(tiny(epochs=50), seed=0, reporter=reporter)
    assert result.finished is False
    assert {epoch for _, epoch, _, _ in reporter.points} == {0}  # no later epoch, no head epoch
    # what the run has: its last stage-1 epoch; a stopped run skips the test pass
    assert result.metrics["loss"] == reporter.curve("loss")[-1][1]
    assert "test_accuracy" not in result.metrics


def test_a_non_finite_layer_loss_ends_the_run_as_diverged(monkeypatch: pytest.MonkeyPatch) -> None:
    reporter = MemoryReporter()

    def nan_after_the_first_epoch(*args: object, **kwargs: object) -> torch.Tensor:
        loss = supcon_margin_loss_from_similarities(*args, **kwargs)
        return loss * math.nan if reporter.points else loss

    monkeypatch.setattr(
        trainers.cff.trainer, "supcon_margin_loss_from_similarities", nan_after_the_first_epoch
    )
    result = run_cff(tiny(epochs=5), seed=0, reporter=reporter)
    assert result.diverged and result.finished
    assert [epoch for _, epoch, name, _ in reporter.points if name == "loss"] == [0, 1]
    assert result.diverged_at_step == reporter.curve("loss")[1][0]
    assert result.metrics["loss"] == reporter.curve("loss")[0][1]  # the last finite epoch's


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"width": 18, "heads": 4}, "divisible by heads"),
        ({"image_size": 10, "patch": 4}, "divisible by patch"),
        ({"margin_mode": "squash"}, "margin_mode"),
        ({"temperature": 0.0}, "temperature"),
        ({"val_fraction": 0.0}, "select_by_validation"),
        ({"dataset": "imagenet"}, "dataset"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        tiny(**overrides)
