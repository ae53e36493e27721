"""The unpaired mean test (service.analysis.mean_test) against scipy, its size by a seeded
simulation where Welch's t from Student's t loses its level (6 seeds against 20 on a bimodal
and a lognormal metric), its interval against the test it inverts, and mean_diff beside its
interval when seeds pair."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from service.analysis.mean_test import BISECTION_TOLERANCE, _end, mean_test
from service.analysis.stats import compare
from tests.scipy_reference import reference_mean_p

REPS = 600


def _bimodal(rng: np.random.Generator, n: int) -> np.ndarray:
    """20% of seeds collapse: a metric near 0.1 among good ones near 0.9."""
    return np.where(rng.random(n) < 0.2, rng.normal(0.1, 0.02, n), rng.normal(0.9, 0.02, n))


def _lognormal(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.lognormal(0.0, 1.0, n)


@pytest.mark.parametrize("draw", [_bimodal, _lognormal], ids=["bimodal", "lognormal"])
def test_six_seeds_against_twenty_keep_the_level_where_welch_does_not(draw) -> None:
    rng = np.random.default_rng(620)
    permutation, welch = [], []
    for _ in range(REPS):
        a, b = draw(rng, 6), draw(rng, 20)
        result = mean_test([(a, b)], with_interval=False)
        assert result is not None
        permutation.append(result.p)
        welch.append(stats.ttest_ind(a, b, equal_var=False).pvalue)
    size, welch_size = np.mean(np.array(permutation) <= 0.05), np.mean(np.array(welch) <= 0.05)
    print(f"\nsize at 0.05, 6 vs 20 seeds, {draw.__name__}: {size:.3f} (Welch {welch_size:.3f})")
    # Monte Carlo error of a rate near 0.05 over 600 nulls: 0.009
    assert size <= 0.05 + 0.02, size
    assert welch_size > size + 0.02, (welch_size, size)


def test_one_stratum_matches_scipys_exact_permutation_test() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 1.0, 6), rng.normal(0.0, 3.0, 5)
    result = mean_test([(a, b)])
    assert result is not None and result.exact and result.resamples == 462
    assert result.p == pytest.approx(reference_mean_p([(list(a), list(b))]), rel=1e-12)
    # two strata whose means differ: runs move only within their own
    c, d = rng.normal(10.0, 1.0, 4), rng.normal(10.0, 1.0, 3)
    two = mean_test([(a, b), (c, d)])
    assert two is not None and two.resamples == 462 * 35
    assert two.p == pytest.approx(reference_mean_p([(list(a), list(b)), (list(c), list(d))]))


def test_the_interval_holds_the_shifts_the_test_does_not_reject() -> None:
    rng = np.random.default_rng(8)
    a, b = rng.normal(2.0, 1.0, 7), rng.lognormal(0.0, 1.0, 9)
    result = mean_test([(a, b)])
    assert result is not None
    low, high = result.interval
    assert low < a.mean() - b.mean() < high
    for end, step in ((low, -1), (high, 1)):
        # an end is a shift the test rejects at 0.05, found to BISECTION_TOLERANCE of Welch's
        # half-width (about half the interval): a little inside it, the test does not reject
        inside_by = 1e-3 * (high - low)
        outside = mean_test([(a, b + end)], with_interval=False)
        inside = mean_test([(a, b + end - step * inside_by)], with_interval=False)
        assert outside is not None and inside is not None
        assert outside.p <= 0.05 < inside.p, (end, outside.p, inside.p)


@pytest.mark.parametrize("shape", ["smooth", "kinked", "no margin"])
def test_the_end_search_brackets_the_end_within_its_tolerance(shape: str) -> None:
    """_end against a known end: a curved margin (the usual case: a few probes), one with
    plateaus and a jump (the secant misled), and none at all (bisection alone)."""
    half_width, root = 2.0, 1.234567
    tolerance = BISECTION_TOLERANCE * half_width
    probes: list[float] = []

    def probe(offset: float) -> tuple[bool, float]:
        probes.append(offset)
        if shape == "smooth":
            margin = (offset - root) * (1 + 0.4 * offset)
        elif shape == "kinked":
            margin = np.floor((offset - root) * 40) / 40 + (5.0 if offset > 2 * root else 0.0)
        else:
            margin = math.nan
        return offset >= root, margin

    end = _end(probe, half_width)
    assert root <= end <= root + tolerance
    assert any(root - tolerance <= x < root for x in probes)  # the accepted side of the bracket
    if shape == "smooth":
        assert len(probes) <= 8, probes
    else:  # never far beyond bisection's count: log2(1.5 * half_width / tolerance) + 2
        assert len(probes) <= 4 * (math.log2(1.5 / BISECTION_TOLERANCE) + 2), len(probes)


def test_an_end_that_nothing_rejects_is_infinite() -> None:
    assert _end(lambda offset: (False, -1.0), 1.0) == math.inf


def test_a_paired_mean_diff_is_the_estimate_its_interval_is_centred_on() -> None:
    """Shared seeds and unequal counts: 6 seeds ran in a, 20 in b (seeds 0-5 in both). The
    paired t uses the 6 shared seeds; mean_diff is their mean difference, not the difference
    of all 6 and all 20 runs, which could fall outside the paired interval."""
    rng = np.random.default_rng(36)
    shared = rng.normal(size=20)
    a = shared[:6] + 0.01 * rng.normal(size=6) + 1.0
    b = shared + 0.01 * rng.normal(size=20)
    got = compare(list(a), list(b), list(range(6)), list(range(20)))
    assert got["pairing"] == "paired" and got["mean_test"] == "paired t"
    assert got["mean_diff"] == pytest.approx(float(np.mean(a - b[:6])), rel=1e-12)
    low, high = got["mean_diff_ci95"]
    assert low <= got["mean_diff"] <= high
    all_runs = float(a.mean() - b.mean())
    assert not low <= all_runs <= high  # the old mean_diff: outside its own interval
