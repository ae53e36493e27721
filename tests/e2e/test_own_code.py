"""A researcher's own training code on a two-node Ray cluster: a function trainer in a file
outside seedgrid (a temporary folder no node has on its path), registered with
`seedgrid serve --trainers FILE`, shipped to the workers by Ray's runtime environment, run over
HTTP on both nodes with the file's hash in every run's provenance; the same code raising inside
a helper stores a traceback naming that helper's file and line."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import LocalRayCluster, ServiceProcess, alive_in_sessions

USER_CODE = '''\
"""A linear fit, as a researcher writes one: plain torch, logged with run.log."""
import time

import torch

from trainers import trainer


def check_inputs(config):
    if config.fail:
        raise ValueError(f"shapes ({config.features},) and ({config.features + 1},) not aligned")


@trainer(metrics=("loss",), defaults={"lr": 0.1, "steps": 30, "features": 4, "fail": False})
def linear_fit(config, run):
    check_inputs(config)
    x = torch.randn(64, config.features, generator=run.sources.data)
    y = x.sum(dim=1)
    w = torch.zeros(config.features, requires_grad=True)
    torch.nn.init.normal_(w, generator=run.sources.init)
    for step in range(config.steps):
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= config.lr * w.grad
            w.grad.zero_()
        time.sleep(0.03)  # a run lasts about a second: both nodes take runs at once
        if run.log(step, {"loss": float(loss)}):
            break
    return {"loss": float(((x @ w - y) ** 2).mean())}
'''
FILE_NAME = "user_linear_fit.py"


@pytest.fixture(scope="module")
def user_file() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sg-own-code-"))
    path = folder / FILE_NAME
    path.write_text(USER_CODE)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def service(user_file: Path) -> Iterator[ServiceProcess]:
    cluster = LocalRayCluster()
    try:
        cluster.start_head(1)
        node = cluster.add_node("node-b", 1, 0)
        served = ServiceProcess(
            cluster,
            cluster.root / "seedgrid.db",
            "--trainers",
            str(user_file),
            SEEDGRID_METRICS_BATCH_INTERVAL_S="0.2",
        )
        try:
            cluster.wait_ready(node)
            served.wait_healthy(cpus=2, gpus=0)
            served.nodes = {n.node_id: n.name for n in cluster.nodes}  # type: ignore[attr-defined]
            yield served
        finally:
            served.close()
            assert not alive_in_sessions([served.session]), "seedgrid serve outlived the test"
    finally:
        sessions = cluster.sessions()
        cluster.shutdown()
        assert not alive_in_sessions(sessions), "Ray processes outlived the cluster"


def test_a_function_trainer_from_a_file_runs_on_both_nodes_with_its_hash_in_provenance(
    service: ServiceProcess, user_file: Path
) -> None:
    listed = {t["name"]: t for t in service.client.get("/trainers").json()}
    assert listed["linear_fit"]["primary_metric"] == "loss"
    assert set(listed["linear_fit"]["config_schema"]["properties"]) == {
        "lr",
        "steps",
        "features",
        "fail",
    }
    experiment = service.submit(
        {
            "name": "own-code",
            "trainer": "linear_fit",
            "grid": {"lr": [0.05, 0.1]},
            "seeds": 4,
            "resources": {"num_cpus": 1, "seeds_per_task": 1},
        }
    )
    detail = service.wait(experiment["id"], timeout_s=180)
    assert detail["counts"]["completed"] == 8, detail
    digest = hashlib.sha256()
    digest.update(FILE_NAME.encode() + b"\0" + user_file.read_bytes() + b"\0")
    nodes = set()
    for run in service.runs(experiment["id"]):
        provenance = service.run(run["id"])["provenance"]
        assert provenance["trainer_source_sha256"] == digest.hexdigest()
        nodes.add(provenance["ray_node_id"])
    assert nodes == set(service.nodes), (nodes, service.nodes)  # type: ignore[attr-defined]
    stats = service.client.get(f"/experiments/{experiment['id']}/stats").json()
    assert {c["condition_key"]: c["n"] for c in stats["conditions"]} == {
        "lr=0.05": 4,
        "lr=0.1": 4,
    }


def test_a_failure_inside_a_helper_names_the_helpers_file_and_line(
    service: ServiceProcess, user_file: Path
) -> None:
    failing = service.submit(
        {"name": "own-code-fails", "trainer": "linear_fit", "config": {"fail": True}, "seeds": 2}
    )
    detail = service.wait(failing["id"], timeout_s=180)
    assert detail["counts"]["failed"] == 2, detail
    raised = next(
        i
        for i, text in enumerate(USER_CODE.splitlines(), start=1)
        if text.strip().startswith("raise ValueError(")
    )
    for run in service.runs(failing["id"]):
        shown = service.run(run["id"])
        assert shown["error"] == "ValueError: shapes (4,) and (5,) not aligned"
        # the file the operator gave `--trainers` (the worker ran Ray's copy of it, in a
        # temporary _ray_pkg_ folder on its node), this line, this helper
        assert shown["failed_at"] == f"{user_file}:{raised}, in check_inputs", shown["failed_at"]
        assert f'File "{user_file}", line {raised}, in check_inputs\n' in shown["traceback"]
        called = USER_CODE.splitlines().index("    check_inputs(config)") + 1
        assert f'File "{user_file}", line {called}, in linear_fit\n' in shown["traceback"]
        assert "_ray_pkg_" not in shown["traceback"], shown["traceback"]
