"""The pre-flight's logic without Ray: which conditions share a check, which node a check goes
to, and how what a node found becomes one 422 naming the field (the whole path, through HTTP
and a real Ray, is in tests/e2e/test_cff_api.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api_schemas import ExperimentSpec
from service.experiments import condition_key, validate_spec
from service.scheduling.preflight import (
    ClusterPreflight,
    Node,
    distinct_checks,
    memory_errors,
    no_gpu_errors,
    pick_node,
    report_errors,
)
from service.settings import Settings
from workers.preflight import check_configs

SETTINGS = Settings(database_url="sqlite://")
CFF = {"width": 16, "depth": 1, "epochs": 1, "head_epochs": 1}


def cff_spec(config: dict[str, object], grid: dict[str, list[object]]) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {"name": "p", "trainer": "cff", "seeds": 2, "config": {**CFF, **config}, "grid": grid}
    )


def test_conditions_share_a_check_by_what_it_reads_and_need_none_without_files() -> None:
    spec = cff_spec(
        {},
        {"dataset": ["cifar10", "svhn", "digits"], "lr": [0.01, 0.02], "device": ["auto", "cuda"]},
    )
    trainer, conditions = validate_spec(spec, settings=SETTINGS)
    checks = {
        tuple(sorted(c.inputs.items())): c for c in distinct_checks(trainer, spec, conditions)
    }
    # 12 conditions, 5 distinct checks: lr changes nothing checked, digits on auto needs none
    assert len(conditions) == 12 and len(checks) == 5
    cifar_auto = checks[(("data_root", None), ("dataset", "cifar10"), ("download", False))]
    assert [condition_key(c) for c in cifar_auto.conditions] == [
        "dataset=cifar10,device=auto,lr=0.01",
        "dataset=cifar10,device=auto,lr=0.02",
    ]
    assert cifar_auto.config["dataset"] == "cifar10" and cifar_auto.config["width"] == 16
    assert checks[(("device", "cuda"),)].conditions[0]["dataset"] == "digits"
    digits = cff_spec({"dataset": "digits"}, {"lr": [0.01, 0.02]})
    trainer, conditions = validate_spec(digits, settings=SETTINGS)
    assert distinct_checks(trainer, digits, conditions) == []


def test_a_check_goes_to_a_node_that_can_hold_the_runs() -> None:
    cpu = Node("a", "10.0.0.1", "cpu-node", cpus=8, gpus=0)
    small_gpu = Node("b", "10.0.0.2", "gpu-node", cpus=2, gpus=1)
    big_gpu = Node("c", "10.0.0.3", "big-gpu-node", cpus=16, gpus=8)
    nodes = [cpu, small_gpu, big_gpu]
    assert pick_node(nodes, 1, 0, wants_gpu=False) is cpu
    assert pick_node(nodes, 1, 0, wants_gpu=True) is small_gpu  # cuda: a node with a GPU
    assert pick_node(nodes, 4, 0.5, wants_gpu=False) is big_gpu
    assert pick_node(nodes, 4, 16, wants_gpu=True) is None


def test_what_a_node_found_is_one_error_per_field_naming_the_conditions() -> None:
    spec = cff_spec({"dataset": "cifar10"}, {"lr": [0.01, 0.02], "device": ["cuda"]})
    trainer, conditions = validate_spec(spec, settings=SETTINGS)
    (check,) = distinct_checks(trainer, spec, conditions)
    node = Node("a", "10.0.0.1", "worker-1", cpus=8, gpus=0)
    missing = "dataset 'cifar10' not found under /data (missing /data/cifar-10-batches-py/...)"
    errors = report_errors(spec, [check], [[("dataset", missing), ("device", "no GPU")]], node)
    assert [e["loc"] for e in errors] == [["body", "config", "dataset"], ["body", "grid", "device"]]
    assert errors[0]["msg"] == (
        f"{missing} (checked on Ray node 10.0.0.1 (worker-1)) "
        "(conditions: device=cuda,lr=0.01; device=cuda,lr=0.02)"
    )
    (no_gpu,) = no_gpu_errors(spec, [check], [node])
    assert no_gpu["loc"] == ["body", "grid", "device"]
    assert "no node of the Ray cluster has a GPU (1 alive nodes)" in no_gpu["msg"]


def test_with_the_check_off_submissions_go_on_unchecked() -> None:
    spec = cff_spec({"dataset": "cifar10", "device": "cuda"}, {})
    trainer, conditions = validate_spec(spec, settings=SETTINGS)
    off = ClusterPreflight(Settings(database_url="sqlite://", preflight_timeout_s=0))
    assert off.check(trainer, spec, conditions) == []


def test_a_missing_dataset_names_the_operators_root_not_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pre-flight task finds on a node, as the 422 reports it: the root by the name
    the operator gave it (the default one, or a name of SEEDGRID_DATA_ROOTS) and the files
    relative to it; the operator's directories never reach the client."""
    roots = f"shared={tmp_path / 'shared'}"
    monkeypatch.setenv("SEEDGRID_DATA_ROOT", str(tmp_path / "default"))
    monkeypatch.setenv("SEEDGRID_DATA_ROOTS", roots)  # as the worker reads them
    spec = cff_spec({"dataset": "cifar10"}, {"data_root": [None, "shared"]})
    trainer, conditions = validate_spec(
        spec, settings=Settings(database_url="sqlite://", data_roots=roots)
    )
    checks = distinct_checks(trainer, spec, conditions)
    report = check_configs("cff", [c.config for c in checks])  # the task's body, without Ray
    node = Node("a", "10.0.0.1", "worker-1", cpus=8, gpus=0)
    errors = report_errors(spec, checks, report.problems, node)
    assert [e["loc"] for e in errors] == [["body", "config", "dataset"]] * 2
    messages = [e["msg"] for e in errors]
    assert messages[0].startswith(
        "dataset 'cifar10' not found under the default data root "
        "(missing cifar-10-batches-py/data_batch_1, "
    )
    assert messages[1].startswith(
        "dataset 'cifar10' not found under data root 'shared' "
        "(missing cifar-10-batches-py/data_batch_1, "
    )
    assert all(str(tmp_path) not in m and "checked on Ray node 10.0.0.1" in m for m in messages)


