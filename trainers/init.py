"""Parameter initialisation drawn from a run's `init` generator (never global random state)."""

from __future__ import annotations

import math

import torch
from torch import nn


def init_linear(linear: nn.Linear, generator: torch.Generator) -> None:
    """PyTorch's default nn.Linear init: kaiming-uniform(a = sqrt 5) weights, uniform
    (-1/sqrt fan_in, 1/sqrt fan_in) biases, with the draws taken from `generator`."""
    nn.init.kaiming_uniform_(linear.weight, a=math.sqrt(5), generator=generator)
    if linear.bias is not None:
        bound = 1 / math.sqrt(linear.weight.shape[1])
        nn.init.uniform_(linear.bias, -bound, bound, generator=generator)
