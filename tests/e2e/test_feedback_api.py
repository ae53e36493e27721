"""The `feedback` trainer and its protocol report: the pairing and verdict logic on plain records,
and grids end to end through the HTTP API on a real local Ray and SQLite."""

from __future__ import annotations

import re
import statistics
from typing import Any

import pytest

from api_schemas import RunStatus
from tests.conftest import Service
from tests.trainers.test_feedback import RESMLP_D2, STUDENT_D1
from trainers.feedback import decode_feedback
from trainers.feedback.report import NO_FROZEN_AXIS, STOPPED_NO_D3, protocol_report
from trainers.reports import ExperimentRecord, RunRecord

VERDICT = re.compile(r"^(PASS|FAIL\((D1|D2|D3)(\+(D2|D3))*\))$")

# CPU-scale StudentNet: a 6-dimensional teacher (tanh with gain 6, 10 classes) that a linear
# read-out cannot follow, 4 residual blocks of width 128 without terminal LayerNorm, the
# embedding left at its random init (the spec's pseudo-code), Adam 5e-3, 30 epochs of 4,000
# fresh samples. Measured with these settings (seeds 0-5, one thread, as in a Ray worker):
# BP passes every check (rho <= 1.9, ||g_L|| ~ 1e-3, 3.1-5.4 points over its frozen baseline);
# DFA trips D1 at epochs 22-28 (rho 53-61) while ||g_L|| stays at 7e-6 .. 6e-5 (no D2);
# FA trips D1 at epochs 23-28 (rho 51-66), ||g_L|| >= 2.7e-7. About 15-22 s per run on a core.
STUDENT_GRID = {
    "arch": "studentnet",
    "width": 128,
    "depth": 4,
    "student_input_dim": 6,
    "teacher_gain": 6.0,
    "teacher_depth": 1,
    "student_train_size": 4000,
    "student_test_size": 1000,
    "eval_batch_size": 256,
    "batch_size": 64,
    "epochs": 30,
    "lr": 0.005,
    "embed_credit": "none",
    "device": "cpu",
}
STUDENT_EPOCHS = 30
SEEDS = 2


# ---------------------------------------------------------------------------------------------
# pairing and verdicts on plain records (no database)


def _checks(d1: bool = False, d2: bool = False) -> dict[str, Any]:
    return {
        "protocol": {
            "checks": {
                "D1": {
                    "value": 80.0 if d1 else 3.0,
                    "threshold": 50.0,
                    "fired": d1,
                    "first_epoch": 4 if d1 else None,
                },
                "D2": {
                    "value": 1e-9 if d2 else 1e-3,
                    "threshold": 1e-7,
                    "fired": d2,
                    "first_epoch": 2 if d2 else None,
                },
            },
            "per_layer_cosine": [1.0, None],
            "deep_cos": None,
            "aggregate_cos": 0.5,
        }
    }


BASE_CONFIG = {"depth_utility_margin_pp": 2.0}


def _run(
    run_id: int,
    seed: int,
    accuracy: float,
    *,
    status: str = "completed",
    diagnostics: dict[str, Any] | None = None,
    **condition: Any,
) -> RunRecord:
    key = ",".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(condition.items())
    )
    return RunRecord(
        id=run_id,
        condition=condition,
        condition_key=key,
        seed=seed,
        status=RunStatus(status),
        config={**BASE_CONFIG, **condition},
        metrics={"test_accuracy": accuracy},
        diagnostics=_checks() if diagnostics is None else diagnostics,
    )


def _experiment(grid: dict[str, list[Any]]) -> ExperimentRecord:
    return ExperimentRecord(id=1, name="audit", trainer="feedback", config=BASE_CONFIG, grid=grid)


def _report(runs: list[RunRecord], grid: dict[str, list[Any]] | None = None) -> dict[int, Any]:
    grid = {"method": ["bp", "dfa"], "frozen_blocks": [False, True]} if grid is None else grid
    report = protocol_report(_experiment(grid), runs)
    return {r.run_id: r for r in report.runs}


