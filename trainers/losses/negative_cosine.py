"""The plain cosine loss of paper 001's theory and convergence simulation.

Draganov et al., On the Importance of Embedding Norms in Self-Supervised Learning, ICML 2025
(arXiv:2502.09252); spec docs/papers/ssl.md sections 2.4 and 2.5. It sees
a and b only through a/||a|| and b/||b||, so its gradient is orthogonal to both and shrinks as
1/||a||: plain gradient steps only grow the norms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def negative_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """L = -(1/B) sum_i cos(a_i, b_i) over the rows of a and b (B x d). With leading
    dimensions (S x B x d): one loss per slice (S), as a seed-batched task stacks its seeds."""
    return -F.cosine_similarity(a, b, dim=-1).mean(dim=-1)
