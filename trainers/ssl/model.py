"""The `ssl` model: a CIFAR ResNet backbone, the method's projector and (SimSiam/BYOL)
predictor, Cut-initialisation and GradScale (spec sections 2.2, 2.3 and 3)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainers.init import init_linear
from trainers.ssl.config import SSLConfig


class GradScale(torch.autograd.Function):
    """Identity forward; backward multiplies each sample's gradient by ||z||^power (norm over
    the last dimension). Inserted on un-normalised embeddings just before normalisation.
    power = 0 is exactly the identity; power = 1 makes the gradient's magnitude independent of
    ||z||, undoing the 1/||z|| of a cosine loss (the paper's setting)."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, power: float) -> torch.Tensor:
        ctx.save_for_backward(z)
        ctx.power = power
        return z.view_as(z)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (z,) = ctx.saved_tensors
        return grad * z.norm(dim=-1, keepdim=True) ** ctx.power, None


def grad_scale(z: torch.Tensor, power: float) -> torch.Tensor:
    return GradScale.apply(z, power)


@torch.no_grad()
def cut_init(model: nn.Module, cut: float) -> None:
    """Cut-initialisation: divide every parameter tensor (weights, biases, norm-layer affine
    parameters) by `cut`, as the official `cut_weights` does. Buffers (BatchNorm running
    statistics) are not parameters and stay."""
    for p in model.parameters():
        p.div_(cut)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem, no max-pool, global average pool; `features` wide."""

    def __init__(self, channels: int, widths: tuple[int, ...], blocks: tuple[int, ...]) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        )
        layers, cin = [], widths[0]
        for stage, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            for index in range(count):
                layers.append(BasicBlock(cin, width, 2 if stage > 0 and index == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*layers)
        self.features = cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x)).mean(dim=(2, 3))


# Stage widths and blocks per stage of each backbone.
BACKBONES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "resnet18": ((64, 128, 256, 512), (2, 2, 2, 2)),
    "resnet_small": ((16, 32, 64), (1, 1, 1)),
}


def build_backbone(kind: str, channels: int) -> ResNet:
    return ResNet(channels, *BACKBONES[kind])


def build_projector(method: str, features: int, dim: int) -> nn.Sequential:
    if method == "simclr":  # Linear-ReLU-Linear, no BN
        return nn.Sequential(nn.Linear(features, dim), nn.ReLU(), nn.Linear(dim, dim))
    return nn.Sequential(  # three Linear layers, BN after each (the last included)
        nn.Linear(features, dim),
        nn.BatchNorm1d(dim),
        nn.ReLU(),
        nn.Linear(dim, dim),
        nn.BatchNorm1d(dim),
        nn.ReLU(),
        nn.Linear(dim, dim),
        nn.BatchNorm1d(dim),
    )


def build_predictor(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, dim)
    )


def init_parameters(model: nn.Module, generator: torch.Generator) -> None:
    """torchvision's ResNet init (kaiming-normal fan_out convs, BN 1/0, zero-init of each
    block's last BN) and PyTorch's default Linear init, drawn from the run's `init` source."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(
                module.weight, mode="fan_out", nonlinearity="relu", generator=generator
            )
        elif isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            init_linear(module, generator)
    for module in model.modules():
        if isinstance(module, BasicBlock):
            nn.init.zeros_(module.bn2.weight)


class SSLModel(nn.Module):
    def __init__(self, config: SSLConfig, channels: int, generator: torch.Generator) -> None:
        super().__init__()
        self.method = config.method
        self.power = config.grad_scale_power
        dim = config.resolved("proj_dim")
        self.backbone = build_backbone(config.backbone, channels)
        self.projector = build_projector(config.method, self.backbone.features, dim)
        self.predictor = (
            build_predictor(dim, config.pred_hidden) if config.method != "simclr" else None
        )
        init_parameters(self, generator)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Backbone features h and un-normalised projector output z."""
        h = self.backbone(x)
        return h, self.projector(h)
