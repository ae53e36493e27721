"""The three-check protocol of paper 002 as pure functions (spec section 4).

D1 scale stability: rho = max_l ||h_{l+1}|| / ||h_l|| (ratio of per-layer medians) > 50 fails.
D2 reference validity: ||g_L|| = ||dCE/dh_L|| (median) < 1e-7 fails.
D3 depth utility: acc - acc_frozen < 2 points fails.
Norms are per-sample L2 over the feature dimension, medians over the evaluation batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

CHECKS = ("D1", "D2", "D3")
SCALE_GROWTH_THRESHOLD = 50.0
REF_GRAD_FLOOR = 1e-7  # 10 x the cosine eps 1e-8 in fp32
DEPTH_UTILITY_MARGIN_PP = 2.0
# acc - acc_frozen in points is rounded to this many decimals before the D3 comparison, so
# that 0.35 - 0.33 counts as 2 points, not 1.9999999999999996.
POINTS_DECIMALS = 9


def sample_norms(t: torch.Tensor) -> torch.Tensor:
    """Per-sample L2 norm over the feature dimension, ||t_i|| = t.norm(dim=-1); never t.norm(-1),
    which is the L_{-1} "norm" of the whole tensor."""
    return t.norm(dim=-1)


def median_norm(t: torch.Tensor) -> float:
    """The median over the batch of the per-sample L2 norms."""
    return float(sample_norms(t).median())


def scale_growth(median_norms: Sequence[float]) -> float:
    """rho = max_l m_{l+1} / m_l over the per-layer median norms m_0..m_L (largest single-block
    amplification); inf when a norm is zero before a non-zero one."""
    ratios = [
        b / a if a > 0 else (float("inf") if b > 0 else 1.0)
        for a, b in zip(median_norms[:-1], median_norms[1:], strict=True)
    ]
    return max(ratios) if ratios else 1.0


def cosine_no_eps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample cos(a_i, b_i) = <a_i, b_i> / (||a_i|| ||b_i||) with no eps clamp (unlike
    F.cosine_similarity, whose 1e-8 floor deflates the cosine of a 1e-10 gradient 100x); a
    zero vector gives nan. Computed in float64, so that tiny gradients do not underflow."""
    a, b = a.double(), b.double()
    return (a * b).sum(dim=-1) / (sample_norms(a) * sample_norms(b))


def layer_cosines(
    credits: Sequence[torch.Tensor], references: Sequence[torch.Tensor]
) -> list[float]:
    """Gamma_l = mean over samples of cos(a_l, g_l), one per pair. A sample whose credit or
    reference is exactly zero (a saturated softmax underflows to 0) has no cosine and is left
    out; nan when no sample has one."""
    return [
        float(torch.nanmean(cosine_no_eps(a, g))) for a, g in zip(credits, references, strict=True)
    ]


def deep_and_aggregate(cosines: Sequence[float]) -> tuple[float, float]:
    """deep cos = mean of Gamma_l over l >= 1; aggregate = mean over all layers (the mean over
    layers then samples equals the mean of the per-layer sample means)."""
    deep = sum(cosines[1:]) / (len(cosines) - 1) if len(cosines) > 1 else float("nan")
    aggregate = sum(cosines) / len(cosines) if cosines else float("nan")
    return deep, aggregate


def scale_check_fires(rho: float, threshold: float = SCALE_GROWTH_THRESHOLD) -> bool:
    """D1 fails strictly above the threshold (rho = 50 passes)."""
    return rho > threshold


def reference_check_fires(ref_grad_norm: float, floor: float = REF_GRAD_FLOOR) -> bool:
    """D2 fails strictly below the floor (||g_L|| = 1e-7 passes); a nan gradient fails too."""
    return not ref_grad_norm >= floor


def depth_utility_pp(accuracy: float, frozen_accuracy: float) -> float:
    """acc - acc_frozen in percentage points (accuracies as fractions)."""
    return round(100.0 * (accuracy - frozen_accuracy), POINTS_DECIMALS)


def depth_check_fires(utility_pp: float, margin_pp: float = DEPTH_UTILITY_MARGIN_PP) -> bool:
    """D3 fails strictly below the margin (2.0 points passes)."""
    return utility_pp < margin_pp


def verdict(fired: Iterable[str]) -> str:
    """PASS when no check fired, else FAIL(...) listing them in order, e.g. FAIL(D1+D2)."""
    names = set(fired)
    unknown = names - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; expected {CHECKS}")
    ordered = [c for c in CHECKS if c in names]
    return "PASS" if not ordered else f"FAIL({'+'.join(ordered)})"


def first_firing(values: Sequence[tuple[int, bool]]) -> int | None:
    """The first epoch whose check fired, from (epoch, fired) pairs in epoch order."""
    return next((epoch for epoch, fired in values if fired), None)
