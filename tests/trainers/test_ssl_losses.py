"""Paper 001's losses (trainers/losses/) in float64 against hand-written references that loop over
samples and pairs, their gradients against finite differences of those references, and the
stop-gradient of SimSiam and BYOL checked with autograd."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from trainers.losses.byol import byol_loss
from trainers.losses.latent_class import attract_pairs_infonce
from trainers.losses.negative_cosine import negative_cosine
from trainers.losses.nt_xent import decoupled_nt_xent
from trainers.losses.simsiam import symmetric_attractive_loss


def random_rows(n: int, d: int, seed: int, unit: bool = False) -> torch.Tensor:
    rows = 2.0 * torch.randn(
        n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    if unit:
        rows = rows / rows.norm(dim=1, keepdim=True)
    return rows.requires_grad_()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(
        sum(x * y for x, y in zip(a, b, strict=True))
        / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
    )


def finite_difference(
    reference: Callable[[np.ndarray], float], x: np.ndarray, h: float = 1e-6
) -> np.ndarray:
    """Central differences of a scalar function of one array, entry by entry."""
    grad = np.zeros_like(x)
    for index in itertools.product(*map(range, x.shape)):
        up, down = x.copy(), x.copy()
        up[index] += h
        down[index] -= h
        grad[index] = (reference(up) - reference(down)) / (2 * h)
    return grad


# ---------------------------------------------------------------------------------------------
# decoupled NT-Xent (SimCLR)


def nt_xent_by_hand(z1: np.ndarray, z2: np.ndarray, t: float) -> float:
    """Each view-1 anchor i: -s_ii / t + log sum over the view-2 candidates j != i of
    exp(s_ij / t), s_ij = z1_i . z2_j; averaged over the anchors."""
    total = 0.0
    for i in range(len(z1)):
        positive = float(z1[i] @ z2[i]) / t
        negatives = sum(math.exp(float(z1[i] @ z2[j]) / t) for j in range(len(z2)) if j != i)
        total += -positive + math.log(negatives)
    return total / len(z1)


@pytest.mark.parametrize("temperature", [0.5, 0.1, 2.0])
def test_nt_xent_equals_the_loop_reference(temperature: float) -> None:
    z1, z2 = random_rows(7, 5, seed=1, unit=True), random_rows(7, 5, seed=2, unit=True)
    expected = nt_xent_by_hand(z1.detach().numpy(), z2.detach().numpy(), temperature)
    loss = decoupled_nt_xent(z1, z2, temperature)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)


def test_nt_xent_leaves_the_positive_out_of_its_denominator() -> None:
    # with the positive in the denominator the loss would be -log softmax, always positive; a
    # strongly aligned pair scores above all its negatives, and the decoupled loss goes negative
    z1 = random_rows(6, 4, seed=3, unit=True)
    loss = float(decoupled_nt_xent(z1, z1, 0.1).detach())
    assert loss < 0
    assert loss == pytest.approx(
        nt_xent_by_hand(z1.detach().numpy(), z1.detach().numpy(), 0.1), rel=1e-12
    )


@pytest.mark.parametrize("temperature", [0.5, 0.2])
def test_nt_xent_gradients_match_finite_differences_of_the_reference(temperature: float) -> None:
    z1, z2 = random_rows(5, 3, seed=4, unit=True), random_rows(5, 3, seed=5, unit=True)
    g1, g2 = torch.autograd.grad(decoupled_nt_xent(z1, z2, temperature), (z1, z2))
    a, b = z1.detach().numpy(), z2.detach().numpy()
    numeric1 = finite_difference(lambda x: nt_xent_by_hand(x, b, temperature), a)
    numeric2 = finite_difference(lambda x: nt_xent_by_hand(a, x, temperature), b)
    assert np.max(np.abs(g1.numpy() - numeric1)) < 1e-8
    assert np.max(np.abs(g2.numpy() - numeric2)) < 1e-8


# ---------------------------------------------------------------------------------------------
# negative cosine


def test_negative_cosine_equals_the_loop_reference() -> None:
    a, b = random_rows(9, 6, seed=6), random_rows(9, 6, seed=7)
    rows_a, rows_b = a.detach().numpy(), b.detach().numpy()
    expected = -sum(cosine(rows_a[i], rows_b[i]) for i in range(9)) / 9
    assert float(negative_cosine(a, b).detach()) == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# SimSiam and BYOL


def attractive_by_hand(
    p1: np.ndarray, p2: np.ndarray, z1: np.ndarray, z2: np.ndarray, t: float
) -> float:
    """-(1/2)[mean_i cos(z2_i, p1_i) + mean_i cos(z1_i, p2_i)] / t, pair by pair."""
    n = len(p1)
    first = sum(cosine(z2[i], p1[i]) for i in range(n)) / n
    second = sum(cosine(z1[i], p2[i]) for i in range(n)) / n
    return -0.5 * (first + second) / t


def byol_mse_by_hand(p1: np.ndarray, p2: np.ndarray, z1: np.ndarray, z2: np.ndarray) -> float:
    """BYOL's own loss (Grill et al. 2020): the normalised squared error between each view's
    prediction and the other view's target, averaged over samples and summed over both
    directions."""
    total = 0.0
    for predictions, targets in ((p1, z2), (p2, z1)):
        for p, z in zip(predictions, targets, strict=True):
            difference = p / np.linalg.norm(p) - z / np.linalg.norm(z)
            total += sum(x * x for x in difference) / len(predictions)
    return total


def two_views(seed: int) -> tuple[torch.Tensor, ...]:
    return tuple(random_rows(6, 4, seed=seed + k) for k in range(4))


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_simsiam_loss_equals_the_loop_reference(temperature: float) -> None:
    p1, p2, z1, z2 = two_views(seed=10)
    expected = attractive_by_hand(*(t.detach().numpy() for t in (p1, p2, z1, z2)), temperature)
    loss = symmetric_attractive_loss(p1, p2, z1, z2, temperature)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_simsiam_targets_get_no_gradient_and_predictions_the_reference_one(
    temperature: float,
) -> None:
    p1, p2, z1, z2 = two_views(seed=20)
    loss = symmetric_attractive_loss(p1, p2, z1, z2, temperature)
    g_p1, g_p2, g_z1, g_z2 = torch.autograd.grad(loss, (p1, p2, z1, z2), allow_unused=True)
    assert g_z1 is None and g_z2 is None  # stop-gradient: the graph never reaches z
    a1, a2, b1, b2 = (t.detach().numpy() for t in (p1, p2, z1, z2))
    numeric1 = finite_difference(lambda x: attractive_by_hand(x, a2, b1, b2, temperature), a1)
    numeric2 = finite_difference(lambda x: attractive_by_hand(a1, x, b1, b2, temperature), a2)
    assert np.max(np.abs(g_p1.numpy() - numeric1)) < 1e-8
    assert np.max(np.abs(g_p2.numpy() - numeric2)) < 1e-8


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_byol_loss_is_byols_normalised_error_rescaled(temperature: float) -> None:
    # BYOL's normalised error is 4 - 2(mean cos + mean cos) = 4 + 4 t L (trainers/losses/byol.py)
    p1, p2, z1, z2 = two_views(seed=30)
    reference = byol_mse_by_hand(*(t.detach().numpy() for t in (p1, p2, z1, z2)))
    loss = byol_loss(p1, p2, z1, z2, temperature)
    assert float(loss.detach()) == pytest.approx((reference - 4.0) / (4.0 * temperature), rel=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_byol_targets_get_no_gradient_and_predictions_the_reference_one(temperature: float) -> None:
    p1, p2, z1, z2 = two_views(seed=40)
    loss = byol_loss(p1, p2, z1, z2, temperature)
    g_p1, g_p2, g_z1, g_z2 = torch.autograd.grad(loss, (p1, p2, z1, z2), allow_unused=True)
    assert g_z1 is None and g_z2 is None  # the EMA targets are never trained by the loss
    a1, a2, b1, b2 = (t.detach().numpy() for t in (p1, p2, z1, z2))
    scale = 1.0 / (4.0 * temperature)
    numeric1 = finite_difference(lambda x: scale * byol_mse_by_hand(x, a2, b1, b2), a1)
    numeric2 = finite_difference(lambda x: scale * byol_mse_by_hand(a1, x, b1, b2), a2)
    assert np.max(np.abs(g_p1.numpy() - numeric1)) < 1e-8
    assert np.max(np.abs(g_p2.numpy() - numeric2)) < 1e-8


# ---------------------------------------------------------------------------------------------
# the latent-class simulation's supervised InfoNCE


def attract_pairs_by_hand(
    z: np.ndarray, labels: np.ndarray, picks: dict[int, int], t: float
) -> float:
    """The notebook's per-row loop in float64: row i's positives are its own pick and every
    anchor that picked i; the denominator is every k != i."""
    n = len(z)
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    e = np.exp(zn @ zn.T / t)
    losses = []
    for i in range(n):
        if i not in picks:
            continue
        positives = {picks[i]} | {j for j, p in picks.items() if p == i}
        numerator = sum(e[i, j] for j in positives)
        denominator = sum(e[i, k] for k in range(n) if k != i)
        losses.append(-math.log(numerator / denominator + 1e-8))
    return float(np.mean(losses))


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_attract_pairs_infonce_matches_the_notebook_loop_and_autograd(temperature: float) -> None:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3])  # class 2 has a single sample
    loss = attract_pairs_infonce(z, labels, torch.Generator().manual_seed(11), temperature)
    # recover the picks the function made from the same generator state
    same = (labels[:, None] == labels[None, :]) & ~torch.eye(9, dtype=torch.bool)
    scores = torch.rand(9, 9, generator=torch.Generator().manual_seed(11)).masked_fill(~same, -1)
    picks = {i: int(scores[i].argmax()) for i in range(9) if same[i].any()}
    assert 5 not in picks and all(labels[i] == labels[j] != 2 for i, j in picks.items())
    expected = attract_pairs_by_hand(z.detach().numpy(), labels.numpy(), picks, temperature)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    # its gradient matches central finite differences of the hand loop
    (grad,) = torch.autograd.grad(loss, z)
    numeric = finite_difference(
        lambda x: attract_pairs_by_hand(x, labels.numpy(), picks, temperature), z.detach().numpy()
    )
    assert np.max(np.abs(grad.numpy() - numeric)) < 1e-8
    # and, a cosine loss, its gradient is orthogonal to every embedding
    assert torch.allclose((grad * z).sum(dim=1), torch.zeros(9, dtype=torch.float64), atol=1e-12)


def test_attract_pairs_infonce_without_any_same_class_pair_is_zero_with_a_gradient() -> None:
    z = random_rows(4, 3, seed=50)
    loss = attract_pairs_infonce(z, torch.tensor([0, 1, 2, 3]), torch.Generator().manual_seed(0))
    assert float(loss.detach()) == 0.0
    (grad,) = torch.autograd.grad(loss, z)
    assert torch.equal(grad, torch.zeros_like(grad))


def test_class_means_match_a_float64_reference_and_skip_empty_and_outside_classes() -> None:
    """The per-class norm means (epoch curves and the final diagnostics) from one host read:
    each class's float64 mean, None for an absent class, labels past `classes` (held out)
    left out."""
    from trainers.ssl.evaluate import class_means

    generator = torch.Generator().manual_seed(0)
    values = torch.rand(200, generator=generator)
    labels = torch.randint(0, 9, (200,), generator=generator)
    labels[labels == 3] = 4  # class 3 absent
    got = class_means(values, labels, 6)  # classes 6..8: outside
    v, y = values.double().numpy(), labels.numpy()
    for c in range(6):
        if c == 3:
            assert got[c] is None
        else:
            assert got[c] == pytest.approx(float(np.mean(v[y == c])), rel=1e-12, abs=0), c
    assert len(got) == 6
