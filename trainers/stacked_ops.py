"""Layers of K seeds' copies of one network as one computation, on stacked parameters (a
leading seed axis, K x ...) and per-seed inputs (K x ... x features), without vmap: one batched
kernel where a solo network launches one, so that a seed-batched task launches about what one
run launches (benchmarks/launches.py). Used by feedback's StackedNet and cff's SeedStack.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Whether a stacked layer norm runs as one fused group norm, by device type (stacked_layer_norm):
# on a GPU it launches fewer kernels; on a CPU the layer norm and affine run faster.
# benchmarks/launches.py sets "cpu" too, to count what a GPU would launch.
FUSED_NORM: dict[str, bool] = {"cuda": True}


def stacked_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """nn.Linear of every seed on its own input (K x ... x in; weight K x out x in, bias
    K x out): one batched GEMM with the bias in it."""
    flat = x.reshape(len(x), -1, x.shape[-1])
    out = (
        torch.bmm(flat, weight.mT)
        if bias is None
        else torch.baddbmm(bias[:, None], flat, weight.mT)
    )
    return out.view(*x.shape[:-1], -1)


def stacked_layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """nn.LayerNorm over the last dimension of every seed's K x ... x d input, with its own
    weight and bias (K x d).

    On a GPU (FUSED_NORM), one group norm: the samples' K x d features side by side in K
    groups (a group: one seed's d features of one sample, normalised together, then that
    seed's affine), which fuses the seeds' own weights and biases into the norm's kernel
    forward and backward, where the layer norm with the affine after it takes three more
    kernels. On a CPU, where kernels cost no launch, the layer norm and affine run faster
    (benchmarks/seed_batching.py). The two agree to float rounding (1e-15 in float64)."""
    k, d = len(x), x.shape[-1]
    if not FUSED_NORM.get(x.device.type, False):
        seedwise = (k,) + (1,) * (x.dim() - 2) + (d,)
        return F.layer_norm(x, (d,), eps=eps) * weight.view(seedwise) + bias.view(seedwise)
    side_by_side = x.movedim(0, -2).reshape(-1, k * d)
    out = F.group_norm(side_by_side, k, weight.reshape(k * d), bias.reshape(k * d), eps=eps)
    return out.view(*x.shape[1:-1], k, d).movedim(-2, 0)


def stacked_attention(
    x: torch.Tensor,
    heads: int,
    qkv: tuple[torch.Tensor, torch.Tensor],
    out: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """cff's Attention (trainers.cff.model) of every seed on K x B x T x E tokens: the
    projections per seed (`qkv`, `out`: each a stacked weight and bias), the parameter-free
    attention core with the seed axis folded into the batch axis (no vmap, whose backward of
    scaled_dot_product_attention fails on CUDA)."""
    k, b, t, e = x.shape
    projected = stacked_linear(x, *qkv).view(k * b, t, 3, heads, e // heads)
    q, key, v = projected.permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, key, v)
    return stacked_linear(y.transpose(1, 2).reshape(k, b, t, e), *out)