def test_a_cpu_task_larger_than_the_largest_nodes_memory_is_refused_naming_its_field() -> None:
    """The trainer's own estimate (called here as the reference) against the largest alive
    node's memory for tasks: only the conditions over it are named, under the grid axis that
    drives the estimate; a seed-batched task counts its seeds; a GPU task is not compared
    (its memory is the device's, which Ray does not report)."""
    spec = ExperimentSpec.model_validate(
        {
            "name": "m",
            "trainer": "collapse",
            "seeds": 2,
            "config": {"n_samples": 10**6},
            "grid": {"dim": [64, 512]},
            "resources": {"seeds_per_task": 1},  # collapse batches 8 by default
        }
    )
    trainer, conditions = validate_spec(
        spec, settings=Settings(database_url="sqlite://", max_run_memory_gb=1000)
    )
    need = {
        c["dim"]: trainer.estimate(trainer.Config(n_samples=10**6, dim=c["dim"])).memory_bytes
        for c in conditions
    }
    assert need[64] < 16.8e9 < need[512]  # 5.8 GB and 45.2 GB
    nodes = [
        Node("a", "10.0.0.1", "small", cpus=8, gpus=0, memory=8e9),
        Node("b", "10.0.0.2", "large", cpus=2, gpus=0, memory=16.8e9),
    ]
    (error,) = memory_errors(trainer, spec, conditions, nodes)
    assert error["loc"] == ["body", "grid", "dim"], error
    assert error["msg"] == (
        f"one run needs about {need[512] / 1e9:,.1f} GB (estimated from n_samples, n_classes, "
        "dim, loss), more than the largest node of the Ray cluster gives its tasks: 16.8 GB on "
        "Ray node 10.0.0.2 (large) (conditions: dim=512)"
    )
    roomy = [Node("c", "10.0.0.3", "roomy", cpus=2, gpus=0, memory=64e9)]
    assert memory_errors(trainer, spec, conditions, roomy) == []
    assert memory_errors(trainer, spec, conditions, []) == []  # nothing known: not refused

    batched = spec.model_copy(
        update={"resources": spec.resources.model_copy(update={"seeds_per_task": 3})}
    )
    (error,) = memory_errors(trainer, batched, conditions, roomy)
    assert error["msg"].startswith(
        f"one task of 3 seeds (resources.seeds_per_task) needs about {3 * need[512] / 1e9:,.1f} GB"
    ), error
    on_gpu = spec.model_copy(
        update={"resources": spec.resources.model_copy(update={"num_gpus": 1.0})}
    )
    assert memory_errors(trainer, on_gpu, conditions, nodes) == []
