"""The feedback-alignment audit protocol of an experiment (paper 002): each run's D1 and D2
come from its own diagnostics; D3 (depth utility) pairs it with the frozen-block run of the same
condition and seed, which only the stored results of the whole experiment can do."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from api_schemas import (
    GridValue,
    ProtocolCheck,
    ProtocolConditionSummary,
    ProtocolReport,
    RunProtocol,
    RunStatus,
)
from service.db import Experiment, Run
from trainers.feedback import protocol as checks

FROZEN_AXIS = "frozen_blocks"
NO_FROZEN_AXIS = (
    "the experiment's grid has no frozen_blocks axis: depth utility (D3) compares each run with "
    "the frozen-block run (frozen_blocks: true) of the same condition and seed; add "
    "frozen_blocks: [false, true] to the grid"
)


def protocol_report(*, experiment: Experiment, runs: Sequence[Run],
                    baseline_ignores: Iterable[str] = ()) -> ProtocolReport:
    """Every completed run's checks and verdict, and a summary per condition.

    `baseline_ignores`: config fields a frozen-block run does not use; a run's baseline is the
    frozen run of the same seed whose condition equals the run's on every other grid axis
    (the one that also matches on these fields when there is one).
    """
    assert experiment.id is not None
    frozen_axis = FROZEN_AXIS in experiment.spec.get("grid", {})
    ignores = set(baseline_ignores) | {FROZEN_AXIS}
    completed = [r for r in runs if r.status == RunStatus.completed.value]
    base: dict[str, Any] = experiment.spec.get("config", {})
    baselines = FrozenRuns(runs, ignores, base)
    audited = [run_protocol(r, baselines, base=base, frozen_axis=frozen_axis)
               for r in completed]
    return ProtocolReport(
        experiment_id=experiment.id,
        trainer=experiment.trainer,
        n_runs=len(runs),
        n_completed=len(completed),
        frozen_axis=frozen_axis,
        d3_reason=None if frozen_axis else NO_FROZEN_AXIS,
        runs=audited,
        conditions=condition_summaries(audited),
    )


def run_protocol(run: Run, baselines: FrozenRuns, *, base: dict[str, Any],
                 frozen_axis: bool) -> RunProtocol:
    """One run's D1 and D2 (stored by the trainer), its D3 and its verdict. `base`: the
    experiment's base config, which the run's condition completes."""
    config = {**base, **run.condition}
    assert run.id is not None
    stored: dict[str, Any] = run.diagnostics.get("protocol") or {}
    stored_checks = stored.get("checks", {})
    d1 = _stored_check("D1", "scale_stability", stored_checks)
    d2 = _stored_check("D2", "reference_validity", stored_checks)
    accuracy = _number(run.metrics.get("test_accuracy"))
    frozen = bool(config.get(FROZEN_AXIS, False))
    baseline: Run | None = None
    utility: float | None = None
    margin = float(config.get("depth_utility_margin_pp",
                                  checks.DEPTH_UTILITY_MARGIN_PP))
    if not frozen_axis:
        reason: str | None = NO_FROZEN_AXIS
    elif frozen:
        reason = "this run is a frozen-block baseline"
    else:
        baseline, reason = baselines.find(run)
        frozen_accuracy = _number(baseline.metrics.get("test_accuracy")) if baseline else None
        if baseline is not None and reason is None:
            if accuracy is None or frozen_accuracy is None:
                reason = "test_accuracy is missing from this run or its frozen-block run"
            else:
                utility = checks.depth_utility_pp(accuracy, frozen_accuracy)
    d3 = ProtocolCheck(
        name="depth_utility", value=utility, threshold=margin,
        fired=None if utility is None else checks.depth_check_fires(utility, margin),
        reason=reason,
    )
    made = {name: c for name, c in (("D1", d1), ("D2", d2), ("D3", d3)) if c.fired is not None}
    return RunProtocol(
        run_id=run.id,
        condition=run.condition,
        condition_key=run.condition_key,
        seed=run.seed,
        frozen_blocks=frozen,
        test_accuracy=accuracy,
        checks={"D1": d1, "D2": d2, "D3": d3},
        verdict=checks.verdict(name for name, c in made.items() if c.fired),
        verdict_checks=list(made),
        frozen_run_id=baseline.id if baseline is not None else None,
        frozen_test_accuracy=(_number(baseline.metrics.get("test_accuracy"))
                              if baseline is not None else None),
        depth_utility_pp=utility,
        per_layer_cosine=[_number(v) for v in stored.get("per_layer_cosine", [])],
        deep_cos=_number(stored.get("deep_cos")),
        aggregate_cos=_number(stored.get("aggregate_cos")),
    )


class FrozenRuns:
    """The frozen-block runs of an experiment indexed by seed and condition (outside the
    ignored axes), so that finding every run's baseline is one pass, not one scan per run."""

    def __init__(self, runs: Sequence[Run], ignores: set[str], base: dict[str, Any]) -> None:
        self.ignores = ignores
        self.by_key: dict[tuple[int, tuple[tuple[str, str], ...]], list[Run]] = {}
        for r in runs:
            if {**base, **r.condition}.get(FROZEN_AXIS):
                self.by_key.setdefault((r.seed, _key(r.condition, ignores)), []).append(r)

    def find(self, run: Run) -> tuple[Run | None, str | None]:
        """The frozen-block run for `run` (same seed, same condition on every axis outside
        the ignored ones, an exact match on those preferred) and, when it cannot serve, why."""
        candidates = self.by_key.get((run.seed, _key(run.condition, self.ignores)), [])
        if not candidates:
            return None, (f"no frozen-block run with seed {run.seed} matches condition "
                          f"{run.condition_key!r}")
        exact = _key(run.condition, {FROZEN_AXIS})
        best = min(candidates, key=lambda r: (_key(r.condition, {FROZEN_AXIS}) != exact,
                                              r.status != RunStatus.completed.value, r.id or 0))
        if best.status != RunStatus.completed.value:
            return best, f"the matching frozen-block run {best.id} is {best.status}, not completed"
        return best, None