def test_depth_utility_fires_exactly_below_two_points() -> None:
    runs = [
        _run(1, 0, 0.35, method="bp", frozen_blocks=False),
        _run(2, 0, 0.33, method="bp", frozen_blocks=True),
        _run(3, 1, 0.3499, method="bp", frozen_blocks=False),
        _run(4, 1, 0.33, method="bp", frozen_blocks=True),
    ]
    by_id = _report(runs)
    assert by_id[1].depth_utility_pp == 2.0  # not 1.9999999999999996
    assert by_id[1].checks["D3"].fired is False and by_id[1].verdict == "PASS"
    assert by_id[1].verdict_checks == ["D1", "D2", "D3"]
    assert by_id[3].depth_utility_pp == pytest.approx(1.99)
    assert by_id[3].verdict == "FAIL(D3)"
    assert (by_id[1].frozen_run_id, by_id[3].frozen_run_id) == (2, 4)
    assert by_id[2].checks["D3"].fired is None
    assert by_id[2].checks["D3"].reason == "this run is a frozen-block baseline"
    assert by_id[2].verdict == "PASS" and by_id[2].verdict_checks == ["D1", "D2"]


def test_verdict_lists_every_fired_check_in_order() -> None:
    runs = [
        _run(1, 0, 0.30, diagnostics=_checks(d1=True, d2=True), method="dfa", frozen_blocks=False),
        _run(2, 0, 0.40, method="dfa", frozen_blocks=True),
    ]
    run = _report(runs)[1]
    assert run.verdict == "FAIL(D1+D2+D3)"
    assert run.checks["D1"].first_epoch == 4 and run.checks["D2"].value == 1e-9
    assert run.depth_utility_pp == -10.0
    assert run.per_layer_cosine == [1.0, None]


def test_baseline_is_the_same_condition_and_seed_else_one_differing_only_in_ignored_fields() -> (
    None
):
    runs = [
        _run(1, 0, 0.5, method="dfa", penalty=0.0, frozen_blocks=False),
        _run(2, 0, 0.3, method="bp", penalty=0.0, frozen_blocks=True),
        _run(3, 0, 0.4, method="dfa", penalty=0.0, frozen_blocks=True),
        _run(4, 1, 0.5, method="fa", penalty=0.0, frozen_blocks=False),
        _run(5, 2, 0.5, method="fa", penalty=0.0, frozen_blocks=False),
    ]
    grid = {"method": ["bp", "fa", "dfa"], "penalty": [0.0], "frozen_blocks": [False, True]}
    by_id = _report(runs, grid)
    assert by_id[1].frozen_run_id == 3  # the exact match, not run 2
    assert by_id[1].depth_utility_pp == 10.0
    assert by_id[4].frozen_run_id is None and by_id[4].checks["D3"].fired is None
    assert by_id[4].checks["D3"].reason == (
        "no frozen-block run with seed 1 matches condition 'frozen_blocks=false,method=fa,"
        "penalty=0.0'"
    )
    # the frozen run of seed 0 serves seed 0 only; a method-only difference is allowed
    runs.append(_run(6, 2, 0.45, method="bp", penalty=0.0, frozen_blocks=True))
    assert _report(runs, grid)[5].frozen_run_id == 6


def test_a_baseline_that_did_not_complete_is_named_and_d3_left_out() -> None:
    runs = [
        _run(1, 0, 0.5, method="dfa", frozen_blocks=False),
        _run(2, 0, 0.3, status="failed", method="dfa", frozen_blocks=True),
    ]
    run = _report(runs)[1]
    assert run.checks["D3"].reason == "the matching frozen-block run 2 is failed, not completed"
    assert run.depth_utility_pp is None and run.verdict == "PASS"
    assert run.verdict_checks == ["D1", "D2"]


