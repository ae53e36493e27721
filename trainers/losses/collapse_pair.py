"""The label-weighted pair loss of the minimal collapse model (paper 004, arXiv:2604.09979;
docs/papers/collapse.md section 2.1) and its closed-form mse gradients (section 2.5).

The model is seedgrid's reconstruction (the paper's equations are not published): sample
predictions pred_i are pulled towards the label embeddings y_c with weights p_ic, the rows of the
label distribution P (N x K, each summing to 1).

Both functions broadcast over leading dimensions (a seed-batched task stacks its seeds' tensors
on a leading axis): each slice is computed as one run's tensors would be, with one loss per
slice.
"""

from __future__ import annotations

import torch


def pair_loss(pred: torch.Tensor, labels: torch.Tensor, p: torch.Tensor, kind: str) -> torch.Tensor:
    """Label-weighted loss between predictions (N x d) and label embeddings (K x d).

    mse:    (1/2N) sum_ic p_ic ||pred_i - y_c||^2
    cosine: (1/N)  sum_ic p_ic (1 - cos(pred_i, y_c))

    With leading dimensions (S x N x d, S x K x d, S x N x K): one loss per slice (S).
    """
    n = pred.shape[-2]
    if kind == "mse":
        sq = (pred[..., :, None, :] - labels[..., None, :, :]).pow(2).sum(-1)
        return 0.5 * (p * sq).sum(dim=(-2, -1)) / n
    cos = (
        torch.nn.functional.normalize(pred, dim=-1)
        @ torch.nn.functional.normalize(labels, dim=-1).mT
    )
    return (p * (1.0 - cos)).sum(dim=(-2, -1)) / n


def mse_gradients(
    x: torch.Tensor,
    y: torch.Tensor,
    w: torch.Tensor | None,
    p: torch.Tensor,
    inputs: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """Closed-form gradients of the mse objective (spec section 2.5), without autograd.

    Returns (dL/dx or dL/dA, dL/dy, dL/dW): dL/dx for free embeddings, dL/dA for the
    teacher-student model (x_i = A u_i). With a head W, the objective is
    pair_loss(emb W^T, sg(y)) + pair_loss(sg(emb), y): the x/A and W gradients see sg(y) and
    the y gradient sees sg(x). With leading dimensions, each slice's gradients are its own
    objective's.
    """
    n = p.shape[-2]
    emb = x if inputs is None else inputs @ x.mT
    pred = emb if w is None else emb @ w.mT
    # rows of P sum to 1, so sum_c p_ic (pred_i - y_c) = pred_i - (P y)_i
    residual = pred - p @ y
    g_emb = residual if w is None else residual @ w
    g_y = (p.sum(-2)[..., :, None] * y - p.mT @ emb) / n
    g_first = g_emb / n if inputs is None else g_emb.mT @ inputs / n
    if w is None:
        return g_first, g_y
    return g_first, g_y, residual.mT @ emb / n
