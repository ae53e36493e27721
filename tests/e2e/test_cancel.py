"""A cancel through the API ends a long run of every registered trainer within 2 s, through the
whole path: HTTP -> runs store -> dispatcher -> ray.cancel -> the worker's reporter -> the
trainer's loop contract -> Ray -> the runs store. ssl_sim's long case is its convergence loop,
which logs nothing until it ends."""

from __future__ import annotations

import time

import pytest

from tests.conftest import Service
from tests.trainers.test_runtime_contract import CASES

CANCEL_BOUND_S = 2.0
# Hours of training at the test sizes, and under the service's cap on logged points.
E2E_EPOCHS = 10_000
# How long a run trains before the test cancels it.
TRAIN_BEFORE_CANCEL_S = 1.0


def wait_until(predicate, timeout_s: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s")


@pytest.mark.parametrize("trainer", sorted(CASES))
def test_a_cancel_ends_a_long_run_of_every_trainer_within_two_seconds(
    service: Service, trainer: str
) -> None:
    client = service.client
    config = dict(CASES[trainer].long)
    if "epochs" in config:
        config["epochs"] = E2E_EPOCHS
    spec = {"name": f"cancel-{trainer}", "trainer": trainer, "config": config, "seeds": 1}
    created = client.post("/experiments", json=spec)
    assert created.status_code == 201, created.text
    experiment_id = created.json()["id"]
    (run,) = wait_until(
        lambda: [
            r for r in client.get(f"/experiments/{experiment_id}/runs").json() if r["started_at"]
        ],
        timeout_s=120,
    )
    time.sleep(TRAIN_BEFORE_CANCEL_S)
    assert client.get(f"/runs/{run['id']}").json()["status"] == "running"
    cancelled_at = time.monotonic()
    assert client.post(f"/experiments/{experiment_id}/cancel").status_code == 202
    ended = wait_until(
        lambda: (r := client.get(f"/runs/{run['id']}").json())["finished_at"] and r, timeout_s=60
    )
    elapsed = time.monotonic() - cancelled_at
    assert ended["status"] == "cancelled", ended
    assert elapsed < CANCEL_BOUND_S, f"{trainer} ended {elapsed:.2f} s after the cancel"