def test_without_a_frozen_axis_d3_is_null_with_the_reason() -> None:
    runs = [_run(1, 0, 0.5, diagnostics=_checks(d1=True), method="dfa")]
    report = protocol_report(_experiment({"method": ["dfa"]}), runs)
    assert report.frozen_axis is False and report.d3_reason == NO_FROZEN_AXIS
    (run,) = report.runs
    assert run.checks["D3"].fired is None and run.checks["D3"].reason == NO_FROZEN_AXIS
    assert run.verdict == "FAIL(D1)" and run.verdict_checks == ["D1", "D2"]


def test_runs_without_protocol_diagnostics_and_unfinished_runs() -> None:
    runs = [
        _run(1, 0, 0.5, diagnostics={}, method="bp", frozen_blocks=False),
        _run(2, 0, 0.4, method="bp", frozen_blocks=True),
        _run(3, 1, 0.5, status="running", method="bp", frozen_blocks=False),
    ]
    report = protocol_report(_experiment({"frozen_blocks": [False, True]}), runs)
    assert (report.n_runs, report.n_completed) == (3, 2)
    run = {r.run_id: r for r in report.runs}[1]
    assert run.checks["D1"].fired is None
    assert run.checks["D1"].reason == "the run stored no protocol diagnostics"
    assert run.verdict == "PASS" and run.verdict_checks == ["D3"]


def test_a_stopped_run_is_audited_on_d1_and_d2_without_d3() -> None:
    stop = {"checks": ["D2"], "epoch": 2, "step": 20, "reason": "D2 fired"}
    runs = [
        _run(
            1,
            0,
            0.5,
            status="stopped",
            method="dfa",
            frozen_blocks=False,
            diagnostics={**_checks(d2=True), "stop": stop},
        ),
        _run(2, 0, 0.3, method="dfa", frozen_blocks=True),
        _run(3, 1, 0.5, status="diverged", method="dfa", frozen_blocks=False),
    ]
    report = protocol_report(_experiment({"frozen_blocks": [False, True]}), runs)
    assert (report.n_runs, report.n_completed, report.n_stopped) == (3, 1, 1)
    run = {r.run_id: r for r in report.runs}[1]
    assert run.status == RunStatus.stopped and run.verdict == "FAIL(D2)"
    assert run.checks["D3"].fired is None and run.checks["D3"].reason == STOPPED_NO_D3
    assert run.frozen_run_id is None and run.verdict_checks == ["D1", "D2"]
    assert 3 not in {r.run_id for r in report.runs}


def test_condition_summary_counts_verdicts_and_summarises_depth_utility() -> None:
    runs = []
    for seed, (acc, frozen) in enumerate([(0.50, 0.40), (0.45, 0.40), (0.41, 0.40)]):
        runs += [
            _run(10 + seed, seed, acc, method="bp", frozen_blocks=False),
            _run(20 + seed, seed, frozen, method="bp", frozen_blocks=True),
        ]
    report = protocol_report(_experiment({"frozen_blocks": [False, True]}), runs)
    trained = next(c for c in report.conditions if c.condition["frozen_blocks"] is False)
    assert trained.n == 3 and trained.verdicts == {"PASS": 2, "FAIL(D3)": 1}
    assert trained.fired == {"D1": 0, "D2": 0, "D3": 1}
    assert trained.depth_utility_pp == pytest.approx([10.0, 5.0, 1.0])
    assert trained.depth_utility_pp_mean == pytest.approx(statistics.fmean([10, 5, 1]))
    assert trained.depth_utility_pp_std == pytest.approx(statistics.stdev([10, 5, 1]))


# ---------------------------------------------------------------------------------------------
# through the HTTP API


