"""service.stats against independent scipy computations and the grid structure of DESIGN.md."""

from __future__ import annotations

import numpy as np
import pytest

from service.stats import compare, condition_stats, experiment_stats
from tests.scipy_reference import assert_matches, reference_comparison, reference_condition


def test_comparison_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    a = list(rng.normal(0, 2.0, size=7))
    b = list(rng.normal(0.5, 1.0, size=6))
    assert_matches(compare(a, b), reference_comparison(a, b))


def test_variance_ratio_of_a_known_pair() -> None:
    got = compare([1.0, 3.0], [0.0, 1.0, 2.0])  # variances 2 and 1
    assert got["var_ratio"] == pytest.approx(2.0)
    assert got["mean_diff"] == pytest.approx(1.0)


def test_condition_summary_matches_scipy() -> None:
    values = [0.91, 0.88, 0.93, 0.90, 0.87]
    got = condition_stats({"a": 1}, "a=1", values).model_dump()
    assert_matches(got, reference_condition(values))
    assert got["values"] == values


def test_small_or_constant_samples_give_nulls_not_errors() -> None:
    one = condition_stats({}, "", [0.5])
    assert one.n == 1 and one.std is None and one.ci95 is None and one.mean == 0.5
    single = compare([1.0], [1.0, 2.0])
    assert single["var_ratio"] is None and single["f_test_p"] is None
    constant = compare([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert constant["var_a"] == 0.0 and constant["var_ratio"] is None
    assert constant["permutation_p"] is None and constant["var_ratio_ci95"] is None


def test_pooled_and_within_comparisons_follow_the_grid() -> None:
    grid = {"mode": ["clamp", "subtract"], "stability": ["detach", "direct"]}
    rng = np.random.default_rng(1)
    runs = []
    for mode in grid["mode"]:
        for stability in grid["stability"]:
            cond = {"mode": mode, "stability": stability}
            key = f"mode={mode},stability={stability}"
            runs += [(cond, key, float(v)) for v in rng.normal(size=4)]
    s = experiment_stats(metric="m", grid=grid, runs=runs)
    assert len(s.conditions) == 4
    # per factor: one pair of levels, pooled + one within each level of the other factor
    assert len(s.comparisons) == 2 * (1 + 2)
    pooled = next(c for c in s.comparisons if c.factor == "mode" and c.within is None)
    assert (pooled.n_a, pooled.n_b) == (8, 8)
    a = [v for c, _, v in runs if c["mode"] == "clamp"]
    b = [v for c, _, v in runs if c["mode"] == "subtract"]
    assert_matches(pooled.model_dump(), reference_comparison(a, b))
    within = next(c for c in s.comparisons
                  if c.factor == "mode" and c.within == {"stability": "direct"})
    a = [v for c, _, v in runs if c == {"mode": "clamp", "stability": "direct"}]
    b = [v for c, _, v in runs if c == {"mode": "subtract", "stability": "direct"}]
    assert (within.n_a, within.n_b) == (4, 4)
    assert_matches(within.model_dump(), reference_comparison(a, b))


def test_boolean_and_integer_levels_are_not_confused() -> None:
    grid = {"flag": [False, 0]}
    runs = [({"flag": False}, "flag=false", 1.0), ({"flag": False}, "flag=false", 2.0),
            ({"flag": 0}, "flag=0", 5.0), ({"flag": 0}, "flag=0", 9.0)]
    (comparison,) = experiment_stats(metric="m", grid=grid, runs=runs).comparisons
    assert (comparison.n_a, comparison.n_b) == (2, 2)
    assert comparison.var_ratio == pytest.approx(0.5 / 8.0)
