"""Holm-adjusted p-values (service.analysis.multiplicity) against statsmodels and against Holm by
hand,
over whole families whatever page is served."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats import multitest

from api_schemas import Stats
from service.analysis.stats import MAX_ANALYSED_COMPARISONS, experiment_stats

GRID = {"mode": ["clamp", "subtract", "none", "soft"], "depth": [2, 4]}
ADJUSTED = ("primary_p", "f_test_p", "brown_forsythe_p", "welch_p", "mean_p")


def grid_runs(seeds: int = 6) -> list[tuple[dict, str, float]]:
    """Normal seeds whose scale and mean change with the levels, so that some p-values are
    small and Holm's step-down order matters."""
    rng = np.random.default_rng(7)
    scale = {"clamp": 4.0, "subtract": 1.0, "none": 1.2, "soft": 0.3}
    runs = []
    for mode in GRID["mode"]:
        for depth in GRID["depth"]:
            condition = {"mode": mode, "depth": depth}
            key = f"depth={depth},mode={mode}"
            runs += [
                (condition, key, float(v))
                for v in rng.normal(depth * 2.0, scale[mode] * (1 + depth / 4), size=seeds)
            ]
    return runs


def multipletests(p: list[float], method: str) -> tuple:
    """statsmodels' Holm, the reference, without the full garbage collection it runs on every
    call (0.3-1 s each in a process that holds torch and Ray; this file makes about 30)."""
    collect = gc.collect
    gc.collect = lambda *args: 0
    try:
        return multitest.multipletests(p, method=method)
    finally:
        gc.collect = collect


@pytest.fixture(scope="module")
def whole() -> Stats:
    """Every comparison of the grid in one page (computed once: resampling tests are slow)."""
    return experiment_stats(metric="m", grid=GRID, runs=grid_runs())


