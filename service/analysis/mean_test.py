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
re-assignments. Its ends are found from the estimate outwards by a safeguarded secant search on
the rank of the observed t among the re-assignments' (`_end`).

Re-assignments: all of them when there are at most resampling.MAX_ENUMERATED, else
resampling.N_RESAMPLES drawn from resampling.RESAMPLING_SEED, a block of rows at a time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from service.analysis import resampling

# Each end of the interval to this fraction of Welch's half-width (the drawn re-assignments' own
# Monte Carlo error in the ends is far larger). Bisection took about 15 passes over the
# re-assignments an end; the secant search of `_end` about 7 (mean_test 2.5-4x faster, the ends
# the same to this tolerance: 300 random layouts, up to 2 tolerances apart).
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

    def statistics_at(shift: float) -> tuple[np.ndarray, float]:
        # H(shift): a's runs and b's runs + shift exchangeable; Welch's t of every
        # re-assignment, and the observed one
        total = sum_a + sum_b + n_b * shift
        total2 = sum2_a + sum2_b + 2 * shift * sum_b + n_b * shift * shift
        observed = float(_welch_t(sum_a, sum2_a, total, total2, n_a, n_b))
        on_a = made.sum_x + shift * made.count_b
        on_a2 = made.sum_x2 + 2 * shift * made.sum_xb + shift * shift * made.count_b
        return _welch_t(on_a, on_a2, total, total2, n_a, n_b), observed

    def p_of(t: np.ndarray, observed: float) -> float:
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
    # The rejection rule as an order statistic: beyond the upper end the observed t is low, and
    # p <= alpha holds when fewer than rank + 1 re-assignments reach it; `margin` is how far the
    # (rank + 1)-th lowest lies above it (the lower end: the same, t negated), a continuous
    # function of the shift whose root is the end.
    rank = max(0, math.floor(alpha * total_rows / 2 - 1 + 1e-9))

    def probe(direction: float, offset: float) -> tuple[bool, float]:
        t, observed = statistics_at(estimate + direction * offset)
        rejected = p_of(t, observed) <= alpha
        values = direction * t
        values = values[np.isfinite(values)]
        if not math.isfinite(observed) or rank >= len(values):
            return rejected, math.nan
        margin = float(np.partition(values, rank)[rank]) - direction * observed
        return rejected, margin

    for direction in (-1.0, 1.0) if with_interval and not ends else ():
        end = _end(functools.partial(probe, direction), half_width)
        ends.append(estimate + direction * end)
    interval = (ends[0], ends[1]) if with_interval else (math.nan, math.nan)
    return MeanTest(
        p=p_of(*statistics_at(0.0)), interval=interval, resamples=total_rows, exact=made.exact
    )


def _end(probe: Callable[[float], tuple[bool, float]], half_width: float) -> float:
    """The offset from the estimate, to BISECTION_TOLERANCE of `half_width`, where the test
    starts to reject: an offset it rejects with one it does not within the tolerance below it
    (inf when none is rejected). `probe(offset)` answers (rejected, margin), margin the
    continuous function that changes sign near the end.

    The bracket [inside, outside] always holds an accepted and a rejected offset. Each probe
    goes where the secant through the last two probes crosses zero, at least one tolerance from
    the last probe (so that two probes near the end close the bracket), or to the bracket's
    middle when the secant leaves it or four probes have not halved it: about 7 probes where
    bisection takes 15, and at worst four probes per halving."""
    tolerance = BISECTION_TOLERANCE * half_width
    inside, outside = 0.0, 1.5 * half_width
    history: list[tuple[float, float]] = []
    # widen until an offset is rejected (past every re-assignment's range none is accepted)
    for _ in range(64):
        rejected, margin = probe(outside)
        history.append((outside, margin))
        if rejected:
            break
        inside, outside = outside, 2 * outside
    else:
        return math.inf
    if len(history) == 1:
        history.insert(0, (inside, probe(inside)[1]))
    width, since_halved = outside - inside, 0
    while outside - inside > tolerance:
        (x0, m0), (x1, m1) = history[-2], history[-1]
        middle = 0.5 * (inside + outside)
        guess = middle
        if since_halved < 4 and math.isfinite(m0) and math.isfinite(m1) and m0 != m1:
            guess = x1 - m1 * (x1 - x0) / (m1 - m0)
            if abs(guess - x1) < tolerance:  # one tolerance across, towards the open side
                guess = x1 - tolerance if x1 == outside else x1 + tolerance
            if not inside < guess < outside:
                guess = middle
        rejected, margin = probe(guess)
        history.append((guess, margin))
        if rejected:
            outside = guess
        else:
            inside = guess
        since_halved += 1
        if outside - inside <= 0.5 * width:
            width, since_halved = outside - inside, 0
    return outside
