"""Feedback's local loss (trainers.losses.local_credit) against hand-written float64 loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainers.losses.local_credit import local_credit_loss, scale_penalty


def reference_local_credit_loss(out: np.ndarray, credit: np.ndarray) -> float:
    """(1/B) sum_i <f_i, a_i>, the inner product over every feature (and token) of sample i."""
    batch = out.shape[0]
    total = 0.0
    for i in range(batch):
        total += sum(f * a for f, a in zip(out[i].ravel(), credit[i].ravel(), strict=True))
    return total / batch


def reference_scale_penalty(out: np.ndarray) -> float:
    """||f||^2 of every sample (every token of every sample for ViT states), averaged."""
    vectors = out.reshape(-1, out.shape[-1])
    return sum(sum(v * v for v in vector) for vector in vectors) / len(vectors)


@pytest.mark.parametrize("shape", [(5, 4), (3, 6, 4)], ids=["per_sample", "per_token"])
def test_local_credit_loss_matches_the_hand_written_sum(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    out, credit = rng.normal(size=shape), rng.normal(size=shape)
    got = local_credit_loss(torch.tensor(out), torch.tensor(credit))
    assert float(got) == pytest.approx(reference_local_credit_loss(out, credit), rel=1e-13)


@pytest.mark.parametrize("shape", [(5, 4), (3, 6, 4)], ids=["per_sample", "per_token"])
def test_scale_penalty_matches_the_hand_written_mean(shape: tuple[int, ...]) -> None:
    out = np.random.default_rng(1).normal(size=shape)
    got = scale_penalty(torch.tensor(out))
    assert float(got) == pytest.approx(reference_scale_penalty(out), rel=1e-13)


def test_the_credit_is_a_constant_and_the_update_is_credit_over_batch() -> None:
    rng = np.random.default_rng(2)
    out = torch.tensor(rng.normal(size=(5, 4)), requires_grad=True)
    credit = torch.tensor(rng.normal(size=(5, 4)), requires_grad=True)
    grad_out, grad_credit = torch.autograd.grad(
        local_credit_loss(out, credit), (out, credit), allow_unused=True
    )
    torch.testing.assert_close(grad_out, credit.detach() / 5)
    assert grad_credit is None
