"""The supervised InfoNCE of paper 001's latent-class simulation ("attract_pairs").

Draganov et al., On the Importance of Embedding Norms in Self-Supervised Learning, ICML 2025
(arXiv:2502.09252), official notebook Simulations.ipynb; spec
docs/papers/ssl.md section 2.5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attract_pairs_infonce(
    z: torch.Tensor, labels: torch.Tensor, generator: torch.Generator, temperature: float = 1.0
) -> torch.Tensor:
    """Every anchor i that has another sample of its class in the batch picks one of them,
    j(i), uniformly (the draw comes from `generator`); the positive mask P is the picks made
    symmetric (P_ij = 1 if j = j(i) or i = j(j)), so a row can hold several positives. With
    s_ij = cos(z_i, z_j) / t,

        l_i = -log(sum_j P_ij exp(s_ij) / sum_{k != i} exp(s_ik) + 1e-8),

    averaged over the anchors with a positive (the denominator keeps the unpicked same-class
    samples as negatives)."""
    n = len(z)
    same = same_class_pairs(labels)
    valid = same.any(dim=-1)
    if not bool(valid.any()):
        return z.sum() * 0.0
    scores = torch.rand(n, n, generator=generator).to(z.device)
    return attract_pairs_terms(z, pick_positives(same, scores), temperature)[valid].mean()


def same_class_pairs(labels: torch.Tensor) -> torch.Tensor:
    """same_ij: samples i != j share a class (n x n, or ... x n x n for ... x n labels). An
    anchor i has a positive to pick when its row has one."""
    n = labels.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=labels.device)
    return (labels[..., :, None] == labels[..., None, :]) & ~eye


def pick_positives(same: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The symmetric positive mask P from each row's pick: the same-class sample with the
    highest score (uniform scores: a uniform pick); a row without one picks nothing."""
    valid = same.any(dim=-1, keepdim=True)
    choice = scores.masked_fill(~same, -1.0).argmax(dim=-1, keepdim=True)
    picked = torch.zeros_like(same).scatter_(-1, choice, valid)
    return picked | picked.mT


def attract_pairs_terms(
    z: torch.Tensor, positive: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """l_i of every anchor (n, or ... x n for ... x n x d embeddings) given the positive mask
    (the mean over the anchors with a positive is the loss)."""
    n = z.shape[-2]
    zn = F.normalize(z, dim=-1)
    s = zn @ zn.mT / temperature
    eye = torch.eye(n, dtype=torch.bool, device=z.device)
    e = torch.exp(s)
    numerator = (e * positive).sum(dim=-1)
    denominator = e.masked_fill(eye, 0.0).sum(dim=-1)
    return -torch.log(numerator / denominator + 1e-8)
