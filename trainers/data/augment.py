"""Batched, seeded image augmentation with one strength knob from 0 (none) to 1 (aggressive).

Augmentation runs on whole batches of [0, 1] images on the batch's device, drawing every random
choice from the run's `augment` generator (torchvision's per-image transforms draw from global
state, which would tie runs together). The strength s maps to:

    s = 0            no augmentation
    0 < s <= 0.5     random crop with zero padding  p = round(s/0.5 * p_ref), horizontal flip
                     where the dataset allows it; s = 0.5 is the reference pipeline (CFF's
                     RandomCrop(32, padding=12) + HFlip on CIFAR-10)
    0.5 < s <= 1     the reference crop grows to 1.5 * p_ref and RandAugment-style ops are added
                     first: n = ceil(3 (2s - 1)) ops per image, magnitude 14 (2s - 1) on
                     RandAugment's 0..30 scale; s = 1 is RandAugment(3, 14) + 1.5x padding,
                     the "aggressive augmentation" of the CFF difficulty sweep.

The RandAugment ops follow torchvision's list and magnitude ranges (identity, shear x/y 0.3,
translate x/y 0.45 of the side, rotate 30 degrees, brightness/color/contrast/sharpness 0.9,
posterize 8 -> 4 bits, solarize, autocontrast, equalize), applied per image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

RANDAUGMENT_OPS = (
    "identity",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "rotate",
    "brightness",
    "color",
    "contrast",
    "sharpness",
    "posterize",
    "solarize",
    "autocontrast",
    "equalize",
)


@dataclass(frozen=True)
class AugmentPlan:
    """What a strength means for one dataset: crop padding, flips, RandAugment ops."""

    crop_padding: int
    hflip: bool
    num_ops: int
    magnitude: float  # on RandAugment's 0..30 scale

    @classmethod
    def from_strength(
        cls,
        strength: float,
        *,
        image_side: int,
        padding_fraction: float,
        hflip: bool,
        crop_padding: int | None = None,
    ) -> AugmentPlan:
        if not 0.0 <= strength <= 1.0:
            raise ValueError(f"augmentation strength must be in [0, 1], got {strength}")
        reference = (
            crop_padding if crop_padding is not None else round(padding_fraction * image_side)
        )
        if strength == 0.0:
            return cls(0, False, 0, 0.0)
        if strength <= 0.5:
            return cls(round(reference * strength / 0.5), hflip, 0, 0.0)
        excess = 2.0 * strength - 1.0
        return cls(
            round(reference * (1.0 + 0.5 * excess)), hflip, math.ceil(3 * excess), 14.0 * excess
        )

    @property
    def active(self) -> bool:
        return self.crop_padding > 0 or self.hflip or self.num_ops > 0


@dataclass(frozen=True)
class Draws:
    """The random choices of one augmented batch, drawn on the host (CPU tensors, one entry per
    image): per RandAugment step its ops and signs, the crop offsets, the flip draws."""

    steps: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    dy: torch.Tensor | None = None
    dx: torch.Tensor | None = None
    flip: torch.Tensor | None = None

    @staticmethod
    def concat(parts: Sequence[Draws]) -> Draws:
        """The draws of batches laid end to end (their images concatenated in that order)."""

        def cat(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
            return None if tensors[0] is None else torch.cat(list(tensors))  # type: ignore[arg-type]

        steps = tuple(
            (torch.cat([p.steps[i][0] for p in parts]), torch.cat([p.steps[i][1] for p in parts]))
            for i in range(len(parts[0].steps))
        )
        return Draws(
            steps,
            cat([p.dy for p in parts]),
            cat([p.dx for p in parts]),
            cat([p.flip for p in parts]),
        )


def draw(plan: AugmentPlan, b: int, generator: torch.Generator) -> Draws:
    """A batch of `b` images' random choices from `generator` (CPU), in the order `augment`
    has always drawn them: per RandAugment step the ops then the signs, the crop's rows then
    columns, the flips."""
    if not plan.active:
        return Draws()
    steps = tuple(
        (
            torch.randint(0, len(RANDAUGMENT_OPS), (b,), generator=generator),
            torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0),
        )
        for _ in range(plan.num_ops)
    )
    dy = dx = flip = None
    if plan.crop_padding > 0:
        span = 2 * plan.crop_padding + 1
        dy = torch.randint(0, span, (b,), generator=generator)
        dx = torch.randint(0, span, (b,), generator=generator)
    if plan.hflip:
        flip = torch.rand(b, generator=generator)
    return Draws(steps, dy, dx, flip)


def augment(x: torch.Tensor, plan: AugmentPlan, generator: torch.Generator) -> torch.Tensor:
    """Augment a batch of [0, 1] images (B x C x H x W); random draws from `generator` (CPU)."""
    return apply(x, plan, draw(plan, len(x), generator))


def apply(x: torch.Tensor, plan: AugmentPlan, draws: Draws) -> torch.Tensor:
    """Augment a batch of [0, 1] images with its draws (`draw`, or `Draws.concat` of several
    batches' draws for their images laid end to end: each image is augmented as in its own
    batch)."""
    if not plan.active:
        return x
    for choice, sign in draws.steps:
        x = _randaugment_step(x, plan.magnitude, choice, sign)
    if draws.dy is not None and draws.dx is not None:
        x = _crop(x, plan.crop_padding, _to(draws.dy, x.device), _to(draws.dx, x.device))
    if draws.flip is not None:
        flip = _to(draws.flip < 0.5, x.device)
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    return x


def _to(draws: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Random draws made on the CPU, on `device`. Without waiting for the device's queue: a
    pageable CPU tensor is staged at once, so the copy cannot see it change."""
    return draws.to(device, non_blocking=True)


