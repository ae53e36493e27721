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
    zn = F.normalize(z, dim=1)
    s = zn @ zn.T / temperature
    eye = torch.eye(n, dtype=torch.bool, device=z.device)
    same = (labels[:, None] == labels[None, :]) & ~eye
    valid = same.any(dim=1)
    if not bool(valid.any()):
        return z.sum() * 0.0
    # a uniform pick among each row's same-class samples: the argmax of uniform scores
    scores = torch.rand(n, n, generator=generator).to(z.device).masked_fill(~same, -1.0)
    rows = torch.arange(n, device=z.device)[valid]
    picked = torch.zeros(n, n, dtype=torch.bool, device=z.device)
    picked[rows, scores.argmax(dim=1)[valid]] = True
    positive = picked | picked.T
    e = torch.exp(s)
    numerator = (e * positive).sum(dim=1)
    denominator = e.masked_fill(eye, 0.0).sum(dim=1)
    return -torch.log(numerator / denominator + 1e-8)[valid].mean()
