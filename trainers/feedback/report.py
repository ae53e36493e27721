"""The audit protocol of a feedback experiment (paper 002), a cross-run report: each run's D1
and D2 come from its own diagnostics; D3 (depth utility) pairs it with the frozen-block run of
the same condition and seed, which only the stored results of the whole experiment can do.
Served at GET /experiments/{id}/reports/protocol (and /experiments/{id}/protocol)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from api_schemas import GridValue, RunStatus
from trainers.feedback import protocol as checks
from trainers.reports import CrossRunReport, ExperimentRecord, RunRecord

FROZEN_AXIS = "frozen_blocks"
NO_FROZEN_AXIS = (
    "the experiment's grid has no frozen_blocks axis: depth utility (D3) compares each run with "
    "the frozen-block run (frozen_blocks: true) of the same condition and seed; add "
    "frozen_blocks: [false, true] to the grid"
)
STOPPED_NO_D3 = (
    "this run was stopped early on a check (stop_on_checks): its accuracy is that of the epoch "
    "it stopped at, not a final one to compare with its frozen-block run"
)
# Config fields a frozen-block run does not use (its blocks follow no credit rule): a run is
# paired with the frozen run whose condition differs only in these.
BASELINE_IGNORES = (
    "method",
    "penalty",
    "fa_top_credit",
    "fa_skip",
    "vit_credit_tokens",
    "cosine_pairing",
    "store_feedback_matrices",
)


class ProtocolCheck(BaseModel):
    """One check of one run. `fired` is null when the check could not be made (`reason`)."""

    name: str  # scale_stability (D1), reference_validity (D2), depth_utility (D3)
    # D1: rho = max_l ||h_{l+1}|| / ||h_l||; D2: ||dCE/dh_L||; D3: acc - acc_frozen in points.
    value: float | None
    threshold: float | None
    fired: bool | None
    # D1 and D2: the first epoch (0 = at initialisation) at which the check fired.
    first_epoch: int | None = None
    reason: str | None = None


class RunProtocol(BaseModel):
    run_id: int
    condition: dict[str, GridValue]
    condition_key: str
    seed: int
    # completed, or stopped (ended early on a check its spec asked to stop on: its D1 and D2
    # are those of the epoch it stopped at, and it has no D3)
    status: RunStatus = RunStatus.completed
    frozen_blocks: bool
    test_accuracy: float | None
    # D1, D2, D3
    checks: dict[str, ProtocolCheck]
    # PASS, or FAIL(...) listing the checks that fired, over the checks in verdict_checks.
    verdict: str
    verdict_checks: list[str]
    # The frozen-block run D3 compares against.
    frozen_run_id: int | None
    frozen_test_accuracy: float | None
    depth_utility_pp: float | None
    # Gamma_l per layer (null when D2 fired: the cosine then measures floating-point noise).
    per_layer_cosine: list[float | None]
    deep_cos: float | None
    aggregate_cos: float | None


class ProtocolConditionSummary(BaseModel):
    condition: dict[str, GridValue]
    condition_key: str
    n: int
    verdicts: dict[str, int]
    fired: dict[str, int]  # runs in which each check fired
    depth_utility_pp: list[float]
    depth_utility_pp_mean: float | None
    depth_utility_pp_std: float | None


class ProtocolReport(BaseModel):
    experiment_id: int
    trainer: str
    n_runs: int
    # Completed and stopped runs are audited; the others (queued, running, failed, diverged,
    # cancelled) are not.
    n_completed: int
    n_stopped: int = 0
    # D3 needs a frozen_blocks axis in the grid; null reason when it has one.
    frozen_axis: bool
    d3_reason: str | None
    runs: list[RunProtocol]
    conditions: list[ProtocolConditionSummary]


def protocol_report(experiment: ExperimentRecord, runs: Sequence[RunRecord]) -> ProtocolReport:
    """Every completed or stopped run's checks and verdict, and a summary per condition. A
    run's baseline is the frozen run of the same seed whose condition equals the run's on every
    grid axis outside BASELINE_IGNORES (the one that also matches on those when there is
    one)."""
    frozen_axis = FROZEN_AXIS in experiment.grid
    ignores = set(BASELINE_IGNORES) | {FROZEN_AXIS}
    ended = [r for r in runs if r.status in RunStatus.succeeded()]
    baselines = FrozenRuns(runs, ignores)
    audited = [run_protocol(r, baselines, frozen_axis=frozen_axis) for r in ended]
    return ProtocolReport(
        experiment_id=experiment.id,
        trainer=experiment.trainer,
        n_runs=len(runs),
        n_completed=sum(1 for r in ended if r.status == RunStatus.completed),
        n_stopped=sum(1 for r in ended if r.status == RunStatus.stopped),
        frozen_axis=frozen_axis,
        d3_reason=None if frozen_axis else NO_FROZEN_AXIS,
        runs=audited,
        conditions=condition_summaries(audited),
    )


PROTOCOL_REPORT = CrossRunReport(
    name="protocol",
    description="The audit protocol of every completed or stopped run (D1 scale stability, "
    "D2 reference validity, D3 depth utility against its frozen-block run) and its "
    "verdict, with a summary per condition.",
    response_model=ProtocolReport,
    build=protocol_report,
)


def run_protocol(run: RunRecord, baselines: FrozenRuns, *, frozen_axis: bool) -> RunProtocol:
    """One run's D1 and D2 (stored by the trainer), its D3 and its verdict."""
    stored: dict[str, Any] = run.diagnostics.get("protocol") or {}
    stored_checks = stored.get("checks", {})
    d1 = _stored_check("D1", "scale_stability", stored_checks)
    d2 = _stored_check("D2", "reference_validity", stored_checks)
    accuracy = _number(run.metrics.get("test_accuracy"))
    frozen = bool(run.config.get(FROZEN_AXIS, False))
    baseline: RunRecord | None = None
    utility: float | None = None
    margin = float(run.config.get("depth_utility_margin_pp", checks.DEPTH_UTILITY_MARGIN_PP))
    if not frozen_axis:
        reason: str | None = NO_FROZEN_AXIS
    elif frozen:
        reason = "this run is a frozen-block baseline"
    elif run.status == RunStatus.stopped:
        reason = STOPPED_NO_D3
    else:
        baseline, reason = baselines.find(run)
        frozen_accuracy = _number(baseline.metrics.get("test_accuracy")) if baseline else None
        if baseline is not None and reason is None:
            if accuracy is None or frozen_accuracy is None:
                reason = "test_accuracy is missing from this run or its frozen-block run"
            else:
                utility = checks.depth_utility_pp(accuracy, frozen_accuracy)
    d3 = ProtocolCheck(
        name="depth_utility",
        value=utility,
        threshold=margin,
        fired=None if utility is None else checks.depth_check_fires(utility, margin),
        reason=reason,
    )
    made = {name: c for name, c in (("D1", d1), ("D2", d2), ("D3", d3)) if c.fired is not None}
    return RunProtocol(
        run_id=run.id,
        condition=dict(run.condition),
        condition_key=run.condition_key,
        seed=run.seed,
        status=run.status,
        frozen_blocks=frozen,
        test_accuracy=accuracy,
        checks={"D1": d1, "D2": d2, "D3": d3},
        verdict=checks.verdict(name for name, c in made.items() if c.fired),
        verdict_checks=list(made),
        frozen_run_id=baseline.id if baseline is not None else None,
        frozen_test_accuracy=(
            _number(baseline.metrics.get("test_accuracy")) if baseline is not None else None
        ),
        depth_utility_pp=utility,
        per_layer_cosine=[_number(v) for v in stored.get("per_layer_cosine", [])],
        deep_cos=_number(stored.get("deep_cos")),
        aggregate_cos=_number(stored.get("aggregate_cos")),
    )


