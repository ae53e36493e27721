"""SimCLR's NT-Xent as paper 001's official code computes it: one-directional and decoupled.

Chen, Kornblith, Norouzi, Hinton, A Simple Framework for Contrastive Learning of Visual
Representations, ICML 2020 (arXiv:2002.05709), in the form of `nt_xent` in
CLA/utils/losses.py of Draganov et al., ICML 2025 (arXiv:2502.09252); spec
docs/papers/ssl.md section 2.1.
"""

from __future__ import annotations

import math

import torch


def decoupled_nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """The one-directional, decoupled NT-Xent on L2-normalised z1, z2 (B x d):

        L = -(1/B) sum_i s_ii / t + (1/B) sum_i log sum_{j != i} exp(s_ij / t),  s = z1 z2^T

    View-1 anchors are scored against view-2 candidates only, and the positive is left out of
    the denominator (the official code sets the diagonal to -1e5)."""
    s = z1 @ z2.T / temperature
    eye = torch.eye(len(s), dtype=torch.bool, device=s.device)
    negatives = torch.logsumexp(s.masked_fill(eye, -math.inf), dim=1)
    return (negatives - s.diagonal()).mean()
