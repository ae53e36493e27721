"""The power of the primary test (service.analysis.resampling) on normal seeds, which plans a
study (GET /planning/seeds); the F-test's closed forms are in service.analysis.power.

The primary test's power has no closed form, so it is simulated on normal seeds (the F-test's
model too, so the two answers compare; the test's level holds without normality):
- SIMULATIONS datasets of n_a and n_b standard normal values from PLANNING_SEED; with paired
  seeds, seed i draws both sides' i-th value, correlated `correlation`, and the strata carry the
  seeds, so service.analysis.resampling decides the pairing as it does for real runs (5 or fewer
  shared seeds get the unpaired test);
- each dataset's interval of var_a / var_b at confidence 1 - alpha from the test's own crossing
  scales: every re-assignment where SIMULATION_RESAMPLES + 1 enumerate the layout, else
  SIMULATION_RESAMPLES drawn afresh for each ROOTS_CHUNK datasets from a stream of
  PLANNING_SEED, so that the rate averages over draws as the service's test does. One matrix
  shared by all datasets put the plan at the mercy of one draw: 0.803 at ratio 4 on 13 pairs
  correlated 0.8, where fresh draws give 0.767 and the service's test rejected 0.770 [0.757,
  0.783] of 4,000 datasets of seed 2024. The service enumerates up to MAX_ENUMERATED (2^16)
  re-assignments and draws N_RESAMPLES beyond; the planner does not enumerate above
  SIMULATION_RESAMPLES + 1, as 4,000 datasets of 2^13 sign flips took 5.6 s and of 2^16 33 s,
  while on the same datasets the draws' rate was within 0.004 of the enumeration's, below it
  (13 pairs: 0.767 and 0.770; 16 pairs at 0.5: 0.687 and 0.691; 8 + 8 unpaired: 0.165 and
  0.164): fewer re-assignments only make a plan cautious;
- the test is equivariant: multiplying a's values by sqrt(r) multiplies every crossing scale by
  r, so the test of ratio 1 on data whose true ratio is r rejects exactly when 1 / r lies
  outside the interval of the ratio-1 data. One simulation answers every ratio:
  power(r) = P(low > 1 / r) + P(high < 1 / r).
Each (n_a, n_b, pairing, correlation, alpha) is simulated once per process (0.2-1.2 s on a busy
2-core machine, the slowest the mode-aligned deviations of 6-15 unpaired seeds).

A plan reaches `power` only where the simulated rate reaches required_rate(power), power plus 2
Monte-Carlo standard errors, sqrt(power (1 - power) / SIMULATIONS) (0.8126 for 0.8): the search
keeps the first n whose estimate passes its target, so an estimate that errs upwards (by about
0.006 on 4,000 datasets) is the one kept (the 13 pairs above). The same target holds for the
detectable ratio and above MAX_SIMULATED_SEEDS, where the approximation answers, so that the
answers join where one method takes over from the other.

Above MAX_SIMULATED_SEEDS seeds on either side a normal approximation replaces the simulation.
To first order the test is a self-normalised sum. Paired: sign flips of
delta_i = d_a,i - d_b,i reject when |sum delta| > q sqrt(sum delta^2); unpaired: permutations
reject when |mean_a - mean_b| > q sqrt(h G), G the pooled deviations' variance and
h = N / (N - 1) (1/n_a + 1/n_b). q is the re-assignment distribution's quantile, z_{1-alpha/2}
corrected by Cornish-Fisher for its shape (sign flips are platykurtic, excess kurtosis
-2 sum delta^4 / (sum delta^2)^2; a permutation's shape is that of sampling without replacement
from the pool). The statistic's numerator and its own spread move together (a large d_a raises
both), so the power is P(V > 0) for V = numerator - q spread by the delta method over the sample
moments of d (and d^2), whose moments are those of chi-square(1) variables: d = var x chi2_1,
and delta is a quadratic form in two independent normals (its eigenvalues give its cumulants);
centring on the median rather than the true centre is left out (an O(1/n) effect). Leaving out
the spread's randomness or the quantile's correction makes the detectable ratio 3-5% too large
at 40 seeds; with both it is within 2% of the simulation there (tests/service/
test_primary_power.py holds it to 3%). Below about 25 seeds the delta method fails (the d^2
terms dominate), which is why it takes over only above 40.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, special

from service.analysis.power import (
    DEFAULT_ALPHA,
    DEFAULT_POWER,
    MAX_SEEDS_PER_LEVEL,
)
from service.analysis.resampling import (
    MIN_DISTINCT_ASSIGNMENTS,
    MODE_ALIGNED_TEST,
    Stratum,
    _roots,
    assignments,
    distinct_assignments,
    draw_assignments,
    enumerated,
    from_crossings,
    mode_aligned_rows,
    paired_deviations,
    unpaired_test_name,
)

SIMULATIONS = 4000
SIMULATION_RESAMPLES = 999
# Datasets whose crossing scales are found at once, with their own re-assignment draws: the
# temporaries stay in cache (twice as fast as 1,000 datasets at once).
ROOTS_CHUNK = 50
PLANNING_SEED = 1
# The re-assignment draws come from the stream (PLANNING_SEED, REASSIGNMENT_STREAM), apart
# from the datasets' (PLANNING_SEED).
REASSIGNMENT_STREAM = 1
# More seeds than this on either side: the normal approximation (module docstring).
MAX_SIMULATED_SEEDS = 40
MAX_DETECTABLE_RATIO = 1e12
# Up to this many seeds per level the power jumps up and down with n (see
# primary_seeds_needed).
FEW_SEEDS = 8
# Simulated, log(detectable ratio) falls about as 1 / sqrt(n - SHAPE_OFFSET) (4.3 at 6 seeds,
# 2.5 at 10, 1.5 at 20, 0.97 at 40, unpaired at correlation 0): the seed search's jumps.
SHAPE_OFFSET = 5


def required_rate(power: float) -> float:
    """The simulated rejection rate at which a plan reaches `power`: power plus 2 Monte-Carlo
    standard errors of a rate of SIMULATIONS datasets (module docstring)."""
    return min(1.0, power + 2 * math.sqrt(power * (1 - power) / SIMULATIONS))


def check_pairing(paired: bool, correlation: float) -> None:
    if not -1 < correlation < 1:
        raise ValueError(f"correlation must lie in (-1, 1), got {correlation}")
    if correlation and not paired:
        raise ValueError("a correlation between conditions needs paired seeds")


def normal_seeds(
    n_a: int,
    n_b: int,
    *,
    paired: bool,
    correlation: float,
    simulations: int = SIMULATIONS,
    seed: int = PLANNING_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """`simulations` datasets of standard normal values, one per row of each side; with paired
    seeds the first min(n_a, n_b) seeds' values on the two sides have correlation
    `correlation`."""
    check_pairing(paired, correlation)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((simulations, n_a))
    b = rng.standard_normal((simulations, n_b))
    shared = min(n_a, n_b) if paired else 0
    b[:, :shared] = correlation * a[:, :shared] + math.sqrt(1 - correlation**2) * b[:, :shared]
    return a, b


def seed_stratum(a: np.ndarray, b: np.ndarray, *, paired: bool) -> Stratum:
    """One comparison's stratum: with paired seeds, seed i ran in both conditions."""
    if not paired:
        return Stratum(a, b)
    return Stratum(a, b, tuple(range(len(a))), tuple(range(len(b))))


