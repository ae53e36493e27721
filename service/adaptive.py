"""Adaptive experiments: seeds in rounds until a named comparison is settled.

The rule (api_schemas.adaptive): K = 1 + ceil((max_seeds - min_seeds) / step) planned looks;
look k, taken when round k has ended, computes the named comparison's two-sided interval at
confidence 1 - alpha / K (Bonferroni over the planned looks) from the completed runs. The
experiment stops at the first look whose interval excludes the null value (1 for var_ratio,
0 for mean_diff), or when max_seeds is reached, or when it is cancelled; otherwise the next round
(`step` more seeds per condition) is queued. Bonferroni is conservative (each look spends
alpha / K whether it is taken or not) and needs no assumption about how the looks correlate:
the chance of any false stop is at most the sum of the looks' levels, alpha.

The dispatcher calls `decide_due` between passes; a look is one transaction, so a dispatcher
that dies mid-look leaves it due, and the next one takes it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy import stats
from sqlmodel import Session, select

from api_schemas import AdaptiveLook, AdaptiveSpec, AdaptiveState, ExperimentSpec, RunStatus
from service.db import Experiment, Run
from service.experiments import grid_conditions, run_defaults, seed_runs, stats_grid
from service.power import f_ratio_interval
from service.run_store import RunStore
from service.stats import RunValues, metric_value

log = logging.getLogger("seedgrid.adaptive")



def look_interval(a_values: Sequence[float], b_values: Sequence[float], target: str,
                  confidence: float) -> tuple[float | None, list[float] | None, str | None]:
    """The estimate, its two-sided interval at `confidence`, and why they are null if so."""
    a = np.asarray(a_values, dtype=float)
    b = np.asarray(b_values, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return None, None, f"fewer than 2 completed runs on a side (n_a {len(a)}, n_b {len(b)})"
    var_a, var_b = float(a.var(ddof=1)), float(b.var(ddof=1))
    if target == "var_ratio":
        if var_a <= 0 or var_b <= 0:
            return None, None, "a side has zero variance: the ratio is undefined"
        ratio = var_a / var_b
        upper, lower = _f_quantiles(len(a) - 1, len(b) - 1, confidence)
        return ratio, [ratio / upper, ratio / lower], None
    diff = float(a.mean() - b.mean())
    if var_a + var_b <= 0:
        return diff, None, "both sides have zero variance: Welch's interval is undefined"
    # Welch: the standard error of the difference and Welch-Satterthwaite's degrees of freedom
    # (the interval scipy.stats.ttest_ind(equal_var=False) gives; a look is simulated
    # thousands of times, so it is written out).
    sa, sb = var_a / len(a), var_b / len(b)
    dof = (sa + sb) ** 2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * math.sqrt(sa + sb)
    return diff, [diff - half, diff + half], None


@lru_cache(maxsize=4096)
def _f_quantiles(dof_a: int, dof_b: int, confidence: float) -> tuple[float, float]:
    """F(dof_a, dof_b)'s upper and lower quantiles of a two-sided interval at `confidence`:
    the exact interval of a variance ratio is [ratio / upper, ratio / lower]."""
    interval = f_ratio_interval(1.0, dof_a + 1, dof_b + 1, confidence)
    return 1 / interval[0], 1 / interval[1]


def take_look(rule: AdaptiveSpec, look: int, a_values: Sequence[float],
              b_values: Sequence[float]) -> AdaptiveLook:
    """Look number `look` (1-based) of the rule on the comparison's two samples."""
    confidence = 1 - rule.alpha_per_look
    estimate, interval, note = look_interval(a_values, b_values, rule.target, confidence)
    null = rule.null_value
    excludes = (interval is not None and all(math.isfinite(v) for v in interval)
                and (interval[0] > null or interval[1] < null))
    return AdaptiveLook(look=look, seeds_per_condition=rule.seeds_at_look(look),
                        n_a=len(a_values), n_b=len(b_values), estimate=estimate,
                        interval=interval, confidence=confidence, excludes_null=excludes,
                        note=note)


def next_step(rule: AdaptiveSpec, state: AdaptiveState, latest: AdaptiveLook, *,
              cancelled: bool) -> tuple[str | None, bool | None]:
    """(stop reason, significant) after `latest`; (None, None) when the next round is due."""
    if latest.excludes_null:
        return (f"significant at look {latest.look} of {state.planned_looks} "
                f"({latest.seeds_per_condition} seeds per condition): the {rule.target} "
                f"interval [{latest.interval[0]:.4g}, {latest.interval[1]:.4g}] "  # type: ignore[index]
                f"at {latest.confidence:.2%} excludes {rule.null_value:g}", True)
    if cancelled:
        return f"cancelled at look {latest.look} of {state.planned_looks}", False
    if latest.seeds_per_condition >= rule.max_seeds:
        return (f"max_seeds reached ({rule.max_seeds} per condition) at look {latest.look} "
                f"without the interval excluding {rule.null_value:g}", False)
    return None, None


def decide_due(session: Session) -> int:
    """Take the look of every adaptive experiment whose round has ended: stop it, or queue its
    next round. Returns the number of looks taken."""
    store = RunStore(session)
    taken = 0
    for experiment_id in store.due_decisions():
        store.lock_experiments([experiment_id])
        experiment = session.get(Experiment, experiment_id, populate_existing=True)
        if experiment is None or not experiment.deciding:
            continue
        spec = ExperimentSpec.model_validate(experiment.spec)
        rule = spec.adaptive
        assert rule is not None and experiment.adaptive is not None
        state = AdaptiveState.model_validate(experiment.adaptive)
        rows = session.exec(
            select(Run.condition, Run.condition_key, Run.metrics)
            .where(Run.experiment_id == experiment_id, Run.status == RunStatus.completed)
        ).all()
        grid = stats_grid(spec)
        values = RunValues(grid, [
            (condition, key, value) for condition, key, metrics in rows
            if (value := metric_value(metrics, experiment.metric)) is not None])
        named = rule.comparison
        latest = take_look(rule, len(state.looks) + 1,
                           values.values(named.factor, named.a, named.within),
                           values.values(named.factor, named.b, named.within))
        state.looks.append(latest)
        reason, significant = next_step(rule, state, latest,
                                        cancelled=experiment.cancel_requested)
        if reason is None:
            first, last = latest.seeds_per_condition, rule.seeds_at_look(latest.look + 1)
            store.add_runs(experiment, seed_runs(grid_conditions(grid),
                                                 list(range(first, last))), run_defaults(spec))
        else:
            state.stop_reason, state.significant = reason, significant
        store.record_look(experiment_id, state.model_dump(mode="json"),
                          stopped=reason is not None)
        store.commit()
        taken += 1
        log.info("experiment %s look %s: %s", experiment_id, latest.look,
                 reason or f"next round to {rule.seeds_at_look(latest.look + 1)} seeds")
    return taken
