"""ResMLP, ViT-Mini and StudentNet as residual streams h_0 = embed(x), h_{l+1} = h_l + f_l(h_l),
read out by head(out_norm(h_L)) (spec section 2.1); and the StudentNet teacher-student task."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from trainers.cff.model import Attention, Block, patchify
from trainers.feedback.config import FeedbackConfig
from trainers.stacked_ops import stacked_attention, stacked_layer_norm, stacked_linear

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "tanh": torch.tanh,
}


class MLPBranch(nn.Module):
    """The residual branch f(h) = W2 phi(W1 LN(h)), W1 and W2: d -> d."""

    def __init__(self, width: int, activation: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.activation = activation

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(self.norm(h))))


class ViTBranch(Block):
    """A pre-LN encoder block's whole residual contribution: f(h) = a + m with
    a = MHA(LN1(h)) and m = fc2(GELU(fc1(LN2(h + a)))), so that the block is h + f(h).
    cff's Block, whose layers it shares, returning the branch instead of the block's output."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.ln1(h))
        return a + self.fc2(F.gelu(self.fc1(self.ln2(h + a))))


class FlatEmbedding(nn.Module):
    """h_0 = Linear(input -> d) of the flattened input."""

    def __init__(self, in_features: int, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.flatten(1))


class PatchEmbedding(nn.Module):
    """h_0 = [CLS; Linear(C p^2 -> d)(patches)] + positions: B x (1 + T) x d."""

    def __init__(self, patch_dim: int, tokens: int, width: int, patch: int) -> None:
        super().__init__()
        self.patch = patch
        self.proj = nn.Linear(patch_dim, width)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.position = nn.Parameter(torch.zeros(1, tokens + 1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(patchify(x, self.patch))
        cls = self.cls.expand(len(x), -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.position


class ResidualNet(nn.Module):
    """embed, residual branches f_0..f_{L-1}, terminal norm (LayerNorm or identity) and head.
    With `cls_token` the states are B x T x d and the CLS token (index 0) is read out."""

    def __init__(
        self,
        embed: nn.Module,
        branches: nn.ModuleList,
        out_norm: nn.Module,
        head: nn.Linear,
        cls_token: bool,
    ) -> None:
        super().__init__()
        self.embed = embed
        self.branches = branches
        self.out_norm = out_norm
        self.head = head
        self.cls_token = cls_token

    def states(self, x: torch.Tensor) -> list[torch.Tensor]:
        """h_0..h_L of the full residual stream, one autograd graph in which every h_l can be
        differentiated (also when the embedding is not trained)."""
        h = [self.embed(x)]
        if not h[0].requires_grad:
            h[0].requires_grad_(True)
        for branch in self.branches:
            h.append(h[-1] + branch(h[-1]))
        return h

    def vector(self, h: torch.Tensor) -> torch.Tensor:
        """The per-sample vector the diagnostics see: the CLS token, or the state itself."""
        return h[:, 0] if self.cls_token else h

    def normed(self, h_last: torch.Tensor) -> torch.Tensor:
        return self.out_norm(self.vector(h_last))

    def readout(self, h_last: torch.Tensor) -> torch.Tensor:
        return self.head(self.normed(h_last))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(self.states(x)[-1])

    def branch_weights(self) -> list[nn.Parameter]:
        """The parameters the frozen-block baseline freezes: every branch parameter but the
        LayerNorms'."""
        return [
            p
            for branch in self.branches
            for m in branch.modules()
            if not isinstance(m, nn.LayerNorm)
            for p in m.parameters(recurse=False)
        ]


def build_model(
    config: FeedbackConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    generator: torch.Generator,
) -> ResidualNet:
    """The configured architecture, initialised from the run's `init` generator: PyTorch's
    default Linear init, W2 (each branch's output weights) N(0, branch_init_std^2) with zero
    bias, attention in-projection xavier-uniform with zero biases, CLS and positions N(0, 0.02^2).
    """
    d = config.width
    if config.arch == "vit_mini":
        channels, side, _ = input_shape
        tokens = (side // config.patch) ** 2
        embed: nn.Module = PatchEmbedding(channels * config.patch**2, tokens, d, config.patch)
        branches: list[MLPBranch | ViTBranch] = [
            ViTBranch(d, config.heads, config.mlp_ratio) for _ in range(config.depth)
        ]
    else:
        embed = FlatEmbedding(math.prod(input_shape), d)
        branches = [MLPBranch(d, config.activation) for _ in range(config.depth)]
    out_norm = nn.Identity() if config.arch == "studentnet" else nn.LayerNorm(d)
    model = ResidualNet(
        embed,
        nn.ModuleList(branches),
        out_norm,
        nn.Linear(d, num_classes),
        cls_token=config.arch == "vit_mini",
    )
    for module in model.modules():
        if isinstance(module, nn.Linear):
            _default_linear_init(module, generator)
        elif isinstance(module, Attention):
            nn.init.xavier_uniform_(module.qkv.weight, generator=generator)
            nn.init.zeros_(module.qkv.bias)
        elif isinstance(module, PatchEmbedding):
            nn.init.normal_(module.cls, std=0.02, generator=generator)
            nn.init.normal_(module.position, std=0.02, generator=generator)
    for branch in branches:
        outputs = [branch.fc2] + ([branch.attn.out] if isinstance(branch, ViTBranch) else [])
        for linear in outputs:
            nn.init.normal_(linear.weight, std=config.branch_init_std, generator=generator)
            nn.init.zeros_(linear.bias)
    return model


def _default_linear_init(linear: nn.Linear, generator: torch.Generator) -> None:
    nn.init.kaiming_uniform_(linear.weight, a=math.sqrt(5), generator=generator)
    if linear.bias is not None:
        bound = 1 / math.sqrt(linear.weight.shape[1])
        nn.init.uniform_(linear.bias, -bound, bound, generator=generator)


class Teacher:
    """StudentNet's teacher (a reconstruction; the spec gives only the teacher map): inputs
    x ~ N(0, I_D); `teacher_depth` layers z_1 = phi(x A_1 / sqrt D), z_k = phi(z_{k-1} A_k /
    sqrt m) with phi(u) = (1 - alpha) u + alpha tanh(gain u); labels y = argmax_c (z_K W)_c;
    A_k and W standard normal, drawn from `teacher_seed` (the same task for every run)."""

    def __init__(self, config: FeedbackConfig) -> None:
        self.generator = torch.Generator().manual_seed(config.teacher_seed)
        self.dim, m = config.student_input_dim, config.teacher_width
        self.alpha, self.gain = config.teacher_alpha, config.teacher_gain
        fan_in = [self.dim] + [m] * (config.teacher_depth - 1)
        self.layers = [torch.randn(n, m, generator=self.generator) / math.sqrt(n) for n in fan_in]
        self.readout = torch.randn(m, config.teacher_classes, generator=self.generator)

    def inputs(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(n, self.dim, generator=generator)

    def label(self, x: torch.Tensor) -> torch.Tensor:
        z = x
        for a in self.layers:
            u = z @ a
            z = (1 - self.alpha) * u + self.alpha * torch.tanh(self.gain * u)
        return (z @ self.readout).argmax(dim=1)


class StackedNet:
    """K ResidualNets of one configuration as one network with a leading seed axis, for
    seed-batched training: each parameter holds the K networks' values stacked (K x ...), and
    the forward pass is ResidualNet's written on stacked tensors (a batched GEMM per Linear,
    every norm and bias with each seed's own values), so that each seed's network sees only its
    own parameters and inputs. It offers ResidualNet's interface (embed, branches, normed,
    head, states, vector), so that step_losses, the credits and the audit run on it as on one
    network: states are K x B x d (K x B x T x d for ViT-Mini).

    An input is K x B x ... (each seed its own batch) or B x ... (one batch for every seed:
    the evaluation batch and the test set, which do not depend on the seed); `sample_dims` is
    the number of dimensions of one sample (1 for StudentNet's vectors, 3 for images).
    ResidualNet keeps no buffers (LayerNorm has none), so the parameters are the whole state.
    `template` is a ResidualNet of the configuration without values (on the meta device): the
    structure (branch kind, activation, heads, patch, norms) and the parameters' names."""

    def __init__(
        self, template: ResidualNet, params: dict[str, torch.Tensor], sample_dims: int
    ) -> None:
        self.template = template
        self.params = params
        self.sample_dims = sample_dims
        self.cls_token = template.cls_token
        self.branches = [partial(self._branch, i) for i in range(len(template.branches))]

    @classmethod
    def stack(cls, models: Sequence[ResidualNet], sample_dims: int) -> StackedNet:
        """The networks' parameters stacked in order (new leaves; a frozen parameter stays
        frozen)."""
        template = copy.deepcopy(models[0]).to("meta")
        params = {
            name: _stacked_leaf(
                torch.stack([m.get_parameter(name).detach() for m in models]),
                p.requires_grad,
                _is_linear_weight(template, name),
            )
            for name, p in models[0].named_parameters()
        }
        return cls(template, params, sample_dims)

    def __len__(self) -> int:
        return len(next(iter(self.params.values())))

    def parameters(self) -> list[torch.Tensor]:
        return list(self.params.values())

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """nn.Linear `name` of every seed on its own input (K x ... x in): one batched GEMM."""
        return stacked_linear(x, self.params[f"{name}.weight"], self.params[f"{name}.bias"])

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """nn.LayerNorm `name` of every seed on its own K x ... x d input."""
        norm = self.template.get_submodule(name)
        assert isinstance(norm, nn.LayerNorm)
        return stacked_layer_norm(
            x, self.params[f"{name}.weight"], self.params[f"{name}.bias"], norm.eps
        )

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """h_0 of every seed, from its own batch (K x B x ...) or from one batch (B x ...)."""
        shared = x.dim() == self.sample_dims + 1
        embed = self.template.embed
        if isinstance(embed, FlatEmbedding):
            flat = x.flatten(1).expand(len(self), -1, -1) if shared else x.flatten(2)
            return self._linear("embed.proj", flat)
        assert isinstance(embed, PatchEmbedding)
        patches = (
            patchify(x, embed.patch).expand(len(self), -1, -1, -1)
            if shared
            else patchify(x.flatten(0, 1), embed.patch).unflatten(0, x.shape[:2])
        )
        tokens = self._linear("embed.proj", patches)
        k, b = tokens.shape[:2]
        cls = self.params["embed.cls"].expand(k, b, 1, -1)
        return torch.cat([cls, tokens], dim=2) + self.params["embed.position"]

    def _branch(self, index: int, h: torch.Tensor) -> torch.Tensor:
        """Branch f_index of every seed (MLPBranch.forward, ViTBranch.forward)."""
        name = f"branches.{index}"
        branch = self.template.branches[index]
        if isinstance(branch, MLPBranch):
            hidden = ACTIVATIONS[branch.activation](
                self._linear(f"{name}.fc1", self._norm(f"{name}.norm", h))
            )
            return self._linear(f"{name}.fc2", hidden)
        assert isinstance(branch, ViTBranch)
        a = self._attention(f"{name}.attn", branch.attn.heads, self._norm(f"{name}.ln1", h))
        hidden = F.gelu(self._linear(f"{name}.fc1", self._norm(f"{name}.ln2", h + a)))
        return a + self._linear(f"{name}.fc2", hidden)

    def _attention(self, name: str, heads: int, x: torch.Tensor) -> torch.Tensor:
        """cff's Attention of every seed on K x B x T x E tokens (stacked_attention)."""
        p = self.params
        return stacked_attention(
            x,
            heads,
            (p[f"{name}.qkv.weight"], p[f"{name}.qkv.bias"]),
            (p[f"{name}.out.weight"], p[f"{name}.out.bias"]),
        )

    def vector(self, h: torch.Tensor) -> torch.Tensor:
        return h[:, :, 0] if self.cls_token else h

    def states(self, x: torch.Tensor) -> list[torch.Tensor]:
        """ResidualNet.states of every seed: h_0..h_L, each K x B x ...; one autograd graph."""
        h = [self.embed(x)]
        if not h[0].requires_grad:
            h[0].requires_grad_(True)
        for branch in self.branches:
            h.append(h[-1] + branch(h[-1]))
        return h

    def normed(self, h_last: torch.Tensor) -> torch.Tensor:
        vector = self.vector(h_last)
        if isinstance(self.template.out_norm, nn.LayerNorm):
            return self._norm("out_norm", vector)
        return vector

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        return self._linear("head", normed)

    def readout(self, h_last: torch.Tensor) -> torch.Tensor:
        return self.head(self.normed(h_last))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(self.states(x)[-1])

    def select(self, keep: Sequence[int]) -> StackedNet:
        """The networks at positions `keep` (their current values, as new leaves)."""
        index = torch.tensor(list(keep), device=next(iter(self.params.values())).device)
        params = {
            name: _stacked_leaf(
                p.detach().index_select(0, index),
                p.requires_grad,
                _is_linear_weight(self.template, name),
            )
            for name, p in self.params.items()
        }
        return StackedNet(self.template, params, self.sample_dims)

    def network_tensors(self, k: int) -> list[torch.Tensor]:
        """A copy of network k's tensors in its state_dict's order (what RunContext.track
        hashes)."""
        return [self.params[name][k].detach().clone() for name in self.template.state_dict()]


def _is_linear_weight(template: ResidualNet, name: str) -> bool:
    module, _, kind = name.rpartition(".")
    return kind == "weight" and isinstance(template.get_submodule(module), nn.Linear)


def _stacked_leaf(values: torch.Tensor, requires_grad: bool, linear_weight: bool) -> torch.Tensor:
    """A stacked parameter as a new leaf. A Linear's K x out x in weight is laid out in
    memory as K x in x out (the batched GEMM's operand), so that its gradient arrives in the
    parameter's own layout and is taken as it is, not copied (autograd's layout contract)."""
    if linear_weight:
        k, out, inp = values.shape
        leaf = torch.empty_strided(
            values.shape, (out * inp, 1, out), dtype=values.dtype, device=values.device
        )
        values = leaf.copy_(values)
    return values.requires_grad_(requires_grad)
