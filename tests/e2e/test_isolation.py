"""No experiment can stop, strand or rewrite another (issue 22), through HTTP and a real local
Ray: what Ray would refuse is a 422 naming the field; a task Ray refuses anyway (a run stored
by an older version) fails its own runs and leaves every other run of the claim to complete; a
failing dispatcher pass shows in /healthz and /metrics; a lost task charges only the seeds a
worker started; a cancelled task starts no further seed, and a trainer that ignores its cancel
ends its worker; a restart keeps seed-batched tasks whole.

The tests with a database run on a SQLite file and on a fresh PostgreSQL database."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from service.scheduling.lease import make_dispatch_lock
from service.storage.db import upgrade_database
from tests.conftest import Service
from tests.e2e.test_toy_trainer import wait_for
from tests.e2e.toy_trainer import ToyTrainer
from trainers import REGISTRY

FAST = {"n_samples": 64, "steps": 50}


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> ToyTrainer:
    trainer = ToyTrainer()
    monkeypatch.setitem(REGISTRY, trainer.name, trainer)
    return trainer


def collapse(name: str, **overrides: Any) -> dict[str, Any]:
    return {"name": name, "trainer": "collapse", "config": FAST, "seeds": 2, **overrides}


def counts(service: Service) -> tuple[int, int]:
    return (
        service.sql("SELECT count(*) FROM experiment")[0][0],
        service.sql("SELECT count(*) FROM run")[0][0],
    )


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        (
            {
                "adaptive": {
                    "comparison": {"factor": "stop_gradient", "a": False, "b": True},
                    "alpha": 5e-324,
                },
                "grid": {"stop_gradient": [False, True]},
            },
            ["body", "adaptive", "alpha"],
        ),
        ({"resources": {"num_cpus": 0.00001}}, ["body", "resources", "num_cpus"]),
        # Ray's unit, but 10,000 such tasks would share one CPU (the floor is 0.25)
        ({"resources": {"num_cpus": 0.0001}}, ["body", "resources", "num_cpus"]),
        ({"resources": {"num_cpus": 0.2}}, ["body", "resources", "num_cpus"]),
        ({"resources": {"num_gpus": 0.00005}}, ["body", "resources", "num_gpus"]),
        # no value is coerced: these were 1 seed, 2 seeds and 1 CPU
        ({"seeds": True}, ["body", "seeds", "int"]),
        ({"seeds": 2.0}, ["body", "seeds", "int"]),
        ({"resources": {"num_cpus": "1"}}, ["body", "resources", "num_cpus"]),
        ({"max_retries": "2"}, ["body", "max_retries"]),
    ],
)
def test_what_ray_or_the_spec_would_refuse_is_a_422_naming_the_field(
    backend_service: Service, overrides: dict[str, Any], loc: list[str]
) -> None:
    before = counts(backend_service)
    response = backend_service.client.post("/experiments", json=collapse("refused", **overrides))
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]], response.text
    assert counts(backend_service) == before


def test_a_run_that_needs_more_memory_than_the_largest_node_gives_is_a_422_naming_the_field(
    start_service: Callable[..., Service],
) -> None:
    """A spec under SEEDGRID_MAX_RUN_MEMORY_GB whose runs' estimate is still more than any
    alive Ray node gives its tasks (53 GB was accepted on a 16.8 GB node) is refused at
    submission, naming the field that drives the estimate; one that fits is accepted. The
    sizes are chosen from this machine's node: the test holds on any."""
    largest = max(n["Resources"].get("memory", 0) for n in ray.nodes() if n["Alive"])
    trainer = REGISTRY["collapse"]
    dim = 64
    while trainer.estimate(trainer.Config(n_samples=10**6, dim=dim)).memory_bytes <= 1.5 * largest:
        dim *= 2
    need = trainer.estimate(trainer.Config(n_samples=10**6, dim=dim)).memory_bytes
    service = start_service(max_run_memory_gb=2 * need / 1e9)
    before = counts(service)
    spec = collapse("too big", grid={"dim": [8, dim]}, resources={"seeds_per_task": 1})
    spec["config"] = {**FAST, "n_samples": 10**6}
    response = service.client.post("/experiments", json=spec)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "grid", "dim"], error
    assert f"about {need / 1e9:,.1f} GB" in error["msg"], error
    assert f"{largest / 1e9:,.1f} GB on Ray node" in error["msg"], error
    assert error["msg"].endswith(f"(conditions: dim={dim})"), error
    assert counts(service) == before
    spec["config"] = FAST  # what fits: accepted, and run
    created = service.client.post("/experiments", json=spec)
    assert created.status_code == 201, created.text
    assert service.wait(created.json()["id"])["status"] == "completed"


def test_add_seeds_refuses_a_number_in_a_string(backend_service: Service) -> None:
    created = backend_service.submit(collapse("seeds"))
    backend_service.wait(created["id"])
    response = backend_service.client.post(
        f"/experiments/{created['id']}/seeds", json={"seeds": "3"}
    )
    assert response.status_code == 422, response.text
    assert backend_service.runs(created["id"]).__len__() == 2


