"""`ssl`'s precision setting (trainers.precision): fp32 is the run as it always was; bf16 runs
the networks under bfloat16 autocast and keeps GradScale, the normalisation and the losses in
float32, and lands near the fp32 run; a bad value is refused naming the field."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch

from tests.trainers.test_runtime_contract import SSL_TINY
from trainers import get_trainer
from trainers.base import MemoryReporter
from trainers.precision import precision_scope
from trainers.ssl.model import SSLModel
from trainers.ssl.trainer import ssl_loss


@pytest.mark.parametrize("method", ["simclr", "simsiam", "byol"])
def test_bf16_runs_the_networks_in_bfloat16_and_the_loss_in_float32(method: str) -> None:
    config = get_trainer("ssl").Config(**{**SSL_TINY, "method": method})
    model = SSLModel(config, 3, torch.Generator().manual_seed(0))
    target = SSLModel(config, 3, torch.Generator().manual_seed(0)) if method == "byol" else None
    seen: list[torch.dtype] = []
    model.backbone.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    views = torch.rand(2, 16, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with precision_scope("bf16", torch.device("cpu")) as precision:
        loss = ssl_loss(model, target, views[0], views[1], 0.5, precision)
    assert seen and set(seen) == {torch.bfloat16}
    assert loss.dtype == torch.float32 and math.isfinite(float(loss))
    seen.clear()
    exact = ssl_loss(model, target, views[0], views[1], 0.5)
    assert set(seen) == {torch.float32} and exact.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: the same loss to about a percent
    assert float(loss) == pytest.approx(float(exact), rel=0.05, abs=0.02)


def test_a_bf16_run_lands_near_its_fp32_run() -> None:
    trainer = get_trainer("ssl")
    results = {}
    for precision in ("fp32", "bf16"):
        config = trainer.Config(**{**SSL_TINY, "epochs": 2, "precision": precision})
        results[precision] = trainer.run(config, 1, MemoryReporter(), threads=1)
    fp32, bf16 = results["fp32"], results["bf16"]
    assert bf16.finished and not bf16.diverged
    assert bf16.provenance["parameters_sha256"] != fp32.provenance["parameters_sha256"]
    assert abs(bf16.metrics["loss"] - fp32.metrics["loss"]) < 0.05
    assert abs(bf16.metrics["knn_accuracy"] - fp32.metrics["knn_accuracy"]) < 0.1


def test_a_bad_precision_is_refused_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        get_trainer("ssl").Config(**{**SSL_TINY, "precision": "fp16"})
    assert refused.value.errors()[0]["loc"] == ("precision",)