@pytest.mark.timeout(900)
def test_studentnet_grid_gives_every_run_its_verdict(service: Service) -> None:
    """Every run of a 3 x 2 grid (two seeds each: every assertion below is per run or per
    condition) gets its verdict, its baseline and the pairing the report promises."""
    created = service.submit(
        {
            "name": "feedback-studentnet-audit",
            "trainer": "feedback",
            "config": STUDENT_GRID,
            "grid": {"method": ["bp", "fa", "dfa"], "frozen_blocks": [False, True]},
            "seeds": SEEDS,
        }
    )
    assert created["n_runs"] == 6 * SEEDS
    detail = service.wait(created["id"], timeout_s=840)
    assert detail["counts"]["completed"] == 6 * SEEDS, detail
    runs = {r["id"]: r for r in service.runs(created["id"])}
    response = service.client.get(f"/experiments/{created['id']}/protocol")
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["n_completed"], report["frozen_axis"], report["d3_reason"]) == (
        6 * SEEDS,
        True,
        None,
    )
    assert len(report["runs"]) == 6 * SEEDS
    for audited in report["runs"]:
        run = runs[audited["run_id"]]
        method, frozen = run["condition"]["method"], run["condition"]["frozen_blocks"]
        checks = audited["checks"]
        assert VERDICT.match(audited["verdict"]), audited
        # the run's own diagnostics carry its D1/D2 verdict, which the report extends
        own = run["diagnostics"]["protocol"]
        assert own["verdict_checks"] == ["D1", "D2"]
        assert own["checks"]["D1"]["fired"] == checks["D1"]["fired"]
        # D2 never fires without a terminal LayerNorm, at any epoch
        assert checks["D2"]["fired"] is False and checks["D2"]["first_epoch"] is None
        if frozen:
            assert checks["D3"]["fired"] is None and audited["frozen_run_id"] is None
            continue
        baseline = runs[audited["frozen_run_id"]]
        assert baseline["seed"] == run["seed"]
        assert baseline["condition"] == {"method": method, "frozen_blocks": True}
        expected = round(
            100 * (run["metrics"]["test_accuracy"] - baseline["metrics"]["test_accuracy"]), 9
        )
        assert audited["depth_utility_pp"] == pytest.approx(expected, abs=1e-9)
        assert checks["D3"]["fired"] == (expected < 2.0)
        fired = [c for c in ("D1", "D2", "D3") if checks[c]["fired"]]
        assert audited["verdict"] == ("PASS" if not fired else f"FAIL({'+'.join(fired)})")
        if method == "bp":  # BP passes every check: D1 and D2 at every epoch, and D3
            assert checks["D1"]["fired"] is False and checks["D1"]["first_epoch"] is None
            assert audited["depth_utility_pp"] >= 2.0 and audited["verdict"] == "PASS", audited
            assert run["warnings"] == []
        if method == "dfa":  # DFA's residual stream explodes: D1 fires, and is stored early
            assert checks["D1"]["fired"] is True and audited["verdict"].startswith("FAIL(D1")
            first = checks["D1"]["first_epoch"]
            curve = service.client.get(
                f"/runs/{run['id']}/metrics", params={"name": "residual_growth_max"}
            ).json()
            # 0 = initialisation
            assert [p["epoch"] for p in curve] == list(range(STUDENT_EPOCHS + 1))
            assert [p["epoch"] for p in curve if p["value"] > 50][0] == first
            assert {w["diagnostic"] for w in run["warnings"]} == {"residual_growth_max"}
    summary = {c["condition_key"]: c for c in report["conditions"]}
    assert len(summary) == 6 and all(c["n"] == SEEDS for c in summary.values())
    assert summary["frozen_blocks=false,method=dfa"]["fired"]["D1"] == SEEDS
    assert summary["frozen_blocks=false,method=bp"]["fired"]["D1"] == 0
    assert len(summary["frozen_blocks=false,method=bp"]["depth_utility_pp"]) == SEEDS
    stats = service.client.get(
        f"/experiments/{created['id']}/stats", params={"metric": "residual_growth_max"}
    ).json()
    assert len(stats["conditions"]) == 6


