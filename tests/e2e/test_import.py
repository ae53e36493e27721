"""Importing per-seed results end to end (real HTTP, a real SQLite file): a W&B and an MLflow
run-table export and a JSON list of runs become ended experiments of trainer `imported` whose
/stats, /compare, runs and export are a launched experiment's; a second import grows one; every
bad input is a 422 naming the row and column and stores nothing; `seedgrid import` does the same
from a file, and the user guide's import commands run as written."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.api.server import BackgroundServer
from service.limits import MAX_IMPORT_ROWS
from service.settings import Settings
from tests.conftest import ROOT, Service

OPTIMIZERS = ("sgd", "adam")
SEEDS = range(6)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    """The API without a dispatcher (an import runs nothing) on a SQLite file."""
    db_path = tmp_path / "seedgrid.db"
    server = BackgroundServer(Settings(database_url=f"sqlite:///{db_path}"), dispatch=False)
    service = Service(server.start(), db_path)
    yield service
    service.close()


def results(seed: int, seeds: range = SEEDS) -> dict[tuple[str, int], tuple[float, float]]:
    """Known values: (optimizer, seed) -> (test accuracy, loss), adam's spread 3x sgd's."""
    rng = np.random.default_rng(seed)
    out = {}
    for optimizer in OPTIMIZERS:
        spread = 0.01 if optimizer == "sgd" else 0.03
        for s in seeds:
            out[(optimizer, s)] = (
                float(0.9 + spread * rng.standard_normal()),
                float(rng.lognormal(0.0, 0.5)),
            )
    return out


def wandb_csv(values: dict[tuple[str, int], tuple[float, float]]) -> str:
    """A W&B run table as its export writes it: bookkeeping columns, config.*, summary.*."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        [
            "Name",
            "State",
            "Created",
            "config.optimizer",
            "config.epochs",
            "config.seed",
            "summary.test_accuracy",
            "summary.loss",
            "summary._runtime",
        ]
    )
    for i, ((optimizer, seed), (accuracy, loss)) in enumerate(values.items()):
        writer.writerow(
            [
                f"run-{i}",
                "finished",
                "2024-05-01T10:00:00",
                optimizer,
                10,
                seed,
                repr(accuracy),
                repr(loss),
                12.5,
            ]
        )
    return out.getvalue()


