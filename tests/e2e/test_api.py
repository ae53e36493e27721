"""seedgrid end to end: HTTP -> database -> dispatcher -> real local Ray -> back.

Every test here runs twice: on a SQLite file and on a fresh database of the local PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Service
from tests.scipy_reference import assert_matches, reference_comparison, reference_condition

FAST = {"n_samples": 200, "steps": 400}


@pytest.fixture
def service(backend_service: Service) -> Service:
    return backend_service


@pytest.fixture
def start_service(start_backend_service: Callable[..., Service]) -> Callable[..., Service]:
    return start_backend_service


def spec(**overrides):
    base = {
        "name": "collapse-test",
        "trainer": "collapse",
        "config": {**FAST, "r": 0.1},
        "grid": {"stop_gradient": [False, True]},
        "seeds": 3,
        "metric": "min_l2",
    }
    base.update(overrides)
    return base


def stored_json(value: Any) -> Any:
    """A JSON column as read: PostgreSQL's driver parses it, SQLite's returns the text."""
    return json.loads(value) if isinstance(value, str) else value


def table_counts(service: Service) -> tuple[int, ...]:
    return tuple(
        service.sql(f"SELECT count(*) FROM {table}")[0][0]
        for table in ("experiment", "run", "metricpoint")
    )


def test_grid_runs_to_completion_and_stats_equal_scipy(service: Service) -> None:
    created = service.submit(spec())
    assert (created["n_conditions"], created["n_runs"]) == (2, 6)
    detail = service.wait(created["id"])
    assert detail["status"] == "completed" and detail["counts"]["completed"] == 6

    runs = service.runs(created["id"])
    assert sorted((r["condition_key"], r["seed"]) for r in runs) == sorted(
        (f"stop_gradient={sg}", s) for sg in ("false", "true") for s in range(3)
    )
    for run in runs:
        assert run["attempts"] == 1 and run["error"] is None
        assert {"min_l2", "loss", "train_accuracy"} <= set(run["metrics"])
        assert run["diagnostics"]["eig_m"][0] == pytest.approx(1.0)

    stats = service.client.get(f"/experiments/{created['id']}/stats").json()
    assert stats["metric"] == "min_l2"
    by_level = {
        lvl: [r["metrics"]["min_l2"] for r in runs if r["condition"]["stop_gradient"] is lvl]
        for lvl in (False, True)
    }
    for cond in stats["conditions"]:
        assert_matches(cond, reference_condition(by_level[cond["condition"]["stop_gradient"]]))
    (comparison,) = stats["comparisons"]
    assert (comparison["factor"], comparison["a"], comparison["b"]) == (
        "stop_gradient",
        False,
        True,
    )
    assert comparison["within"] is None
    assert_matches(comparison, reference_comparison(by_level[False], by_level[True]))

    other = service.client.get(
        f"/experiments/{created['id']}/stats", params={"metric": "train_accuracy"}
    ).json()
    assert other["metric"] == "train_accuracy"
    assert (
        service.client.get(
            f"/experiments/{created['id']}/stats", params={"metric": "nope"}
        ).status_code
        == 422
    )

    # Curves were streamed and stored; provenance names versions, device and the Ray worker.
    run_id = runs[0]["id"]
    curve = service.client.get(f"/runs/{run_id}/metrics", params={"name": "min_l2"}).json()
    assert [p["step"] for p in curve] == list(range(0, 401, 2))
    later = service.client.get(
        f"/runs/{run_id}/metrics", params={"name": "min_l2", "since_step": 390}
    ).json()
    assert [p["step"] for p in later] == list(range(390, 401, 2))
    one = service.client.get(f"/runs/{run_id}").json()
    assert one["provenance"]["torch_version"] and one["provenance"]["device"] == "cpu"
    assert one["provenance"]["ray_node_id"] and one["provenance"]["worker_pid"] > 0
    assert one["config"]["n_samples"] == 200 and one["attempt_history"][0]["outcome"] == "completed"
    # the null defaults show the values the run used (lr for stop_gradient false; a logged
    # point every 2 steps, as the curve above has), as the worker recorded them
    assert (one["condition"], one["config"]["lr"], one["config"]["log_every"]) == (
        {"stop_gradient": False},
        0.5,
        2,
    )
    assert one["config"] == one["provenance"]["config"]

    # The same config and seed, run again through the whole system, give identical metrics.
    again = service.submit(spec(name="again"))
    service.wait(again["id"])
    first = {(r["condition_key"], r["seed"]): r["metrics"] for r in runs}
    second = {(r["condition_key"], r["seed"]): r["metrics"] for r in service.runs(again["id"])}
    assert first == second

    listed = service.client.get("/experiments", params={"limit": 1}).json()
    assert [e["id"] for e in listed] == [again["id"]]
    assert service.client.get("/experiments", params={"status": "completed"}).json()

    # The final metrics and diagnostics are served as stored, each number of its JSON type (the
    # schema types them: numbers or null, nested JSON); a stored metric that is not a number
    # is served as null, as the statistics read it.
    stored = {
        run_id: (stored_json(metrics), stored_json(diagnostics))
        for run_id, metrics, diagnostics in service.sql(
            "SELECT id, metrics, diagnostics FROM run WHERE experiment_id = :e", e=created["id"]
        )
    }
    served = {r["id"]: (r["metrics"], r["diagnostics"]) for r in runs}
    assert json.dumps(served, sort_keys=True) == json.dumps(
        {run_id: stored[run_id] for run_id in served}, sort_keys=True
    )
    service.sql(
        'UPDATE run SET metrics = \'{"min_l2": 0.5, "count": 3, "note": "x", '
        '"flag": true}\' WHERE id = :id',
        id=run_id,
    )
    response = service.client.get(f"/runs/{run_id}")
    assert response.status_code == 200, response.text
    assert response.json()["metrics"] == {"min_l2": 0.5, "count": 3.0, "note": None, "flag": None}


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (spec(trainer="nonexistent"), ["body", "trainer"]),
        (spec(config={"no_such_field": 1}), ["body", "config", "no_such_field"]),
        (spec(config={"r": "high"}), ["body", "config", "r"]),
        (spec(grid={"r": [0.1, "x"]}), ["body", "grid", "r", 1]),
        (spec(grid={"r": []}), ["body", "grid"]),
        (spec(grid={"bogus": [1, 2]}), ["body", "grid", "bogus"]),
        (spec(seeds=0), ["body", "seeds"]),
        (spec(seeds=[]), ["body", "seeds"]),
        (spec(grid={"r": [0.0, 0.1, 0.2], "dim": [2, 4, 8, 16]}, seeds=20), ["body", "grid"]),
        (spec(metric="accuracy_of_nothing"), ["body", "metric"]),
        (spec(resources={"num_cpus": -1}), ["body", "resources", "num_cpus"]),
        ({"trainer": "collapse"}, ["body", "name"]),
    ],
)
def test_bad_specs_get_422_naming_the_field_and_store_nothing(start_service, body, loc) -> None:
    service = start_service(max_runs_per_experiment=200)
    before = table_counts(service)
    response = service.client.post("/experiments", json=body)
    assert response.status_code == 422, response.text
    locs = [e["loc"] for e in response.json()["detail"]]
    assert any(list(found[: len(loc)]) == loc for found in locs), locs
    assert table_counts(service) == before


def test_unknown_ids_and_bad_json(service: Service) -> None:
    assert service.client.get("/experiments/9999").status_code == 404
    assert service.client.get("/experiments/9999/runs").status_code == 404
    assert service.client.get("/experiments/9999/stats").status_code == 404
    assert service.client.post("/experiments/9999/cancel").status_code == 404
    assert service.client.get("/runs/9999").status_code == 404
    assert service.client.get("/runs/9999/metrics").status_code == 404
    assert service.client.get("/experiments/abc").status_code == 422
    bad = service.client.post(
        "/experiments", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 422


def test_trainers_and_health(service: Service) -> None:
    trainers = service.client.get("/trainers").json()
    collapse = next(t for t in trainers if t["name"] == "collapse")
    assert collapse["primary_metric"] == "min_l2"
    assert "stop_gradient" in collapse["config_schema"]["properties"]
    health = service.client.get("/healthz").json()
    assert health["status"] == "ok" and health["database"] == "ok" and health["ray"] == "ok"
    assert health["cluster_resources"]["CPU"] == 2.0


def test_cancelling_a_running_experiment_leaves_nothing_queued_or_running(service: Service) -> None:
    # One seed per task (collapse batches 8 by default): six tasks for Ray's 2 CPUs.
    created = service.submit(
        spec(
            config={"steps": 10**7, "stop_gradient": True},
            grid={},
            seeds=6,
            resources={"seeds_per_task": 1},
        )
    )
    # All six are handed to Ray at once; its 2 CPUs run two, and the other four wait there as
    # pending: `running` never counts more runs than the cluster runs.
    deadline = time.monotonic() + 60
    while (counts := service.client.get(f"/experiments/{created['id']}").json()["counts"])[
        "running"
    ] < 2:
        assert counts["running"] + counts["pending"] + counts["queued"] == 6, counts
        assert time.monotonic() < deadline, counts
        time.sleep(0.1)
    assert (counts["running"], counts["pending"]) == (2, 4), counts
    runs = service.runs(created["id"])
    assert sorted(r["status"] for r in runs) == ["pending"] * 4 + ["running"] * 2
    assert all((r["started_at"] is not None) == (r["status"] == "running") for r in runs)
    time.sleep(1.0)  # an observation window: the counts stay (2, 4) across it
    counts = service.client.get(f"/experiments/{created['id']}").json()["counts"]
    assert (counts["running"], counts["pending"]) == (2, 4), counts
    response = service.client.post(f"/experiments/{created['id']}/cancel")
    assert response.status_code == 202
    detail = service.wait(created["id"], timeout_s=60)
    assert detail["status"] == "cancelled"
    assert detail["counts"]["cancelled"] == 6
    assert detail["counts"]["queued"] == detail["counts"]["pending"] == 0
    assert detail["counts"]["running"] == 0
    # a pending run's task left Ray's queue before a worker started it
    errors = sorted(r["error"] for r in service.runs(created["id"]))
    assert errors == ["cancelled before start"] * 4 + ["cancelled while running"] * 2
    # one rule: cancelling what is cancelled already changes nothing and says so
    again = service.client.post(f"/experiments/{created['id']}/cancel")
    assert again.status_code == 409 and "cancelled already" in again.json()["detail"]
    time.sleep(1.0)  # nothing comes back to life afterwards
    again = service.client.get(f"/experiments/{created['id']}").json()
    assert again["counts"]["cancelled"] == 6 and again["status"] == "cancelled"


def test_cancelling_an_ended_experiment_is_a_conflict(service: Service) -> None:
    created = service.submit(spec(grid={}, seeds=1))
    service.wait(created["id"])
    response = service.client.post(f"/experiments/{created['id']}/cancel")
    assert response.status_code == 409 and "already ended (completed)" in response.json()["detail"]
    assert service.client.get(f"/experiments/{created['id']}").json()["status"] == "completed"


def running_attempt(service: Service, run_id: int) -> tuple[int, int] | None:
    """(attempt, worker pid) of the run's attempt in progress, once its worker has reported."""
    detail = service.client.get(f"/runs/{run_id}").json()
    pid = detail["provenance"]["worker_pid"]
    history = detail["attempt_history"]
    if detail["status"] != "running" or pid is None or history[-1]["outcome"] is not None:
        return None
    assert history[-1]["attempt"] == detail["attempts"]
    return detail["attempts"], pid


