"""The Python client (service/client/) end to end over HTTP: a YAML spec submitted, waited
for, and its runs, statistics and curves read as DataFrames equal to what the API serves.

Every test here runs twice: on a SQLite file and on a fresh PostgreSQL database."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from api_schemas import ExperimentStatus, RunStatus
from service.client import ApiError, Client
from tests.conftest import Service

FAST = {"n_samples": 64, "steps": 60}
TOKEN = "client-token-0123456789abcdef"


@pytest.fixture
def service(backend_service: Service) -> Service:
    return backend_service


@pytest.fixture
def start_service(start_backend_service: Callable[..., Service]) -> Callable[..., Service]:
    return start_backend_service


def split(value: list[float | None] | None) -> tuple[float | None, float | None]:
    return (None, None) if value is None else (value[0], value[1])


def same(a: object, b: object) -> bool:
    """Equal, with NaN (pandas' missing float) equal to None."""
    if isinstance(a, float) and math.isnan(a):
        return b is None
    return a == b


def test_submit_wait_and_read_runs_stats_and_curves(service: Service, tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "client",
                "trainer": "collapse",
                "config": FAST,
                "grid": {"stop_gradient": [False, True]},
                "seeds": 3,
                "metric": "min_l2",
            }
        )
    )
    with Client(service.server.url) as sg:
        created = sg.submit(spec_file)
        assert (created.n_conditions, created.n_runs) == (2, 6)
        detail = sg.wait(created.id, progress=True, timeout_s=120)
        assert detail.status is ExperimentStatus.completed and detail.counts.completed == 6

        served_runs = service.runs(created.id)
        runs = sg.runs(created.id)
        assert list(runs["run_id"]) == [r["id"] for r in served_runs]
        assert list(runs["seed"]) == [r["seed"] for r in served_runs]
        assert list(runs["stop_gradient"]) == [r["condition"]["stop_gradient"] for r in served_runs]
        assert list(runs["metric.min_l2"]) == [r["metrics"]["min_l2"] for r in served_runs]
        assert set(runs["status"]) == {RunStatus.completed.value}

        conditions, comparisons = sg.stats(created.id)
        served = service.client.get(f"/experiments/{created.id}/stats").json()
        assert len(conditions) == len(served["conditions"]) == 2
        for (_, row), expected in zip(conditions.iterrows(), served["conditions"], strict=True):
            for key, value in expected.items():
                if key == "condition":
                    assert all(row[f] == v for f, v in value.items())
                elif key == "runs":
                    continue
                elif key == "ci95":
                    assert (row["ci95_low"], row["ci95_high"]) == split(value)
                else:
                    assert same(row[key], value), key
            # and against float64 arithmetic on the runs' final metrics
            values = np.array(
                [
                    r["metrics"]["min_l2"]
                    for r in served_runs
                    if r["condition_key"] == row["condition_key"]
                ],
                dtype=np.float64,
            )
            assert row["mean"] == pytest.approx(values.mean(), rel=1e-12)
            assert row["var"] == pytest.approx(values.var(ddof=1), rel=1e-12)
        assert len(comparisons) == len(served["comparisons"]) == 1
        (expected,) = served["comparisons"]
        row = comparisons.iloc[0]
        for key, value in expected.items():
            if isinstance(value, list) and "ci95" in key:
                assert (row[f"{key}_low"], row[f"{key}_high"]) == split(value), key
            elif key != "warnings":
                assert same(row[key], value), key
        assert list(row["warnings"]) == expected["warnings"]
        # scale="log": the within-cell variance ratio of the runs' logarithms (one factor: of
        # the two levels' sample variances), against numpy on the stored metrics
        log = sg.stats(created.id, scale="log")
        assert log.stats.scale == "log" and list(log.comparisons["scale"]) == ["log"]
        logs = {
            level: np.log(
                [
                    r["metrics"]["min_l2"]
                    for r in served_runs
                    if r["condition"]["stop_gradient"] is level
                ]
            )
            for level in (False, True)
        }
        a_level, b_level = expected["a"], expected["b"]
        assert log.comparisons.iloc[0]["var_ratio"] == pytest.approx(
            logs[a_level].var(ddof=1) / logs[b_level].var(ddof=1), rel=1e-9
        )

        curves = sg.curves(created.id, name="min_l2")
        assert list(curves.columns[:4]) == ["run_id", "seed", "condition_key", "stop_gradient"]
        for run in served_runs:
            points = service.client.get(
                f"/runs/{run['id']}/metrics", params={"name": "min_l2"}
            ).json()
            mine = curves[curves["run_id"] == run["id"]]
            assert len(points) > 0 and list(mine["step"]) == [p["step"] for p in points]
            assert list(mine["value"]) == [p["value"] for p in points]
            assert set(mine["seed"]) == {run["seed"]}
        by_id = sg.curves(run_ids=[served_runs[0]["id"]], name="min_l2")
        assert by_id.equals(curves[curves["run_id"] == served_runs[0]["id"]].reset_index(drop=True))

        added = sg.add_seeds(created.id, 1)
        assert added.seeds == [3] and (added.runs_added, added.n_runs) == (2, 8)
        assert sg.wait(created.id, progress=False, timeout_s=120).counts.completed == 8
        assert list(sg.stats(created.id).conditions["n"]) == [4, 4]