def random_crop(x: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """torchvision's RandomCrop(side, padding) with zero fill, one offset per image."""
    b = len(x)
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    return _crop(x, padding, _to(dy, x.device), _to(dx, x.device))


def _crop(x: torch.Tensor, padding: int, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    channel = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]


def _randaugment_step(
    x: torch.Tensor, magnitude: float, choice: torch.Tensor, sign: torch.Tensor
) -> torch.Tensor:
    """One RandAugment op per image, each image with its own op and sign (host tensors)."""
    m = magnitude / 30.0
    out = x.clone()
    for index, op in enumerate(RANDAUGMENT_OPS):
        members = (choice == index).nonzero().flatten()
        if len(members) == 0 or op == "identity":
            continue
        s, rows = _to(sign[members], x.device), _to(members, x.device)
        out[rows] = _apply(op, x[rows], m, s).clamp(0.0, 1.0)
    return out


def _apply(op: str, x: torch.Tensor, m: float, sign: torch.Tensor) -> torch.Tensor:
    side = x.shape[-1]
    if op in ("shear_x", "shear_y", "translate_x", "translate_y", "rotate"):
        theta = torch.zeros(len(x), 2, 3, device=x.device)
        theta[:, 0, 0] = theta[:, 1, 1] = 1.0
        if op == "shear_x":
            theta[:, 0, 1] = 0.3 * m * sign
        elif op == "shear_y":
            theta[:, 1, 0] = 0.3 * m * sign
        elif op == "translate_x":  # affine_grid coordinates span 2 per side
            theta[:, 0, 2] = 2 * 0.45 * m * sign
        elif op == "translate_y":
            theta[:, 1, 2] = 2 * 0.45 * m * sign
        else:
            angle = math.radians(30.0 * m) * sign
            theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle), -torch.sin(angle)
            theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle), torch.cos(angle)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    factor = (1.0 + 0.9 * m * sign)[:, None, None, None]
    if op == "brightness":
        return x * factor
    gray = (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]) if x.shape[1] == 3 else x
    if op == "color":
        return gray + factor * (x - gray)
    if op == "contrast":
        mean = gray.mean(dim=(1, 2, 3), keepdim=True)
        return mean + factor * (x - mean)
    if op == "sharpness":
        kernel = (
            device_constant(
                ((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0)), torch.float32, x.device
            )
            / 13.0
        )
        c = x.shape[1]
        smooth = F.conv2d(
            F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel.expand(c, 1, 3, 3), groups=c
        )
        return smooth + factor * (x - smooth)
    if op == "posterize":
        bits = 8 - int(round(4 * m))
        step = 2 ** (8 - bits)
        return torch.floor(x * 255 / step) * step / 255
    if op == "solarize":
        return torch.where(x >= 1.0 - m, 1.0 - x, x)
    flat = x.reshape(len(x), x.shape[1], -1)
    if op == "autocontrast":
        lo, hi = flat.amin(-1, keepdim=True), flat.amax(-1, keepdim=True)
        scaled = (flat - lo) / (hi - lo).clamp(min=1e-6)
        return torch.where(hi > lo, scaled, flat).reshape(x.shape)
    # equalize: map each pixel to its value's empirical CDF within its image and channel
    ordered = flat.sort(dim=-1).values.contiguous()
    cdf = torch.searchsorted(ordered, flat.contiguous(), right=True).to(x.dtype)
    return (cdf / (side * side)).reshape(x.shape)


