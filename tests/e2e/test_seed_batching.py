"""Seed-batched tasks through HTTP and the local Ray: resources.seeds_per_task = K runs K seeds of
a condition in one Ray task, and each seed stays its own run (status, attempts, curve, result).
A worker killed mid-task re-runs exactly the seeds without a result (charging only those a worker
had started); a cancel ends every seed;
the results and /stats are those of one task per seed."""

from __future__ import annotations

import math
import os
import signal
import time
from typing import Any

import pytest

from tests.conftest import Service
from tests.e2e.test_toy_trainer import wait_for
from tests.e2e.toy_trainer import ToyTrainer
from trainers import REGISTRY, get_trainer


def collapse_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "batched",
        "trainer": "collapse",
        "config": {"n_samples": 40, "steps": 300, "log_every": 30},
        "grid": {"r": [0.1, 0.3]},
        "seeds": 4,
        "resources": {"seeds_per_task": 4},
    }
    spec.update(overrides)
    return spec


def running_runs(service: Service, experiment_id: int) -> list[dict[str, Any]]:
    """The experiment's runs, once every one is running on a worker that has reported."""
    runs = [service.client.get(f"/runs/{r['id']}").json() for r in service.runs(experiment_id)]
    if all(r["status"] == "running" and r["provenance"]["worker_pid"] for r in runs):
        return runs
    return []


def test_a_seed_batched_experiment_stores_each_seed_as_its_own_run(service: Service) -> None:
    batched = service.submit(collapse_spec())
    solo = service.submit(collapse_spec(name="solo", resources={"seeds_per_task": 1}))
    assert service.wait(batched["id"])["status"] == "completed"
    assert service.wait(solo["id"])["status"] == "completed"
    runs = [service.client.get(f"/runs/{r['id']}").json() for r in service.runs(batched["id"])]
    solo_runs = {
        (r["condition"]["r"], r["seed"]): service.client.get(f"/runs/{r['id']}").json()
        for r in service.runs(solo["id"])
    }
    assert len(runs) == 8 and all(r["status"] == "completed" and r["attempts"] == 1 for r in runs)
    by_condition: dict[float, list[dict[str, Any]]] = {}
    for run in runs:
        by_condition.setdefault(run["condition"]["r"], []).append(run)
    for r, group in by_condition.items():
        # one task per condition: the four seeds shared a worker process and say so
        assert {run["provenance"]["task_seeds"] == [0, 1, 2, 3] for run in group} == {True}
        assert len({run["provenance"]["worker_pid"] for run in group}) == 1
        for run in group:
            alone = solo_runs[(r, run["seed"])]
            assert "task_seeds" not in alone["provenance"]
            for name, value in alone["metrics"].items():
                assert math.isclose(run["metrics"][name], value, rel_tol=1e-9), (name, run)
            curve = service.client.get(
                f"/runs/{run['id']}/metrics", params={"name": "min_l2"}
            ).json()
            alone_curve = service.client.get(
                f"/runs/{alone['id']}/metrics", params={"name": "min_l2"}
            ).json()
            assert [p["step"] for p in curve] == [p["step"] for p in alone_curve]
            assert [p["step"] for p in curve] == list(range(0, 301, 30))
            for point, reference in zip(curve, alone_curve, strict=True):
                assert math.isclose(point["value"], reference["value"], rel_tol=1e-9)
    # the statistics of the two experiments are the same
    stats = service.client.get(f"/experiments/{batched['id']}/stats").json()
    solo_stats = service.client.get(f"/experiments/{solo['id']}/stats").json()
    for mine, theirs in zip(stats["conditions"], solo_stats["conditions"], strict=True):
        assert mine["condition"] == theirs["condition"] and mine["n"] == theirs["n"] == 4
        assert math.isclose(mine["mean"], theirs["mean"], rel_tol=1e-9)
        assert math.isclose(mine["std"], theirs["std"], rel_tol=1e-9)
    for mine, theirs in zip(stats["comparisons"], solo_stats["comparisons"], strict=True):
        assert (mine["factor"], mine["a"], mine["b"]) == (
            theirs["factor"],
            theirs["a"],
            theirs["b"],
        )
        for field in ("var_ratio", "mean_diff", "f_test_p", "welch_p"):
            assert math.isclose(mine[field], theirs[field], rel_tol=1e-7), field


