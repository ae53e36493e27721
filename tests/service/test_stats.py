"""service.analysis.stats against independent computations (scipy, enumeration by hand) and the grid
structure of docs/api.md: within-cell comparisons, the primary test paired by seed, its
interval, the log scale and the result cache."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from service.analysis import resampling, variance
from service.analysis.conditions import condition_stats
from service.analysis.mean_test import MEAN_TEST
from service.analysis.stats import ScaleError, compare, experiment_stats
from tests.scipy_reference import (
    assert_matches,
    paired_cell_deviations,
    reference_comparison,
    reference_condition,
    reference_primary_p,
    reference_strata,
)


def test_an_unpaired_comparison_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    a = list(rng.normal(0, 2.0, size=7))
    b = list(rng.normal(0.5, 1.0, size=6))
    got = compare(a, b)
    assert got["pairing"] == "unpaired" and got["primary_exact"] is True
    assert got["primary_test"] == resampling.MODE_ALIGNED_TEST  # 6 seeds in the smaller cell
    assert_matches(got, reference_comparison(a, b))


def test_without_the_mean_test_the_variance_fields_are_the_same_and_the_mean_test_is_unset() -> (
    None
):
    """analyse(mean_test=False), what the size simulations of the variance tests call: every
    field but the permutation mean test's (and its warning) is what /stats answers, and the
    two are cached apart."""
    rng = np.random.default_rng(7)
    scopes = [
        variance.Scope((resampling.Stratum(rng.lognormal(size=n), rng.normal(size=n)),), False)
        for n in (3, 6, 10)
    ]
    variance._results.clear()
    full = variance.analyse(scopes)
    lean = variance.analyse(scopes, mean_test=False)
    mean_fields = {"mean_test", "mean_p", "mean_diff_ci95", "mean_p_null_reason"}
    for with_mean, without in zip(full, lean, strict=True):
        assert with_mean["mean_test"] == MEAN_TEST and with_mean["mean_diff_ci95"] is not None
        assert mean_fields.isdisjoint(without)
        assert {k: v for k, v in with_mean.items() if k not in mean_fields | {"warnings"}} == {
            k: v for k, v in without.items() if k != "warnings"
        }
        assert [w for w in with_mean["warnings"] if not w.startswith("mean_")] == without[
            "warnings"
        ]
    assert variance.analyse(scopes) == full  # the cached full answers, not the lean ones


def test_up_to_2_16_re_assignments_are_enumerated_so_no_resampling_seed_decides() -> None:
    """16 shared seeds: all 65,536 sign flips, as scipy's exact permutation_test counts them
    (9,999 drawn flips answered 0.0542 where the exact p was 0.0499); 17: drawn."""
    rng = np.random.default_rng(16)
    shared = rng.normal(size=17)
    a = list(1.8 * shared + 0.5 * rng.normal(size=17))
    b = list(shared + 0.5 * rng.normal(size=17))
    seeds = list(range(16))
    got = compare(a[:16], b[:16], seeds, seeds)
    assert got["pairing"] == "paired" and got["primary_exact"] is True
    assert got["primary_resamples"] == 2**16
    want = reference_primary_p([(a[:16], b[:16])], paired=True)
    assert got["primary_p"] == pytest.approx(want, rel=1e-12)
    more = compare(a, b, list(range(17)), list(range(17)))
    assert more["primary_exact"] is False and more["primary_resamples"] == 10_000
    # unpaired 9 + 9 seeds (deviations from one mode-aligned centre): all C(18, 9) = 48,620
    unpaired = compare(a[:9], b[:9])
    assert unpaired["primary_exact"] is True and unpaired["primary_resamples"] == 48_620
    assert unpaired["primary_p"] == pytest.approx(
        reference_primary_p([(a[:9], b[:9])], paired=False), rel=1e-12
    )


def test_a_paired_comparison_matches_scipy_and_reports_the_seed_correlation() -> None:
    rng = np.random.default_rng(1)
    shared = rng.normal(size=9)
    a = list(shared + 0.3 * rng.normal(size=9))
    b = list(2 * shared + 0.3 * rng.normal(size=9) + 1)
    seeds = list(range(9))
    got = compare(a, b, seeds, seeds)
    assert got["pairing"] == "paired" and got["paired_seeds"] == 9
    assert got["primary_test"] == resampling.PAIRED_MIXED_TEST and got["mean_test"] == "paired t"
    assert_matches(got, reference_comparison(a, b, seeds))
    assert got["seed_correlation"] == pytest.approx(np.corrcoef(a, b)[0, 1], rel=1e-9)


def test_seeds_in_another_order_pair_by_seed_not_by_position() -> None:
    rng = np.random.default_rng(2)
    a = list(rng.normal(size=8))
    b = [2.0 * v for v in a]
    order = [3, 0, 7, 1, 6, 2, 5, 4]
    shuffled = compare(a, [b[i] for i in order], list(range(8)), order)
    assert shuffled["primary_p"] == pytest.approx(2 / 256)


def test_an_exact_per_seed_scale_of_1_5_is_significant_with_8_paired_seeds() -> None:
    rng = np.random.default_rng(3)
    a = list(rng.lognormal(size=8))
    b = [1.5 * v for v in a]
    seeds = list(range(8))
    paired = compare(a, b, seeds, seeds)
    # every seed says var_a / var_b = 1 / 2.25: only "no swap" and "swap all" are as extreme
    assert paired["primary_p"] == pytest.approx(2 / 256)
    assert paired["primary_ci95"] == pytest.approx([1 / 2.25, 1 / 2.25], rel=1e-9)
    assert paired["seed_correlation"] == pytest.approx(1.0)
    unpaired = compare(a, b)  # the same values without their seeds: nothing to see
    assert unpaired["primary_p"] > 0.3


def test_the_primary_interval_is_the_set_of_ratios_the_test_does_not_reject() -> None:
    rng = np.random.default_rng(4)
    for seeds in (None, list(range(7))):
        shared = rng.normal(size=7)  # correlated seeds: 7 pairs are paired only then
        a = list(3.0 * (shared + 0.3 * rng.normal(size=7)))
        b = list(shared + 0.3 * rng.normal(size=7))
        got = compare(a, b, seeds, seeds)
        assert got["pairing"] == ("unpaired" if seeds is None else "paired")
        low, high = got["primary_ci95"]
        paired = seeds is not None
        for end in (low, high):
            inside = end * (1.001 if end == low else 0.999)
            outside = end * (0.999 if end == low else 1.001)
            assert reference_primary_p([(a, b)], paired, null=inside) > 0.05
            assert reference_primary_p([(a, b)], paired, null=outside) <= 0.05
        assert low < got["var_ratio"] < high


def test_small_or_constant_samples_give_nulls_not_errors() -> None:
    one = condition_stats({}, "", [0.5])
    assert one.n == 1 and one.std is None and one.ci95 is None and one.mean == 0.5
    single = compare([1.0], [1.0, 2.0])
    assert single["var_ratio"] is None and single["f_test_p"] is None
    assert single.get("primary_p") is None
    constant = compare([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert constant["var_a"] == 0.0 and constant["var_ratio"] is None
    assert constant.get("primary_p") is None and constant.get("primary_ci95") is None


def test_welch_with_two_zero_variance_levels_is_null_with_its_reason() -> None:
    got = compare([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert got["welch_p"] is None and "zero variance" in got["welch_p_null_reason"]
    assert got["mean_diff"] == -1.0


def test_three_seeds_unpaired_warn_that_the_primary_test_cannot_reach_0_05() -> None:
    got = compare([1.0, 2.0, 4.0], [0.0, 0.1, 0.3])
    # an odd cell's zero deviation leaves the shuffle: 2 + 2 deviations, 6 splits
    assert got["primary_resamples"] == 6 and got["primary_p"] >= 2 / 6
    assert got["primary_ci95"] == [0.0, None]
    assert any("cannot fall below" in w for w in got["warnings"])


def test_seeds_run_in_one_condition_only_are_shuffled_and_the_rest_stay_paired() -> None:
    """A failed run (seed 7 of b) does not unpair the other seven: their pairs are sign-flipped
    and seed 7's value of a, with no partner and none to shuffle with, stays on a's side. By
    hand: every one of the 2^7 flips, deviations from each full cell's centre (the paired
    centre of scipy_reference, the smaller cell holding 7)."""
    rng = np.random.default_rng(5)
    shared = rng.normal(size=8)
    a = list(shared + 0.2 * rng.normal(size=8))
    b = list(3 * shared[:7] + 0.2 * rng.normal(size=7))
    got = compare(a, b, list(range(8)), list(range(7)))
    assert got["pairing"] == "paired" and got["paired_seeds"] == 7
    assert "1 value(s) of seeds that ran in only one" in got["pairing_note"]
    d_a = paired_cell_deviations(np.asarray(a), 7)
    d_b = paired_cell_deviations(np.asarray(b), 7)
    statistics = []
    for flips in itertools.product([0, 1], repeat=7):
        f = np.asarray(flips, dtype=bool)
        side_a = np.r_[np.where(f, d_b, d_a[:7]), d_a[7]]
        side_b = np.where(f, d_a[:7], d_b)
        statistics.append(np.log(side_a.mean() / side_b.mean()))
    observed, values = statistics[0], np.asarray(statistics)
    want = min(
        1.0, 2 * min(np.mean(values >= observed - 1e-12), np.mean(values <= observed + 1e-12))
    )
    assert got["primary_p"] == pytest.approx(want, rel=1e-12) and got["primary_exact"]
    assert got["mean_test"] == "paired t"
    assert got["mean_p"] == pytest.approx(scipy_stats.ttest_rel(a[:7], b).pvalue, rel=1e-9)
    # mean_diff is the paired t's estimate (seed 7 of a has no partner): inside its interval
    assert got["mean_diff"] == pytest.approx(float(np.mean(np.subtract(a[:7], b))), rel=1e-12)
    low, high = got["mean_diff_ci95"]
    assert low < got["mean_diff"] < high
    few = compare(a[:5], b[:5], list(range(5)), list(range(5)))  # 32 sign flips
    assert few["pairing"] == "unpaired" and "too few to reach 0.05" in few["pairing_note"]
    assert few["mean_test"] == MEAN_TEST
    welch_t = scipy_stats.permutation_test(
        (a[:5], b[:5]),
        lambda x, y: scipy_stats.ttest_ind(x, y, equal_var=False).statistic,
        permutation_type="independent",
        n_resamples=np.inf,
        vectorized=False,
    )
    assert few["mean_p"] == pytest.approx(welch_t.pvalue, rel=1e-12)
    # 8 shared seeds that do not correlate are still paired: the seeds, not the data, decide
    loose = compare(
        list(rng.normal(size=8)), list(rng.normal(size=8)), list(range(8)), list(range(8))
    )
    assert loose["pairing"] == "paired" and loose["pairing_note"] is None


def grid_runs(seed: int, interaction: float) -> tuple[dict, list, list[int]]:
    """A 2 x 3 grid, 5 shared seeds per cell, equal within-cell variances and `interaction` in
    the means of `mode` x `r` only."""
    grid = {"mode": ["a", "b"], "r": [0, 1, 2]}
    rng = np.random.default_rng(seed)
    runs, seeds = [], []
    for mode in grid["mode"]:
        for r in grid["r"]:
            shift = interaction * r * (1 if mode == "a" else -1)
            for s in range(5):
                runs.append(
                    ({"mode": mode, "r": r}, f"mode={mode},r={r}", float(rng.normal(shift, 1.0)))
                )
                seeds.append(s)
    return grid, runs, seeds


def test_a_pooled_comparison_is_stratified_by_cell_and_matches_enumeration() -> None:
    grid, runs, seeds = grid_runs(6, interaction=3.0)
    stats = experiment_stats(metric="m", grid=grid, runs=runs)  # no seeds: unpaired
    pooled = next(c for c in stats.comparisons if c.factor == "mode" and c.within is None)
    cells = {
        (c["mode"], c["r"]): [v for cc, _, v in runs if cc == c]
        for c in ({"mode": m, "r": r} for m in grid["mode"] for r in grid["r"])
    }
    # 3 strata of 4 + 4 deviations: 70^3 splits, more than the 10,000 drawn; enumerate two
    # strata by hand and check the drawn p against it within Monte Carlo error
    want = reference_strata([(cells[("a", r)], cells[("b", r)]) for r in (0, 1, 2)], paired=False)
    got = pooled.model_dump()
    primary = want.pop("primary_p")
    assert "mean_p" not in want  # 252^3 re-assignments: too many to enumerate here
    assert_matches(got, want)
    assert got["primary_p"] == pytest.approx(primary, abs=4 * math.sqrt(0.25 / 9999) + 1e-3)
    assert got["dof_a"] == got["dof_b"] == 12
    # the marginal variance counts the interaction in the means: a warning says so
    assert got["marginal_var_a"] == pytest.approx(
        np.var(sum((cells[("a", r)] for r in (0, 1, 2)), []), ddof=1), rel=1e-12
    )
    assert got["marginal_var_ratio"] is not None
    two = reference_strata([(cells[("a", r)], cells[("b", r)]) for r in (0, 1)], paired=False)
    two_got = experiment_stats(
        metric="m",
        grid={"mode": ["a", "b"], "r": [0, 1]},
        runs=[run for run in runs if run[0]["r"] in (0, 1)],
    ).comparisons[0]
    assert two_got.primary_p == pytest.approx(
        two["primary_p"], abs=4 * math.sqrt(0.25 / 9999) + 1e-3
    )


def test_an_interaction_in_the_means_does_not_make_the_variances_differ() -> None:
    marginal_rejects = primary_rejects = f_rejects = 0
    for seed in range(40):
        grid, runs, seeds = grid_runs(100 + seed, interaction=1.5)
        stats = experiment_stats(metric="m", grid=grid, runs=runs, seeds=seeds)
        pooled = next(
            c
            for c in stats.comparisons
            if c.factor == "r" and c.within is None and (c.a, c.b) == (0, 2)
        )
        assert pooled.pairing == "paired"
        primary_rejects += pooled.primary_p < 0.05
        f_rejects += pooled.f_test_p < 0.05
        a = [v for c, _, v in runs if c["r"] == 0]
        b = [v for c, _, v in runs if c["r"] == 2]
        marginal = np.var(a, ddof=1) / np.var(b, ddof=1)
        assert pooled.marginal_var_ratio == pytest.approx(marginal, rel=1e-12)
        tail = scipy_stats.f.cdf(marginal, len(a) - 1, len(b) - 1)
        marginal_rejects += 2 * min(tail, 1 - tail) < 0.05
    # pooled over `mode`, r=0 has means 0, 0 and r=2 has 3, -3: its marginal variance is
    # inflated; the within-cell tests are not
    mode = next(
        c
        for c in stats.comparisons
        if c.factor == "r" and c.within is None and (c.a, c.b) == (0, 2)
    )
    assert mode.marginal_var_ratio < 0.5 and any("marginal_var_ratio" in w for w in mode.warnings)
    assert primary_rejects <= 6 and f_rejects <= 6
    assert marginal_rejects >= 30  # what the pooled F-test on all runs of a level said


def test_the_log_scale_compares_relative_spreads_and_refuses_non_positive_values() -> None:
    rng = np.random.default_rng(7)
    grid = {"r": [0.05, 0.1]}
    runs = [({"r": 0.05}, "r=0.05", float(v)) for v in 1e-4 * rng.lognormal(0, 0.15, 8)]
    runs += [({"r": 0.1}, "r=0.1", float(v)) for v in rng.lognormal(0, 0.15, 8)]
    raw = experiment_stats(metric="m", grid=grid, runs=runs).comparisons[0]
    assert raw.var_ratio < 1e-6 and any("-fold" in w for w in raw.warnings)
    log = experiment_stats(metric="m", grid=grid, runs=runs, scale="log").comparisons[0]
    assert log.scale == "log"
    logs = {r: [math.log(v) for c, _, v in runs if c["r"] == r] for r in grid["r"]}
    assert log.var_ratio == pytest.approx(
        np.var(logs[0.05], ddof=1) / np.var(logs[0.1], ddof=1), rel=1e-9
    )
    assert log.primary_p > 0.05 and raw.primary_p < 0.01
    with pytest.raises(ScaleError, match="1 of 16 are 0 or below"):
        experiment_stats(
            metric="m", grid=grid, runs=[*runs[:-1], ({"r": 0.1}, "r=0.1", 0.0)], scale="log"
        )


def test_condition_summary_matches_scipy() -> None:
    values = [0.91, 0.88, 0.93, 0.90, 0.87]
    got = condition_stats({"a": 1}, "a=1", values).model_dump()
    assert_matches(got, reference_condition(values))
    assert got["values"] == values


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
    within = next(
        c for c in s.comparisons if c.factor == "mode" and c.within == {"stability": "direct"}
    )
    a = [v for c, _, v in runs if c == {"mode": "clamp", "stability": "direct"}]
    b = [v for c, _, v in runs if c == {"mode": "subtract", "stability": "direct"}]
    assert (within.n_a, within.n_b) == (4, 4)
    assert_matches(within.model_dump(), reference_comparison(a, b))
    assert within.marginal_var_ratio is None  # only pooled comparisons carry it


def test_boolean_and_integer_levels_are_not_confused() -> None:
    grid = {"flag": [False, 0]}
    runs = [
        ({"flag": False}, "flag=false", 1.0),
        ({"flag": False}, "flag=false", 2.0),
        ({"flag": 0}, "flag=0", 5.0),
        ({"flag": 0}, "flag=0", 9.0),
    ]
    (comparison,) = experiment_stats(metric="m", grid=grid, runs=runs).comparisons
    assert (comparison.n_a, comparison.n_b) == (2, 2)
    assert comparison.var_ratio == pytest.approx(0.5 / 8.0)


def test_a_new_run_recomputes_only_the_comparisons_whose_cells_it_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grid, runs, seeds = grid_runs(8, interaction=0.0)
    tested: list[int] = []
    real = resampling.randomisation_tests

    def counting(preps, *args, **kwargs):  # type: ignore[no-untyped-def]
        tested.append(len(preps))
        return real(preps, *args, **kwargs)

    monkeypatch.setattr(resampling, "randomisation_tests", counting)
    variance._results.clear()
    first = experiment_stats(metric="m", grid=grid, runs=runs, seeds=seeds)
    assert sum(tested) == len(first.comparisons) == 1 * (1 + 3) + 3 * (1 + 2)
    tested.clear()
    again = experiment_stats(metric="m", grid=grid, runs=runs, seeds=seeds)
    assert sum(tested) == 0 and again == first
    # a sixth seed in (mode=a, r=2): the mode comparisons pooled and within r=2, and the r
    # comparisons pooled and within mode=a that involve r=2 (0 vs 2, 1 vs 2)
    more = [*runs, ({"mode": "a", "r": 2}, "mode=a,r=2", 0.5)]
    experiment_stats(metric="m", grid=grid, runs=more, seeds=[*seeds, 5])
    assert sum(tested) == 2 + 2 * 2


@pytest.mark.parametrize("paired", [False, True])
def test_the_omnibus_primary_test_agrees_with_scipys_permutation_test(paired: bool) -> None:
    rng = np.random.default_rng(11)
    grid = {"lr": [1, 2, 3]}
    values = {1: rng.normal(0, 1, 8), 2: rng.normal(5, 1.8, 8), 3: rng.normal(1, 1.2, 8)}
    runs = [({"lr": lr}, f"lr={lr}", float(v)) for lr in grid["lr"] for v in values[lr]]
    seeds = [s for _ in grid["lr"] for s in range(8)] if paired else None
    (omnibus,) = experiment_stats(metric="m", grid=grid, runs=runs, seeds=seeds).omnibus
    assert omnibus.primary_test.startswith("paired" if paired else "stratified")
    deviations = [(v - np.median(v)) ** 2 for v in values.values()]

    def spread(*groups: np.ndarray, axis: int = -1) -> np.ndarray:
        means = np.stack([np.mean(g, axis=axis) for g in groups], axis=-1)
        logs = np.log(means)
        return ((logs - logs.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1) * 8

    want = scipy_stats.permutation_test(
        deviations,
        spread,
        permutation_type="samples" if paired else "independent",
        n_resamples=1999,
        alternative="greater",
        vectorized=True,
        random_state=0,
    ).pvalue
    assert omnibus.primary_p == pytest.approx(want, abs=0.03)
    by_hand = scipy_stats.levene(*values.values(), center="median").pvalue
    assert omnibus.brown_forsythe_p == pytest.approx(by_hand, rel=1e-9)


def test_pooling_cells_whose_variances_differ_by_orders_of_magnitude_is_warned_about() -> None:
    rng = np.random.default_rng(12)
    grid = {"sg": [False, True], "r": [0.0, 0.1]}
    scale = {0.0: 1.0, 0.1: 1e-7}  # like collapse's min_l2: r shrinks it by 7 decades
    runs = [
        ({"sg": sg, "r": r}, f"r={r},sg={sg}", float(v))
        for sg in grid["sg"]
        for r in grid["r"]
        for v in rng.lognormal(0, 0.3, 6) * scale[r]
    ]
    stats = experiment_stats(metric="m", grid=grid, runs=runs)
    pooled = next(c for c in stats.comparisons if c.factor == "sg" and c.within is None)
    variances = [
        np.var([v for c, _, v in runs if c == {"sg": sg, "r": r}], ddof=1)
        for sg in grid["sg"]
        for r in grid["r"]
    ]
    decades = math.log10(max(variances) / min(variances))  # about 14
    assert decades > 12
    assert any(f"span {decades:.0f} orders of magnitude" in w for w in pooled.warnings)
    within = next(c for c in stats.comparisons if c.factor == "sg" and c.within is not None)
    assert not any("cells' variances span" in w for w in within.warnings)
    logged = experiment_stats(metric="m", grid=grid, runs=runs, scale="log").comparisons
    assert not any("cells' variances span" in w for c in logged for w in c.warnings)