def test_resmlp_dfa_on_digits_stores_an_exploding_stream_and_its_feedback_matrices(
    service: Service,
) -> None:
    created = service.submit(
        {
            "name": "feedback-resmlp-digits-dfa",
            "trainer": "feedback",
            "config": {
                "arch": "resmlp",
                "dataset": "digits",
                "width": 32,
                "depth": 2,
                "epochs": 5,
                "batch_size": 32,
                "lr": 0.01,
                "method": "dfa",
                "device": "cpu",
            },
            "seeds": 1,
        }
    )
    detail = service.wait(created["id"], timeout_s=120)
    assert detail["counts"]["completed"] == 1, detail
    (run,) = service.runs(created["id"])
    curve = service.client.get(
        f"/runs/{run['id']}/metrics", params={"name": "h_norm_layer2"}
    ).json()
    assert [p["epoch"] for p in curve] == [0, 1, 2, 3, 4, 5]
    assert curve[-1]["value"] > 100 * curve[0]["value"]  # two orders of magnitude or more
    matrices = decode_feedback(run["diagnostics"]["feedback_matrices"])
    assert {n: list(b.shape) for n, b in matrices.items()} == {
        "B_h0": [10, 32],
        "B_h1": [10, 32],
        "B_h2": [10, 32],
    }
    report = service.client.get(f"/experiments/{created['id']}/protocol").json()
    assert service.client.get(f"/experiments/{created['id']}/reports/protocol").json() == report
    assert report["frozen_axis"] is False and "frozen_blocks" in report["d3_reason"]
    (audited,) = report["runs"]
    assert audited["checks"]["D3"] == {
        "name": "depth_utility",
        "value": None,
        "threshold": 2.0,
        "fired": None,
        "first_epoch": None,
        "reason": report["d3_reason"],
    }
    assert audited["verdict_checks"] == ["D1", "D2"]


def test_protocol_errors(service: Service) -> None:
    assert service.client.get("/experiments/987654/protocol").status_code == 404
    assert service.client.get("/experiments/0/protocol").status_code == 422
    other = service.submit(
        {
            "name": "not-feedback",
            "trainer": "collapse",
            "config": {"n_samples": 16, "steps": 5},
            "seeds": 1,
        }
    )
    for path in ("protocol", "reports/protocol"):
        response = service.client.get(f"/experiments/{other['id']}/{path}")
        assert response.status_code == 404
        assert response.json()["detail"] == (
            f"experiment {other['id']} ran trainer 'collapse', which has no 'protocol' report "
            "(its reports: none); 'protocol' is a report of trainer 'feedback'"
        )
    trainers = {t["name"]: t for t in service.client.get("/trainers").json()}
    assert trainers["feedback"]["reports"] == ["protocol"]
    assert trainers["collapse"]["reports"] == []
    bad = service.client.post(
        "/experiments",
        json={
            "name": "bad",
            "trainer": "feedback",
            "config": {"arch": "studentnet"},
            "grid": {"method": ["bp", "ep"]},
            "seeds": 1,
        },
    )
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "grid", "method", 1]


