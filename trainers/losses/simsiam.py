"""SimSiam's symmetric negative-cosine loss with stop-gradient on the targets.

Chen and He, Exploring Simple Siamese Representation Learning, CVPR 2021 (arXiv:2011.10566),
in the form of `symmetric_attractive_loss` in CLA/utils/losses.py of Draganov et al.,
ICML 2025 (arXiv:2502.09252), which adds a temperature t (1 by default); spec
docs/papers/ssl.md section 2.1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def symmetric_attractive_loss(
    p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor, temperature: float
) -> torch.Tensor:
    """L = -(1/2)[(1/B) sum_i cos(sg z2_i, p1_i) + (1/B) sum_i cos(sg z1_i, p2_i)] / t

    for predictor outputs p1, p2 and projector outputs z1, z2 of the two views (B x d); sg is
    stop-gradient: no gradient reaches z1 or z2."""
    return (
        -0.5
        * (
            F.cosine_similarity(z2.detach(), p1).mean()
            + F.cosine_similarity(z1.detach(), p2).mean()
        )
        / temperature
    )
