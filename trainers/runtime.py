"""Process-wide PyTorch settings a trainer applies before it trains."""

from __future__ import annotations

import torch


def deterministic_cpu() -> None:
    """Same config and seed on the same CPU give identical metrics (DESIGN.md)."""
    torch.use_deterministic_algorithms(True)


def pick_device(name: str) -> torch.device:
    """auto: the GPU Ray assigned to this process if there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but no GPU is visible to this process")
    return torch.device(name)
