"""Adaptive experiments: seeds in rounds until a named comparison is settled.

The rule (api_schemas.adaptive): K = 1 + ceil((max_seeds - min_seeds) / step) planned looks;
look k, taken when round k has ended, computes the named comparison's two-sided interval at
confidence 1 - alpha / K (Bonferroni over the planned looks) from the completed runs:

- var_ratio: the interval of var_a / var_b that inverts seedgrid's primary variance test
  (service.analysis.resampling): a sign-flip test of each seed's two squared deviations from their
  cell
  medians when both levels ran the same seeds in every cell (seedgrid's conditions share
  seeds), else a permutation test within the cells of the other factors. It keeps its level
  without normality; the normal-theory F interval the rule used before stopped falsely in up
  to 44% of simulated experiments at alpha 0.05 on lognormal and failed-seed data (docs/api.md).
  With too few re-assignments at that confidence (an unpaired look at 4 seeds a side, say) the
  interval is [0, inf] and the look cannot stop the experiment (its note says so);
- mean_diff: the paired t interval of the per-seed differences (averaged over the cells) when
  both levels ran the same seeds in every cell, else Welch's interval.

The experiment stops at the first look whose interval excludes the null value (1 for var_ratio,
0 for mean_diff), or when max_seeds is reached, or when it is cancelled; otherwise the next round
(`step` more seeds per condition) is queued. Bonferroni is conservative (each look spends
alpha / K whether it is taken or not) and needs no assumption about how the looks correlate:
the chance of any false stop is at most the sum of the looks' levels, alpha.

The dispatcher calls `decide_due` between passes; a look is one transaction, so a dispatcher
that dies mid-look leaves it due, and the next one takes it. A round enters the queue like any
submission, under SEEDGRID_MAX_QUEUED_RUNS: when it would pass the cap, the look is recorded
with the round it asked for (`next_round`, `waiting`), and the round is queued at a later pass
once there is room. A look that fails for one experiment (its stored spec, its data) stops that
experiment's rule with the error and no other experiment's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats
from sqlmodel import Session, col, select

from api_schemas import (
    AdaptiveLook,
    AdaptiveSpec,
    AdaptiveState,
    RunStatus,
    first_line,
    level_key,
    storable_text,
)
from api_schemas.adaptive import NamedComparison
from service.analysis.conditions import metric_value
from service.analysis.resampling import Stratum, prepare, randomisation_test, usable_strata
from service.errors import QueueFull
from service.scheduling.admission import count_queue, recount_queue
from service.scheduling.run_store import RunStore
from service.settings import Settings
from service.specs import grid_conditions, run_defaults, seed_runs, stats_grid
from service.storage.db import Experiment, Run, database_trouble

log = logging.getLogger("seedgrid.adaptive")

PAIRED_T = "paired t"
WELCH_T = "Welch t"

# (estimate, interval (an infinite end as inf), the test's name, a note)
Interval = tuple[float | None, tuple[float, float] | None, str | None, str | None]


def comparison_strata(
    grid: dict[str, list[Any]],
    named: NamedComparison,
    runs: Sequence[tuple[Mapping[str, Any], int, float]],
) -> list[Stratum]:
    """The named comparison's strata from (condition, seed, value) per completed run: one per
    combination of the other factors' levels (only `within`'s when it names one), each with
    level a's and level b's values and seeds."""
    factors = list(grid)
    cells: dict[tuple[str, ...], tuple[list[float], list[int]]] = {}
    for condition, seed, value in runs:
        if any(f not in condition for f in factors):
            continue  # not a condition of this grid
        values, seeds = cells.setdefault(tuple(level_key(condition[f]) for f in factors), ([], []))
        values.append(value)
        seeds.append(seed)
    others = {f: levels for f, levels in grid.items() if f != named.factor}
    combinations = [named.within] if named.within is not None else grid_conditions(others)
    strata = []
    for combination in combinations:
        sides = [
            cells.get(
                tuple(level_key({**combination, named.factor: level}[f]) for f in factors), ([], [])
            )
            for level in (named.a, named.b)
        ]
        strata.append(
            Stratum(
                np.asarray(sides[0][0], dtype=float),
                np.asarray(sides[1][0], dtype=float),
                tuple(sides[0][1]),
                tuple(sides[1][1]),
            )
        )
    return strata


def _too_few(n_a: int, n_b: int) -> str:
    return f"fewer than 2 completed runs on a side (n_a {n_a}, n_b {n_b})"


def within_cell_variance(cells: Sequence[np.ndarray]) -> float:
    """sum_k (n_k - 1) s_k^2 / sum_k (n_k - 1): the spread of each cell around its own mean."""
    return sum(float(((c - c.mean()) ** 2).sum()) for c in cells) / sum(len(c) - 1 for c in cells)


def variance_interval(strata: Sequence[Stratum], confidence: float) -> Interval:
    """var_a / var_b (within cells) and the interval that inverts the primary variance test."""
    usable = usable_strata(strata)
    if not usable:
        return (
            None,
            None,
            None,
            _too_few(sum(len(s.a) for s in strata), sum(len(s.b) for s in strata)),
        )
    var_a = within_cell_variance([s.a for s in usable])
    var_b = within_cell_variance([s.b for s in usable])
    prep = prepare(usable)
    if prep is None or var_a <= 0 or var_b <= 0:
        return None, None, None, "a side has zero variance: the ratio is undefined"
    result = randomisation_test(prep, null=1.0, confidence=confidence)
    notes = [prep.note] if prep.note else []
    if 2 / result.resamples > 1 - confidence:
        notes.append(
            f"{result.resamples} re-assignments are too few for the test to exclude "
            f"any ratio at confidence {confidence:.4g}: the interval is [0, inf] and "
            "this look cannot stop the experiment"
        )
    return var_a / var_b, result.interval, prep.name, "; ".join(notes) or None


def paired_differences(strata: Sequence[Stratum]) -> tuple[np.ndarray | None, str | None]:
    """Each seed's a - b, averaged over the cells, when both levels completed the same seeds
    (once each) in every cell that has runs; else None and why (no reason when the runs carry
    no seeds)."""
    filled = [s for s in strata if len(s.a) or len(s.b)]
    if not filled or any(s.a_seeds is None or s.b_seeds is None for s in filled):
        return None, None
    seeds = set(filled[0].a_seeds or ())
    per_cell = []
    for s in filled:
        a_seeds, b_seeds = s.a_seeds or (), s.b_seeds or ()
        if (
            len(set(a_seeds)) != len(a_seeds)
            or len(set(b_seeds)) != len(b_seeds)
            or set(a_seeds) != seeds
            or set(b_seeds) != seeds
        ):
            return None, (
                "Welch: the two levels did not complete the same seeds in every cell "
                "(failed runs), so the seeds do not pair up"
            )
        per_cell.append(
            s.a[np.argsort(a_seeds, kind="stable")] - s.b[np.argsort(b_seeds, kind="stable")]
        )
    return np.mean(per_cell, axis=0), None


def mean_interval(strata: Sequence[Stratum], confidence: float) -> Interval:
    """mean_a - mean_b and its t interval: paired on the seeds when they pair up, else Welch."""
    a = np.concatenate([s.a for s in strata]) if strata else np.empty(0)
    b = np.concatenate([s.b for s in strata]) if strata else np.empty(0)
    if len(a) < 2 or len(b) < 2:
        return None, None, None, _too_few(len(a), len(b))
    tail = 0.5 + confidence / 2
    differences, why_unpaired = paired_differences(strata)
    if differences is not None and len(differences) >= 2:
        diff = float(differences.mean())
        sd = float(differences.std(ddof=1))
        if sd <= 0:
            return (
                diff,
                None,
                PAIRED_T,
                ("every seed has the same difference: the paired t interval is undefined"),
            )
        half = float(stats.t.ppf(tail, len(differences) - 1)) * sd / math.sqrt(len(differences))
        return diff, (diff - half, diff + half), PAIRED_T, None
    diff = float(a.mean() - b.mean())
    var_a, var_b = float(a.var(ddof=1)), float(b.var(ddof=1))
    if var_a + var_b <= 0:
        return diff, None, WELCH_T, "both sides have zero variance: Welch's interval is undefined"
    # Welch: the standard error of the difference and Welch-Satterthwaite's degrees of freedom
    # (the interval scipy.stats.ttest_ind(equal_var=False) gives; a look is simulated
    # thousands of times, so it is written out).
    sa, sb = var_a / len(a), var_b / len(b)
    dof = (sa + sb) ** 2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    half = float(stats.t.ppf(tail, dof)) * math.sqrt(sa + sb)
    return diff, (diff - half, diff + half), WELCH_T, why_unpaired


def take_look(rule: AdaptiveSpec, look: int, strata: Sequence[Stratum]) -> AdaptiveLook:
    """Look number `look` (1-based) of the rule on the comparison's strata (one per cell of
    the other factors it pools over; comparison_strata)."""
    confidence = 1 - rule.alpha_per_look
    measure = variance_interval if rule.target == "var_ratio" else mean_interval
    estimate, interval, test, note = measure(strata, confidence)
    null = rule.null_value
    excludes = interval is not None and (interval[0] > null or interval[1] < null)
    return AdaptiveLook(
        look=look,
        seeds_per_condition=rule.seeds_at_look(look),
        n_a=sum(len(s.a) for s in strata),
        n_b=sum(len(s.b) for s in strata),
        estimate=estimate,
        # JSON has no inf: an end the test cannot bound is null
        interval=None if interval is None else [v if math.isfinite(v) else None for v in interval],
        confidence=confidence,
        excludes_null=excludes,
        test=test,
        note=note,
    )


def _end(value: float | None) -> str:
    return "inf" if value is None else f"{value:.4g}"


def next_step(
    rule: AdaptiveSpec, state: AdaptiveState, latest: AdaptiveLook, *, cancelled: bool
) -> tuple[str | None, bool | None]:
    """(stop reason, significant) after `latest`; (None, None) when the next round is due."""
    if latest.excludes_null:
        assert latest.interval is not None
        low, high = latest.interval
        return (
            f"significant at look {latest.look} of {state.planned_looks} "
            f"({latest.seeds_per_condition} seeds per condition): the {rule.target} "
            f"interval [{_end(low)}, {_end(high)}] ({latest.test}) at "
            f"{latest.confidence:.2%} excludes {rule.null_value:g}",
            True,
        )
    if cancelled:
        return f"cancelled at look {latest.look} of {state.planned_looks}", False
    if latest.seeds_per_condition >= rule.max_seeds:
        return (
            f"max_seeds reached ({rule.max_seeds} per condition) at look {latest.look} "
            f"without the interval excluding {rule.null_value:g}",
            False,
        )
    return None, None


def decide_due(
    session: Session, *, settings: Settings, trainers: Collection[str] | None = None
) -> int:
    """Take the look of every adaptive experiment whose round has ended (of `trainers` only,
    when given: a dispatcher decides for the trainers whose runs it dispatches): stop it, or
    queue its next round (when the queue has room for it). Returns the number of looks taken.
    A look that raises stops its own experiment's rule with the error (`stop_on_error`);
    trouble of the database itself propagates (the dispatcher retries the pass)."""
    taken = 0
    for experiment_id in RunStore(session).due_decisions(trainers):
        try:
            taken += _decide(session, experiment_id, settings)
        except Exception as exc:
            session.rollback()
            if database_trouble(exc):
                raise
            log.exception("experiment %s: its adaptive look failed", experiment_id)
            stop_on_error(session, experiment_id, exc)
    return taken


def _decide(session: Session, experiment_id: int, settings: Settings) -> int:
    """One due experiment: its look (unless one already asked for a round that still waits
    for room in the queue), then its stop or its next round. Returns the looks taken (0 or 1)."""
    store = RunStore(session)
    store.lock_experiments([experiment_id])
    experiment = session.get(Experiment, experiment_id, populate_existing=True)
    if experiment is None or not experiment.deciding:
        return 0
    spec = experiment.stored_spec
    rule = spec.adaptive
    assert rule is not None and experiment.adaptive is not None
    state = AdaptiveState.model_validate(experiment.adaptive)
    grid = stats_grid(spec)
    taken = 0
    if state.next_round is None:
        rows = session.exec(
            select(col(Run.condition), col(Run.seed), col(Run.metrics)).where(
                col(Run.experiment_id) == experiment_id, col(Run.status) == RunStatus.completed
            )
        ).all()
        strata = comparison_strata(
            grid,
            rule.comparison,
            [
                (condition, seed, value)
                for condition, seed, metrics in rows
                if (value := metric_value(metrics, experiment.metric)) is not None
            ],
        )
        latest = take_look(rule, len(state.looks) + 1, strata)
        state.looks.append(latest)
        taken = 1
        reason, significant = next_step(rule, state, latest, cancelled=experiment.cancel_requested)
        if reason is not None:
            state.stop_reason, state.significant = reason, significant
            store.record_look(experiment_id, state.model_dump(mode="json"), stopped=True)
            store.commit()
            log.info("experiment %s look %s: %s", experiment_id, latest.look, reason)
            return taken
        state.next_round = [latest.seeds_per_condition, rule.seeds_at_look(latest.look + 1)]
    elif experiment.cancel_requested:
        state.stop_reason = (
            f"cancelled at look {len(state.looks)} of {state.planned_looks}, "
            "its next round still waiting for room in the queue"
        )
        state.significant, state.next_round, state.waiting = False, None, None
        store.record_look(experiment_id, state.model_dump(mode="json"), stopped=True)
        store.commit()
        return taken
    first, last = state.next_round
    runs = seed_runs(grid_conditions(grid), list(range(first, last)))
    try:
        queued = count_queue(session, store, len(runs), settings)
        store.add_runs(experiment, runs, run_defaults(spec))
        recount_queue(session, store, queued, len(runs), settings)
    except QueueFull:
        session.rollback()
        waiting = (
            f"the round to {last} seeds per condition ({len(runs):,} runs) waits for room "
            f"in the queue: it would pass the cap of {settings.max_queued_runs:,} queued "
            "runs (SEEDGRID_MAX_QUEUED_RUNS)"
        )
        if taken or state.waiting != waiting:  # recorded once, not at every pass
            state.waiting = waiting
            store = RunStore(session)
            store.lock_experiments([experiment_id])
            store.record_look(experiment_id, state.model_dump(mode="json"), stopped=False)
            store.commit()
            log.info("experiment %s: %s", experiment_id, waiting)
        return taken
    state.next_round, state.waiting = None, None
    store.record_look(experiment_id, state.model_dump(mode="json"), stopped=False)
    store.commit()
    log.info("experiment %s look %s: next round to %s seeds", experiment_id, len(state.looks), last)
    return taken


def stop_on_error(session: Session, experiment_id: int, error: BaseException) -> None:
    """Stop one experiment's rule because its look raised: the error is recorded in its
    adaptive state (`error`, `stop_reason`), its runs are kept, and its status then follows
    from them like a stopped experiment's."""
    store = RunStore(session)
    store.lock_experiments([experiment_id])
    experiment = session.get(Experiment, experiment_id, populate_existing=True)
    if experiment is None or not experiment.deciding:
        return
    message = storable_text(f"{type(error).__name__}: {first_line(str(error))}", 1000)
    recorded = experiment.adaptive if isinstance(experiment.adaptive, dict) else {}
    try:
        state = AdaptiveState.model_validate(recorded)
    except ValueError:  # a record this version cannot read: a new one, from the rule if it can
        try:
            rule = experiment.stored_spec.adaptive
        except ValueError:
            rule = None
        state = (
            AdaptiveState.start(rule)
            if rule is not None
            else AdaptiveState(rule="(unreadable)", planned_looks=0, alpha_per_look=0.0)
        )
    state.error = message
    state.stop_reason = (
        f"stopped at look {len(state.looks) + 1} of {state.planned_looks}: the "
        f"look failed ({message}); its completed runs are kept"
    )
    state.significant, state.next_round, state.waiting = None, None, None
    store.record_look(experiment_id, state.model_dump(mode="json"), stopped=True)
    store.commit()