def test_killed_worker_is_retried_and_the_run_completes(service: Service) -> None:
    # ~2 s in a Ray worker: its pid is reported within ~0.3 s, so the kill lands mid-run.
    # (20,000 steps: the trainer's default with stop_gradient, left null in the spec)
    created = service.submit(spec(config={"stop_gradient": True}, grid={}, seeds=1, max_retries=2))
    (run,) = service.runs(created["id"])
    # before a worker ran it, the config shows what it will run with
    before = service.client.get(f"/runs/{run['id']}").json()
    assert before["config"]["steps"] == 20_000 and before["config"]["lr"] == 0.2
    deadline = time.monotonic() + 60
    while (current := running_attempt(service, run["id"])) is None:
        assert time.monotonic() < deadline, "the run never reported its worker"
        time.sleep(0.05)
    assert current[0] == 1, current
    pid = current[1]
    # Right before the kill: the run is still in its first attempt on that worker, and the
    # worker process is executing this run's task (Ray titles it after the task).
    assert running_attempt(service, run["id"]) == (1, pid), "the run ended before the kill"
    title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    assert title[:1] == [f"ray::seedgrid-run-{run['id']}".encode()], title
    os.kill(pid, signal.SIGKILL)
    detail = service.wait(created["id"], timeout_s=120)
    assert detail["status"] == "completed"
    final = service.client.get(f"/runs/{run['id']}").json()
    assert final["status"] == "completed" and final["attempts"] == 2
    history = final["attempt_history"]
    assert [a["outcome"] for a in history] == ["lost", "completed"]
    assert history[0]["worker_pid"] == pid and final["provenance"]["worker_pid"] != pid
    # /metrics counts the loss, and both attempts' dispatch (claim to Started)
    scraped = {
        s.name: s.value
        for family in text_string_to_metric_families(service.client.get("/metrics").text)
        for s in family.samples
    }
    assert scraped["seedgrid_worker_losses_total"] == 1
    assert scraped["seedgrid_dispatch_latency_seconds_count"] == 2
    # the metrics of the lost attempt were dropped: one curve, not two
    steps = [
        p["step"]
        for p in service.client.get(f"/runs/{run['id']}/metrics", params={"name": "loss"}).json()
    ]
    assert steps == sorted(set(steps))
    # its config shows the steps it ran, which the spec left to the trainer
    assert steps[-1] == final["config"]["steps"] == final["provenance"]["config"]["steps"] == 20_000


