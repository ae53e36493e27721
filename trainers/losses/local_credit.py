"""The local loss shared by BP, feedback alignment and direct feedback alignment (paper 002,
arXiv:2606.21126; docs/papers/feedback.md section 2.2).

Block l is trained with

    l_l = <f_l(h_l), a_{l+1}> (batch mean) + lambda ||f_l(h_l)||^2

on a detached input h_l and a constant credit a_{l+1}, so that its update is J_f^T a / B
(+ 2 lambda J_f^T f / B; ViT's states also average the penalty over tokens): the credit term is
`local_credit_loss`, the scale penalty `scale_penalty` (the trainer multiplies it by lambda).
"""

from __future__ import annotations

import torch


def local_credit_loss(out: torch.Tensor, credit: torch.Tensor) -> torch.Tensor:
    """(1/B) sum_i <f(h)_i, a_i>: summed over features (and tokens), averaged over the batch;
    its gradient is J_f^T a / B (the credit is held constant)."""
    return (out * credit.detach()).flatten(1).sum(1).mean()


def scale_penalty(out: torch.Tensor) -> torch.Tensor:
    """||f(h)||^2 per sample (per token for ViT), averaged over the batch (and tokens)."""
    return out.pow(2).sum(-1).mean()
