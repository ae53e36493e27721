"""The `cff` trainer end to end through the HTTP API on a real local Ray."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import ray

from tests.conftest import Service
from tests.scipy_reference import assert_matches, reference_comparison, reference_strata


@pytest.fixture
def service(backend_service: Service) -> Service:
    """Each test here runs on a SQLite file and on a fresh PostgreSQL database."""
    return backend_service


TINY = {
    "dataset": "digits",
    "image_size": 8,
    "width": 16,
    "depth": 2,
    "heads": 2,
    "patch": 4,
    "epochs": 2,
    "head_epochs": 2,
    "batch_size": 128,
    "head_lr": 0.02,
}


def test_margin_by_stability_grid_serves_pooled_and_within_comparisons(service: Service) -> None:
    created = service.submit(
        {
            "name": "cff-2x2",
            "trainer": "cff",
            "config": TINY,
            "grid": {"margin_mode": ["clamp", "subtract"], "stability": ["detach", "direct"]},
            "seeds": 3,
        }
    )
    assert created["n_runs"] == 12
    detail = service.wait(created["id"], timeout_s=300)
    assert detail["counts"]["completed"] == 12, detail
    runs = service.runs(created["id"])
    for run in runs:
        assert 0.0 <= run["metrics"]["car_layer0_early"] <= 1.0
        assert len(run["diagnostics"]["final_grad_norms"]) == 2
        assert run["metrics"]["test_accuracy"] > 0.1
    # each worker process decodes the dataset at most once (none when an earlier test's runs
    # left it decoded); its later runs reuse it
    pid_of = {
        r["id"]: service.client.get(f"/runs/{r['id']}").json()["provenance"]["worker_pid"]
        for r in runs
    }
    decoded = [pid_of[r["id"]] for r in runs if not r["diagnostics"]["dataset_cached"]]
    assert len(decoded) == len(set(decoded)) and len(set(pid_of.values())) < len(runs)
    curve = service.client.get(
        f"/runs/{runs[0]['id']}/metrics", params={"name": "grad_norm_layer0"}
    ).json()
    assert [p["epoch"] for p in curve] == [0, 1]
    # the experiment names the curves its runs logged: a depth-2 model's layers 0 and 1 only
    # (the dashboard offers these, not the trainer's whole list)
    logged = {p["name"] for p in service.client.get(f"/runs/{runs[0]['id']}/metrics").json()}
    shown = service.client.get(f"/experiments/{created['id']}").json()["curve_metrics"]
    assert shown == sorted(logged) and "grad_norm_layer1" in shown
    assert not [name for name in shown if name.endswith("layer2")]

    stats = service.client.get(f"/experiments/{created['id']}/stats").json()
    assert stats["metric"] == "test_accuracy"
    margin = [c for c in stats["comparisons"] if c["factor"] == "margin_mode"]
    scopes = {None if c["within"] is None else c["within"]["stability"]: c for c in margin}
    assert set(scopes) == {None, "detach", "direct"}

    def accuracies(mode: str, stability: str | None) -> list[float]:
        """In seed order: the conditions share seeds, so the pooled comparison pairs them."""
        return [
            r["metrics"]["test_accuracy"]
            for r in sorted(runs, key=lambda r: r["seed"])
            if r["condition"]["margin_mode"] == mode
            and stability in (None, r["condition"]["stability"])
        ]

    for stability, comparison in scopes.items():
        assert (comparison["a"], comparison["b"]) == ("clamp", "subtract")
        expected_n = 6 if stability is None else 3
        assert comparison["n_a"] == comparison["n_b"] == expected_n
        if stability is None:
            # pooled: within each stability cell, 3 seeds x 2 cells = 64 sign flips: paired
            assert comparison["pairing"] == "paired"
            want = reference_strata(
                [
                    (accuracies("clamp", st), accuracies("subtract", st))
                    for st in ("detach", "direct")
                ],
                paired=True,
            )
        else:  # 3 seeds have 8 sign flips, too few: unpaired, and it says so
            assert comparison["pairing"] == "unpaired" and comparison["pairing_note"]
            want = reference_comparison(
                accuracies("clamp", stability), accuracies("subtract", stability)
            )
        assert_matches(comparison, want)
    # both readings of "pooled" (paper 000 section 4.1): the within-cell pooled variance over
    # the two stability cells (var_a, what the tests compare), and the plain variance of the 6
    # runs (marginal_var_a, descriptive)
    cells = {
        mode: sum(2 * np.var(accuracies(mode, st), ddof=1) for st in ("detach", "direct")) / 4
        for mode in ("clamp", "subtract")
    }
    assert scopes[None]["var_a"] == pytest.approx(cells["clamp"], rel=1e-9)
    assert scopes[None]["var_b"] == pytest.approx(cells["subtract"], rel=1e-9)
    assert scopes[None]["marginal_var_a"] == pytest.approx(
        np.var(accuracies("clamp", None), ddof=1), rel=1e-9
    )
    # the diagnostics are served as metrics too
    car = service.client.get(
        f"/experiments/{created['id']}/stats", params={"metric": "grad_norm_layer0"}
    ).json()
    assert len(car["conditions"]) == 4


def test_a_missing_dataset_or_a_gpu_the_cluster_lacks_is_one_422_and_stores_nothing(
    start_backend_service: Callable[..., Service], data_roots: dict[str, Path]
) -> None:
    """The pre-flight: what would fail every run before it trains is found on a node of the
    cluster before any run is queued. (A run whose files vanish after it was queued fails
    with the loader's same message: tests/trainers/test_data.py.)"""
    # a generous wait: the check's worker may import torch first on this busy machine
    service = start_backend_service(preflight_timeout_s=120)
    missing = service.client.post(
        "/experiments",
        json={
            "name": "cff-missing",
            "trainer": "cff",
            "config": {**TINY, "dataset": "cifar10", "image_size": None},
            "grid": {"margin_mode": ["clamp", "subtract"]},
            "seeds": 2,
        },
    )
    assert missing.status_code == 422, missing.text
    (error,) = missing.json()["detail"]  # two conditions, one check, one error
    assert error["loc"] == ["body", "config", "dataset"]
    message = error["msg"]
    # the loader's message: the operator's default root (by name: its path is not the client's
    # to see), what to put there, where it was seen
    assert message.startswith(
        "dataset 'cifar10' not found under the default data root (missing "
        "cifar-10-batches-py/data_batch_1, "
    ), message
    assert str(data_roots["default"]) not in message
    assert "SEEDGRID_DATA_ROOT" in message and "checked on Ray node " in message
    assert "(conditions: margin_mode=clamp; margin_mode=subtract)" in message

    if not ray.cluster_resources().get("GPU"):  # known from the resources of a CPU cluster
        cuda = service.client.post(
            "/experiments",
            json={
                "name": "cff-cuda",
                "trainer": "cff",
                "config": TINY,
                "grid": {"device": ["auto", "cuda"]},
                "seeds": 2,
            },
        )
        assert cuda.status_code == 422, cuda.text
        (error,) = cuda.json()["detail"]
        assert error["loc"] == ["body", "grid", "device"]
        assert "no node of the Ray cluster has a GPU" in error["msg"]
        assert "(conditions: device=cuda)" in error["msg"]
    assert service.sql("SELECT count(*) FROM experiment") == [(0,)]
    assert service.sql("SELECT count(*) FROM run") == [(0,)]


def test_a_named_data_root_of_the_operator_serves_its_dataset(service: Service) -> None:
    created = service.submit(
        {
            "name": "cff-named-root",
            "trainer": "cff",
            "config": {
                **TINY,
                "dataset": "cifar10",
                "image_size": None,
                "data_root": "fake",
                "select_by_validation": False,
                "val_fraction": 0.0,
            },
            "seeds": 1,
        }
    )
    detail = service.wait(created["id"], timeout_s=120)
    assert detail["status"] == "completed", service.runs(created["id"])
    (run,) = service.runs(created["id"])
    assert 0.0 <= run["metrics"]["test_accuracy"] <= 1.0