def test_non_finite_loss_makes_the_run_diverged_with_last_finite_metrics(service: Service) -> None:
    created = service.submit(
        spec(config={"lr": 50.0, "steps": 2000, "log_every": 1}, grid={}, seeds=1)
    )
    detail = service.wait(created["id"])
    # its only run diverged: nothing to compare, so the experiment failed
    assert detail["status"] == "failed" and detail["counts"]["diverged"] == 1
    (run,) = service.runs(created["id"])
    assert run["status"] == "diverged" and "non-finite loss" in run["error"]
    assert run["metrics"]["loss"] is not None and run["metrics"]["loss"] > 0
    step = run["diagnostics"]["diverged_at_step"]
    assert run["diagnostics"]["last_finite_step"] == step - 1


def test_trainer_exception_makes_the_run_failed_with_its_message(service: Service) -> None:
    # A stored run whose config its trainer rejects (say, written by an older seedgrid).
    ((new_id,),) = service.sql(
        "INSERT INTO experiment (name, trainer, spec, metric, status, priority, "
        "n_conditions, n_runs, runs_queued, cancel_requested, created_at) VALUES ('old', "
        "'collapse', "
        '\'{"name": "old", "trainer": "collapse", "config": {"retired_field": 1}, '
        "\"grid\": {}}', 'min_l2', 'queued', 0, 1, 1, 1, false, '2026-01-01 00:00:00') "
        "RETURNING id",
    )
    service.sql(
        "INSERT INTO run (experiment_id, condition_key, condition, seed, "
        "trainer, status, priority, attempts, max_retries, num_cpus, num_gpus, "
        "cancel_requested, metrics, diagnostics, warnings, provenance, created_at) "
        "VALUES (:id, '', '{}', 0, 'collapse', 'queued', 0, 0, "
        "2, 1, 0, false, '{}', '{}', '[]', '{}', '2026-01-01 00:00:00')",
        id=new_id,
    )
    detail = service.wait(new_id)
    assert detail["status"] == "failed" and detail["counts"]["failed"] == 1
    (run,) = service.runs(new_id)
    assert run["status"] == "failed" and run["attempts"] == 1
    assert run["error"].startswith("ValidationError") and "retired_field" in run["error"]


