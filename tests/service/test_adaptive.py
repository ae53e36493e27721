"""The adaptive stopping rule alone (service.adaptive), simulated without training: under equal
variances (or equal means) it stops with a false "significant" in at most alpha of the
experiments, while testing each look at the full alpha would not."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from api_schemas import AdaptiveSpec, AdaptiveState
from service.adaptive import next_step, take_look

N_EXPERIMENTS = 2000


def rule(target: str = "var_ratio", **overrides: object) -> AdaptiveSpec:
    return AdaptiveSpec.model_validate({
        "comparison": {"factor": "f", "a": 0, "b": 1}, "target": target,
        "min_seeds": 4, "step": 2, "max_seeds": 12, **overrides})


def simulate(spec: AdaptiveSpec, *, sd_a: float, mean_a: float = 0.0,
             seed: int = 0) -> tuple[float, float]:
    """(share of experiments stopped significant, mean seeds per condition at the stop) over
    N_EXPERIMENTS simulated experiments with normal seeds: side b is N(0, 1)."""
    rng = np.random.default_rng(seed)
    significant, seeds = 0, 0
    for _ in range(N_EXPERIMENTS):
        a = rng.normal(mean_a, sd_a, spec.max_seeds)
        b = rng.normal(0.0, 1.0, spec.max_seeds)
        state = AdaptiveState.start(spec)
        for look in range(1, spec.planned_looks + 1):
            n = spec.seeds_at_look(look)
            latest = take_look(spec, look, a[:n], b[:n])
            state.looks.append(latest)
            reason, hit = next_step(spec, state, latest, cancelled=False)
            if reason is not None:
                significant += bool(hit)
                seeds += n
                break
        else:
            raise AssertionError("the rule ran past its planned looks without a stop")
    return significant / N_EXPERIMENTS, seeds / N_EXPERIMENTS


@pytest.mark.parametrize("target", ["var_ratio", "mean_diff"])
def test_under_the_null_false_stops_stay_within_alpha(target: str) -> None:
    spec = rule(target)
    assert spec.planned_looks == 5 and spec.alpha_per_look == pytest.approx(0.01)
    rate, _ = simulate(spec, sd_a=1.0)
    assert rate <= 0.05 + 0.01, rate
    # The same looks each at the full alpha: the inflation the split exists to prevent, seen
    # by this simulation (so the bound above is a real test of the rule).
    naive = rule(target, alpha=0.05 * spec.planned_looks)
    naive_rate, _ = simulate(naive, sd_a=1.0)
    assert naive_rate > 0.08, naive_rate


def test_a_large_true_ratio_stops_early_and_significant() -> None:
    rate, mean_seeds = simulate(rule(), sd_a=4.0, seed=1)  # variance ratio 16
    assert rate > 0.8, rate
    assert mean_seeds < 10, mean_seeds


def test_a_look_is_the_exact_f_interval_at_the_split_level() -> None:
    spec = rule()
    a, b = [1.0, 3.0, 2.0, 7.0, 4.0], [0.5, 0.7, 0.4, 0.6]
    look = take_look(spec, 2, a, b)
    ratio = np.var(a, ddof=1) / np.var(b, ddof=1)
    tail = 0.01 / 2
    expected = [ratio / stats.f.ppf(1 - tail, 4, 3), ratio / stats.f.ppf(tail, 4, 3)]
    assert look.estimate == pytest.approx(ratio, rel=1e-12)
    assert look.interval == pytest.approx(expected, rel=1e-9)
    assert look.confidence == pytest.approx(0.99)
    assert look.excludes_null == (expected[0] > 1)
    assert (look.n_a, look.n_b, look.seeds_per_condition) == (5, 4, 6)


def test_a_look_with_an_undefined_ratio_never_stops_and_says_why() -> None:
    spec = rule()
    look = take_look(spec, 1, [1.0, 1.0, 1.0], [0.0, 2.0, 4.0])
    assert look.interval is None and not look.excludes_null
    assert "zero variance" in (look.note or "")
    assert take_look(spec, 1, [1.0], [0.0, 2.0]).note.startswith("fewer than 2")  # type: ignore[union-attr]


def test_the_stop_reasons() -> None:
    spec = rule(min_seeds=4, step=3, max_seeds=10)
    assert spec.planned_looks == 3 and spec.seeds_at_look(3) == 10
    state = AdaptiveState.start(spec)
    same = take_look(spec, 3, [1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    reason, significant = next_step(spec, state, same, cancelled=False)
    assert reason is not None and reason.startswith("max_seeds reached (10 per condition)")
    assert significant is False
    early = take_look(spec, 1, [1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert next_step(spec, state, early, cancelled=False) == (None, None)
    reason, _ = next_step(spec, state, early, cancelled=True)
    assert reason == "cancelled at look 1 of 3"


def test_spec_bounds() -> None:
    with pytest.raises(ValueError, match="max_seeds .* is below min_seeds"):
        rule(min_seeds=6, max_seeds=4)
    with pytest.raises(ValueError, match="min_seeds"):
        rule(min_seeds=1)


def test_a_mean_look_is_welchs_interval() -> None:
    spec = rule("mean_diff")
    a, b = [1.0, 3.0, 2.0, 7.0, 4.0], [0.5, 0.7, 0.4, 0.6]
    look = take_look(spec, 1, a, b)
    expected = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.99)
    assert look.estimate == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
    assert look.interval == pytest.approx([expected.low, expected.high], rel=1e-9)
    assert look.excludes_null == (expected.low > 0 or expected.high < 0)
