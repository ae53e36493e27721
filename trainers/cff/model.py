"""The CFF ViT (spec section 2.1): patches, layer-local encoder units and the linear head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainers.cff.config import CFFConfig
from trainers.init import init_linear


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """B x C x H x W -> B x T x (C p p), patches row-major, channel-major inside a patch.

    The same values as F.unfold(x, patch, stride=patch).transpose(1, 2) (non-overlapping
    patches), as one copy instead of im2col."""
    b, c, h, w = x.shape
    grid = x.reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5)
    return grid.reshape(b, (h // patch) * (w // patch), c * patch * patch)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with plain matmuls: the math of scaled_dot_product_attention,
    for code under torch.func.vmap (whose fused attention fails in backward on CUDA)."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return scores.softmax(dim=-1) @ v


class Attention(nn.Module):
    """Multi-head self-attention with nn.MultiheadAttention's parameterisation and init."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        # False: explicit_attention instead of the fused kernel (the seed-batched path)
        self.fused = True
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v) if self.fused else explicit_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, e))


class Block(nn.Module):
    """Pre-LN encoder block: r = x + MHA(LN1(x)); out = r + fc2(GELU(fc1(LN2(r))))."""

    def __init__(self, width: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp_ratio * width)
        self.fc2 = nn.Linear(mlp_ratio * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = x + self.attn(self.ln1(x))
        return r + self.fc2(F.gelu(self.fc1(self.ln2(r))))


class Embedding(nn.Module):
    """Layer 0's input stage: Linear(C p^2 -> E), ReLU, + learnable positional embedding."""

    def __init__(self, patch_dim: int, tokens: int, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(patch_dim, width)
        self.position = nn.Parameter(torch.zeros(1, tokens, width))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return F.relu(self.proj(patches)) + self.position


class CFFLayer(nn.Module):
    """One layer-local unit: layer 0 is embedding + block, later layers a block."""

    def __init__(self, block: Block, embedding: Embedding | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        return self.block(x)


def build_layers(
    config: CFFConfig, channels: int, side: int, generator: torch.Generator
) -> nn.ModuleList:
    """The L layers, initialised from the run's `init` generator as PyTorch would by default
    (nn.Linear: kaiming-uniform(a=sqrt 5) weights, uniform(+-1/sqrt fan_in) biases; attention
    in-projection xavier-uniform with zero biases, as nn.MultiheadAttention; positions N(0, 1))."""
    tokens = (side // config.patch) ** 2
    layers = nn.ModuleList()
    for index in range(config.depth):
        embedding = (
            Embedding(channels * config.patch**2, tokens, config.width) if index == 0 else None
        )
        layers.append(CFFLayer(Block(config.width, config.heads, config.mlp_ratio), embedding))
    for module in layers.modules():
        if isinstance(module, nn.Linear):
            init_linear(module, generator)
        elif isinstance(module, Attention):
            nn.init.xavier_uniform_(module.qkv.weight, generator=generator)
            nn.init.zeros_(module.qkv.bias)
            nn.init.zeros_(module.out.bias)
        elif isinstance(module, Embedding):
            nn.init.normal_(module.position, generator=generator)
    return layers


def build_head(width: int, num_classes: int, generator: torch.Generator) -> nn.Sequential:
    linear = nn.Linear(width, num_classes)
    init_linear(linear, generator)
    return nn.Sequential(nn.LayerNorm(width), linear)


def encode(layers: nn.ModuleList, x: torch.Tensor, patch: int) -> torch.Tensor:
    """The last layer's token mean, the head's input."""
    h = patchify(x, patch)
    for layer in layers:
        h = layer(h)
    return h.mean(dim=1)