def test_runs_left_running_by_a_previous_process_are_requeued(start_service) -> None:
    """What a dispatcher that died leaves: of three runs, one completed, one a worker was
    running (its attempt has the worker's pid and half a curve) and one still pending in Ray's
    queue (no worker reported it). The next one re-queues the last two, charging only the
    attempt a worker had started, drops the half curve, and leaves the completed run alone.
    (tests/e2e/test_crash_soak.py kills real `seedgrid serve` processes.)"""
    first = start_service("restart.db")
    created = first.submit(spec(grid={}, seeds=3))
    first.wait(created["id"])
    done, started, waiting = sorted(r["id"] for r in first.runs(created["id"]))
    first.server.stop()
    (finished_at,) = first.sql("SELECT finished_at FROM run WHERE id = :id", id=done)[0]
    for run_id, status, pid in ((started, "running", 4242), (waiting, "pending", None)):
        first.sql(
            "UPDATE run SET status = :status, metrics = '{}', finished_at = NULL, "
            "worker_pid = :pid WHERE id = :id",
            id=run_id,
            status=status,
            pid=pid,
        )
        first.sql("DELETE FROM metricpoint WHERE run_id = :id AND step > 100", id=run_id)
        first.sql(
            "UPDATE runattempt SET outcome = NULL, finished_at = NULL, worker_pid = :pid "
            "WHERE run_id = :id",
            id=run_id,
            pid=pid,
        )
    # as the runs store keeps them: one run completed, one running, one pending
    first.sql(
        "UPDATE experiment SET status = 'running', finished_at = NULL, "
        "runs_completed = 1, runs_running = 1, runs_pending = 1"
    )

    second = start_service("restart.db")
    assert second.wait(created["id"])["status"] == "completed"
    history = {
        run_id: [
            a["outcome"] for a in second.client.get(f"/runs/{run_id}").json()["attempt_history"]
        ]
        for run_id in (done, started, waiting)
    }
    assert history == {
        done: ["completed"],
        started: ["lost", "completed"],
        waiting: ["interrupted", "completed"],
    }
    assert second.sql("SELECT attempts, finished_at FROM run WHERE id = :id", id=done) == [
        (1, finished_at)
    ]
    for run in second.runs(created["id"]):
        assert run["status"] == "completed" and "min_l2" in run["metrics"]
        steps = [
            p["step"]
            for p in second.client.get(f"/runs/{run['id']}/metrics", params={"name": "loss"}).json()
        ]
        assert steps == list(range(0, 401, 2)), run["id"]  # one whole curve each


