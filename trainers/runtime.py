"""Process-wide PyTorch settings a trainer applies before it trains."""

from __future__ import annotations

import torch


def deterministic_cpu() -> None:
    """Same config and seed on the same CPU give identical metrics (DESIGN.md)."""
    torch.use_deterministic_algorithms(True)
