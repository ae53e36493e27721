"""The collapse model's pair loss and its closed-form mse gradients (trainers.losses.collapse_pair)
against hand-written float64 loops and autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainers.collapse import frustration_matrix
from trainers.losses.collapse_pair import mse_gradients, pair_loss


def reference_pair_loss(pred: np.ndarray, labels: np.ndarray, p: np.ndarray, kind: str) -> float:
    """Spec section 2.1 term by term: (1/2N) sum_ic p_ic ||pred_i - y_c||^2 (mse) or
    (1/N) sum_ic p_ic (1 - cos(pred_i, y_c)) (cosine)."""
    n, k = p.shape
    total = 0.0
    for i in range(n):
        for c in range(k):
            if kind == "mse":
                term = 0.5 * sum((pred[i, j] - labels[c, j]) ** 2 for j in range(pred.shape[1]))
            else:
                dot = sum(pred[i, j] * labels[c, j] for j in range(pred.shape[1]))
                norms = math.sqrt(sum(v * v for v in pred[i])) * math.sqrt(
                    sum(v * v for v in labels[c])
                )
                term = 1.0 - dot / norms
            total += p[i, c] * term
    return total / n


def reference_mse_gradients(
    x: np.ndarray, y: np.ndarray, w: np.ndarray | None, p: np.ndarray, inputs: np.ndarray | None
) -> list[np.ndarray]:
    """dL/dx (or dL/dA with emb_i = A u_i), dL/dy and dL/dW of
    (1/2N) sum_ic p_ic ||W emb_i - sg(y_c)||^2 + (1/2N) sum_ic p_ic ||sg(emb_i) - y_c||^2
    (without a head: (1/2N) sum_ic p_ic ||emb_i - y_c||^2), differentiated by hand."""
    n, k = p.shape
    d = y.shape[1]
    emb = (
        x
        if inputs is None
        else np.array(
            [
                [sum(x[a, b] * inputs[i, b] for b in range(inputs.shape[1])) for a in range(d)]
                for i in range(n)
            ]
        )
    )
    pred = (
        emb
        if w is None
        else np.array(
            [[sum(w[a, b] * emb[i, b] for b in range(d)) for a in range(d)] for i in range(n)]
        )
    )
    g_emb = np.zeros((n, d))
    g_y = np.zeros((k, d))
    g_w = np.zeros((d, d))
    for i in range(n):
        for c in range(k):
            for a in range(d):
                residual = pred[i, a] - y[c, a]
                g_y[c, a] += p[i, c] * (y[c, a] - emb[i, a]) / n
                if w is None:
                    g_emb[i, a] += p[i, c] * residual / n
                    continue
                for b in range(d):
                    g_emb[i, b] += p[i, c] * w[a, b] * residual / n
                    g_w[a, b] += p[i, c] * residual * emb[i, b] / n
    if inputs is None:
        g_first = g_emb
    else:
        g_first = np.zeros_like(x)
        for i in range(n):
            for a in range(d):
                for b in range(inputs.shape[1]):
                    g_first[a, b] += g_emb[i, a] * inputs[i, b]
    return [g_first, g_y] if w is None else [g_first, g_y, g_w]


def draw(stop_gradient: bool, teacher_student: bool, seed: int = 3):
    rng = np.random.default_rng(seed)
    n, k, d, d_in = 12, 3, 4, 5
    p = frustration_matrix(n, k, 0.25, "all", np.random.default_rng(0))[0]
    inputs = rng.normal(size=(n, d_in)) if teacher_student else None
    x = rng.normal(size=(d, d_in) if teacher_student else (n, d))
    y = rng.normal(size=(k, d))
    w = rng.normal(size=(d, d)) if stop_gradient else None
    return x, y, w, p, inputs


def tensor(a: np.ndarray | None) -> torch.Tensor | None:
    return None if a is None else torch.tensor(a, dtype=torch.float64)


@pytest.mark.parametrize("kind", ["mse", "cosine"])
def test_pair_loss_matches_the_hand_written_sum(kind: str) -> None:
    rng = np.random.default_rng(1)
    pred, labels = rng.normal(size=(6, 3)), rng.normal(size=(2, 3))
    p = rng.dirichlet([1, 1], size=6)
    got = pair_loss(torch.tensor(pred), torch.tensor(labels), torch.tensor(p), kind)
    assert float(got) == pytest.approx(reference_pair_loss(pred, labels, p, kind), rel=1e-13)


def test_cosine_pair_loss_ignores_norms_and_vanishes_on_aligned_embeddings() -> None:
    rng = np.random.default_rng(2)
    labels = rng.normal(size=(3, 4))
    p = np.eye(3)[[0, 1, 2, 0]]
    aligned = labels[[0, 1, 2, 0]] * np.array([[0.1], [2.0], [5.0], [30.0]])
    assert float(
        pair_loss(torch.tensor(aligned), torch.tensor(labels), torch.tensor(p), "cosine")
    ) == pytest.approx(0.0, abs=1e-15)
    assert float(
        pair_loss(torch.tensor(-aligned), torch.tensor(labels), torch.tensor(p), "cosine")
    ) == pytest.approx(2.0, rel=1e-15)


@pytest.mark.parametrize("stop_gradient", [False, True])
@pytest.mark.parametrize("teacher_student", [False, True])
def test_closed_form_gradients_match_the_hand_written_derivatives(
    stop_gradient: bool, teacher_student: bool
) -> None:
    x, y, w, p, inputs = draw(stop_gradient, teacher_student)
    got = mse_gradients(tensor(x), tensor(y), tensor(w), tensor(p), tensor(inputs))
    expected = reference_mse_gradients(x, y, w, p, inputs)
    assert len(got) == len(expected)
    for ours, reference in zip(got, expected, strict=True):
        np.testing.assert_allclose(ours.numpy(), reference, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("stop_gradient", [False, True])
@pytest.mark.parametrize("teacher_student", [False, True])
def test_closed_form_gradients_match_autograd(stop_gradient: bool, teacher_student: bool) -> None:
    x_np, y_np, w_np, p_np, inputs_np = draw(stop_gradient, teacher_student)
    x, y, p, inputs = (tensor(a) for a in (x_np, y_np, p_np, inputs_np))
    x.requires_grad_(True)
    y.requires_grad_(True)
    w = tensor(w_np)
    emb = x if inputs is None else inputs @ x.T
    if w is None:
        loss = pair_loss(emb, y, p, "mse")
        expected = torch.autograd.grad(loss, (x, y))
    else:
        w.requires_grad_(True)
        loss = pair_loss(emb @ w.T, y.detach(), p, "mse") + pair_loss(emb.detach(), y, p, "mse")
        expected = torch.autograd.grad(loss, (x, y, w))
    got = mse_gradients(x.detach(), y.detach(), None if w is None else w.detach(), p, inputs)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
