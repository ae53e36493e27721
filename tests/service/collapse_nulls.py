"""Null families of the metric shapes training produces, and the primary variance test's size
on them, through the code /stats runs (service.analysis.resampling, Holm from
service.analysis.multiplicity).

Every family draws both levels from one distribution (the null: equal variances), b's mean
shifted by 3 of the family's units (a mean effect the within-cell test must not see):

- `bimodal F% dD`: a share F of seeds collapses, its value D standard deviations below the good
  seeds' (the same mixture in both levels);
- `beta(50,1)`: an accuracy-like metric piled against its bound; `lognormal1`: lognormal
  sigma 1; `t3`: Student's t with 3 degrees of freedom; `normal`.

Paired rows share seeds: seed s draws both levels' values through a Gaussian copula with
correlation PAIRED_CORRELATION (for the mixtures, whether a seed collapses in each level is
correlated the same way), and the strata carry the seeds, so the test pairs them as it pairs
real runs. `missing` drops 30% of each level's runs at random.

`python -m tests.service.collapse_nulls --reps 4000` prints the offline table that
docs/statistics.md quotes (about 10 minutes on this 2-core machine).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from service.analysis import resampling
from service.analysis.multiplicity import holm
from service.analysis.resampling import Stratum

PAIRED_CORRELATION = 0.5
MEAN_SHIFT = 3.0

Marginal = Callable[[np.ndarray], np.ndarray]  # uniform(0, 1) -> the metric


def _bimodal(share: float, distance: float) -> Marginal:
    def marginal(u: np.ndarray) -> np.ndarray:
        # u decides collapse (below `share`) and, rescaled, the value within its mode
        collapsed = u < share
        within = np.where(collapsed, u / share, (u - share) / (1 - share))
        z = special.ndtri(np.clip(within, 1e-12, 1 - 1e-12))
        return z - distance * collapsed

    return marginal


FAMILIES: dict[str, Marginal] = {
    "normal": stats.norm.ppf,
    "bimodal 20% d8": _bimodal(0.2, 8.0),
    "bimodal 10% d20": _bimodal(0.1, 20.0),
    "bimodal 30% d4": _bimodal(0.3, 4.0),
    "beta(50,1)": stats.beta(50, 1).ppf,
    "lognormal1": stats.lognorm(1.0).ppf,
    "t3": stats.t(3).ppf,
}


@dataclass(frozen=True)
class Row:
    family: str
    seeds: int
    paired: bool
    missing: bool = False

    @property
    def name(self) -> str:
        kind = "paired" if self.paired else "unpaired"
        return f"{self.family}, {self.seeds} seeds, {kind}" + (
            ", 30% missing" if self.missing else ""
        )


def draw_levels(
    row: Row, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """One null comparison's two cells and their seeds."""
    n = row.seeds
    rho = PAIRED_CORRELATION if row.paired else 0.0
    z = rng.normal(size=(2, n))
    z[1] = rho * z[0] + math.sqrt(1 - rho**2) * z[1]
    u = special.ndtr(z)
    marginal = FAMILIES[row.family]
    a, b = marginal(u[0]), marginal(u[1])
    spread = float(np.std(marginal(np.linspace(0.01, 0.99, 99))))
    b = b + MEAN_SHIFT * spread
    seeds_a = seeds_b = tuple(range(n))
    if row.missing:
        keep_a = np.sort(rng.permutation(n)[: n - round(0.3 * n)])
        keep_b = np.sort(rng.permutation(n)[: n - round(0.3 * n)])
        a, b = a[keep_a], b[keep_b]
        seeds_a, seeds_b = tuple(int(s) for s in keep_a), tuple(int(s) for s in keep_b)
    return a, b, seeds_a, seeds_b


def primary_p_values(strata_lists: list[list[Stratum]]) -> np.ndarray:
    """The primary test's p of each comparison (its strata), as /stats computes it; NaN where
    the test has no answer."""
    preps = [resampling.prepare(strata) for strata in strata_lists]
    ready = [p for p in preps if p is not None]
    results = iter(resampling.randomisation_tests(ready))
    return np.array([math.nan if p is None else next(results).p for p in preps])