@lru_cache(maxsize=64)
def device_constant(
    values: tuple[float, ...] | tuple[tuple[float, ...], ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A constant tensor made once per (values, dtype, device) and kept: on a GPU, building it
    from Python numbers on every batch was a blocking host-to-device copy each time. Never
    written to; made outside inference mode, so that autograd may save it."""
    with torch.inference_mode(False):
        return torch.tensor(values, dtype=dtype, device=device)


def normalize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    m = device_constant(tuple(mean), x.dtype, x.device)[None, :, None, None]
    s = device_constant(tuple(std), x.dtype, x.device)[None, :, None, None]
    return (x - m) / s


def simclr_augment(
    x: torch.Tensor,
    generator: torch.Generator,
    *,
    hflip: bool,
    strength: float = 0.5,
    min_scale: float = 0.2,
) -> torch.Tensor:
    """SimCLR's view pipeline on a batch of [0, 1] images, one draw per image (paper 001):
    RandomResizedCrop(side, scale=(min_scale, 1), ratio=(3/4, 4/3)) + HFlip where the dataset
    allows it; then brightness, contrast and saturation jitter of 0.8 * strength and hue jitter
    of 0.2 * strength (0.4 / 0.4 / 0.4 / 0.1 at strength 0.5), each applied with p = 0.8;
    grayscale with p = 0.2. No normalisation, as the paper's code."""
    b, c, h, w = x.shape
    device = x.device
    jitter = 0.8 * strength
    # every uniform draw of the view, in the order the pipeline takes them, made on the host
    # first and copied to the device at once (one copy per view, not one per draw)
    bounds = _simclr_bounds(hflip=hflip, rgb=c == 3, jitter=jitter, min_scale=min_scale)
    drawn = torch.stack([lo + (hi - lo) * torch.rand(b, generator=generator) for lo, hi in bounds])
    rows = iter(zip(bounds, _to(drawn, device).unbind(0), strict=True))

    def uniform(lo: float, hi: float) -> torch.Tensor:
        (want_lo, want_hi), row = next(rows)
        assert (want_lo, want_hi) == (lo, hi), "the SimCLR draws were made out of order"
        return row

    area = uniform(min_scale, 1.0)
    log_ratio = uniform(math.log(3 / 4), math.log(4 / 3))
    ratio = torch.exp(log_ratio)
    # crop width and height as fractions of the side (clipped to the image, as torchvision's
    # fallback does)
    cw = torch.sqrt(area * ratio).clamp(max=1.0)
    ch = torch.sqrt(area / ratio).clamp(max=1.0)
    cx = (uniform(0.0, 1.0) * (1 - cw) + cw / 2) * 2 - 1  # centre in [-1, 1] coordinates
    cy = (uniform(0.0, 1.0) * (1 - ch) + ch / 2) * 2 - 1
    flip = (
        torch.where(uniform(0.0, 1.0) < 0.5, -1.0, 1.0) if hflip else torch.ones(b, device=device)
    )
    theta = torch.zeros(b, 2, 3, device=device)
    theta[:, 0, 0] = cw * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = ch
    theta[:, 1, 2] = cy
    grid = F.affine_grid(theta, [b, c, h, w], align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    if c == 3:
        gray_weights = device_constant((0.299, 0.587, 0.114), torch.float32, device)[
            None, :, None, None
        ]
    for op in ("brightness", "contrast", "saturation", "hue"):
        apply = (uniform(0.0, 1.0) < 0.8)[:, None, None, None]
        if op == "hue":
            if c != 3:
                continue
            changed = _hue_shift(out, uniform(-0.25 * jitter, 0.25 * jitter))
        else:
            factor = uniform(max(0.0, 1 - jitter), 1 + jitter)[:, None, None, None]
            if op == "brightness":
                changed = out * factor
            else:
                gray = (out * gray_weights).sum(1, keepdim=True) if c == 3 else out
                if op == "contrast":
                    gray = gray.mean(dim=(1, 2, 3), keepdim=True)
                changed = gray + factor * (out - gray)
        out = torch.where(apply, changed.clamp(0.0, 1.0), out)
    if c == 3:
        to_gray = (uniform(0.0, 1.0) < 0.2)[:, None, None, None]
        out = torch.where(to_gray, (out * gray_weights).sum(1, keepdim=True).expand_as(out), out)
    return out


def _simclr_bounds(
    *, hflip: bool, rgb: bool, jitter: float, min_scale: float
) -> list[tuple[float, float]]:
    """The (low, high) of each uniform draw simclr_augment takes, in its order: crop area, log
    aspect ratio, centre x and y, the flip (with hflip); per colour op whether it applies, then
    its factor (hue's shift only for RGB: a grey image draws whether hue applies, and no
    shift); the grey conversion (RGB)."""
    bounds = [(min_scale, 1.0), (math.log(3 / 4), math.log(4 / 3)), (0.0, 1.0), (0.0, 1.0)]
    if hflip:
        bounds.append((0.0, 1.0))
    for op in ("brightness", "contrast", "saturation", "hue"):
        bounds.append((0.0, 1.0))
        if op != "hue":
            bounds.append((max(0.0, 1 - jitter), 1 + jitter))
        elif rgb:
            bounds.append((-0.25 * jitter, 0.25 * jitter))
    if rgb:
        bounds.append((0.0, 1.0))
    return bounds


@lru_cache(maxsize=16)
def _yiq(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """RGB -> YIQ and its inverse, made once per dtype and device (the inverse's error check
    waited for the device on every batch)."""
    to_yiq = device_constant(
        ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312)), dtype, device
    )
    with torch.inference_mode(False):
        return to_yiq, torch.linalg.inv(to_yiq)


def _hue_shift(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate hue by `shift` turns (per image) in YIQ space, an exact rotation of chroma."""
    to_yiq, from_yiq = _yiq(x.dtype, x.device)
    yiq = torch.einsum("ij,bjhw->bihw", to_yiq, x)
    angle = 2 * math.pi * shift
    cos, sin = torch.cos(angle)[:, None, None], torch.sin(angle)[:, None, None]
    i, q = yiq[:, 1], yiq[:, 2]
    rotated = torch.stack([yiq[:, 0], cos * i - sin * q, sin * i + cos * q], dim=1)
    return torch.einsum("ij,bjhw->bihw", from_yiq, rotated)
