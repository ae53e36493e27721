"""Random sources in a spec, and where the seed variance comes from (issue 14, item 5).

A run's seed drives named random sources (docs/architecture.md "Random sources"): `init`, `data`,
`augment`, and `evaluate` (evaluation only). A spec can

- pin sources (`seed_sources`, say {"data": 0}): every run takes those sources from the given
  seed, whatever its own seed, and the others from its seed;
- ask for a decomposition (`decompose_sources`): every condition runs once per level of the
  reserved grid factor `varying_source`, and in each level only some sources follow the run's
  seed while the rest are pinned to the experiment's first seed:

    init, data, augment   only that source varies;
    all                   every source varies (the experiment as it runs without decomposing);
    none                  every source is pinned: all seeds run one computation, so its variance
                          is hardware nondeterminism (exactly 0 on a deterministic CPU).

  `evaluate` is pinned in every level but `all`: it draws only the noise of measuring a trained
  model (augmented evaluation views), not a source of what is trained, so the source levels
  measure their training source alone and the evaluation noise shows up only in `all`, inside
  the gap between the sum of the source variances and the all-varying variance.

The factor reaches the worker as source seeds (source -> seed, checked on the worker side),
never as a trainer config field: it is stripped from the condition before the trainer's config
is built. Its levels are ordinary grid levels to the statistics, so per-condition summaries and
the pairwise comparisons (`varying_source=init` vs `all`, say) work on it unchanged; this module
adds, per condition of the other factors, each level's variance with its chi-square interval
and the sum of the three source variances against the all-varying one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import stats

from api_schemas import (
    RANDOM_SOURCES,
    SOURCE_FACTOR,
    SOURCE_LEVELS,
    ExperimentSpec,
    SourceDecomposition,
    SourceVariance,
)
from service.analysis.stats import RunValues
from service.specs import first_seed

# Which sources follow the run's seed in each level of the decomposition factor.
VARYING: dict[str, frozenset[str]] = {
    "init": frozenset({"init"}),
    "data": frozenset({"data"}),
    "augment": frozenset({"augment"}),
    "all": frozenset(RANDOM_SOURCES),
    "none": frozenset(),
}
# The levels whose variances add up to (about) the all-varying one.
TRAINING_SOURCES = ("init", "data", "augment")
assert set(VARYING) == set(SOURCE_LEVELS)


@dataclass(frozen=True)
class SourcePlan:
    """How one experiment's runs seed their random sources: the spec's pinned sources, and the
    seed the pinned sources of a decomposition take (None: no decomposition)."""

    pinned: dict[str, int] = field(default_factory=dict)
    decomposition_seed: int | None = None

    @classmethod
    def of(cls, spec: ExperimentSpec) -> SourcePlan:
        """The plan of an experiment's spec."""
        decomposition_seed = first_seed(spec.seeds) if spec.decompose_sources else None
        pinned: dict[str, int] = {source: seed for source, seed in spec.seed_sources.items()}
        return cls(pinned=pinned, decomposition_seed=decomposition_seed)

    def source_seeds(self, condition: Mapping[str, Any]) -> dict[str, int]:
        """The sources one run of `condition` takes from another seed than its own."""
        if self.decomposition_seed is None or SOURCE_FACTOR not in condition:
            return dict(self.pinned)
        varying = VARYING[condition[SOURCE_FACTOR]]
        return {s: self.decomposition_seed for s in RANDOM_SOURCES if s not in varying}


@lru_cache(maxsize=1024)  # an experiment's cells share a few n
def _chi2_quantiles(dof: int, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    dist = stats.chi2(dof)
    return float(dist.ppf(1 - tail)), float(dist.ppf(tail))


def variance_interval(var: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The interval of a normal variance from the sample variance of n values:
    [(n - 1) s^2 / chi2_{1-a/2}, (n - 1) s^2 / chi2_{a/2}] with n - 1 degrees of freedom."""
    upper_q, lower_q = _chi2_quantiles(n - 1, confidence)
    return (n - 1) * var / upper_q, (n - 1) * var / lower_q


def sample_variance(values: Sequence[float]) -> float:
    """The sample variance (ddof = 1) of at least two values; exactly 0 for identical values,
    where a floating-point mean can leave about 1e-34 (three 0.1s average to 0.10000000000000002),
    and the `none` level's zero is the point of the measurement."""
    x = np.asarray(values, dtype=float)
    return 0.0 if np.ptp(x) == 0 else float(x.var(ddof=1))


def source_variance(level: str, values: Sequence[float]) -> SourceVariance:
    n = len(values)
    if n < 2:
        return SourceVariance(source=level, n=n, var=None, var_ci95=None)
    var = sample_variance(values)
    low, high = variance_interval(var, n)
    return SourceVariance(
        source=level, n=n, var=_number(var), var_ci95=[_number(low), _number(high)]
    )


def _number(value: float | None) -> float | None:
    """A finite float, or None (JSON has no Infinity or NaN)."""
    return value if value is not None and math.isfinite(value) else None


def source_decomposition(
    grid: dict[str, list[Any]], runs: Sequence[tuple[dict[str, Any], str, float]]
) -> list[SourceDecomposition]:
    """Per condition of the factors other than `varying_source` (in grid order), each level's
    variance with its interval, and the sum of the source variances against `all`'s."""
    values = RunValues(grid, runs)
    others = [f for f in grid if f != SOURCE_FACTOR]
    out = []
    for combo in itertools.product(*(grid[f] for f in others)):
        within = dict(zip(others, combo, strict=True))
        levels = [
            source_variance(level, values.values(SOURCE_FACTOR, level, within))
            for level in SOURCE_LEVELS
        ]
        var = {v.source: v.var for v in levels}
        parts = [var[s] for s in TRAINING_SOURCES]
        total = None if None in parts else math.fsum(p for p in parts if p is not None)
        everything = var["all"]
        gap = ratio = None
        if total is not None and everything is not None:
            gap = _number(total - everything)
            ratio = _number(total / everything) if everything > 0 else None
        out.append(
            SourceDecomposition(
                within=within,
                sources=levels,
                sum_var=_number(total),
                all_var=everything,
                sum_minus_all=gap,
                sum_over_all=ratio,
            )
        )
    return out
