"""A fifth trainer, added at runtime with no change to seedgrid, gets everything the four
shipped ones get through HTTP and a real Ray: /trainers, cancellation, divergence handling,
provenance and /stats; and an experiment whose first runs all fail stops there."""

from __future__ import annotations

import inspect
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, Service, process_cpu_s
from tests.e2e.toy_trainer import ToyTrainer
from trainers import REGISTRY

# CPU seconds the run's worker may use from the cancel to the run's end (tests/e2e/test_cancel.py
# says why CPU time, not wall time).
CANCEL_BOUND_S = 2.0


def wait_for(predicate, timeout_s: float = 60.0, interval_s: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError("timed out")


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> ToyTrainer:
    trainer = ToyTrainer()
    monkeypatch.setitem(REGISTRY, trainer.name, trainer)
    return trainer


def test_a_toy_trainer_registered_at_runtime_is_served_end_to_end(
    start_service: Callable[..., Service], toy: ToyTrainer
) -> None:
    """...and an experiment of it whose first runs all fail stops there, alone: two task slots,
    so that its runs (of a higher priority) go first while the other one's wait in the queue."""
    service = start_service(max_in_flight=2)
    client = service.client
    listed = {t["name"]: t for t in client.get("/trainers").json()}
    assert listed["toy"]["primary_metric"] == "loss"
    assert set(listed["toy"]["config_schema"]["properties"]) == {
        "steps",
        "lr",
        "log_every",
        "fail_at_step",
        "stall_at_step",
        "stall_s",
        "stall_spins",
    }

    spec = {
        "name": "toy",
        "trainer": "toy",
        "config": {"steps": 2000, "log_every": 5},
        "grid": {"lr": [0.1, 0.2, 2.0]},
        "seeds": 3,
    }
    created = client.post("/experiments", json=spec)
    assert created.status_code == 201, created.text
    experiment_id = created.json()["id"]
    failing_id = service.submit(
        {
            "name": "toy-fails",
            "trainer": "toy",
            "priority": 1,
            "config": {"fail_at_step": 0},
            "seeds": 8,
        }
    )["id"]
    assert_stopped_after_its_first_failures(service, failing_id, n_runs=8)
    detail = wait_for(
        lambda: (
            (d := client.get(f"/experiments/{experiment_id}").json())["status"]
            in {"completed", "partial"}
            and d
        )
    )
    # none of its runs was touched by the other experiment's stop
    assert detail["counts"] == {
        "queued": 0,
        "pending": 0,
        "running": 0,
        "completed": 6,
        "failed": 0,
        "diverged": 3,
        "cancelled": 0,
        "stopped": 0,
    }
    assert detail["message"] is None
    runs = client.get(f"/experiments/{experiment_id}/runs").json()
    diverged = [r for r in runs if r["status"] == "diverged"]
    assert {r["condition"]["lr"] for r in diverged} == {2.0}
    for run in diverged:
        step = run["diagnostics"]["diverged_at_step"]
        assert run["error"] == f"non-finite loss at step {step}"
        assert run["diagnostics"]["last_finite_step"] == step - 5
        assert run["metrics"]["loss"] > 1e300  # the last finite point's, not inf
    run = client.get(f"/runs/{runs[0]['id']}").json()
    provenance = run["provenance"]
    assert provenance["seed"] == runs[0]["seed"] and provenance["device"] == "cpu"
    assert provenance["torch_threads"] == 1  # the run's one CPU
    assert len(provenance["trainer_source_sha256"]) == 64
    assert len(provenance["parameters_sha256"]) == 64

    stats = client.get(f"/experiments/{experiment_id}/stats").json()
    conditions = {c["condition_key"]: c for c in stats["conditions"]}
    assert conditions["lr=0.1"]["n"] == 3 and conditions["lr=0.2"]["n"] == 3
    assert set(conditions) == {"lr=0.1", "lr=0.2"}, set(conditions)  # diverged: no sample
    pooled = [
        c for c in stats["comparisons"] if c["a"] == 0.1 and c["b"] == 0.2 and c["within"] is None
    ]
    assert len(pooled) == 1 and pooled[0]["n_a"] == 3, stats["comparisons"]


def assert_stopped_after_its_first_failures(
    service: Service, experiment_id: int, n_runs: int
) -> None:
    """The first runs all failed (three, or four stored in one pass): the rest were never run,
    each cancelled with the reason, which the experiment, and `seedgrid status`, show."""
    detail = service.wait(experiment_id)
    counts = detail["counts"]
    assert detail["status"] == "failed" and counts["completed"] == 0, detail
    assert counts["failed"] in (3, 4) and counts["cancelled"] == n_runs - counts["failed"]
    where = raise_site()
    assert re.fullmatch(
        r"stopped after its first [34] runs failed: RuntimeError: toy asked to "
        r"fail at step 0 \(at " + re.escape(where) + r"\)",
        detail["message"],
    ), detail["message"]
    listed = service.runs(experiment_id)
    first_failed = next(r for r in listed if r["status"] == "failed")
    failed = service.client.get(f"/runs/{first_failed['id']}").json()
    assert failed["status"] == "failed" and failed["failed_at"] == where
    file, line = where.split(", in ")[0].rsplit(":", 1)
    assert failed["traceback"].startswith("Traceback (most recent call last):\n")
    assert f'  File "{file}", line {line}, in train\n' in failed["traceback"]
    assert failed["traceback"].endswith("RuntimeError: toy asked to fail at step 0\n")
    assert [a["traceback"] for a in failed["attempt_history"]] == [failed["traceback"]]
    # ...and only GET /runs/{id} carries it, not the run lists
    assert "traceback" not in listed[0]
    run_log = subprocess.run(
        [sys.executable, "-m", "service.cli", "run-log", str(failed["id"]), "--url"]
        + [service.server.url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run_log.returncode == 0, run_log.stderr
    assert f"failed at: {where}\n" in run_log.stdout
    assert failed["traceback"].rstrip("\n") in run_log.stdout
    cancelled = [r for r in listed if r["status"] == "cancelled"]
    assert cancelled and all(r["started_at"] is None for r in cancelled)
    assert {r["error"] for r in cancelled} == {f"cancelled: the experiment {detail['message']}"}
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "status",
            str(experiment_id),
            "--url",
            service.server.url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert status.returncode == 0 and detail["message"] in status.stdout, status.stdout


def raise_site() -> str:
    """Where the toy trainer raises for `fail_at_step`, as GET /runs/{id}'s failed_at says it:
    "file:line, in train"."""
    source = inspect.getsource(ToyTrainer.train).splitlines()
    first = inspect.getsourcelines(ToyTrainer.train)[1]
    offset = next(i for i, text in enumerate(source) if "raise RuntimeError" in text)
    return f"{Path(inspect.getfile(ToyTrainer)).resolve()}:{first + offset}, in train"


def test_a_long_toy_run_ends_within_two_seconds_of_a_cancel(
    service: Service, toy: ToyTrainer
) -> None:
    client = service.client
    spec = {
        "name": "toy-long",
        "trainer": "toy",
        "config": {"steps": 10**10, "lr": 0.1, "log_every": 100_000},
        "seeds": 1,
    }
    experiment_id = client.post("/experiments", json=spec).json()["id"]
    (run,) = wait_for(
        lambda: [
            r for r in client.get(f"/experiments/{experiment_id}/runs").json() if r["started_at"]
        ]
    )
    wait_for(lambda: client.get(f"/runs/{run['id']}/metrics").json())  # it is training
    pid = client.get(f"/runs/{run['id']}").json()["provenance"]["worker_pid"]
    cancelled_cpu = process_cpu_s(pid)
    assert cancelled_cpu is not None, pid
    cancelled_at = time.monotonic()
    assert client.post(f"/experiments/{experiment_id}/cancel").status_code == 202
    ended = wait_for(
        lambda: (r := client.get(f"/runs/{run['id']}").json())["finished_at"] and r, timeout_s=30
    )
    used = (process_cpu_s(pid) or float("inf")) - cancelled_cpu  # ended: past its grace
    elapsed = time.monotonic() - cancelled_at
    assert ended["status"] == "cancelled"
    assert used < CANCEL_BOUND_S, (
        f"the worker used {used:.2f} CPU s after the cancel (the run ended {elapsed:.2f} s after)"
    )


def test_shared_seeds_that_scale_exactly_by_1_5_are_significant_with_8_seeds(
    start_service: Callable[..., Service], toy: ToyTrainer
) -> None:
    """Seed s of both conditions starts from the same w (the `init` stream), so one step of
    size lr leaves loss_s = |w_s|^2 (1 - 2 lr)^2: a per-seed scale of 1.5 between the two lr
    levels. Analysed as independent, 8 seeds a side could not tell; paired, the primary test
    sees it (2 of the 256 sign flips are as extreme)."""
    service = start_service()
    lr_b = (1 - math.sqrt(1.5 * 0.25)) / 2  # (1 - 2 lr_b)^2 = 1.5 (1 - 2 * 0.25)^2
    created = service.submit(
        {
            "name": "paired",
            "trainer": "toy",
            "config": {"steps": 1, "log_every": 1},
            "grid": {"lr": [0.25, lr_b]},
            "seeds": 8,
        }
    )
    assert service.wait(created["id"])["counts"]["completed"] == 16
    stats = service.client.get(f"/experiments/{created['id']}/stats").json()
    (comparison,) = stats["comparisons"]
    by_seed = {
        (r["condition"]["lr"], r["seed"]): r["metrics"]["loss"] for r in service.runs(created["id"])
    }
    assert all(
        by_seed[(lr_b, s)] == pytest.approx(1.5 * by_seed[(0.25, s)], rel=1e-12) for s in range(8)
    )
    assert comparison["pairing"] == "paired" and comparison["paired_seeds"] == 8
    assert comparison["seed_correlation"] == pytest.approx(1.0)
    assert comparison["primary_p"] == pytest.approx(2 / 256) and comparison["primary_p"] < 0.05
    assert comparison["primary_ci95"] == pytest.approx([1 / 2.25, 1 / 2.25], rel=1e-6)
    assert comparison["var_ratio"] == pytest.approx(1 / 2.25, rel=1e-9)
    assert comparison["mean_test"] == "paired t" and comparison["mean_p"] < 0.05