def test_a_worker_killed_mid_task_re_runs_all_its_seeds_once(service: Service) -> None:
    # One task of four seeds for a few seconds; the kill lands while all four run in it.
    created = service.submit(
        collapse_spec(
            config={"n_samples": 200, "steps": 20_000, "stop_gradient": True},
            grid={},
            max_retries=2,
        )
    )
    runs = wait_for(lambda: running_runs(service, created["id"]))
    pids = {run["provenance"]["worker_pid"] for run in runs}
    assert len(pids) == 1, runs
    (pid,) = pids
    assert {run["attempts"] for run in runs} == {1}
    os.kill(pid, signal.SIGKILL)
    detail = service.wait(created["id"], timeout_s=180)
    assert detail["status"] == "completed", detail
    for run in service.runs(created["id"]):
        final = service.client.get(f"/runs/{run['id']}").json()
        assert final["status"] == "completed" and final["attempts"] == 2, final
        assert [a["outcome"] for a in final["attempt_history"]] == ["lost", "completed"]
        assert final["attempt_history"][0]["worker_pid"] == pid
        assert final["provenance"]["worker_pid"] != pid
        steps = [
            p["step"]
            for p in service.client.get(
                f"/runs/{run['id']}/metrics", params={"name": "loss"}
            ).json()
        ]
        assert steps == sorted(set(steps))  # the lost attempt's points were dropped


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> ToyTrainer:
    trainer = ToyTrainer()
    monkeypatch.setitem(REGISTRY, trainer.name, trainer)
    return trainer


def test_a_killed_task_keeps_the_seeds_it_finished_and_re_runs_the_others(
    service: Service, toy: ToyTrainer
) -> None:
    # The toy trainer does not batch: its task runs the seeds one after another and sends each
    # seed's result when it ends, so the kill can land after some seeds have finished.
    assert not toy.batched
    created = service.submit(
        {
            "name": "toy-batched",
            "trainer": "toy",
            "config": {"steps": 300_000, "log_every": 10_000, "lr": 0.01},
            "seeds": 4,
            "max_retries": 2,
            "resources": {"seeds_per_task": 4},
        }
    )
    runs = sorted(service.runs(created["id"]), key=lambda r: r["seed"])
    first = wait_for(
        lambda: (
            (r := service.client.get(f"/runs/{runs[0]['id']}").json())["status"] == "completed"
            and r
        )
    )
    pid = first["provenance"]["worker_pid"]
    finished = {
        r["id"]: r
        for r in (service.client.get(f"/runs/{run['id']}").json() for run in runs)
        if r["status"] == "completed"
    }
    assert len(finished) < 4, "every seed finished before the kill"
    # the seeds waiting for their turn in the task are pending, not running: at most the one
    # training is running
    waiting = [service.client.get(f"/runs/{run['id']}").json()["status"] for run in runs[1:]]
    assert set(waiting) <= {"pending", "running", "completed"}, waiting
    assert waiting.count("running") <= 1, waiting
    os.kill(pid, signal.SIGKILL)
    detail = service.wait(created["id"], timeout_s=180)
    assert detail["status"] == "completed", detail
    for run in runs:
        final = service.client.get(f"/runs/{run['id']}").json()
        assert final["status"] == "completed"
        if run["id"] in finished:
            # untouched: one attempt, the same result and end
            before = finished[run["id"]]
            assert final["attempts"] == 1 and final["finished_at"] == before["finished_at"]
            assert final["metrics"] == before["metrics"]
        else:
            assert final["attempts"] == 2, final
            # charged (lost) only when a worker had started it; a seed waiting its turn in
            # the task was not (interrupted)
            lost = final["attempt_history"][0]
            assert lost["outcome"] == ("lost" if lost["worker_pid"] else "interrupted"), final
            assert final["attempt_history"][1]["outcome"] == "completed"
    assert (
        sum(
            run_detail["attempt_history"][0]["outcome"] == "lost"
            for run_detail in (service.client.get(f"/runs/{run['id']}").json() for run in runs)
        )
        <= 1
    )


def test_a_cancel_ends_every_seed_of_a_task(service: Service) -> None:
    created = service.submit(
        collapse_spec(config={"n_samples": 200, "steps": 100_000_000, "log_every": 1000}, grid={})
    )
    wait_for(lambda: running_runs(service, created["id"]))
    cancelled_at = time.monotonic()
    assert service.client.post(f"/experiments/{created['id']}/cancel").status_code == 202
    detail = service.wait(created["id"], timeout_s=60)
    assert time.monotonic() - cancelled_at < 10
    assert detail["status"] == "cancelled" and detail["counts"]["cancelled"] == 4


def test_seeds_per_task_is_checked_against_the_trainer(service: Service) -> None:
    listed = {t["name"]: t for t in service.client.get("/trainers").json()}
    for name, info in listed.items():
        trainer = get_trainer(name)
        assert info["max_seeds_per_task"] == trainer.max_seeds_per_task
        assert info["seeds_per_task_default"] == trainer.seeds_per_task_default
        assert info["batched"] == trainer.batched
    assert listed["collapse"]["batched"] and not listed["ssl"]["batched"]
    ssl = get_trainer("ssl")
    too_many = ssl.max_seeds_per_task + 1
    response = service.client.post(
        "/experiments",
        json={
            "name": "too-many",
            "trainer": "ssl",
            "config": {"dataset": "digits"},
            "seeds": 2,
            "resources": {"seeds_per_task": too_many},
        },
    )
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"][-2:] == ["resources", "seeds_per_task"]
    assert f"trainer 'ssl' runs at most {ssl.max_seeds_per_task} seeds per task" in error["msg"]
    zero = service.client.post("/experiments", json=collapse_spec(resources={"seeds_per_task": 0}))
    assert zero.status_code == 422 and "seeds_per_task" in zero.text