def mlflow_csv(values: dict[tuple[str, int], tuple[float, float]]) -> str:
    """An MLflow runs table (mlflow.search_runs().to_csv()): run_id, params.*, metrics.*."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        [
            "run_id",
            "experiment_id",
            "status",
            "start_time",
            "metrics.test_accuracy",
            "metrics.loss",
            "params.seed",
            "params.optimizer",
            "params.epochs",
            "tags.mlflow.runName",
        ]
    )
    for i, ((optimizer, seed), (accuracy, loss)) in enumerate(values.items()):
        writer.writerow(
            [
                f"{i:032x}",
                "1",
                "FINISHED",
                "2024-05-01 10:00:00+00:00",
                repr(accuracy),
                repr(loss),
                seed,
                optimizer,
                10,
                f"run-{i}",
            ]
        )
    return out.getvalue()


def imported(service: Service, body: dict[str, Any], into: int | None = None) -> dict[str, Any]:
    path = "/experiments/import" if into is None else f"/experiments/{into}/import"
    response = service.client.post(path, json=body)
    assert response.status_code == 201, response.text
    return response.json()


def assert_stats_match(
    service: Service,
    experiment_id: int,
    values: dict[tuple[str, int], tuple[float, float]],
    metric: str = "test_accuracy",
) -> dict[str, Any]:
    """/stats' conditions hold numpy's mean and variance (ddof=1) of the imported values."""
    response = service.client.get(f"/experiments/{experiment_id}/stats", params={"metric": metric})
    assert response.status_code == 200, response.text
    stats = response.json()
    index = 0 if metric == "test_accuracy" else 1
    by_key = {c["condition_key"]: c for c in stats["conditions"]}
    assert set(by_key) == {f"optimizer={o}" for o in OPTIMIZERS}
    for optimizer in OPTIMIZERS:
        expected = np.array([v[index] for (o, _), v in values.items() if o == optimizer])
        got = by_key[f"optimizer={optimizer}"]
        assert got["n"] == len(expected)
        assert got["mean"] == pytest.approx(float(np.mean(expected)), rel=0, abs=1e-9)
        assert got["var"] == pytest.approx(float(np.var(expected, ddof=1)), rel=0, abs=1e-9)
        assert sorted(r["seed"] for r in got["runs"]) == sorted(
            s for (o, s) in values if o == optimizer
        )
    return stats


def counts(service: Service) -> tuple[int, int]:
    """Experiments and runs stored."""
    ((experiments,),) = service.sql("SELECT count(*) FROM experiment")
    ((runs,),) = service.sql("SELECT count(*) FROM run")
    return experiments, runs


def test_wandb_and_mlflow_exports_give_numpys_statistics(service: Service) -> None:
    wandb_values, mlflow_values = results(1), results(2)
    a = imported(service, {"name": "lr-wandb", "csv": wandb_csv(wandb_values)})
    assert a["source"] == "wandb" and a["trainer"] == "imported" and a["status"] == "completed"
    assert a["factors"] == ["optimizer"]  # epochs is 10 in every run: the base config
    assert a["metrics"] == ["test_accuracy", "loss"] and a["metric"] == "test_accuracy"
    assert a["ignored_columns"] == ["Name", "State", "Created", "summary._runtime"]
    assert (a["n_runs"], a["runs_added"], a["n_conditions"]) == (12, 12, 2)
    b = imported(service, {"name": "lr-mlflow", "csv": mlflow_csv(mlflow_values)})
    assert b["source"] == "mlflow" and b["factors"] == ["optimizer"]
    assert b["metrics"] == ["test_accuracy", "loss"]
    assert b["ignored_columns"] == [
        "run_id",
        "experiment_id",
        "status",
        "start_time",
        "tags.mlflow.runName",
    ]

    detail = service.client.get(f"/experiments/{a['id']}").json()
    assert detail["status"] == "completed" and detail["counts"]["completed"] == 12
    assert detail["finished_at"] is not None
    assert detail["spec"]["config"] == {"epochs": 10}
    assert detail["spec"]["grid"] == {"optimizer": ["sgd", "adam"]}
    assert detail["spec"]["imported"] == {"metrics": ["test_accuracy", "loss"], "source": "wandb"}

    stats = assert_stats_match(service, a["id"], wandb_values)
    assert [c["factor"] for c in stats["comparisons"]] == ["optimizer"]
    assert stats["comparisons"][0]["var_ratio"] is not None
    assert_stats_match(service, a["id"], wandb_values, metric="loss")
    assert_stats_match(service, b["id"], mlflow_values)
    refused = service.client.get(f"/experiments/{a['id']}/stats", params={"metric": "accuracy"})
    assert refused.status_code == 422 and "test_accuracy" in refused.text

    runs = service.runs(a["id"])
    assert {r["status"] for r in runs} == {"completed"} and len(runs) == 12
    first = runs[0]
    assert first["metrics"] == dict(
        zip(("test_accuracy", "loss"), wandb_values[("sgd", 0)], strict=True)
    )

    exported = service.client.get(f"/experiments/{a['id']}/export")
    assert exported.status_code == 200
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert len(rows) == 12
    assert {float(r["test_accuracy"]) for r in rows} == {v[0] for v in wandb_values.values()}


def test_compare_two_imported_experiments(service: Service) -> None:
    wandb_values, mlflow_values = results(1), results(2)
    a = imported(service, {"name": "a", "csv": wandb_csv(wandb_values)})
    b = imported(service, {"name": "b", "csv": mlflow_csv(mlflow_values)})
    response = service.client.get("/compare", params={"a": a["id"], "b": b["id"]})
    assert response.status_code == 200, response.text
    comparison = response.json()
    assert comparison["trainer"] == "imported" and comparison["metric"] == "test_accuracy"
    assert comparison["total_conditions"] == 2
    for side in comparison["conditions"]:
        optimizer = side["condition"]["optimizer"]
        for name, values in (("a", wandb_values), ("b", mlflow_values)):
            expected = [v[0] for (o, _), v in values.items() if o == optimizer]
            assert side[name]["mean"] == pytest.approx(float(np.mean(expected)), abs=1e-9)
            assert side[name]["var"] == pytest.approx(float(np.var(expected, ddof=1)), abs=1e-9)
        assert side["comparison"]["var_ratio"] == pytest.approx(
            side["a"]["var"] / side["b"]["var"], rel=1e-9
        )
    unknown = service.client.get("/compare", params={"a": a["id"], "b": b["id"], "metric": "nope"})
    assert unknown.status_code == 422 and "unknown metric 'nope'" in unknown.text


def test_a_second_import_grows_the_experiment(service: Service) -> None:
    first = results(1)
    created = imported(service, {"name": "grow", "csv": wandb_csv(first)})
    more = results(7, seeds=range(6, 9))
    grown = imported(service, {"csv": wandb_csv(more)}, into=created["id"])
    assert grown["id"] == created["id"]
    assert (grown["runs_added"], grown["n_runs"], grown["seeds"]) == (6, 18, [6, 7, 8])
    detail = service.client.get(f"/experiments/{created['id']}").json()
    assert detail["status"] == "completed" and detail["counts"]["completed"] == 18
    assert detail["spec"]["seeds"] == list(range(9))
    assert_stats_match(service, created["id"], {**first, **more})

    # The same runs again: every row is a (condition, seed) the experiment holds.
    before = counts(service)
    again = service.client.post(
        f"/experiments/{created['id']}/import", json={"csv": wandb_csv(more)}
    )
    assert again.status_code == 422
    problem = again.json()["detail"][0]
    assert problem["loc"] == ["body", "csv", "row 1", "config.seed"]
    assert "row 1 (line 2)" in problem["msg"] and "seed 6" in problem["msg"]
    assert counts(service) == before

    # A level the experiment does not have, and a config value that differs.
    text = wandb_csv(results(8, seeds=range(9, 10))).replace(",adam,10,", ",rmsprop,10,")
    text = text.replace(",sgd,10,", ",sgd,20,")
    refused = service.client.post(f"/experiments/{created['id']}/import", json={"csv": text})
    assert refused.status_code == 422
    messages = [e["msg"] for e in refused.json()["detail"]]
    assert any("column 'config.optimizer': 'rmsprop' is not one" in m for m in messages)
    assert any("column 'config.epochs': 20" in m for m in messages)
    assert counts(service) == before

    # Seeds cannot be launched for it, and no spec can name its trainer.
    seeds = service.client.post(f"/experiments/{created['id']}/seeds", json={"seeds": 2})
    assert seeds.status_code == 409 and "imported results" in seeds.json()["detail"]
    spec = {"name": "x", "trainer": "imported", "grid": {}, "seeds": 1}
    submitted = service.client.post("/experiments", json=spec)
    assert submitted.status_code == 422
    assert submitted.json()["detail"][0]["loc"] == ["body", "trainer"]
    report = service.client.get(f"/experiments/{created['id']}/reports/protocol")
    assert report.status_code == 404 and "imported results" in report.json()["detail"]
    assert counts(service) == before

    # It ended, so it can be deleted like any ended experiment.
    assert service.client.delete(f"/experiments/{created['id']}").status_code == 204
    assert service.client.get(f"/experiments/{created['id']}").status_code == 404


def test_json_runs_import(service: Service) -> None:
    values = results(3)
    runs = [
        {"condition": {"optimizer": o, "width": 64}, "seed": s, "metrics": {"test_accuracy": a}}
        for (o, s), (a, _) in values.items()
    ]
    created = imported(service, {"name": "json", "runs": runs})
    assert created["source"] == "json" and created["factors"] == ["optimizer"]
    assert_stats_match(service, created["id"], values)


def csv_body(text: str, **options: Any) -> dict[str, Any]:
    return {"name": "bad", "csv": text, **options}


GOOD_HEAD = "optimizer,seed,test_accuracy\n"
BAD_INPUTS = {
    "no seed column": (
        csv_body("optimizer,test_accuracy\nsgd,0.9\n"),
        ["body", "csv", "header"],
        ["header", "no seed column"],
    ),
    "no such seed column": (
        csv_body(GOOD_HEAD + "sgd,0,0.9\n", seed_column="run_seed"),
        ["body", "seed_column"],
        ["header", "'run_seed'"],
    ),
    "duplicate condition and seed": (
        csv_body(GOOD_HEAD + "sgd,0,0.9\nadam,0,0.8\nsgd,0,0.7\n"),
        ["body", "csv", "row 3", "seed"],
        ["row 3 (line 4)", "column 'seed'", "optimizer=sgd seed 0", "row 1"],
    ),
    "non-numeric metric": (
        csv_body(GOOD_HEAD + "sgd,0,0.9\nsgd,1,high\n"),
        ["body", "csv", "row 2", "test_accuracy"],
        ["row 2 (line 3)", "column 'test_accuracy'", "'high' is not a finite number"],
    ),
    "infinite metric": (
        csv_body(GOOD_HEAD + "sgd,0,inf\n"),
        ["body", "csv", "row 1", "test_accuracy"],
        ["row 1 (line 2)", "column 'test_accuracy'"],
    ),
    "seed that is no whole number": (
        csv_body(GOOD_HEAD + "sgd,0.5,0.9\n"),
        ["body", "csv", "row 1", "seed"],
        ["row 1 (line 2)", "column 'seed'", "'0.5'"],
    ),
    "too many rows": (
        csv_body(GOOD_HEAD + "".join(f"sgd,{s},0.5\n" for s in range(MAX_IMPORT_ROWS + 1))),
        ["body", "csv", f"row {MAX_IMPORT_ROWS + 1}"],
        [f"row {MAX_IMPORT_ROWS + 1} (line {MAX_IMPORT_ROWS + 2})", f"{MAX_IMPORT_ROWS:,}"],
    ),
    "empty file": (csv_body(""), ["body", "csv"], ["empty"]),
    "header only": (csv_body(GOOD_HEAD), ["body", "csv"], ["no rows"]),
    "unparseable CSV": (
        csv_body(GOOD_HEAD + 'sgd,0,0.9\nsgd,1,"0.8"x\n'),
        ["body", "csv", "line 3"],
        ["line 3", "not CSV"],
    ),
    "a row of the wrong width": (
        csv_body(GOOD_HEAD + "sgd,0,0.9\nsgd,1\n"),
        ["body", "csv", "row 2"],
        ["row 2 (line 3)", "2 cells", "3 columns"],
    ),
    "no metric column": (
        csv_body("optimizer,seed\nsgd,0\n"),
        ["body", "csv", "header"],
        ["no metric columns"],
    ),
    "an unknown primary metric": (
        csv_body(GOOD_HEAD + "sgd,0,0.9\n", metric="loss"),
        ["body", "metric"],
        ["'loss'", "test_accuracy"],
    ),
    "JSON: non-numeric metric": (
        {"name": "bad", "runs": [{"seed": 0, "metrics": {"test_accuracy": "high"}}]},
        ["body", "runs", 0, "metrics", "test_accuracy"],
        [],
    ),
    "JSON: duplicate condition and seed": (
        {
            "name": "bad",
            "runs": [
                {"condition": {"optimizer": "sgd"}, "seed": 0, "metrics": {"a": 1.0}},
                {"condition": {"optimizer": "adam"}, "seed": 0, "metrics": {"a": 1.0}},
                {"condition": {"optimizer": "sgd"}, "seed": 0, "metrics": {"a": 2.0}},
            ],
        },
        ["body", "runs", 2, "seed"],
        ["run 2", "optimizer=sgd seed 0", "run 0"],
    ),
    "JSON: no runs": ({"name": "bad", "runs": []}, ["body", "runs"], ["no runs"]),
    "JSON: runs and csv": (
        {"name": "bad", "runs": [], "csv": GOOD_HEAD},
        ["body"],
        ["exactly one of runs"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_422_naming_row_and_column_and_stores_nothing(
    service: Service, case: str
) -> None:
    imported(service, {"name": "kept", "csv": GOOD_HEAD + "sgd,0,0.9\n"})
    body, loc, words = BAD_INPUTS[case]
    before = counts(service)
    response = service.client.post("/experiments/import", json=body)
    assert response.status_code == 422, response.text
    problem = response.json()["detail"][0]
    assert problem["loc"] == loc, problem
    for word in words:
        assert word in problem["msg"], problem
    assert counts(service) == before


def seedgrid(service: Service, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SEEDGRID_URL": service.server.url,
            "COLUMNS": "160",  # the tables at one width, whatever the terminal (xdist sets 80)
        },
    )


def test_the_cli_imports_a_file_and_grows_it(service: Service, tmp_path: Path) -> None:
    values = results(4)
    path = tmp_path / "runs-wandb.csv"
    path.write_text(wandb_csv(values))
    done = seedgrid(service, "import", str(path))
    assert done.returncode == 0, done.stderr
    assert "experiment 1 runs-wandb: 12 runs imported (wandb; 2 conditions" in done.stdout
    assert "ignored columns: Name, State, Created, summary._runtime" in done.stdout
    assert_stats_match(service, 1, values)

    more = results(5, seeds=range(6, 8))
    path.write_text(wandb_csv(more))
    grown = seedgrid(service, "import", str(path), "--into", "1", "--json")
    assert grown.returncode == 0, grown.stderr
    assert '"n_runs": 16' in grown.stdout
    assert_stats_match(service, 1, {**values, **more})

    stats = seedgrid(service, "stats", "1")
    assert stats.returncode == 0, stats.stderr
    assert "optimizer=sgd" in stats.stdout and "optimizer: sgd vs adam" in stats.stdout

    before = counts(service)
    bad = tmp_path / "bad.csv"
    bad.write_text(GOOD_HEAD + "sgd,0,0.9\nsgd,1,high\n")
    refused = seedgrid(service, "import", str(bad))
    assert refused.returncode == 2
    assert "row 2 (line 3), column 'test_accuracy': 'high' is not a finite number" in (
        refused.stderr.replace("\n", " ")
    )
    wrong = seedgrid(service, "import", str(tmp_path / "missing.csv"))
    assert wrong.returncode == 2 and "cannot read" in wrong.stderr
    assert counts(service) == before


def guide_import_commands() -> list[str]:
    """The commands of the user guide's "Analyse results you already have" block."""
    guide = (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8")
    section = guide.split("## Analyse results you already have", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the section has no bash block"
    return [line.split("  #")[0].strip() for line in block[1].splitlines() if line.strip()]


def test_the_guide_import_runs_as_written(service: Service) -> None:
    commands = guide_import_commands()
    assert len(commands) == 3 and commands[0].startswith("seedgrid serve")
    outputs = []
    for command in commands[1:]:  # the service runs already (the fixture's)
        program, *args = command.split()
        assert program == "seedgrid", command
        done = seedgrid(service, *args)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        outputs.append(done.stdout)
    assert "experiment 1 seeds: 20 runs imported" in outputs[0]
    assert "optimizer=sgd" in outputs[1]
    with (ROOT / "examples" / "seeds.csv").open() as file:
        rows = list(csv.DictReader(file))
    stats = service.client.get("/experiments/1/stats").json()
    for condition in stats["conditions"]:
        values = [
            float(r["test_accuracy"])
            for r in rows
            if all(r[f] == str(v) for f, v in condition["condition"].items())
        ]
        assert condition["mean"] == pytest.approx(float(np.mean(values)), abs=1e-9)
        assert condition["var"] == pytest.approx(float(np.var(values, ddof=1)), abs=1e-9)