def test_runs_stopped_by_their_checks_read_back_with_verdict_epoch_and_reason(
    backend_service: Service,
) -> None:
    """D2 on a ResMLP with its terminal LayerNorm on digits (D1 fires first but was not asked
    for), D1 on StudentNet (where D2 never fires): each run ends `stopped` at the epoch its
    check fired, and the API serves the stop, the verdict and the curves up to that epoch."""
    service = backend_service
    resmlp = service.submit(
        {
            "name": "stop-on-d2",
            "trainer": "feedback",
            "config": RESMLP_D2,
            "seeds": 1,
            "stop_on_checks": ["D2"],
        }
    )
    student = service.submit(
        {
            "name": "stop-on-d1",
            "trainer": "feedback",
            "config": STUDENT_D1,
            "seeds": 1,
            "stop_on_checks": ["D1", "D2"],
        }
    )
    for created, check, other in ((resmlp, "D2", "D1"), (student, "D1", "D2")):
        detail = service.wait(created["id"], timeout_s=180)
        assert detail["status"] == "completed", detail  # stopped as asked: not partial
        assert detail["counts"]["stopped"] == 1 and detail["counts"]["completed"] == 0
        (run,) = service.client.get(
            f"/experiments/{created['id']}/runs", params={"status": "stopped"}
        ).json()
        stop = service.client.get(f"/runs/{run['id']}").json()["stop"]
        assert stop == run["stop"] and stop["checks"] == [check] and run["error"] is None
        protocol = run["diagnostics"]["protocol"]
        assert protocol["checks"][check]["first_epoch"] == stop["epoch"] > 0
        assert protocol["verdict"].startswith("FAIL(") and check in protocol["verdict"]
        name = "ref_grad_norm" if check == "D2" else "residual_growth_max"
        label = {"D1": "D1 scale stability", "D2": "D2 reference validity"}[check]
        assert stop["reason"].startswith(f"{label} fired at epoch {stop['epoch']}: {name} ")
        curve = service.client.get(f"/runs/{run['id']}/metrics", params={"name": name}).json()
        assert [p["epoch"] for p in curve] == list(range(stop["epoch"] + 1))  # none after it
        fired = [
            p["epoch"] for p in curve if (p["value"] < 1e-7 if check == "D2" else p["value"] > 50)
        ]
        assert fired[0] == stop["epoch"]
        if check == "D1":  # StudentNet: D2 did not fire at any epoch up to the stop
            assert protocol["checks"][other]["first_epoch"] is None
        else:  # ResMLP: D1 fired at an earlier epoch without stopping the run
            assert protocol["checks"][other]["first_epoch"] < stop["epoch"]
        report = service.client.get(f"/experiments/{created['id']}/protocol").json()
        assert (report["n_completed"], report["n_stopped"]) == (0, 1)
        assert report["runs"][0]["status"] == "stopped"
        assert report["runs"][0]["verdict"] == protocol["verdict"]
        stats = service.client.get(f"/experiments/{created['id']}/stats").json()
        assert stats["n_completed"] == 0  # a stopped run's final metric is not comparable
        assert all(c["n"] == 0 for c in stats["conditions"])
    # a trainer without checks, or a check the trainer cannot stop on: a 422 naming the field
    for trainer, config, checks, message in (
        (
            "collapse",
            {"n_samples": 16, "steps": 5},
            ["D1"],
            "trainer 'collapse' has no checks a run can stop on",
        ),
        (
            "feedback",
            {"arch": "studentnet"},
            ["D1", "D3"],
            "unknown check 'D3' of trainer 'feedback'; a run can stop on: D1, D2",
        ),
    ):
        bad = service.client.post(
            "/experiments",
            json={
                "name": "bad",
                "trainer": trainer,
                "config": config,
                "seeds": 1,
                "stop_on_checks": checks,
            },
        )
        assert bad.status_code == 422, bad.text
        (error,) = bad.json()["detail"]
        assert error["loc"] == ["body", "stop_on_checks", len(checks) - 1]
        assert message in error["msg"]
    repeated = service.client.post(
        "/experiments",
        json={"name": "bad", "trainer": "feedback", "seeds": 1, "stop_on_checks": ["D1", "D1"]},
    )
    assert repeated.status_code == 422
    assert repeated.json()["detail"][0]["loc"] == ["body", "stop_on_checks"]
    trainers = {t["name"]: t for t in service.client.get("/trainers").json()}
    assert trainers["feedback"]["stop_checks"] == ["D1", "D2"]
    assert trainers["collapse"]["stop_checks"] == []