class FrozenRuns:
    """The frozen-block runs of an experiment indexed by seed and condition (outside the
    ignored axes), so that finding every run's baseline is one pass, not one scan per run."""

    def __init__(self, runs: Sequence[RunRecord], ignores: set[str]) -> None:
        self.ignores = ignores
        self.by_key: dict[tuple[int, tuple[tuple[str, str], ...]], list[RunRecord]] = {}
        for r in runs:
            if r.config.get(FROZEN_AXIS):
                self.by_key.setdefault((r.seed, _key(r.condition, ignores)), []).append(r)

    def find(self, run: RunRecord) -> tuple[RunRecord | None, str | None]:
        """The frozen-block run for `run` (same seed, same condition on every axis outside
        the ignored ones, an exact match on those preferred) and, when it cannot serve, why."""
        candidates = self.by_key.get((run.seed, _key(run.condition, self.ignores)), [])
        if not candidates:
            return None, (
                f"no frozen-block run with seed {run.seed} matches condition {run.condition_key!r}"
            )
        exact = _key(run.condition, {FROZEN_AXIS})
        best = min(
            candidates,
            key=lambda r: (
                _key(r.condition, {FROZEN_AXIS}) != exact,
                r.status != RunStatus.completed,
                r.id,
            ),
        )
        if best.status != RunStatus.completed:
            return best, f"the matching frozen-block run {best.id} is {best.status}, not completed"
        return best, None


def _key(condition: Mapping[str, GridValue], skip: set[str]) -> tuple[tuple[str, str], ...]:
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
        out.append(
            ProtocolConditionSummary(
                condition=members[0].condition,
                condition_key=key,
                n=len(members),
                verdicts=verdicts,
                fired={
                    name: sum(1 for r in members if r.checks[name].fired) for name in checks.CHECKS
                },
                depth_utility_pp=utilities,
                depth_utility_pp_mean=statistics.fmean(utilities) if utilities else None,
                depth_utility_pp_std=statistics.stdev(utilities) if len(utilities) > 1 else None,
            )
        )
    return out


def _stored_check(name: str, label: str, stored: dict[str, Any]) -> ProtocolCheck:
    check = stored.get(name)
    if not isinstance(check, dict) or not isinstance(check.get("fired"), bool):
        return ProtocolCheck(
            name=label,
            value=None,
            threshold=None,
            fired=None,
            reason="the run stored no protocol diagnostics",
        )
    return ProtocolCheck(
        name=label,
        value=_number(check.get("value")),
        threshold=_number(check.get("threshold")),
        fired=check["fired"],
        first_epoch=check.get("first_epoch"),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
