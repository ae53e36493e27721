"""A client nobody here wrote: openapi-python-client generates one from the live service's
/openapi.json, `mypy --strict` checks the generated package together with a script that uses
it, and the script submits a collapse experiment, waits for it and reads its statistics.

What this holds the schema to: operation ids that name the action (the generated functions are
`submit_experiment`, `get_stats`), error responses declared with their models (a 404 comes back
as a typed ErrorDetail, not None), response fields typed as what they are (no `Unset` in a
response model: the script reads `stats.conditions[0].runs[0].seed` as an int under --strict),
and no field typed as a dict of Any where the API knows more (a run's metrics are `float | None`,
a grid's levels JSON scalars, its diagnostics nested JSON).

On SQLite only: the schema and the client do not depend on the database, and generating and
type-checking take most of this test's time.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Service

PACKAGE = "seedgrid_generated"
VENV_BIN = Path(sys.executable).parent

# Uses the generated package as a user would; type-checked with it under --strict, then run.
USE_CLIENT = '''
"""Submit, wait and read statistics through the generated client."""

from __future__ import annotations

import time
from typing import assert_type

from seedgrid_generated import Client
from seedgrid_generated.api.experiments import (
    get_experiment,
    get_stats,
    list_runs,
    submit_experiment,
)
from seedgrid_generated.api.system import get_health
from seedgrid_generated.models import (
    ErrorDetail,
    ExperimentCreated,
    ExperimentDetail,
    ExperimentSpec,
    ExperimentSpecConfig,
    ExperimentSpecGrid,
    ExperimentStatus,
    Health,
    HealthStatus,
    Stats,
)


def submit_wait_stats(base_url: str) -> tuple[int, list[tuple[str, int, int, float]],
                                              dict[int, float | None]]:
    """The experiment's id; per condition key, each run id, seed and value /stats serves; and
    per run id, the final min_l2 its run serves."""
    client = Client(base_url=base_url, timeout=None)
    health = get_health.sync(client=client)
    assert isinstance(health, Health) and health.status is HealthStatus.OK, health

    spec = ExperimentSpec(
        name="generated-client", trainer="collapse",
        config=ExperimentSpecConfig.from_dict({"n_samples": 64, "steps": 50}),
        grid=ExperimentSpecGrid.from_dict({"stop_gradient": [False, True]}),
        seeds=2, metric="min_l2")
    created = submit_experiment.sync(client=client, body=spec)
    assert isinstance(created, ExperimentCreated), created
    experiment_id: int = created.id

    deadline = time.monotonic() + 60
    while True:
        detail = get_experiment.sync(client=client, experiment_id=experiment_id)
        assert isinstance(detail, ExperimentDetail), detail
        if detail.status is ExperimentStatus.COMPLETED:
            break
        assert time.monotonic() < deadline, detail.to_dict()
        time.sleep(0.2)

    missing = get_experiment.sync(client=client, experiment_id=2_000_000_000)
    assert isinstance(missing, ErrorDetail) and "not found" in missing.detail, missing

    stats = get_stats.sync(client=client, experiment_id=experiment_id)
    assert isinstance(stats, Stats), stats

    runs = list_runs.sync(client=client, experiment_id=experiment_id)
    assert isinstance(runs, list), runs
    final = {run.id: run.metrics["min_l2"] for run in runs}
    assert_type(final, dict[int, float | None])  # mypy --strict fails it if a metric is Any
    return experiment_id, [(condition.condition_key, run.run_id, run.seed, run.value)
                           for condition in stats.conditions for run in condition.runs], final
'''


def test_a_generated_client_type_checks_and_reads_stats(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = service.client.get("/openapi.json").json()
    (tmp_path / "openapi.json").write_text(json.dumps(schema))
    # No post hooks: the package is checked exactly as the generator's templates write it.
    (tmp_path / "config.yaml").write_text(
        f"project_name_override: {PACKAGE}\npackage_name_override: {PACKAGE}\npost_hooks: []\n"
    )
    generated = subprocess.run(
        [
            str(VENV_BIN / "openapi-python-client"),
            "generate",
            "--path",
            "openapi.json",
            "--meta",
            "none",
            "--output-path",
            PACKAGE,
            "--config",
            "config.yaml",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    # Every operation and every model made it into the client (the generator skips what it
    # cannot parse, with a warning, and still exits 0).
    assert "Warning" not in generated.stdout + generated.stderr, generated.stdout
    functions = {p.stem for p in (tmp_path / PACKAGE / "api").rglob("*.py")} - {"__init__"}
    operation_ids = {op["operationId"] for ops in schema["paths"].values() for op in ops.values()}
    assert functions == operation_ids
    assert {"submit_experiment", "get_stats", "list_runs", "get_health"} <= functions

    def value_type(model: str) -> str:
        """The value type of a generated dict model (its additional_properties)."""
        source = (tmp_path / PACKAGE / "models" / f"{model}.py").read_text()
        found = re.search(r"additional_properties: dict\[str, (.+)\] = ", source)
        assert found, source
        return found.group(1)

    assert value_type("run_out_metrics") == "float | None"
    assert value_type("experiment_spec_grid") == "list[bool | float | int | None | str]"
    # nested JSON: an object is the recursive JsonObject model, a list of lists still typed
    diagnostics = value_type("run_out_diagnostics")
    assert diagnostics == value_type("json_object") == value_type("run_detail_provenance")
    assert diagnostics.startswith(
        "bool | float | int | JsonObject | list[bool | float | int | JsonObject | list["
    ), diagnostics

    (tmp_path / "use_client.py").write_text(USE_CLIENT)
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            PACKAGE,
            "use_client.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    monkeypatch.syspath_prepend(str(tmp_path))
    use_client = importlib.import_module("use_client")
    experiment_id, runs, final = use_client.submit_wait_stats(service.server.url)

    # The values /stats serves, each beside the run and seed the database holds for it.
    stored = {
        (key, run_id, seed, metrics["min_l2"])
        for run_id, key, seed, metrics in (
            (row[0], row[1], row[2], json.loads(row[3]) if isinstance(row[3], str) else row[3])
            for row in service.sql(
                "SELECT id, condition_key, seed, metrics FROM run WHERE experiment_id = :e",
                e=experiment_id,
            )
        )
    }
    assert len(runs) == 4 and set(runs) == stored
    assert final == {run_id: value for _, run_id, _, value in stored}
    served = service.client.get(f"/experiments/{experiment_id}/stats").json()
    for condition in served["conditions"]:
        assert condition["values"] == [run["value"] for run in condition["runs"]]
