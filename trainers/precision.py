"""A run's float precision, one setting for every trainer that offers it.

    with precision_scope(config.precision, run.device) as precision:
        ...
        with precision.autocast():
            output = model(x)               # the forward pass only
        with precision.float32():
            loss = loss_fn(output.float())  # what must stay exact: full float32
        loss.backward()                     # outside autocast, as PyTorch recommends

`fp32` is float32 everywhere: matrix products at torch's "highest" precision and cuDNN's
convolutions without TF32 (torch lets cuDNN use TF32 by default, so without this an `fp32` run
on a GPU convolved in TF32). `tf32` lets float32 matrix products and convolutions use TF32 on a
GPU (10 mantissa bits in the products, float32 sums). Both set these for the scope and restore
the process's previous settings afterwards; on a CPU neither has an effect. `bf16` runs what a
trainer puts under `precision.autocast()` in torch.autocast with bfloat16 (on a CPU too). Under
`tf32` or `bf16`, what a trainer puts under `precision.float32()` runs in full float32.

The TF32 setting is process-wide: two runs in threads of one process would share it. seedgrid's
workers run one task per process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

Precision = Literal["fp32", "tf32", "bf16"]

PRECISION = (
    "fp32: float32 throughout (cuDNN's convolutions included); tf32: float32 matrix products "
    "in TF32 on a GPU (no effect on a CPU); bf16: the forward passes under bfloat16 "
    "autocast, the losses in float32"
)


@dataclass(frozen=True)
class PrecisionScope:
    """What a trainer asks of the precision inside the scope."""

    precision: Precision
    device: torch.device

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """bfloat16 autocast on the run's device under `bf16`; nothing otherwise."""
        if self.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def float32(self) -> contextlib.AbstractContextManager[object]:
        """Full float32 for the block under every precision: no autocast under `bf16`, no TF32
        under `tf32` (restored after the block); nothing to change under `fp32`."""
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, enabled=False)
        if self.precision == "tf32":
            return _matmul_precision("highest")
        return contextlib.nullcontext()


@contextlib.contextmanager
def _matmul_precision(setting: str) -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def precision_scope(precision: Precision, device: torch.device) -> Iterator[PrecisionScope]:
    """The run's precision for the duration of the `with` block (see the module docstring)."""
    if precision not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"precision must be fp32, tf32 or bf16, not {precision!r}")
    scope = PrecisionScope(precision, device)
    if precision == "bf16":
        yield scope
        return
    matmul_before = torch.get_float32_matmul_precision()
    cudnn_before = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield scope
    finally:
        torch.set_float32_matmul_precision(matmul_before)
        torch.backends.cudnn.allow_tf32 = cudnn_before