def _deviations(x: np.ndarray, drop_zero: bool) -> np.ndarray:
    """Each row's squared deviations from its median, as service.analysis.resampling takes them (for
    the unpaired test, its structural zero or tie left out: resampling.drop_structural_zero)."""
    d = (x - np.median(x, axis=1, keepdims=True)) ** 2
    if not drop_zero or (d.shape[1] % 2 == 0 and d.shape[1] != 4):
        return d
    keep = np.ones(d.shape, dtype=bool)
    keep[np.arange(len(d)), np.argmin(d, axis=1)] = False
    return d[keep].reshape(len(d), -1)


def _test_deviations(
    a: np.ndarray, b: np.ndarray, paired_test: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Each dataset's deviations as service.analysis.resampling.prepare takes them: paired, from
    each side's own centre (resampling.paired_deviations); unpaired, from one mode-aligned
    centre at MODE_ALIGNED_MIN_SEEDS to MODE_ALIGNED_MAX_SEEDS seeds in the smaller cell, else
    from each side's median with the structural zero left out."""
    if paired_test:
        smaller = min(a.shape[1], b.shape[1])
        return paired_deviations(a, smaller), paired_deviations(b, smaller)
    if unpaired_test_name(min(a.shape[1], b.shape[1])) == MODE_ALIGNED_TEST:
        d_a, d_b = [], []
        for start in range(0, len(a), ROOTS_CHUNK):
            made = mode_aligned_rows(a[start : start + ROOTS_CHUNK], b[start : start + ROOTS_CHUNK])
            d_a.append(made[0])
            d_b.append(made[1])
        return np.concatenate(d_a), np.concatenate(d_b)
    return _deviations(a, True), _deviations(b, True)


@dataclass(frozen=True)
class NullIntervals:
    """The primary test's intervals of var_a / var_b on simulated equal-variance data."""

    paired_test: bool  # the paired sign-flip test ran (else the unpaired permutation test)
    lows: np.ndarray  # sorted
    highs: np.ndarray  # sorted

    def power(self, ratio: float) -> float:
        """The rejection rate at true ratio `ratio`: 1 / ratio outside the null intervals."""
        x = 1 / ratio
        below = len(self.lows) - int(np.searchsorted(self.lows, x, side="right"))
        above = int(np.searchsorted(self.highs, x, side="left"))
        return (below + above) / len(self.lows)

    def detectable_ratio(self, power: float) -> float:
        """The smallest ratio > 1 detected with `power`, that is rejected at rate
        required_rate(power) (1.0 when the test rejects that often at ratio 1; inf when no
        ratio up to MAX_DETECTABLE_RATIO is). The rate rises only where 1 / ratio passes a low
        end, so the answer is one of the 1 / low."""
        rate = required_rate(power)
        if self.power(1.0) >= rate:
            return 1.0
        x = self.lows[::-1]  # descending: ratios 1 / x ascending
        at_or_above = len(x) - np.searchsorted(self.lows, x, side="left")
        above = np.searchsorted(self.highs, x, side="left")
        reached = (
            ((at_or_above + above) / len(x) >= rate) & (x < 1) & (x >= 1 / MAX_DETECTABLE_RATIO)
        )
        return float(1 / x[np.argmax(reached)]) if reached.any() else math.inf


def chunk_assignments(
    layout: tuple[int, ...], datasets: int, seed: int = PLANNING_SEED
) -> Iterator[tuple[slice, np.ndarray]]:
    """Each ROOTS_CHUNK of `datasets` simulated datasets (their rows) with the re-assignments
    it is tested with, none the observed one: all of them where SIMULATION_RESAMPLES + 1
    enumerate the layout, else SIMULATION_RESAMPLES drawn for that chunk from the stream
    (seed, REASSIGNMENT_STREAM)."""
    if enumerated(layout, SIMULATION_RESAMPLES, 0):
        matrix = assignments(layout, SIMULATION_RESAMPLES)[0]
        for start in range(0, datasets, ROOTS_CHUNK):
            yield slice(start, start + ROOTS_CHUNK), matrix
        return
    rng = np.random.default_rng([seed, REASSIGNMENT_STREAM])
    for start in range(0, datasets, ROOTS_CHUNK):
        yield (
            slice(start, start + ROOTS_CHUNK),
            draw_assignments(layout, SIMULATION_RESAMPLES, rng),
        )


@lru_cache(maxsize=1024)
def null_intervals(
    n_a: int, n_b: int, paired: bool, correlation: float, alpha: float
) -> NullIntervals:
    """The primary test's (1 - alpha) intervals on SIMULATIONS normal datasets of equal
    variances: the test's own steps, vectorised over the datasets (a matrix product per
    ROOTS_CHUNK, each with its own re-assignments: chunk_assignments)."""
    a, b = normal_seeds(n_a, n_b, paired=paired, correlation=correlation)
    paired_test = prepare_is_paired(n_a, n_b, paired, correlation)
    d_a, d_b = _test_deviations(a, b, paired_test)
    layout = (n_a,) if paired_test else (0, d_a.shape[1], d_b.shape[1])
    exact = enumerated(layout, SIMULATION_RESAMPLES, 0)
    resamples = distinct_assignments(layout) - 1 if exact else SIMULATION_RESAMPLES
    scale = (d_a.sum(axis=1) + d_b.sum(axis=1)) / (d_a.shape[1] + d_b.shape[1])
    d_a, d_b = d_a / scale[:, None], d_b / scale[:, None]
    total_a, total_b = d_a.sum(axis=1), d_b.sum(axis=1)
    # The interval's ends are order statistics of a dataset's crossing scales: their ranks, as
    # the test takes them, read off crossings 1, 2, ..., m.
    low_rank, high_rank = from_crossings(
        np.arange(1.0, resamples + 1)[:, None], exact, confidence=1 - alpha
    )[0].interval
    if not math.isfinite(high_rank):  # too few re-assignments: no ratio is ever excluded
        return NullIntervals(
            paired_test=paired_test, lows=np.zeros(len(a)), highs=np.full(len(a), math.inf)
        )
    ranks = [int(low_rank) - 1, int(high_rank) - 1]
    ends = np.empty((len(a), 2))
    # einsum, not BLAS: a chunk's products are small, and OpenBLAS's threads made them 10x
    # slower on a busy 2-core machine
    for rows, matrix in chunk_assignments(layout, len(a)):
        if paired_test:  # as service.analysis.resampling: a column per pair, 1 where it swaps
            u = total_a[rows, None] - np.einsum("dn,rn->dr", d_a[rows], matrix)
            v = np.einsum("dn,rn->dr", d_b[rows], matrix)
        else:
            kept = d_a.shape[1]
            u = np.einsum("dn,rn->dr", d_a[rows], matrix[:, :kept])
            v = np.einsum("dn,rn->dr", d_b[rows], matrix[:, kept:])
        crossings = _roots(u, v, total_a[rows, None], total_b[rows, None])
        ends[rows] = np.partition(crossings, ranks, axis=1)[:, ranks]
    lows, highs = np.sort(ends[:, 0]), np.sort(ends[:, 1])
    lows.flags.writeable = highs.flags.writeable = False  # cached and shared
    return NullIntervals(paired_test=paired_test, lows=lows, highs=highs)


def _cornish_fisher(z: float, skewness: float, excess_kurtosis: float) -> float:
    """The upper z-quantile of a distribution with these shape cumulants, to second order."""
    return (
        z
        + (z * z - 1) * skewness / 6
        + (z**3 - 3 * z) * excess_kurtosis / 24
        - (2 * z**3 - 5 * z) * skewness**2 / 36
    )


def _difference_moments(ratio: float, correlation: float) -> tuple[float, float, float, float]:
    """E delta^k, k = 1..4, of delta = X^2 - Y^2 for X, Y normal with variances ratio and 1 and
    correlation `correlation`: a quadratic form in two independent standard normals, so delta
    = l1 chi2_1 + l2 chi2_1 with l the eigenvalues of its matrix (trace ratio - 1, determinant
    -ratio (1 - correlation^2)) and cumulants 2^(k-1) (k-1)! (l1^k + l2^k)."""
    trace, det = ratio - 1, -ratio * (1 - correlation**2)
    root = math.sqrt(trace * trace - 4 * det)
    eigen = ((trace + root) / 2, (trace - root) / 2)
    k1, k2, k3, k4 = (
        2 ** (j - 1) * math.factorial(j - 1) * sum(x**j for x in eigen) for j in range(1, 5)
    )
    return (
        k1,
        k2 + k1**2,
        k3 + 3 * k2 * k1 + k1**3,
        k4 + 4 * k3 * k1 + 3 * k2**2 + 6 * k2 * k1**2 + k1**4,
    )


def _reject_probability(mean: float, gradient: np.ndarray, covariance: np.ndarray) -> float:
    """P(V > 0) for V normal with this mean and the delta method's variance."""
    return float(special.ndtr(mean / math.sqrt(float(gradient @ covariance @ gradient))))


def approximate_primary_power(
    ratio: float,
    n_a: int,
    n_b: int,
    *,
    paired: bool = False,
    correlation: float = 0.0,
    alpha: float = DEFAULT_ALPHA,
) -> float:
    """The primary test's power at var_a / var_b = `ratio` by the normal approximation (module
    docstring); within a few percent of the simulation from MAX_SIMULATED_SEEDS seeds per side.
    Shared seeds of unequal counts get the unpaired test, and the approximation then ignores
    their correlation (which only makes that test conservative)."""
    check_pairing(paired, correlation)
    # from the lower tail: 1 - alpha / 2 rounds to 1 (z infinite, the power NaN) below 1e-16
    r, z = ratio, -float(special.ndtri(alpha / 2))
    power = 0.0
    if prepare_is_paired(n_a, n_b, paired, correlation):
        # Sign flips of delta_i = d_a,i - d_b,i: reject when +-sum(delta) > q sqrt(sum(delta^2))
        # (the flips' spread), q the flips' quantile (symmetric, excess kurtosis
        # -2 sum(delta^4) / sum(delta^2)^2).
        n = n_a
        m1, m2, m3, m4 = _difference_moments(r, correlation)
        covariance = np.array([[m2 - m1**2, m3 - m1 * m2], [m3 - m1 * m2, m4 - m2**2]]) / n
        q = _cornish_fisher(z, 0.0, -2 * m4 / (n * m2**2))
        for sign in (1, -1):  # V = +-mean(delta) - q sqrt(mean(delta^2) / n)
            gradient = np.array([sign, -q / (2 * math.sqrt(n * m2))])
            power += _reject_probability(sign * m1 - q * math.sqrt(m2 / n), gradient, covariance)
        return power
    # A permutation of the pooled deviations (an odd side's structural zero left out): reject
    # when +-(mean_a - mean_b) > q sqrt(h G), G the pooled deviations' variance and q the
    # permutation distribution's quantile (its skewness and kurtosis those of a sample drawn
    # without replacement from the pool).
    k_a, k_b = n_a - n_a % 2, n_b - n_b % 2
    total = k_a + k_b
    h = total / (total - 1) * (1 / k_a + 1 / k_b)
    double_factorial = (1, 1, 3, 15, 105)  # E chi2_1^j
    raw = [(k_a * r**j + k_b) / total * double_factorial[j] for j in range(5)]
    pooled_mean, pooled_variance = raw[1], raw[2] - raw[1] ** 2
    mu3 = raw[3] - 3 * pooled_mean * raw[2] + 2 * pooled_mean**3
    mu4 = raw[4] - 4 * pooled_mean * raw[3] + 6 * pooled_mean**2 * raw[2] - 3 * pooled_mean**4
    share = k_a / total
    spread = total * share * (1 - share)
    skewness = mu3 / pooled_variance**1.5 * (1 - 2 * share) / math.sqrt(spread)
    excess_kurtosis = (mu4 / pooled_variance**2 - 3) * (1 - 6 * share * (1 - share)) / spread

    # (mean d_a, mean d_a^2, mean d_b, mean d_b^2), d = scale chi2_1 on each side
    covariance = np.zeros((4, 4))
    for i, (scale, n) in enumerate(((r, n_a), (1.0, n_b))):
        covariance[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = (
            np.array([[2 * scale**2, 12 * scale**3], [12 * scale**3, 96 * scale**4]]) / n
        )
    for sign in (1, -1):  # V = +-(mean_a - mean_b) - q sqrt(h G)
        q = _cornish_fisher(z, sign * skewness, excess_kurtosis)
        c = q * math.sqrt(h) / (2 * math.sqrt(pooled_variance))
        gradient = np.array(
            [
                sign + 2 * c * pooled_mean * k_a / total,
                -c * k_a / total,
                -sign + 2 * c * pooled_mean * k_b / total,
                -c * k_b / total,
            ]
        )
        power += _reject_probability(
            sign * (r - 1) - q * math.sqrt(h * pooled_variance), gradient, covariance
        )
    return power


def prepare_is_paired(n_a: int, n_b: int, paired: bool, correlation: float = 0.0) -> bool:
    """Whether service.analysis.resampling runs the paired test on n_a and n_b seeds (shared when
    `paired`): the same seeds on both sides, enough of them to sign-flip (its pairing rule;
    the correlation does not decide it)."""
    return paired and n_a == n_b and 2**n_a >= MIN_DISTINCT_ASSIGNMENTS


def primary_power(
    ratio: float,
    n_a: int,
    n_b: int,
    *,
    paired: bool = False,
    correlation: float = 0.0,
    alpha: float = DEFAULT_ALPHA,
) -> float:
    """The primary test's power at var_a / var_b = `ratio` on normal seeds: simulated up to
    MAX_SIMULATED_SEEDS seeds per side, approximated above (0 below 2 seeds: no test). The
    estimate itself: a plan reaches a power where this reaches required_rate of it."""
    check_pairing(paired, correlation)
    if n_a < 2 or n_b < 2:
        return 0.0
    if max(n_a, n_b) > MAX_SIMULATED_SEEDS:
        return approximate_primary_power(
            ratio, n_a, n_b, paired=paired, correlation=correlation, alpha=alpha
        )
    return null_intervals(n_a, n_b, paired, correlation, alpha).power(ratio)


# primary_detectable_ratio at the default alpha and power for uncorrelated seeds, every n_a and
# n_b up to MAX_SIMULATED_SEEDS, paired and unpaired: written by scripts/detectable_ratios.py
# (each entry a simulation of 0.2-1.2 s, which a comparison whose cells reached a new size
# paid for again in every new process), beside this module.
DETECTABLE_TABLE_FILE = "detectable_ratios.json"


def detectable_table_key() -> dict[str, Any]:
    """What the table's entries depend on besides the code: a table written with other
    settings is not used."""
    return {
        "simulations": SIMULATIONS,
        "resamples": SIMULATION_RESAMPLES,
        "planning_seed": PLANNING_SEED,
        "reassignment_stream": REASSIGNMENT_STREAM,
        "max_simulated_seeds": MAX_SIMULATED_SEEDS,
        "alpha": DEFAULT_ALPHA,
        "power": DEFAULT_POWER,
    }


@lru_cache(maxsize=1)
def detectable_table() -> dict[str, Any] | None:
    """The table of DETECTABLE_TABLE_FILE, or None where it is missing or was written with
    other settings (then every entry is simulated, as before the table)."""
    path = Path(__file__).with_name(DETECTABLE_TABLE_FILE)
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return table if table.get("key") == detectable_table_key() else None


def simulated_detectable_ratio(n_a: int, n_b: int, paired: bool) -> float:
    """primary_detectable_ratio at the defaults for uncorrelated seeds, by simulation (what the
    table holds; 2 <= n_a, n_b <= MAX_SIMULATED_SEEDS)."""
    return null_intervals(n_a, n_b, paired, 0.0, DEFAULT_ALPHA).detectable_ratio(DEFAULT_POWER)


def _tabled_detectable_ratio(n_a: int, n_b: int, paired: bool) -> float | None:
    table = detectable_table()
    if table is None:
        return None
    value = table["paired" if paired else "unpaired"][n_a - 2][n_b - 2]
    return math.inf if value is None else float(value)


@lru_cache(maxsize=4096)
def primary_detectable_ratio(
    n_a: int,
    n_b: int,
    *,
    paired: bool = False,
    correlation: float = 0.0,
    alpha: float = DEFAULT_ALPHA,
    power: float = DEFAULT_POWER,
) -> float:
    """The smallest var_a / var_b > 1 that the primary test detects with `power` on normal
    seeds, n_a and n_b per level (shared by the two levels when `paired`, their values
    correlated `correlation`), that is at which primary_power reaches required_rate(power);
    math.inf when none up to MAX_DETECTABLE_RATIO is."""
    check_pairing(paired, correlation)
    if n_a < 2 or n_b < 2:
        return math.inf
    if max(n_a, n_b) <= MAX_SIMULATED_SEEDS:
        if correlation == 0 and alpha == DEFAULT_ALPHA and power == DEFAULT_POWER:
            tabled = _tabled_detectable_ratio(n_a, n_b, paired)
            if tabled is not None:
                return tabled
        return null_intervals(n_a, n_b, paired, correlation, alpha).detectable_ratio(power)
    rate = required_rate(power)

    def target(r: float) -> float:
        return (
            approximate_primary_power(
                r, n_a, n_b, paired=paired, correlation=correlation, alpha=alpha
            )
            - rate
        )

    if target(1.0) >= 0:
        return 1.0
    high = 2.0
    while target(high) < 0:
        high *= 2
        if high > MAX_DETECTABLE_RATIO:
            return math.inf
    return float(optimize.brentq(target, 1.0, high, xtol=1e-10, rtol=1e-10))


def _seeds_for(log_ratio: float, anchors: list[tuple[int, float]]) -> int:
    """Where log(detectable ratio) falls to `log_ratio`, from the last one or two (n, log of the
    detectable ratio) known: it falls about as 1 / sqrt(n - offset), the offset fitted through
    two anchors (SHAPE_OFFSET from one)."""
    n_last, log_last = anchors[-1]
    offset: float = SHAPE_OFFSET
    if log_last <= 0:  # ratio 1 detected already (power at most alpha): no shape to follow
        return n_last
    if len(anchors) > 1 and anchors[-2][1] > 0:
        n_before, log_before = anchors[-2]
        squared = (log_last / log_before) ** 2
        if squared != 1:
            fitted = (n_before - squared * n_last) / (1 - squared)
            offset = fitted if fitted < min(n_last, n_before) else SHAPE_OFFSET
    n = offset + (n_last - offset) * (log_last / log_ratio) ** 2
    return min(max(math.ceil(n), 2), MAX_SIMULATED_SEEDS)


@lru_cache(maxsize=4096)
def primary_seeds_needed(
    ratio: float,
    *,
    paired: bool = False,
    correlation: float = 0.0,
    alpha: float = DEFAULT_ALPHA,
    power: float = DEFAULT_POWER,
) -> int | None:
    """The smallest number of seeds per level (the same for both, shared when `paired`) at
    which the primary test detects `ratio` (or its inverse) with `power` on normal seeds, that
    is at which primary_power reaches required_rate(power); None above MAX_SEEDS_PER_LEVEL.

    Where the approximation needs more than MAX_SIMULATED_SEEDS + 1 seeds it answers alone.
    Else the search jumps by the detectable ratio's shape in n (_seeds_for), anchored at the
    approximation's MAX_SIMULATED_SEEDS + 1 and then at each simulated n, and steps to the
    first n that reaches `power`: two to four simulations, each cached. Power rises
    with n except at a handful of seeds (the pairing rule's step at 6, an odd side's
    structural zero), so below FEW_SEEDS every smaller n is tried too."""
    check_pairing(paired, correlation)
    # a ratio beyond MAX_DETECTABLE_RATIO needs no more seeds than that one (power rises with
    # the ratio); 1e-100 overflowed the approximation's moments
    rho = min(max(ratio, 1 / ratio), MAX_DETECTABLE_RATIO)
    if rho == 1.0:
        return None
    rate = required_rate(power)

    def reaches(n: int) -> bool:
        return primary_power(rho, n, n, paired=paired, correlation=correlation, alpha=alpha) >= rate

    def detectable(n: int) -> float:
        return primary_detectable_ratio(
            n, n, paired=paired, correlation=correlation, alpha=alpha, power=power
        )

    if not reaches(MAX_SEEDS_PER_LEVEL):
        return None
    beyond = MAX_SIMULATED_SEEDS + 1
    if not reaches(beyond):  # the approximation's answer: its power rises with n
        low, high = beyond + 1, MAX_SEEDS_PER_LEVEL
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if reaches(middle) else (middle + 1, high)
        return low
    anchors = [(beyond, math.log(detectable(beyond)))]
    n = _seeds_for(math.log(rho), anchors)
    for _ in range(3):
        simulated = detectable(n)
        if simulated <= 1:  # reached already at ratio 1 (power at most alpha)
            break
        if math.isfinite(simulated):
            anchors.append((n, math.log(simulated)))
        jump = _seeds_for(math.log(rho), anchors) if math.isfinite(simulated) else n + 1
        if jump == n:
            break
        n = jump
    if reaches(n):
        while n > 2 and reaches(n - 1):
            n -= 1
    else:
        while not reaches(n):  # ends by MAX_SIMULATED_SEEDS + 1, which reaches
            n += 1
    if n <= FEW_SEEDS:
        n = next((m for m in range(2, n) if reaches(m)), n)
    return n