def test_a_task_ray_refuses_fails_its_own_runs_and_strands_no_other(
    backend: str,
    start_backend_service: Callable[..., Service],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Runs stored with num_cpus 1e-5 (as an older version accepted them, written here behind
    the API's back) are claimed in one pass with another experiment's runs: Ray refuses their
    task, they fail with the reason, and the other experiment's runs, claimed after them in
    the same pass, complete; no run is left pending, and no dispatcher pass fails. (The test
    holds the dispatch lock while it sets up, so that one claim takes every run.)"""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    else:
        url = request.getfixturevalue("pg_databases").url("seedgrid.db")
    upgrade_database(url)
    holder = make_dispatch_lock(url, "test-holder", REGISTRY)
    assert holder.try_acquire()
    try:
        service = start_backend_service()
        assert service.client.get("/healthz").json()["dispatcher"] == "standby"
        one_per_task = {"resources": {"seeds_per_task": 1}}
        poisoned = service.submit(collapse("poisoned", **one_per_task))
        innocent = service.submit(collapse("innocent", **one_per_task))
        service.sql(
            "UPDATE run SET num_cpus = 0.00001 WHERE experiment_id = :id", id=poisoned["id"]
        )
    finally:
        holder.close()
    assert service.wait(innocent["id"], timeout_s=60)["status"] == "completed"
    detail = service.wait(poisoned["id"], timeout_s=30)
    assert detail["status"] == "failed" and detail["counts"]["failed"] == 2, detail
    for run in service.runs(poisoned["id"]):
        assert run["error"].startswith(
            "its task could not be submitted to Ray: ValueError: "
            "The precision of the fractional quantity of resource "
            "num_cpus"
        ), run
    assert (
        service.sql("SELECT count(*) FROM run WHERE status IN ('queued', 'pending', 'running')")[0][
            0
        ]
        == 0
    )
    health = service.client.get("/healthz").json()
    assert health["status"] == "ok" and health["dispatcher_step_errors"] == 0, health


def test_a_failing_dispatcher_pass_is_reported_by_healthz_and_metrics(
    backend_service: Service,
) -> None:
    """While every pass fails (its runs table renamed away behind its back), /healthz says
    degraded with the error and /metrics counts the failed passes; once the table is back the
    next pass succeeds, /healthz is ok again and an experiment runs."""
    service = backend_service
    assert service.client.get("/healthz").json()["dispatcher_step_errors"] == 0
    service.sql("ALTER TABLE run RENAME TO run_away")
    try:
        health = wait_for(
            lambda: (h := service.client.get("/healthz").json())["status"] == "degraded" and h,
            timeout_s=30,
        )
    finally:
        service.sql("ALTER TABLE run_away RENAME TO run")
    assert health["dispatcher"] == "active" and health["database"] == "ok"
    assert health["dispatcher_step_errors"] >= 1 and "run" in health["dispatcher_error"]
    metrics = service.client.get("/metrics").text
    failed_passes = re.search(r"^seedgrid_dispatcher_step_errors_total (\S+)$", metrics, re.M)
    assert failed_passes is not None and float(failed_passes.group(1)) >= 1
    wait_for(lambda: service.client.get("/healthz").json()["status"] == "ok", timeout_s=30)
    created = service.submit(collapse("after"))
    assert service.wait(created["id"])["status"] == "completed"
    assert service.client.get("/healthz").json()["dispatcher_error"] is None


def run_detail(service: Service, run_id: int) -> dict[str, Any]:
    return service.client.get(f"/runs/{run_id}").json()


def running_attempt(service: Service, run_id: int, attempt: int) -> int | None:
    """The worker pid of the run's `attempt` once a worker reported starting it."""
    run = run_detail(service, run_id)
    if run["status"] == "running" and run["attempts"] == attempt:
        return run["provenance"]["worker_pid"]
    return None


def toy_task(name: str, steps: int, **overrides: Any) -> dict[str, Any]:
    """Four toy seeds in one task, one after another (the toy does not batch)."""
    return {
        "name": name,
        "trainer": "toy",
        "seeds": 4,
        "config": {"steps": steps, "log_every": 10_000, "lr": 0.01},
        "resources": {"seeds_per_task": 4},
        **overrides,
    }


def test_a_worker_killed_twice_during_seed_0_leaves_the_other_seeds_uncharged(
    service: Service, toy: ToyTrainer
) -> None:
    """max_retries 1: seed 0 fails, lost on both of its charged attempts; seeds 1-3 waited in
    the task, so their lost attempts are not charged and they complete."""
    # a few seconds per seed: each kill lands while seed 0 trains
    created = service.submit(toy_task("killed-twice", 150_000, max_retries=1))
    runs = sorted(service.runs(created["id"]), key=lambda r: r["seed"])
    first = runs[0]["id"]
    for attempt in (1, 2):
        pid = wait_for(lambda a=attempt: running_attempt(service, first, a), timeout_s=60)
        os.kill(pid, signal.SIGKILL)
    detail = service.wait(created["id"], timeout_s=180)
    assert detail["counts"]["failed"] == 1 and detail["counts"]["completed"] == 3, detail
    failed = run_detail(service, first)
    assert failed["error"].startswith("lost on each of 2 attempts"), failed
    assert [a["outcome"] for a in failed["attempt_history"]] == ["lost", "lost"]
    for run in runs[1:]:
        final = run_detail(service, run["id"])
        assert final["status"] == "completed", final
        history = final["attempt_history"]
        # every attempt before the last was lost unstarted: interrupted, no worker pid
        assert [a["outcome"] for a in history] == ["interrupted"] * (len(history) - 1) + [
            "completed"
        ], history
        assert all(a["worker_pid"] is None for a in history[:-1])
        assert final["started_at"] is not None


# Each seed's first step sleeps this long, ignoring a cancel.
SEQUENTIAL_STALL_S = 6.0


def test_a_cancelled_sequential_task_starts_no_further_seed(
    service: Service, toy: ToyTrainer
) -> None:
    """Each seed stalls SEQUENTIAL_STALL_S at its first step: a task that started a further
    seed after the cancel would end no sooner than that stall after it; it ends at once. (The
    seeds it did not start say nothing here: a task's messages after its cancel are not read.)
    The bound is that stall, the same wall-clock sleep the task would add."""
    created = service.submit(
        toy_task(
            "cancel-sequential",
            10**9,
            config={
                "steps": 10**9,
                "log_every": 10**6,
                "stall_at_step": 0,
                "stall_s": SEQUENTIAL_STALL_S,
            },
        )
    )
    runs = sorted(service.runs(created["id"]), key=lambda r: r["seed"])
    # seed 0's step 0 stored: past its stall, it checks for a cancel at every step now
    wait_for(
        lambda: service.client.get(f"/runs/{runs[0]['id']}/metrics?name=loss").json(),
        timeout_s=60,
    )
    cancelled_at = time.monotonic()
    assert service.client.post(f"/experiments/{created['id']}/cancel").status_code == 202
    detail = service.wait(created["id"], timeout_s=30)
    assert time.monotonic() - cancelled_at < SEQUENTIAL_STALL_S
    assert detail["status"] == "cancelled" and detail["counts"]["cancelled"] == 4
    for run in runs[1:]:
        final = run_detail(service, run["id"])
        assert final["started_at"] is None, final
        assert final["attempt_history"][0]["worker_pid"] is None, final


def test_a_trainer_that_ignores_its_cancel_ends_its_worker(
    service: Service, toy: ToyTrainer
) -> None:
    """A step that sleeps through the cancel: past the worker's grace (10 s) the worker
    process ends, the run ends cancelled (not lost and retried), and the next run gets a
    fresh worker."""
    from workers.task import CANCEL_GRACE_S

    created = service.submit(
        {
            "name": "stall",
            "trainer": "toy",
            "seeds": 1,
            "config": {"steps": 10**9, "log_every": 10**6, "stall_at_step": 1, "stall_s": 300.0},
        }
    )
    (run,) = service.runs(created["id"])
    pid = wait_for(lambda: running_attempt(service, run["id"], 1), timeout_s=60)
    # step 0's point stored: the toy is in its step 1 now, the stall
    wait_for(lambda: service.client.get(f"/runs/{run['id']}/metrics?name=loss").json())
    cancelled_at = time.monotonic()
    assert service.client.post(f"/experiments/{created['id']}/cancel").status_code == 202
    detail = service.wait(created["id"], timeout_s=CANCEL_GRACE_S + 20)
    assert time.monotonic() - cancelled_at < CANCEL_GRACE_S + 10
    assert detail["status"] == "cancelled", detail
    final = run_detail(service, run["id"])
    assert final["attempts"] == 1 and final["error"] == "cancelled while running", final
    wait_for(lambda: not _alive(pid), timeout_s=10)
    after = service.submit(collapse("after-stall"))
    assert service.wait(after["id"])["status"] == "completed"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_first_claim_of_a_fresh_dispatcher_keeps_a_task_whole(
    start_service: Callable[..., Service], tmp_path: Any
) -> None:
    """Two task slots and 8 seeds per task: the first claim of a dispatcher that just started
    (as after a restart) runs the 8 seeds in one task, not in tasks of 2."""
    service = start_service(max_in_flight=2)
    created = service.submit(collapse("whole", seeds=8, resources={"seeds_per_task": 8}))
    assert service.wait(created["id"])["status"] == "completed"
    tasks = {
        tuple(run_detail(service, r["id"])["provenance"]["task_seeds"])
        for r in service.runs(created["id"])
    }
    assert tasks == {tuple(range(8))}


def test_healthz_reports_no_error_on_a_healthy_service(service: Service) -> None:
    health = httpx.get(f"{service.server.url}/healthz", timeout=10).json()
    assert health["dispatcher_step_errors"] == 0 and health["dispatcher_error"] is None
