"""The CFF margin loss in float64 against a hand-written reference, autograd and finite
differences (spec section 2.2 and its derived properties)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from trainers.cff import CFFConfig, margin_schedule
from trainers.losses.supcon_margin import (
    clamp_activation_rate,
    expected_positives_per_anchor,
    pair_similarities,
    supcon_margin_loss,
    supcon_margin_loss_from_similarities,
)

TAU = 0.15


def reference_loss(f1: np.ndarray, f2: np.ndarray, y: np.ndarray, m: float, mode: str) -> float:
    """Loop-by-loop float64 version of spec section 2.2."""
    z = np.concatenate([f1, f2])
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    yy = np.concatenate([y, y])
    n = len(z)
    total = 0.0
    for i in range(n):
        a = np.empty(n)
        for j in range(n):
            s = float(z[i] @ z[j])
            if mode == "clamp" and j != i and yy[j] == yy[i]:
                s = min(s + m, 1.0)
            a[j] = s / TAU
        row_max = a.max()
        denominator = sum(np.exp(a[k] - row_max) for k in range(n) if k != i)
        positives = [j for j in range(n) if j != i and yy[j] == yy[i]]
        log_p = [
            a[j] - row_max - np.log(denominator) - (m if mode == "subtract" else 0.0)
            for j in positives
        ]
        total += -sum(log_p) / len(positives)
    return total / n


def features(n: int = 6, dim: int = 5, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    f1 = torch.randn(n, dim, generator=g, dtype=torch.float64)
    f2 = f1 + 0.7 * torch.randn(n, dim, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 2, 1, 0][:n])
    return f1.requires_grad_(), f2.requires_grad_(), y


def loss_and_grads(mode: str, margin: float, stability: str = "detach", seed: int = 0):
    f1, f2, y = features(seed=seed)
    loss = supcon_margin_loss(
        f1, f2, y, margin, temperature=TAU, margin_mode=mode, stability=stability
    )
    g1, g2 = torch.autograd.grad(loss, (f1, f2))
    return loss, g1, g2, (f1, f2, y)


@pytest.mark.parametrize("mode", ["clamp", "subtract", "none"])
def test_loss_equals_the_loop_reference(mode: str) -> None:
    loss, _, _, (f1, f2, y) = loss_and_grads(mode, 0.4)
    expected = reference_loss(f1.detach().numpy(), f2.detach().numpy(), y.numpy(), 0.4, mode)
    assert abs(float(loss.detach()) - expected) < 1e-12


@pytest.mark.parametrize("mode", ["clamp", "subtract", "none"])
def test_autograd_matches_finite_differences_of_the_reference(mode: str) -> None:
    _, g1, _, (f1, f2, y) = loss_and_grads(mode, 0.4)
    a, b, labels = f1.detach().numpy(), f2.detach().numpy(), y.numpy()
    h = 1e-6
    for i, k in itertools.product(range(a.shape[0]), range(a.shape[1])):
        plus, minus = a.copy(), a.copy()
        plus[i, k] += h
        minus[i, k] -= h
        numeric = (
            reference_loss(plus, b, labels, 0.4, mode) - reference_loss(minus, b, labels, 0.4, mode)
        ) / (2 * h)
        assert abs(numeric - float(g1[i, k])) < 1e-7, (mode, i, k)


def test_subtract_has_the_gradients_of_no_margin_and_a_loss_shifted_by_m() -> None:
    for margin in (0.4, 0.1, 1.3):
        sub, g1_sub, g2_sub, _ = loss_and_grads("subtract", margin)
        none, g1_none, g2_none, _ = loss_and_grads("none", margin)
        assert torch.max(torch.abs(g1_sub - g1_none)) < 1e-10
        assert torch.max(torch.abs(g2_sub - g2_none)) < 1e-10
        assert abs(float((sub - none).detach()) - margin) < 1e-12
    clamp, g1_clamp, _, _ = loss_and_grads("clamp", 0.4)
    assert torch.max(torch.abs(g1_clamp - g1_none)) > 1e-3  # clamping does change gradients


def test_a_saturated_positive_pair_gets_exactly_zero_gradient_on_its_logit() -> None:
    f1, f2, y = features()
    s, positives = pair_similarities(f1.detach(), f2.detach(), y)
    s = s.clone().requires_grad_()
    margin = 0.4
    loss = supcon_margin_loss_from_similarities(
        s, positives, margin, temperature=TAU, margin_mode="clamp"
    )
    (grad,) = torch.autograd.grad(loss, s)
    saturated = positives & (s.detach() + margin > 1.0)
    unsaturated = positives & (s.detach() + margin < 1.0)
    assert saturated.sum() >= 2 and unsaturated.sum() >= 2  # the example has both kinds
    assert torch.all(grad[saturated] == 0.0)
    assert torch.all(grad[unsaturated] != 0.0)
    # a saturated pair still sits in the denominator of its row: the row's other logits feel it
    (grad_none,) = torch.autograd.grad(
        supcon_margin_loss_from_similarities(
            s, positives, margin, temperature=TAU, margin_mode="none"
        ),
        s,
    )
    assert torch.all(grad_none[saturated] != 0.0)


def test_detach_and_direct_agree_to_rounding() -> None:
    for mode in ("clamp", "subtract", "none"):
        for seed in range(3):
            loss_d, g1_d, g2_d, _ = loss_and_grads(mode, 0.4, "detach", seed)
            loss_r, g1_r, g2_r, _ = loss_and_grads(mode, 0.4, "direct", seed)
            assert abs(float((loss_d - loss_r).detach())) < 1e-13
            assert torch.max(torch.abs(g1_d - g1_r)) < 1e-13
            assert torch.max(torch.abs(g2_d - g2_r)) < 1e-13


def test_clamp_activation_rate_equals_a_hand_count() -> None:
    # Three images in 2-D, two views each; labels [0, 0, 1]. Unit vectors at known angles.
    def unit(deg: float) -> list[float]:
        return [np.cos(np.radians(deg)), np.sin(np.radians(deg))]

    f1 = torch.tensor([unit(0), unit(30), unit(90)], dtype=torch.float64)
    f2 = torch.tensor([unit(10), unit(70), unit(100)], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    s, positives = pair_similarities(f1, f2, y)
    # anchors 0:0deg 1:30deg 2:90deg 3:10deg 4:70deg 5:100deg; positives among {0,1,3,4} and {2,5}
    # pairs (unordered) of class 0: 0-1 30deg, 0-3 10deg, 0-4 70deg, 1-3 20deg, 1-4 40deg,
    # 3-4 60deg; class 1: 2-5 10deg. With m = 0.4 a pair saturates iff cos > 0.6, i.e. angle
    # < 53.13deg: 0-1, 0-3, 1-3, 1-4, 2-5 saturate; 0-4 and 3-4 do not. 5 of 7 pairs.
    assert int(positives.sum()) == 14
    assert float(clamp_activation_rate(s, positives, 0.4)) == pytest.approx(5 / 7, abs=1e-15)
    # m = 0.1: cos > 0.9, angle < 25.84deg: 0-3, 1-3, 2-5 -> 3 of 7
    assert float(clamp_activation_rate(s, positives, 0.1)) == pytest.approx(3 / 7, abs=1e-15)


def test_expected_positive_density_matches_label_draws() -> None:
    rng = np.random.default_rng(0)
    n, k = 64, 10
    counts = []
    for _ in range(400):
        y = torch.from_numpy(rng.integers(0, k, size=n))
        _, positives = pair_similarities(torch.randn(n, 4), torch.randn(n, 4), y)
        counts.append(float(positives.sum()) / (2 * n))
    assert np.mean(counts) == pytest.approx(expected_positives_per_anchor(n, k), rel=0.02)
    # the spec's figures at batch 512: CIFAR-10 ~103.2, CIFAR-100 ~11.2 of 1023 others
    assert expected_positives_per_anchor(512, 10) == pytest.approx(103.2)
    assert expected_positives_per_anchor(512, 100) == pytest.approx(11.22)


def test_margin_schedules() -> None:
    # a null margin_end is margin_start / 4: CFF's linspace(0.4, 0.1, L)
    assert CFFConfig(depth=5).margins() == pytest.approx([0.4, 0.325, 0.25, 0.175, 0.1])
    assert margin_schedule("linear", 0.4, 0.1, 5) == pytest.approx([0.4, 0.325, 0.25, 0.175, 0.1])
    for kind in ("parabolic", "cosine", "exponential"):
        m = margin_schedule(kind, 0.4, 0.1, 5)
        assert m[0] == pytest.approx(0.4) and m[-1] == pytest.approx(0.1)
        assert all(a >= b for a, b in itertools.pairwise(m))
    assert CFFConfig(margin_start=0.0, depth=4).margins() == [0.0] * 4
    assert CFFConfig(margin_start=0.2, depth=1).margins() == [0.2]