def _key(condition: dict[str, GridValue], skip: set[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in condition.items() if k not in skip))


def condition_summaries(audited: Sequence[RunProtocol]) -> list[ProtocolConditionSummary]:
    """Per condition (in first-seen order): verdict counts over seeds, how often each check
    fired, and the depth utility's values, mean and sample standard deviation."""
    groups: dict[str, list[RunProtocol]] = {}
    for r in audited:
        groups.setdefault(r.condition_key, []).append(r)
    out = []
    for key, members in groups.items():
        verdicts: dict[str, int] = {}
        for r in members:
            verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
        utilities = [r.depth_utility_pp for r in members if r.depth_utility_pp is not None]
        out.append(ProtocolConditionSummary(
            condition=members[0].condition,
            condition_key=key,
            n=len(members),
            verdicts=verdicts,
            fired={name: sum(1 for r in members if r.checks[name].fired)
                   for name in checks.CHECKS},
            depth_utility_pp=utilities,
            depth_utility_pp_mean=statistics.fmean(utilities) if utilities else None,
            depth_utility_pp_std=statistics.stdev(utilities) if len(utilities) > 1 else None,
        ))
    return out


def _stored_check(name: str, label: str, stored: dict[str, Any]) -> ProtocolCheck:
    check = stored.get(name)
    if not isinstance(check, dict) or not isinstance(check.get("fired"), bool):
        return ProtocolCheck(name=label, value=None, threshold=None, fired=None,
                             reason="the run stored no protocol diagnostics")
    return ProtocolCheck(name=label, value=_number(check.get("value")),
                         threshold=_number(check.get("threshold")), fired=check["fired"],
                         first_epoch=check.get("first_epoch"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
