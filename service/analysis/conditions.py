"""Per-condition summaries (service.analysis.stats): n, mean, variance, the mean's 95% interval
(Student's t, or for a bounded metric the t interval on the logit scale), the binomial
test-set error and the warnings on them; and a run's final value of a metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from api_schemas import ConditionStats
from service.analysis.variance import MIN_SEEDS_MEAN_INTERVAL, finite
from trainers.base import binomial_noise_floor

# The test-set error is worth a note once it is this share of the seed variance.
NOISE_FLOOR_WARNING_SHARE = 0.5


def metric_value(metrics: dict[str, Any], name: str) -> float | None:
    """A run's final value of metric `name`, or None when it has none that is a number (JSON
    true and false are not)."""
    value = metrics.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def condition_stats(
    condition: dict[str, Any],
    key: str,
    values: Sequence[float],
    *,
    bounds: tuple[float, float] | None = None,
    test_set_sizes: Sequence[int | None] | None = None,
) -> ConditionStats:
    """A condition's summary; `bounds` makes its mean interval respect them, `test_set_sizes`
    (one per value, None where a run declares none) gives its binomial noise floor."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return ConditionStats(
            condition=condition,
            condition_key=key,
            n=0,
            mean=None,
            std=None,
            var=None,
            min=None,
            median=None,
            max=None,
            ci95=None,
            values=[],
        )
    mean = float(x.mean())
    if n >= 2:
        var = float(x.var(ddof=1))
        std = math.sqrt(var)
        sem = std / math.sqrt(n)
        if sem == 0:
            ci: list[float | None] | None = [mean, mean]
        elif bounds is not None:
            ci = bounded_mean_interval(mean, sem, n, bounds)
        else:
            lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=sem)
            ci = [finite(lo), finite(hi)]
    else:
        var = std = None  # type: ignore[assignment]
        ci = None
    floor = share = None
    if test_set_sizes is not None and all(s is not None and s > 0 for s in test_set_sizes):
        floor = finite(np.mean(binomial_noise_floor(x, np.asarray(test_set_sizes, float))))
        share = finite(floor / var) if floor is not None and var else None
    return ConditionStats(
        condition=condition,
        condition_key=key,
        n=n,
        mean=mean,
        std=finite(std),
        var=finite(var),
        min=float(x.min()),
        median=float(np.median(x)),
        max=float(x.max()),
        ci95=ci,
        values=[float(v) for v in x],
        ci95_method=None
        if ci is None
        else ("t" if bounds is None else f"logit-t within [{bounds[0]:g}, {bounds[1]:g}]"),
        noise_floor_var=floor,
        noise_floor_share=share,
        warnings=_condition_warnings(n, share),
    )


def bounded_mean_interval(
    mean: float, sem: float, n: int, bounds: tuple[float, float]
) -> list[float | None]:
    """The 95% interval of a bounded metric's mean: Student's t on the logit scale of the mean
    rescaled to (0, 1), with the delta method's standard error sem / (m (1 - m)), mapped back;
    strictly inside the bounds. A mean outside them (a metric that broke its declared bounds)
    gets the t interval clipped to them."""
    low, high = bounds
    width = high - low
    m = (mean - low) / width
    t = float(stats.t.ppf(0.975, n - 1))
    if not 0 < m < 1:
        return [max(low, min(high, mean - t * sem)), max(low, min(high, mean + t * sem))]
    centre = math.log(m / (1 - m))
    half = t * (sem / width) / (m * (1 - m))
    return [low + width * _expit(centre - half), low + width * _expit(centre + half)]


def _expit(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def _condition_warnings(n: int, noise_share: float | None) -> list[str]:
    out = []
    if n == 1:
        out.append("one seed: no variance and no ci95 (they need at least 2 seeds)")
    elif 2 <= n < MIN_SEEDS_MEAN_INTERVAL:
        t = float(stats.t.ppf(0.975, n - 1))
        out.append(
            f"ci95 from {n} seeds: Student's t with {n - 1} degree of freedom puts each "
            f"end {t:.3g} standard errors from the mean; it needs "
            f"{MIN_SEEDS_MEAN_INTERVAL} or more seeds to say much"
        )
    if noise_share is not None and noise_share >= NOISE_FLOOR_WARNING_SHARE:
        out.append(
            f"p(1 - p)/n_test is {noise_share:.0%} of the seed variance. It is the "
            "sampling error of each run's accuracy as an estimate of that run's accuracy "
            "on the whole test distribution; every seed here is scored on the same test "
            "set, so it is not a floor under the seed-to-seed variance and does not say "
            "that the spread is measurement noise"
        )
    return out
