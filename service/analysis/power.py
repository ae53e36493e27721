"""How sure, and how many seeds: the exact F interval of a variance ratio and the power of the
two-sided F-test, from scipy's F distribution (its special functions: a frozen scipy.stats.f
costs about a millisecond to build, and /stats asks for hundreds). The power of the primary
test (service.analysis.resampling), which plans a study (GET /planning/seeds), is in
service.analysis.primary_power.

Under normality the sample ratio R = s_a^2 / s_b^2 of n_a and n_b seeds is rho * F with
F ~ F(n_a - 1, n_b - 1) and rho = sigma_a^2 / sigma_b^2. Hence
- the (1 - alpha) interval of rho: [R / f_{1-alpha/2}, R / f_{alpha/2}], finite whenever both
  sample variances are positive (the bootstrap's often is not at 3-4 seeds);
- the power of the two-sided level-alpha F-test against rho:
  P(rho F > f_{1-alpha/2}) + P(rho F < f_{alpha/2})
  = sf(f_{1-alpha/2} / rho) + cdf(f_{alpha/2} / rho).
"""

from __future__ import annotations

import math
from functools import lru_cache

from scipy import optimize, special

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
# The planning answer's bound: more seeds per level than this is reported as "more than".
MAX_SEEDS_PER_LEVEL = 100_000


def f_ratio_interval(
    ratio: float, n_a: int, n_b: int, confidence: float = 0.95
) -> tuple[float, float]:
    """The exact interval of sigma_a^2 / sigma_b^2 from the sample ratio (normal samples)."""
    tail = (1 - confidence) / 2
    return (
        ratio / float(special.fdtri(n_a - 1, n_b - 1, 1 - tail)),
        ratio / float(special.fdtri(n_a - 1, n_b - 1, tail)),
    )


def f_test_power(ratio: float, n_a: int, n_b: int, alpha: float = DEFAULT_ALPHA) -> float:
    """Power of the two-sided level-alpha F-test of equal variances when the true ratio
    sigma_a^2 / sigma_b^2 is `ratio`, with n_a and n_b seeds."""
    d_a, d_b = n_a - 1, n_b - 1
    upper, lower = special.fdtri(d_a, d_b, 1 - alpha / 2), special.fdtri(d_a, d_b, alpha / 2)
    return float(special.fdtrc(d_a, d_b, upper / ratio) + special.fdtr(d_a, d_b, lower / ratio))


@lru_cache(maxsize=4096)  # one experiment's comparisons share a few (n_a, n_b) pairs
def detectable_ratio(
    n_a: int, n_b: int, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER
) -> float:
    """The smallest ratio sigma_a^2 / sigma_b^2 > 1 that the test detects with `power`."""
    if n_a < 2 or n_b < 2:
        return math.inf
    target = lambda rho: f_test_power(rho, n_a, n_b, alpha) - power  # noqa: E731
    if target(1.0) >= 0:  # power <= alpha: equal variances are "detected" that often already
        return 1.0
    high = 2.0
    while target(high) < 0:
        high *= 2
        if high > 1e12:
            return math.inf
    return float(optimize.brentq(target, 1.0, high, xtol=1e-10, rtol=1e-10))


def seeds_needed(
    ratio: float, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER
) -> int | None:
    """The smallest number of seeds per level (the same for both) at which the two-sided
    F-test detects `ratio` (or its inverse: the test is symmetric then) with `power`; None
    above MAX_SEEDS_PER_LEVEL (a ratio this close to 1 is not worth a seed study)."""
    rho = max(ratio, 1 / ratio)
    if rho == 1.0:
        return None
    if f_test_power(rho, MAX_SEEDS_PER_LEVEL, MAX_SEEDS_PER_LEVEL, alpha) < power:
        return None
    low, high = 2, 2
    while f_test_power(rho, high, high, alpha) < power:
        low, high = high, high * 2
    while low < high:  # power grows with n: the first n that reaches it
        middle = (low + high) // 2
        if f_test_power(rho, middle, middle, alpha) >= power:
            high = middle
        else:
            low = middle + 1
    return low
