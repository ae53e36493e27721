"""Supervised contrastive loss with a positive-pair margin, as Contrastive Forward-Forward
trains each layer (Aghagolzadeh & Ezoji, Contrastive Forward-Forward: A training algorithm of
vision transformer, Neural Networks 192:107867 (2025), arXiv:2502.00571; clamped or subtracted
margin as compared in Steier, When Does Margin Clamping Affect Training Variance?
arXiv:2603.00951 (2026)). Specification: docs/papers/cff.md section 2.2.

For n images in two views (N = 2n anchors, view-1 rows first), cosines s_ij between the
L2-normalised features, positives P(i) = {j != i : y_j = y_i}, temperature tau and margin m:

    s'_ij = min(s_ij + m, 1) for j in P(i) under clamp, else s_ij
    log p_ij = s'_ij / tau - M_i - log sum_{k != i} exp(s'_ik / tau - M_i)
    log p_ij -= m for j in P(i) under subtract
    L = mean_i [ -(1/|P(i)|) sum_{j in P(i)} log p_ij ]

with M_i = max_j s'_ij / tau. The clamp activation rate (CAR) is the diagnostic of the clamp:
the share of positive pairs it saturates.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

MarginMode = Literal["clamp", "subtract", "none"]
Stability = Literal["detach", "direct"]


def pair_similarities(
    f1: torch.Tensor, f2: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarities s (2n x 2n, view-1 rows first) and the positive mask P (same label,
    off-diagonal, so the other view of an image is always a positive)."""
    z = F.normalize(torch.cat([f1, f2]), dim=1)
    yy = torch.cat([labels, labels])
    eye = torch.eye(len(z), dtype=torch.bool, device=z.device)
    positives = (yy[:, None] == yy[None, :]) & ~eye
    return z @ z.T, positives


def supcon_margin_loss_from_similarities(
    s: torch.Tensor,
    positives: torch.Tensor,
    margin: float,
    *,
    temperature: float,
    margin_mode: MarginMode,
    stability: Stability = "detach",
) -> torch.Tensor:
    """CFF's supervised contrastive loss with a positive-pair margin (spec section 2.2).

        s'_ij = min(s_ij + m, 1) for j in P(i) under clamp, else s_ij
        a_ij = s'_ij / tau,  M_i = max_j a_ij (diagonal included; detached under `detach`)
        log p_ij = (a_ij - M_i) - log sum_{k != i} exp(a_ik - M_i)
        log p_ij -= m for j in P(i) under subtract
        L = mean_i [ -(1/|P(i)|) sum_{j in P(i)} log p_ij ]

    Subtraction adds exactly m to the loss and nothing to its gradient; clamping zeroes the
    gradient of every saturated positive pair (s_ij + m > 1).
    """
    eye = torch.eye(len(s), dtype=torch.bool, device=s.device)
    if margin_mode == "clamp":
        s = torch.where(positives, (s + margin).clamp(max=1.0), s)
    a = s / temperature
    row_max = a.max(dim=1, keepdim=True).values
    if stability == "detach":
        row_max = row_max.detach()
    logits = a - row_max
    log_p = logits - torch.log((logits.exp() * ~eye).sum(dim=1, keepdim=True))
    if margin_mode == "subtract":
        log_p = torch.where(positives, log_p - margin, log_p)
    per_anchor = -(log_p * positives).sum(dim=1) / positives.sum(dim=1).clamp(min=1)
    return per_anchor.mean()


def supcon_margin_loss(
    f1: torch.Tensor,
    f2: torch.Tensor,
    labels: torch.Tensor,
    margin: float,
    *,
    temperature: float,
    margin_mode: MarginMode,
    stability: Stability = "detach",
) -> torch.Tensor:
    """The loss of one layer from the features of two views (n x E each) and labels (n)."""
    s, positives = pair_similarities(f1, f2, labels)
    return supcon_margin_loss_from_similarities(
        s,
        positives,
        margin,
        temperature=temperature,
        margin_mode=margin_mode,
        stability=stability,
    )


def clamp_activation_rate(s: torch.Tensor, positives: torch.Tensor, margin: float) -> torch.Tensor:
    """CAR: the share of positive pairs with s_ij + m > 1, on raw cosines before any clamp."""
    saturated = (s.detach() + margin > 1.0) & positives
    return saturated.sum().to(s.dtype) / positives.sum().clamp(min=1).to(s.dtype)


def expected_positives_per_anchor(batch_size: int, num_classes: int) -> float:
    """2(1 + (n - 1)/K) - 1 positives per anchor among the 2n - 1 others, balanced classes."""
    return 2 * (1 + (batch_size - 1) / num_classes) - 1
