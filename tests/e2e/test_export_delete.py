"""Export and housekeeping end to end, on a SQLite file and on the local PostgreSQL: the CSV and
Parquet files (API and `seedgrid export`) read back equal to /runs and /runs/{id}/metrics;
DELETE refuses a running experiment and removes every row of an ended one; the name filter."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, Service

QUICK = {"n_samples": 64, "steps": 100, "log_every": 10}


@pytest.fixture
def service(backend_service: Service) -> Service:
    return backend_service


def export_cli(service: Service, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", "export", *args, "--url",
                           service.server.url], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(os.environ))


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def assert_runs_equal(table: pd.DataFrame, runs: list[dict], factors: list[str]) -> None:
    assert list(table["id"]) == [r["id"] for r in runs]
    metric_names = list(dict.fromkeys(m for r in runs for m in r["metrics"]))
    assert list(table.columns) == ["id", "condition_key", *factors, "seed", "status", "error",
                                   *metric_names]
    for row, run in zip(table.to_dict("records"), runs, strict=True):
        assert row["seed"] == run["seed"] and row["status"] == run["status"]
        assert row["condition_key"] == run["condition_key"]
        for factor in factors:
            assert row[factor] == run["condition"][factor]
        for name in metric_names:
            assert same(float(row[name]), float(run["metrics"][name])), (name, row, run)


def test_export_round_trips_through_csv_and_parquet(service: Service, tmp_path: Path) -> None:
    created = service.submit({"name": "exported", "trainer": "collapse", "config": QUICK,
                              "grid": {"r": [0.0, 0.5]}, "seeds": 2})
    service.wait(created["id"])
    experiment_id = created["id"]
    runs = service.runs(experiment_id)
    assert len(runs) == 4 and {r["status"] for r in runs} == {"completed"}

    for fmt in ("csv", "parquet"):
        target = tmp_path / f"runs.{fmt}"
        result = export_cli(service, str(experiment_id), "--format", fmt, "-o", str(target))
        assert result.returncode == 0, result.stderr
        table = pd.read_csv(target) if fmt == "csv" else pq.read_table(target).to_pandas()
        assert_runs_equal(table, runs, ["r"])

    points = []
    for run in runs:
        curve = service.client.get(f"/runs/{run['id']}/metrics").json()
        assert curve, "each run logged points"
        points += [(run["id"], run["seed"], run["condition_key"], p["step"], p["epoch"],
                    p["name"], p["value"]) for p in curve]
    for fmt in ("csv", "parquet"):
        target = tmp_path / f"curves.{fmt}"
        result = export_cli(service, str(experiment_id), "--format", fmt, "--curves", "-o",
                            str(target))
        assert result.returncode == 0, result.stderr
        table = (pd.read_csv(target, keep_default_na=False) if fmt == "csv"
                 else pq.read_table(target).to_pandas())
        assert list(table.columns) == ["run_id", "seed", "condition", "step", "epoch", "name",
                                       "value"]
        assert len(table) == len(points)
        for row, expected in zip(table.itertuples(index=False), points, strict=True):
            epoch = None if row.epoch in ("", None) or pd.isna(row.epoch) else int(row.epoch)
            got = (row.run_id, row.seed, row.condition, row.step, epoch, row.name,
                   float(row.value))
            assert all(same(a, b) for a, b in zip(got, expected, strict=True)), (got, expected)

    response = service.client.get(f"/experiments/{experiment_id}/export",
                                  params={"format": "parquet"})
    assert response.status_code == 200
    assert response.headers["content-disposition"].endswith(
        f'filename="experiment-{experiment_id}-runs.parquet"')
    assert_runs_equal(pq.read_table(io.BytesIO(response.content)).to_pandas(), runs, ["r"])
    bad = service.client.get(f"/experiments/{experiment_id}/export", params={"format": "xlsx"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "format"]
    assert service.client.get("/experiments/999999/export").status_code == 404


def rows_of(service: Service, experiment_id: int) -> dict[str, int]:
    run_ids = f"SELECT id FROM run WHERE experiment_id = {experiment_id}"
    counts = {
        "experiment": f"SELECT count(*) FROM experiment WHERE id = {experiment_id}",
        "run": f"SELECT count(*) FROM run WHERE experiment_id = {experiment_id}",
        "runattempt": f"SELECT count(*) FROM runattempt WHERE run_id IN ({run_ids})",
        "metricpoint": f"SELECT count(*) FROM metricpoint WHERE run_id IN ({run_ids})",
        "statscache": f"SELECT count(*) FROM statscache WHERE experiment_id = {experiment_id}",
    }
    return {table: service.sql(query)[0][0] for table, query in counts.items()}


def test_delete_refuses_a_running_experiment_and_removes_every_row_of_an_ended_one(
        service: Service) -> None:
    kept = service.submit({"name": "kept", "trainer": "collapse", "config": QUICK, "grid": {},
                           "seeds": 2})
    ended = service.submit({"name": "ended", "trainer": "collapse", "config": QUICK,
                            "grid": {"r": [0.0, 0.5]}, "seeds": 2})
    long = service.submit({"name": "long", "trainer": "collapse",
                           "config": {"n_samples": 64, "steps": 10**7}, "grid": {}, "seeds": 1})
    for created in (kept, ended):
        service.wait(created["id"])
        assert service.client.get(f"/experiments/{created['id']}/stats").status_code == 200
    before_kept = rows_of(service, kept["id"])
    before = rows_of(service, ended["id"])
    assert all(n > 0 for n in before.values()), before

    refused = service.client.delete(f"/experiments/{long['id']}")
    assert refused.status_code == 409
    assert "cancel it" in refused.json()["detail"]
    assert rows_of(service, long["id"])["run"] == 1

    assert service.client.delete(f"/experiments/{ended['id']}").status_code == 204
    assert rows_of(service, ended["id"]) == dict.fromkeys(before, 0)
    assert rows_of(service, kept["id"]) == before_kept
    assert service.client.get(f"/experiments/{ended['id']}").status_code == 404
    assert service.client.delete(f"/experiments/{ended['id']}").status_code == 404

    assert service.client.post(f"/experiments/{long['id']}/cancel").status_code == 202
    service.wait(long["id"])
    assert service.client.delete(f"/experiments/{long['id']}").status_code == 204
    assert rows_of(service, long["id"])["run"] == 0


def test_the_name_filter_is_a_case_insensitive_substring_with_pagination(
        service: Service) -> None:
    for name in ("Alpha_ONE", "alpha_two", "beta", "alpha%x"):
        service.submit({"name": name, "trainer": "collapse", "config": QUICK, "grid": {},
                        "seeds": 1})

    def names(**params: object) -> list[str]:
        response = service.client.get("/experiments", params=params)
        assert response.status_code == 200, response.text
        return [e["name"] for e in response.json()]

    assert names(name="ALPHA") == ["alpha%x", "alpha_two", "Alpha_ONE"]
    assert names(name="a_o") == ["Alpha_ONE"]  # `_` is matched as itself, not any character
    assert names(name="%") == ["alpha%x"]
    assert names(name="gamma") == []
    first = service.client.get("/experiments", params={"name": "alpha", "limit": 2})
    assert [e["name"] for e in first.json()] == ["alpha%x", "alpha_two"]
    assert 'rel="next"' in first.headers["link"] and "name=alpha" in first.headers["link"]
    assert names(name="alpha", limit=2, offset=2) == ["Alpha_ONE"]
    too_long = service.client.get("/experiments", params={"name": "x" * 101})
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["loc"] == ["query", "name"]
    listed = subprocess.run([sys.executable, "-m", "service.cli", "list", "--name", "alpha",
                             "--json", "--url", service.server.url], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    assert [e["name"] for e in json.loads(listed.stdout)] == ["alpha%x", "alpha_two", "Alpha_ONE"]
