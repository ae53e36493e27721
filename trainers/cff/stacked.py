"""K seeds' copies of one module as one: stacked parameters with a leading seed axis, a forward
pass written for stacked parameters (cff's layers, trainers.stacked_ops) or under
torch.func.vmap (any other module: the heads), and AdamW on the stacked tensors.

AdamW is elementwise, so one AdamW over the stacked tensors updates each seed's slice exactly
as that seed's own AdamW would (same lr, weight decay, betas and step count). Gradient norms are
per seed. A seed that stops is dropped from the stack, optimiser state included, so that it stops
changing and costs nothing more.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from trainers.cff.model import Attention, CFFLayer
from trainers.stacked_ops import stacked_attention, stacked_layer_norm, stacked_linear


class _MatmulLinear(nn.Linear):
    """nn.Linear as a matmul and an add, for the stack's template only: under vmap, F.linear's
    batching rule adds a copy and two scalings, three more kernels a layer forward and
    backward (benchmarks/launches.py); the solo modules keep F.linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class SeedStack:
    """Copies of one architecture (`modules`, one per seed, in the stack's order)."""

    def __init__(
        self, modules: Sequence[nn.Module], *, lr: float | None = None, weight_decay: float = 0.0
    ) -> None:
        """`lr`: train the stack with AdamW(lr, weight_decay); None: frozen (no gradients)."""
        template = copy.deepcopy(modules[0]).to("meta")
        for module in template.modules():
            if isinstance(module, Attention):
                module.fused = False  # the fused kernel fails in backward under vmap on CUDA
            if type(module) is nn.Linear:
                module.__class__ = _MatmulLinear
        self.template = template
        params, self.buffers = stack_module_state(list(modules))
        self.params = {
            name: p.detach().requires_grad_(lr is not None) for name, p in params.items()
        }
        self.lr, self.weight_decay = lr, weight_decay
        self.optimizer = self._adamw()

    def __len__(self) -> int:
        return len(next(iter(self.params.values())))

    def __call__(self, x: torch.Tensor, *, shared: bool = False) -> torch.Tensor:
        """Each seed's module on its slice of `x` (K x ...), or on all of `x` when `shared`."""
        if isinstance(self.template, CFFLayer):
            return self._layer(x.expand(len(self), *x.shape) if shared else x)
        return vmap(self._one, in_dims=(0, 0, None if shared else 0))(self.params, self.buffers, x)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        """CFFLayer.forward of every seed on its own K x B x T x ... input, written for stacked
        parameters (trainers.stacked_ops: one batched kernel where a solo layer launches one),
        not vmapped: vmap's rules for a layer norm's and a linear layer's per-seed weights
        took about 50 more kernels a training step of the paper's 5 layers."""
        template, p = self.template, self.params
        assert isinstance(template, CFFLayer)
        if template.embedding is not None:
            proj = stacked_linear(x, p["embedding.proj.weight"], p["embedding.proj.bias"])
            x = F.relu(proj) + p["embedding.position"]
        block = template.block

        def norm(name: str, h: torch.Tensor) -> torch.Tensor:
            module = block.get_submodule(name)
            assert isinstance(module, nn.LayerNorm)
            weight, bias = p[f"block.{name}.weight"], p[f"block.{name}.bias"]
            return stacked_layer_norm(h, weight, bias, module.eps)

        def linear(name: str, h: torch.Tensor) -> torch.Tensor:
            return stacked_linear(h, p[f"block.{name}.weight"], p[f"block.{name}.bias"])

        attention = stacked_attention(
            norm("ln1", x),
            block.attn.heads,
            (p["block.attn.qkv.weight"], p["block.attn.qkv.bias"]),
            (p["block.attn.out.weight"], p["block.attn.out.bias"]),
        )
        r = x + attention
        return r + linear("fc2", F.gelu(linear("fc1", norm("ln2", r))))

    def _one(
        self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        return functional_call(self.template, (params, buffers), (x,))

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def step(self) -> None:
        assert self.optimizer is not None, "a frozen stack has no optimiser"
        self.optimizer.step()

    def grad_norms(self) -> torch.Tensor:
        """Each seed's total gradient 2-norm over the stack's parameters (K), what
        torch.nn.utils.get_total_norm computes for one seed (the 2-norm of the per-tensor
        norms), as one norm of the seed's gradients laid end to end: two kernels, not one per
        parameter tensor (the sum runs in another order: float32 rounding apart)."""
        grads = [p.grad.flatten(1) for p in self.params.values() if p.grad is not None]
        return torch.linalg.vector_norm(torch.cat(grads, dim=1), dim=1)

    def state(self, position: int) -> dict[str, torch.Tensor]:
        """A copy of the seed at `position` as its module's state_dict."""
        tensors = {**self.params, **self.buffers}
        return {name: t.detach()[position].clone() for name, t in tensors.items()}

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only the seeds at `positions`, in that order, with their optimiser state."""
        device = next(iter(self.params.values())).device
        where = torch.tensor(list(positions), dtype=torch.long, device=device)
        self.params = {
            name: p.detach()[where].requires_grad_(p.requires_grad)
            for name, p in self.params.items()
        }
        self.buffers = {name: b[where] for name, b in self.buffers.items()}
        if self.optimizer is None:
            return
        saved = self.optimizer.state_dict()
        saved["state"] = {
            key: {name: value[where] if value.dim() > 0 else value for name, value in entry.items()}
            for key, entry in saved["state"].items()
        }
        self.optimizer = self._adamw()
        assert self.optimizer is not None
        self.optimizer.load_state_dict(saved)

    def _adamw(self) -> torch.optim.AdamW | None:
        if self.lr is None:
            return None
        return torch.optim.AdamW(self.params.values(), lr=self.lr, weight_decay=self.weight_decay)