def null_p_values(row: Row, reps: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    comparisons = []
    for _ in range(reps):
        a, b, seeds_a, seeds_b = draw_levels(row, rng)
        if row.paired:
            comparisons.append([Stratum(a, b, seeds_a, seeds_b)])
        else:
            comparisons.append([Stratum(a, b)])
    return primary_p_values(comparisons)


def holm_family_error(family: str, seeds: int, reps: int, seed: int, alpha: float) -> float:
    """A 2 x 6 grid's family of one factor (its 2 levels compared pooled over the other
    factor's 6 levels and within each: 7 comparisons), unpaired: the share of nulls where
    some Holm-adjusted primary p falls to alpha or below."""
    rng = np.random.default_rng(seed)
    comparisons = []
    row = Row(family, seeds, paired=False)
    for _ in range(reps):
        strata = [Stratum(*draw_levels(row, rng)[:2]) for _ in range(6)]
        comparisons.append(strata)  # pooled over the other factor
        comparisons.extend([s] for s in strata)  # within each of its levels
    p = primary_p_values(comparisons).reshape(reps, 7)
    adjusted = np.array([holm(family_p) for family_p in p])
    return float(np.mean(np.nanmin(adjusted, axis=1) <= alpha))


def size(p: np.ndarray, alpha: float) -> float:
    """Rejections at alpha among the comparisons with an answer (a null p is no rejection)."""
    return float(np.mean(np.nan_to_num(p, nan=1.0) <= alpha))


def uniformity_p(p: np.ndarray) -> float:
    """One-sided Kolmogorov-Smirnov test that the p-values are not stochastically smaller than
    uniform (a conservative test passes; one whose small p-values come too often fails). The
    discrete re-assignment p-values are compared at their own support: P(p <= t) <= t."""
    values = np.nan_to_num(p, nan=1.0)
    return float(stats.kstest(values, "uniform", alternative="greater").pvalue)


ROWS = [
    *(
        Row(family, n, paired)
        for family in FAMILIES
        for n in (5, 6, 8, 10, 12)
        for paired in (False, True)
    ),
    *(Row("bimodal 20% d8", n, paired, missing=True) for n in (8, 12) for paired in (False, True)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--family", choices=sorted(FAMILIES), help="only this family's rows")
    parser.add_argument("--paired", action="store_true", help="only the paired rows")
    args = parser.parse_args()
    rows = [
        row
        for row in ROWS
        if (args.family is None or row.family == args.family) and (row.paired or not args.paired)
    ]
    print("| null | size at 0.05 | size at 0.01 | KS (p-values not too small) |")
    print("|---|---|---|---|")
    for row in rows:
        p = null_p_values(row, args.reps, args.seed)
        print(
            f"| {row.name} | {size(p, 0.05):.3f} | {size(p, 0.01):.3f} | {uniformity_p(p):.3f} |",
            flush=True,
        )
    for n in (6, 8) if args.family is None and not args.paired else ():
        fwer = holm_family_error("bimodal 20% d8", n, args.reps, args.seed, 0.05)
        print(f"| Holm family of 7, bimodal 20% d8, {n} seeds | {fwer:.3f} | | |", flush=True)


if __name__ == "__main__":
    main()


def power_row(
    family: str, seeds: int, ratio: float, reps: int, seed: int, *, paired: bool = False
) -> dict[str, float]:
    """Rejections at 0.05 when a's values are b's family scaled by sqrt(ratio): the primary test
    as it stands, the per-cell median form it replaced for unpaired cells of up to
    MODE_ALIGNED_MAX_SEEDS seeds, and Brown-Forsythe (scipy.stats.levene, centre median)."""
    rng = np.random.default_rng(seed)
    row = Row(family, seeds, paired)
    comparisons, forsythe = [], []
    for _ in range(reps):
        a, b, seeds_a, seeds_b = draw_levels(row, rng)
        a = math.sqrt(ratio) * a
        strata = [Stratum(a, b, seeds_a, seeds_b) if paired else Stratum(a, b)]
        comparisons.append(strata)
        forsythe.append(stats.levene(a, b, center="median").pvalue)
    now = primary_p_values(comparisons)
    kept = resampling.MODE_ALIGNED_MAX_SEEDS
    resampling.MODE_ALIGNED_MAX_SEEDS = 0  # every cell on its own median, as before
    try:
        before = primary_p_values(comparisons) if not paired else now
    finally:
        resampling.MODE_ALIGNED_MAX_SEEDS = kept
    return {
        "primary": size(now, 0.05),
        "median form": size(before, 0.05),
        "Brown-Forsythe": size(np.asarray(forsythe), 0.05),
    }
