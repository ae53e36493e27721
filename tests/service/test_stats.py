"""service.stats against independent scipy computations and the grid structure of docs/api.md."""

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
    assert within.within_cell_var_ratio is None  # only pooled comparisons carry it


def test_pooled_comparisons_also_give_the_within_cell_pooled_variance() -> None:
    grid = {"mode": ["clamp", "subtract"], "stability": ["detach", "direct"]}
    rng = np.random.default_rng(2)
    runs, cells = [], {}
    for mode in grid["mode"]:
        for stability, shift in zip(grid["stability"], (0.0, 5.0), strict=True):
            values = [float(v) for v in rng.normal(loc=shift, size=7)]
            cells[(mode, stability)] = values
            cond = {"mode": mode, "stability": stability}
            runs += [(cond, f"mode={mode},stability={stability}", v) for v in values]
    pooled = next(c for c in experiment_stats(metric="m", grid=grid, runs=runs).comparisons
                  if c.factor == "mode" and c.within is None)

    def within_cells(mode: str) -> float:  # sum (n_k - 1) s_k^2 / sum (n_k - 1), by hand
        parts = [cells[(mode, s)] for s in grid["stability"]]
        return sum(6 * np.var(p, ddof=1) for p in parts) / 12

    assert pooled.within_cell_var_a == pytest.approx(within_cells("clamp"), rel=1e-12)
    assert pooled.within_cell_var_b == pytest.approx(within_cells("subtract"), rel=1e-12)
    assert pooled.within_cell_var_ratio == pytest.approx(
        within_cells("clamp") / within_cells("subtract"), rel=1e-12)
    # the plain variance of the 14 runs also counts the stability shift: much larger
    assert pooled.var_a > 3 * pooled.within_cell_var_a


def test_boolean_and_integer_levels_are_not_confused() -> None:
    grid = {"flag": [False, 0]}
    runs = [({"flag": False}, "flag=false", 1.0), ({"flag": False}, "flag=false", 2.0),
            ({"flag": 0}, "flag=0", 5.0), ({"flag": 0}, "flag=0", 9.0)]
    (comparison,) = experiment_stats(metric="m", grid=grid, runs=runs).comparisons
    assert (comparison.n_a, comparison.n_b) == (2, 2)
    assert comparison.var_ratio == pytest.approx(0.5 / 8.0)
