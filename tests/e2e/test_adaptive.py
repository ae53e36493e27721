"""Studies that grow after the first look, through HTTP on a real Ray and both databases: an
adaptive experiment adds seeds in rounds and records why it stopped; seeds added by hand join an
experiment's statistics; two experiments compare side by side.

The toy trainer (tests/e2e/toy_trainer.py) makes the truth known: its loss after T steps is
(1 - 2 lr)^(2T) ||w0||^2 with w0 drawn from the seed, so two learning rates run on the same
seeds have a variance ratio of exactly ((1 - 2 lr_a) / (1 - 2 lr_b))^(4T)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import Service
from tests.e2e.toy_trainer import ToyTrainer
from trainers import REGISTRY

STEPS = 3
RATIO = (0.8 / 0.6) ** (4 * STEPS)  # lr 0.1 vs 0.2: 31.6


@pytest.fixture
def start_service(start_backend_service: Callable[..., Service]) -> Callable[..., Service]:
    return start_backend_service


@pytest.fixture
def service(backend_service: Service, monkeypatch: pytest.MonkeyPatch) -> Service:
    monkeypatch.setitem(REGISTRY, "toy", ToyTrainer())  # the workers have it from conftest
    return backend_service


def toy(name: str, lrs: list[float], **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "trainer": "toy",
        "config": {"steps": STEPS, "log_every": 1},
        "grid": {"lr": lrs},
        **fields,
    }


def cli(service: Service, *args: str) -> str:
    """The seedgrid command's output against the test's service."""
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--url", service.server.url],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_ended(service: Service, experiment_id: int, timeout_s: float = 120.0) -> dict[str, Any]:
    """The experiment once its status has ended (an adaptive one between rounds has no run
    queued or running, yet is still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        detail = service.client.get(f"/experiments/{experiment_id}").json()
        if detail["status"] not in ("queued", "running"):
            return detail
        time.sleep(0.1)
    raise AssertionError(f"experiment {experiment_id} did not end: {detail}")


def test_an_adaptive_experiment_adds_rounds_until_its_interval_excludes_one(
    service: Service,
) -> None:
    rule = {
        "comparison": {"factor": "lr", "a": 0.1, "b": 0.2},
        "target": "var_ratio",
        "min_seeds": 4,
        "step": 4,
        "max_seeds": 8,
        "alpha": 0.05,
    }
    created = service.submit(toy("adaptive", [0.1, 0.2], adaptive=rule))
    assert created["n_runs"] == 8  # the first round only
    detail = wait_ended(service, created["id"])
    assert detail["status"] == "completed" and detail["n_runs"] == 16, detail
    state = detail["adaptive"]
    assert state["planned_looks"] == 2 and state["alpha_per_look"] == pytest.approx(0.025)
    first, second = state["looks"]
    for look, n in ((first, 4), (second, 8)):
        assert (look["n_a"], look["n_b"], look["seeds_per_condition"]) == (n, n, n)
        assert look["estimate"] == pytest.approx(RATIO, rel=1e-6)
    # Look 1, 4 seeds: 16 sign flips are too few, so the unpaired test, whose 20 splits (3 + 3
    # deviations: a 4-seed cell's structural tie is left out) cannot reach 0.025: the interval
    # is [0, inf].
    assert first["test"].startswith("stratified permutation") and first["interval"] == [0, None]
    assert "20 re-assignments are too few" in first["note"]
    # Look 2, 8 shared seeds: the sign-flip test. Each seed's loss at lr 0.1 is RATIO^(1/2)
    # times its loss at lr 0.2, so every ratio but RATIO is rejected: the interval is a point.
    assert second["test"].startswith("paired sign-flip") and second["note"] is None
    assert second["interval"] == pytest.approx([RATIO, RATIO], rel=1e-6)
    assert (first["excludes_null"], second["excludes_null"]) == (False, True)
    assert state["significant"] is True
    assert state["stop_reason"].startswith("significant at look 2 of 2 (8 seeds per condition)")
    runs = service.runs(created["id"])
    assert sorted({r["seed"] for r in runs}) == list(range(8))
    assert all(r["status"] == "completed" for r in runs) and len(runs) == 16
    shown = cli(service, "status", str(created["id"]))
    assert "look 1: 4 seeds" in shown and "look 2: 8 seeds" in shown
    assert "significant at look 2 of 2" in shown
    # The rounds join the statistics like any run; the rule has decided, so they are final.
    served = service.client.get(f"/experiments/{created['id']}/stats").json()
    assert [c["n"] for c in served["conditions"]] == [8, 8]
    assert served["interim"] is False and served["interim_note"] is None
    # Seeds by hand after the stop would be a look the rule did not count: refused.
    added = service.client.post(f"/experiments/{created['id']}/seeds", json={"seeds": 1})
    assert added.status_code == 409, added.text
    assert "is adaptive: its rule decides its seeds" in added.json()["detail"]
    assert "submit a new experiment" in added.json()["detail"]
    assert len(service.runs(created["id"])) == 16


def test_an_adaptive_experiment_without_a_difference_stops_at_max_seeds(service: Service) -> None:
    rule = {
        "comparison": {"factor": "lr", "a": 0.1, "b": 0.1001},
        "min_seeds": 2,
        "step": 2,
        "max_seeds": 4,
    }
    created = service.submit(toy("no-difference", [0.1, 0.1001], adaptive=rule))
    detail = wait_ended(service, created["id"])
    state = detail["adaptive"]
    assert detail["status"] == "completed" and detail["n_runs"] == 8
    assert [look["excludes_null"] for look in state["looks"]] == [False, False]
    # 2 and 4 seeds a side: too few re-assignments to exclude any ratio at 0.025
    assert [look["interval"] for look in state["looks"]] == [[0, None], [0, None]]
    assert state["significant"] is False
    assert state["stop_reason"] == (
        "max_seeds reached (4 per condition) at look 2 without the interval excluding 1"
    )


def test_adaptive_specs_are_checked_against_the_grid(service: Service) -> None:
    def refused(rule: dict[str, Any], **fields: Any) -> list[Any]:
        response = service.client.post(
            "/experiments", json=toy("bad", [0.1, 0.2], adaptive=rule, **fields)
        )
        assert response.status_code == 422, response.text
        return [e["loc"] for e in response.json()["detail"]]

    named = {"factor": "lr", "a": 0.1, "b": 0.2}
    assert refused({"comparison": {**named, "factor": "steps"}}) == [
        ["body", "adaptive", "comparison", "factor"]
    ]
    assert refused({"comparison": {**named, "b": 0.3}}) == [["body", "adaptive", "comparison", "b"]]
    assert refused({"comparison": {**named, "b": 0.1}}) == [["body", "adaptive", "comparison", "b"]]
    # 10,000 runs per experiment at most (the setting's default): the whole plan must fit.
    lrs = [0.1 + i / 1000 for i in range(11)]
    response = service.client.post(
        "/experiments",
        json=toy(
            "too-many",
            lrs,
            adaptive={
                "comparison": {**named, "a": lrs[0], "b": lrs[1]},
                "min_seeds": 2,
                "max_seeds": 1000,
            },
        ),
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "adaptive", "max_seeds"]
    assert "11 conditions x at most 1000 seeds = 11000 runs" in response.text
    response = service.client.post(
        "/experiments", json=toy("bad", [0.1, 0.2], seeds=5, adaptive={"comparison": named})
    )
    assert response.status_code == 422 and "seeds: an adaptive spec" in response.text
    assert service.sql("SELECT count(*) FROM experiment") == [(0,)]


def test_seeds_added_by_hand_join_the_statistics(service: Service) -> None:
    created = service.submit(toy("grows", [0.1, 0.2], seeds=2))
    assert wait_ended(service, created["id"])["status"] == "completed"
    url = f"/experiments/{created['id']}/seeds"
    added = service.client.post(url, json={"seeds": 2})
    assert added.status_code == 201, added.text
    assert added.json() == {
        "experiment_id": created["id"],
        "seeds": [2, 3],
        "runs_added": 4,
        "n_runs": 8,
    }
    detail = wait_ended(service, created["id"])
    assert detail["status"] == "completed" and detail["counts"]["completed"] == 8
    assert detail["finished_at"] is not None
    stats_ = service.client.get(f"/experiments/{created['id']}/stats").json()
    assert [c["n"] for c in stats_["conditions"]] == [4, 4]
    (pooled,) = stats_["comparisons"]
    assert pooled["var_ratio"] == pytest.approx(RATIO, rel=1e-6)

    shown = cli(service, "add-seeds", str(created["id"]), "1")
    assert f"experiment {created['id']}: seeds 4 to 4 added, 2 runs queued (10 in all)" in shown
    assert wait_ended(service, created["id"])["counts"]["completed"] == 10
    again = service.client.post(url, json={"seeds": [3, 7]})
    assert again.status_code == 422 and again.json()["detail"][0]["loc"] == ["body", "seeds"]
    assert "has seeds [3] already" in again.text
    assert service.client.post(url, json={"seeds": 0}).status_code == 422
    assert service.client.post("/experiments/999999/seeds", json={"seeds": 1}).status_code == 404
    slow = service.submit(
        toy("cancelled", [0.1], seeds=1, config={"steps": 10**9, "log_every": 10**6})
    )
    assert service.client.post(f"/experiments/{slow['id']}/cancel").status_code == 202
    refused = service.client.post(f"/experiments/{slow['id']}/seeds", json={"seeds": 1})
    assert refused.status_code == 409 and "cancelled" in refused.text
    assert service.sql("SELECT count(*) FROM run") == [(11,)]


def test_two_experiments_compare_side_by_side(service: Service) -> None:
    # Same seeds, one more step in b: at lr 0.2 each seed's loss is 0.6^2 times a's, so the
    # variance ratio a / b is 0.6^-4 and the mean difference a's mean times (1 - 0.36).
    a = service.submit(toy("first", [0.1, 0.2], seeds=3))
    b = service.submit(
        {**toy("follow-up", [0.2, 0.3], seeds=3), "config": {"steps": STEPS + 1, "log_every": 1}}
    )
    for experiment in (a, b):
        assert wait_ended(service, experiment["id"])["status"] == "completed"
    response = service.client.get("/compare", params={"a": a["id"], "b": b["id"]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["trainer"], body["metric"], body["total_conditions"]) == ("toy", "loss", 1)
    assert body["only_in_a"] == ["lr=0.1"] and body["only_in_b"] == ["lr=0.3"]
    (side,) = body["conditions"]
    assert side["condition"] == {"lr": 0.2} and side["a"]["n"] == 3 and side["b"]["n"] == 3
    # each value beside its run and seed: a's runs of lr=0.2, seeds 0, 1, 2
    for experiment, summary in ((a, side["a"]), (b, side["b"])):
        stored = {
            (r["id"], r["seed"], r["metrics"]["loss"])
            for r in service.runs(experiment["id"])
            if r["condition_key"] == "lr=0.2"
        }
        served = [(r["run_id"], r["seed"], r["value"]) for r in summary["runs"]]
        assert set(served) == stored and [v for _, _, v in served] == summary["values"]
        assert sorted(seed for _, seed, _ in served) == [0, 1, 2]
    tests = side["comparison"]
    assert (tests["factor"], tests["a"], tests["b"]) == ("experiment", a["id"], b["id"])
    assert tests["var_ratio"] == pytest.approx(0.6**-4, rel=1e-6)
    assert tests["mean_diff"] == pytest.approx(side["a"]["mean"] * (1 - 0.36), rel=1e-6)

    shown = cli(service, "compare", str(a["id"]), str(b["id"]))
    assert "toy, metric loss (raw scale: the metric itself tested; means shown raw): 1 shared" in (
        " ".join(shown.split())
    )
    assert "lr=0.2" in shown
    assert "only in a: lr=0.1" in shown and "only in b: lr=0.3" in shown

    def refused(params: dict[str, Any]) -> list[Any]:
        response = service.client.get("/compare", params=params)
        assert response.status_code == 422, response.text
        return response.json()["detail"][0]["loc"]

    assert refused({"a": a["id"], "b": a["id"]}) == ["query", "b"]
    assert refused({"a": a["id"], "b": b["id"], "metric": "nope"}) == ["query", "metric"]
    assert refused({"a": a["id"], "b": b["id"], "offset": 5}) == ["query", "offset"]
    other = service.client.post(
        "/experiments",
        json={"name": "other", "trainer": "collapse", "config": {"steps": 5}, "seeds": 1},
    )
    assert other.status_code == 201
    assert refused({"a": a["id"], "b": other.json()["id"]}) == ["query", "b"]
    assert service.client.get("/compare", params={"a": a["id"], "b": 999999}).status_code == 404
