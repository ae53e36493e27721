"""The unpaired mean test: a studentised permutation test of the difference of the two levels'
means, with its interval by inverting the test.

Welch's t-test takes its p from Student's t, which needs near-normal means: with 6 seeds against
20 it rejected a true null 14.6% of the time at 0.05 on a bimodal metric (a share of seeds
collapsed, the same in both levels) and 7.4-7.9% on beta and lognormal ones. Here Welch's
statistic is kept but its null distribution comes from re-assignments of the runs between the
two levels within each stratum (each combination of the other factors), which keep every
stratum's counts. That is exact when the levels' runs are exchangeable within strata (the
level changes nothing), and, being studentised, it stays asymptotically valid when only the
means are equal and the spreads differ (Janssen 1997; Chung and Romano 2013).

The interval holds the shifts d that the test does not reject: under H(d) a's runs and b's runs
plus d are exchangeable, and every statistic of a re-assignment is a closed form in d of four
matrix products (sums and sums of squares of each side), so p(d) costs one pass over the
re-assignments. Its ends are found by bisection from the estimate outwards.

Re-assignments: all of them when there are at most resampling.MAX_ENUMERATED, else
resampling.N_RESAMPLES drawn from resampling.RESAMPLING_SEED, a block of rows at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from service.analysis import resampling

# Each end of the interval to this fraction of Welch's half-width (a bisection of about 14
# steps: the interval costs about 30 passes over the re-assignments; the drawn re-assignments'
# own Monte Carlo error in the ends is far larger).
BISECTION_TOLERANCE = 1e-4
# Rows of drawn re-assignments made at once (a few MB for a large experiment's layout).
ROWS_PER_BLOCK = 2048

MEAN_TEST = "studentised permutation test (Welch's t)"


@dataclass
class MeanTest:
    p: float
    interval: tuple[float, float]
    resamples: int  # re-assignments counted, the observed one included
    exact: bool


@dataclass
class _Products:
    """Per re-assignment (the observed one excluded): the sum and the sum of squares of the
    values it puts on a's side, the number of b's runs among them and the sum of those."""

    sum_x: np.ndarray
    sum_x2: np.ndarray
    count_b: np.ndarray
    sum_xb: np.ndarray
    exact: bool


def _products(strata: Sequence[tuple[np.ndarray, np.ndarray]]) -> _Products:
    layout = (0, *(n for a, b in strata for n in (len(a), len(b))))
    x = np.concatenate([np.r_[a, b] for a, b in strata])
    is_b = np.concatenate([np.r_[np.zeros(len(a)), np.ones(len(b))] for a, b in strata])
    columns = np.stack([x, x * x, is_b, x * is_b], axis=1)
    enumerate_all = resampling.enumerated(layout, resampling.N_RESAMPLES, resampling.MAX_ENUMERATED)
    if enumerate_all or resampling.N_RESAMPLES * len(x) * 8 <= resampling.MAX_MATRIX_BYTES:
        # kept in resampling's cache: an experiment's comparisons share a few layouts
        matrix, exact = resampling.assignments(
            layout, resampling.N_RESAMPLES, resampling.MAX_ENUMERATED
        )
        made = matrix @ columns
    else:
        exact = False
        sizes = [(len(a), len(b)) for a, b in strata]
        rng = np.random.default_rng(resampling.RESAMPLING_SEED)
        blocks = []
        for start in range(0, resampling.N_RESAMPLES, ROWS_PER_BLOCK):
            rows = min(ROWS_PER_BLOCK, resampling.N_RESAMPLES - start)
            _, choices = resampling._draw(0, sizes, rows, rng)
            blocks.append(np.concatenate(choices, axis=1) @ columns)
        made = np.concatenate(blocks, axis=0)
    return _Products(made[:, 0], made[:, 1], made[:, 2], made[:, 3], exact)


def _welch_t(
    sum_a: np.ndarray | float,
    sum2_a: np.ndarray | float,
    total: float,
    total2: float,
    n_a: int,
    n_b: int,
) -> np.ndarray:
    sum_b, sum2_b = total - np.asarray(sum_a), total2 - np.asarray(sum2_a)
    var_a = np.maximum(sum2_a - np.square(sum_a) / n_a, 0.0) / (n_a - 1)
    var_b = np.maximum(sum2_b - np.square(sum_b) / n_b, 0.0) / (n_b - 1)
    with np.errstate(all="ignore"):
        return (np.asarray(sum_a) / n_a - sum_b / n_b) / np.sqrt(var_a / n_a + var_b / n_b)


def mean_test(
    strata: Sequence[tuple[np.ndarray, np.ndarray]],
    confidence: float = 0.95,
    *,
    with_interval: bool = True,
) -> MeanTest | None:
    """The test of mean_a = mean_b over all runs of each level, runs re-assigned within their
    stratum (a's and b's values of one combination of the other factors), and the interval of
    mean_a - mean_b at `confidence` (unless not `with_interval`: (nan, nan)); None with fewer
    than 2 runs a side or no spread at all."""
    kept = [(np.asarray(a, float), np.asarray(b, float)) for a, b in strata if len(a) + len(b)]
    n_a = sum(len(a) for a, _ in kept)
    n_b = sum(len(b) for _, b in kept)
    if n_a < 2 or n_b < 2:
        return None
    a_all = np.concatenate([a for a, _ in kept])
    b_all = np.concatenate([b for _, b in kept])
    if a_all.var() == 0 and b_all.var() == 0:
        return None
    made = _products(kept)
    total_rows = len(made.sum_x) + 1
    sum_b, sum2_b = float(b_all.sum()), float((b_all * b_all).sum())
    sum_a, sum2_a = float(a_all.sum()), float((a_all * a_all).sum())

    def p_at(shift: float) -> float:
        # H(shift): a's runs and b's runs + shift exchangeable
        total = sum_a + sum_b + n_b * shift
        total2 = sum2_a + sum2_b + 2 * shift * sum_b + n_b * shift * shift
        observed = float(_welch_t(sum_a, sum2_a, total, total2, n_a, n_b))
        on_a = made.sum_x + shift * made.count_b
        on_a2 = made.sum_x2 + 2 * shift * made.sum_xb + shift * shift * made.count_b
        t = _welch_t(on_a, on_a2, total, total2, n_a, n_b)
        if not math.isfinite(observed):
            return 1.0
        tolerance = 1e-9 * max(1.0, abs(observed))
        greater = 1 + int(np.sum(t >= observed - tolerance))
        less = 1 + int(np.sum(t <= observed + tolerance))
        return min(1.0, 2.0 * min(greater, less) / total_rows)

    alpha = 1 - confidence
    estimate = float(a_all.mean() - b_all.mean())
    spread = math.sqrt(a_all.var(ddof=1) / n_a + b_all.var(ddof=1) / n_b)
    ends: list[float] = []
    if 2.0 / total_rows > alpha:  # too few re-assignments to reject any shift
        ends = [-math.inf, math.inf]
    # Welch's half-width from Student's t: where the ends usually are (a bracket, not an answer)
    dof = max(1, min(n_a, n_b) - 1)
    half_width = max(float(special.stdtrit(dof, 1 - alpha / 2)) * spread, 1e-300)
    for direction in (-1.0, 1.0) if with_interval and not ends else ():
        inside, outside = 0.0, 1.5 * half_width
        # widen until a shift is rejected (past every re-assignment's range none is accepted)
        for _ in range(64):
            if p_at(estimate + direction * outside) <= alpha:
                break
            inside, outside = outside, 2 * outside
        else:
            ends.append(direction * math.inf)
            continue
        while outside - inside > BISECTION_TOLERANCE * half_width:
            middle = 0.5 * (inside + outside)
            if p_at(estimate + direction * middle) <= alpha:
                outside = middle
            else:
                inside = middle
        ends.append(estimate + direction * outside)
    interval = (ends[0], ends[1]) if with_interval else (math.nan, math.nan)
    return MeanTest(p=p_at(0.0), interval=interval, resamples=total_rows, exact=made.exact)