def holm_by_hand(p: list[float]) -> list[float]:
    """Sort the p-values, multiply the i-th smallest (from 0) by m - i, take the running
    maximum, clip at 1, and put them back in their places."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def test_holm_per_factor_and_across_all_equals_statsmodels_and_the_hand_computation(
    whole: Stats,
) -> None:
    comparisons = [c.model_dump() for c in whole.comparisons]
    for test in ADJUSTED:
        raw_all = [c[test] for c in comparisons]
        assert None not in raw_all and min(raw_all) < 0.01  # a family where Holm acts
        want_all = multipletests(raw_all, method="holm")[1]
        assert [c[f"{test}_holm_all"] for c in comparisons] == pytest.approx(want_all, rel=1e-9)
        assert want_all == pytest.approx(holm_by_hand(raw_all), rel=1e-12)
        for factor in GRID:
            members = [c for c in comparisons if c["factor"] == factor]
            raw = [c[test] for c in members]
            want = holm_by_hand(raw)
            assert [c[f"{test}_holm_factor"] for c in members] == pytest.approx(want, rel=1e-9)
            assert want == pytest.approx(multipletests(raw, method="holm")[1], rel=1e-12)
            # an adjusted p is never below its raw p, and the factor family is the smaller one
            assert all(c[f"{test}_holm_factor"] >= c[test] * (1 - 1e-12) for c in members)
            assert all(
                c[f"{test}_holm_all"] >= c[f"{test}_holm_factor"] * (1 - 1e-12) for c in members
            )
    families = {f.factor: f for f in whole.multiplicity}
    assert families["mode"].comparisons == 6 * 3 and families["depth"].comparisons == 1 * 5
    assert families[None].comparisons == 23 and families[None].tested["f_test_p"] == 23


def test_a_page_is_adjusted_over_the_whole_family_not_over_the_page(whole: Stats) -> None:
    runs = grid_runs()
    first = experiment_stats(metric="m", grid=GRID, runs=runs, offset=0, limit=7)
    second = experiment_stats(metric="m", grid=GRID, runs=runs, offset=7, limit=10)
    assert first.next_offset == 7 and len(second.comparisons) == 10
    paged = first.comparisons + second.comparisons
    assert paged == whole.comparisons[:17]
    # the second page's Holm values equal statsmodels over the whole family, which they would
    # not over the page's ten comparisons alone
    raw_mode = [c.f_test_p for c in whole.comparisons if c.factor == "mode"]
    whole_family = multipletests(raw_mode, method="holm")[1]
    page_only = multipletests([c.f_test_p for c in second.comparisons], method="holm")[1]
    got = [c.f_test_p_holm_factor for c in second.comparisons]
    assert got == pytest.approx(whole_family[7:17], rel=1e-9)
    assert got != pytest.approx(page_only, rel=1e-6)
    # asking for one factor pages the same family
    by_factor = experiment_stats(
        metric="m", grid=GRID, runs=runs, factor="depth", offset=2, limit=2
    )
    depth = [c for c in whole.comparisons if c.factor == "depth"]
    assert by_factor.comparisons == depth[2:4]


def test_null_p_values_leave_the_family() -> None:
    runs = grid_runs(seeds=3)
    runs = [r for r in runs if not (r[0]["mode"] == "none" and r[0]["depth"] == 2)][:-1]
    runs.append(({"mode": "none", "depth": 2}, "depth=2,mode=none", 1.0))  # one seed
    stats = experiment_stats(metric="m", grid=GRID, runs=runs)
    mode = [c for c in stats.comparisons if c.factor == "mode"]
    defined = [c.f_test_p for c in mode if c.f_test_p is not None]
    assert len(defined) < len(mode)
    want = iter(holm_by_hand(defined))
    for c in mode:
        if c.f_test_p is None:
            assert c.f_test_p_holm_factor is None and c.f_test_p_holm_all is None
        else:
            assert c.f_test_p_holm_factor == pytest.approx(next(want), rel=1e-9)
    family = next(f for f in stats.multiplicity if f.factor == "mode")
    assert family.tested["f_test_p"] == len(defined)


def test_a_family_too_large_to_adjust_is_null_with_its_reason() -> None:
    levels = list(range(700))  # comb(700, 2) * 3 comparisons
    grid = {"lr": levels, "sg": [False, True]}
    rng = np.random.default_rng(0)
    runs = [
        ({"lr": lr, "sg": sg}, f"lr={lr},sg={sg}", float(v))
        for lr in levels
        for sg in (False, True)
        for v in rng.normal(size=2)
    ]
    stats = experiment_stats(metric="m", grid=grid, runs=runs, factor="sg", limit=3)
    families = {f.factor: f for f in stats.multiplicity}
    assert families["lr"].comparisons > MAX_ANALYSED_COMPARISONS
    assert "more than the 20,000" in families["lr"].null_reason
    assert families[None].null_reason is not None and families["sg"].null_reason is None
    for c in stats.comparisons:
        assert c.f_test_p is not None and c.f_test_p_holm_all is None
        assert c.f_test_p_holm_factor is not None

    # sg's own family is every one of its 701 comparisons (pooled, then within each lr),
    # adjusted as a whole: its raw F-test p-values by scipy here
    def f_p(a: list[float], b: list[float]) -> float:
        ratio = np.var(a, ddof=1) / np.var(b, ddof=1)
        dist = scipy_stats.f(len(a) - 1, len(b) - 1)
        return min(1.0, 2 * min(dist.cdf(ratio), dist.sf(ratio)))

    def values(sg: bool, lr: int) -> list[float]:
        return [v for c, _, v in runs if c["sg"] is sg and c["lr"] == lr]

    # pooled over lr: the F-test of the within-cell variances, 700 degrees of freedom a side
    pooled = [np.mean([np.var(values(sg, lr), ddof=1) for lr in levels]) for sg in (False, True)]
    tail = scipy_stats.f.cdf(pooled[0] / pooled[1], 700, 700)
    raw = [min(1.0, 2 * min(tail, 1 - tail))]
    raw += [f_p(values(False, lr), values(True, lr)) for lr in levels]
    assert [c.f_test_p for c in stats.comparisons] == pytest.approx(raw[:3], rel=1e-9)
    assert [c.f_test_p_holm_factor for c in stats.comparisons] == pytest.approx(
        holm_by_hand(raw)[:3], rel=1e-9
    )


def test_an_experiment_without_a_grid_has_one_empty_family() -> None:
    # one condition, no factor: no comparison to adjust, and no error (it was a 500 on /stats)
    stats = experiment_stats(metric="m", grid={}, runs=[({}, "", 1.0), ({}, "", 2.5)])
    assert stats.comparisons == [] and stats.conditions[0].n == 2
    (family,) = stats.multiplicity
    assert (family.factor, family.comparisons, family.null_reason) == (None, 0, None)
    assert family.tested == {
        "primary_p": 0,
        "f_test_p": 0,
        "brown_forsythe_p": 0,
        "welch_p": 0,
        "mean_p": 0,
    }