def test_errors_carry_the_status_and_the_api_detail(service: Service, tmp_path: Path) -> None:
    with Client(service.server.url) as sg:
        with pytest.raises(ApiError) as missing:
            sg.experiment(999_999)
        assert missing.value.status_code == 404
        assert missing.value.detail == "experiment 999999 not found"

        with pytest.raises(ApiError) as invalid:
            sg.submit({"name": "bad", "trainer": "collapse", "config": {"n_sample": 10}})
        assert invalid.value.status_code == 422
        assert any("n_sample" in ".".join(map(str, e["loc"])) for e in invalid.value.detail)
        assert "n_sample" in str(invalid.value)

        readme = tmp_path / "README.md"
        readme.write_text("# not a spec\n")
        with pytest.raises(
            ValueError, match=r"expected a \.json, \.yaml or \.yml spec file, got README\.md"
        ):
            sg.submit(readme)

        slow = sg.submit(
            {"name": "slow", "trainer": "collapse", "config": {**FAST, "steps": 10**7}, "seeds": 2}
        )
        assert sg.cancel(slow.id).id == slow.id
        assert sg.wait(slow.id, progress=False, timeout_s=60).status is ExperimentStatus.cancelled
        with pytest.raises(ApiError) as again:
            sg.cancel(slow.id)
        assert again.value.status_code == 409 and "cancelled already" in again.value.detail


def test_url_and_token_come_from_the_environment(
    start_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    guarded = start_service(api_token=TOKEN)
    monkeypatch.setenv("SEEDGRID_URL", guarded.server.url)
    monkeypatch.setenv("SEEDGRID_API_TOKEN", TOKEN)
    with Client() as sg:
        assert sg.experiments() == []
        assert {t.name for t in sg.trainers()} >= {"collapse", "cff", "ssl", "feedback"}
    with Client(token="not-the-token-0123456789") as wrong, pytest.raises(ApiError) as refused:
        wrong.experiments()
    assert refused.value.status_code == 401 and refused.value.detail == "invalid bearer token"


def test_compare_of_two_experiments_is_what_the_api_serves(
    service: Service, tmp_path: Path
) -> None:
    """Client.compare pages /compare with a page size the server allows (it once asked for 500
    conditions a page where /compare allows 200, and every call was a 422)."""
    spec_file = tmp_path / "spec.yaml"
    ids = []
    with Client(service.server.url) as sg:
        for name in ("compare-a", "compare-b"):
            spec_file.write_text(
                yaml.safe_dump(
                    {
                        "name": name,
                        "trainer": "collapse",
                        "config": FAST,
                        "grid": {"stop_gradient": [False, True]},
                        "seeds": 3,
                        "metric": "min_l2",
                    }
                )
            )
            ids.append(sg.submit(spec_file).id)
        for experiment_id in ids:
            assert sg.wait(experiment_id, progress=False, timeout_s=120).counts.completed == 6
        compared = sg.compare(*ids)
    served = service.client.get("/compare", params={"a": ids[0], "b": ids[1]}).json()
    assert compared.total_conditions == served["total_conditions"] == 2
    assert compared.model_dump(mode="json") == {**served, "next_offset": None}