def test_queue_runs_higher_priority_first(start_service) -> None:
    service = start_service("priority.db", max_in_flight=1)
    # one seed per task: a seed-batched task would claim all four low runs at once
    low = service.submit(
        spec(
            name="low",
            grid={},
            seeds=4,
            config={**FAST, "steps": 3000},
            resources={"seeds_per_task": 1},
        )
    )
    high = service.submit(spec(name="high", grid={}, seeds=1, priority=10))
    service.wait(low["id"])
    service.wait(high["id"])
    low_starts = sorted(r["started_at"] for r in service.runs(low["id"]))
    (high_run,) = service.runs(high["id"])
    # at most the low run already claimed when `high` arrived runs before it
    assert high_run["started_at"] < low_starts[1]


def test_submission_warns_when_the_seeds_cannot_reach_alpha(service: Service) -> None:
    """Issue 39: 3 seeds per condition can never give a p at or below 0.05 (one factor: no
    other to pool over); the 201 body and the experiment's detail say so, with the seeds that
    would, and queue it all the same."""
    created = service.submit(spec(seeds=3, config={**FAST, "steps": 50}))
    (warning,) = created["seed_warnings"]
    assert "3 seeds per condition" in warning and "no comparison of this grid can" in warning
    assert "5 seeds per condition would" in warning
    detail = service.wait(created["id"])
    assert detail["seed_warnings"] == created["seed_warnings"]
    assert detail["counts"]["completed"] == 6
    enough = service.submit(spec(seeds=6, config={**FAST, "steps": 50}))
    assert enough["seed_warnings"] == []
    service.wait(enough["id"])
