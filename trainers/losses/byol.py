"""BYOL's loss as paper 001's official code computes it: SimSiam's symmetric attractive loss
with the targets taken from the EMA target network.

Grill et al., Bootstrap Your Own Latent, NeurIPS 2020 (arXiv:2006.07733); the official code of
Draganov et al., ICML 2025 (arXiv:2502.09252) calls `symmetric_attractive_loss` for BYOL too;
spec docs/papers/ssl.md section 2.1. BYOL's own normalised MSE,
sum over both directions of (1/B) sum_i ||p_i/||p_i|| - z'_i/||z'_i||||^2 = 4 - 2(mean cos +
mean cos), is 4 + 4 t L: the same minimiser, and gradients 4 t times these.
"""

from __future__ import annotations

import torch

from trainers.losses.simsiam import symmetric_attractive_loss


def byol_loss(
    p1: torch.Tensor,
    p2: torch.Tensor,
    target_z1: torch.Tensor,
    target_z2: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """L = -(1/2)[(1/B) sum_i cos(sg z'2_i, p1_i) + (1/B) sum_i cos(sg z'1_i, p2_i)] / t

    for online predictor outputs p1, p2 and target-network projections z'1, z'2 of the two views
    (B x d); no gradient reaches the targets."""
    return symmetric_attractive_loss(p1, p2, target_z1, target_z2, temperature)
