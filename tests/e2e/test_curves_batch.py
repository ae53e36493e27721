"""GET /experiments/{id}/curves: one metric's curves of several runs of an experiment in one
answer (the dashboard's curves, a request per CURVE_RUNS runs rather than one per run; issue
38), the same points as each run's GET /runs/{id}/metrics; a run of another experiment, too
many runs or an id out of range is a 422 naming `run`, never a 500. Over real HTTP, on a SQLite
file and on PostgreSQL; the points are written behind the API's back (no dispatcher: the test
needs no Ray)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from api_schemas.pages import CURVE_RUNS
from service.api.server import BackgroundServer
from service.experiments import views
from service.settings import Settings
from tests.conftest import PostgresDatabases, Service

SPEC = {"name": "curves", "trainer": "collapse", "config": {"steps": 50}, "seeds": 3}


@pytest.fixture
def api(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Service]:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    else:
        databases: PostgresDatabases = request.getfixturevalue("pg_databases")
        url = databases.url()
    server = BackgroundServer(Settings(database_url=url), dispatch=False)
    service = Service(server.start(), None, url)
    yield service
    service.close()


def run_ids(service: Service, experiment_id: int) -> list[int]:
    return [r["id"] for r in service.runs(experiment_id)]


def test_curves_of_several_runs_in_one_answer(
    api: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = api.submit(SPEC)["id"]
    other = api.submit({**SPEC, "name": "other"})["id"]
    ours, theirs = run_ids(api, first), run_ids(api, other)
    api.sql("UPDATE run SET status = 'running', started_at = '2026-01-01 00:00:00'")
    points = {
        ours[0]: [(step, 1.0 / (step + 1)) for step in (3, 0, 2, 1)],  # stored out of order
        ours[1]: [(0, 5.0), (1, None)],  # a value that was not finite
        theirs[0]: [(0, 9.0)],
    }
    for run_id, curve in points.items():
        for step, value in curve:
            api.sql(
                "INSERT INTO metricpoint (run_id, name, step, value) VALUES (:r, 'loss', :s, :v)",
                r=run_id,
                s=step,
                v=value,
            )
        api.sql(
            "INSERT INTO metricpoint (run_id, name, step, value) VALUES (:r, 'other', 0, 7.0)",
            r=run_id,
        )

    asked = [ours[0], ours[1], ours[2], ours[0]]  # a run given twice is answered once
    answer = api.client.get(f"/experiments/{first}/curves", params={"name": "loss", "run": asked})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["name"] == "loss" and body["truncated"] == []
    assert list(body["curves"]) == [str(ours[0]), str(ours[1]), str(ours[2])]
    for run_id in ours:
        one_by_one = api.client.get(f"/runs/{run_id}/metrics", params={"name": "loss"}).json()
        assert body["curves"][str(run_id)] == [[p["step"], p["value"]] for p in one_by_one]
    assert body["curves"][str(ours[0])] == [[s, 1.0 / (s + 1)] for s in range(4)]
    assert body["curves"][str(ours[2])] == []
    unknown = api.client.get(f"/experiments/{first}/curves", params={"name": "x", "run": ours})
    assert unknown.json()["curves"] == {str(r): [] for r in ours}

    # a curve longer than CURVE_POINTS is cut, and said to be
    monkeypatch.setattr(views, "CURVE_POINTS", 3)
    cut = api.client.get(f"/experiments/{first}/curves", params={"name": "loss", "run": ours})
    assert cut.json()["truncated"] == [ours[0]]
    assert cut.json()["curves"][str(ours[0])] == [[s, 1.0 / (s + 1)] for s in range(3)]

    too_many = list(range(1, CURVE_RUNS + 2))
    for run, expected in [
        ([theirs[0]], f"run {theirs[0]} is not a run of experiment {first}"),
        ([ours[0], theirs[0]], f"run {theirs[0]} is not a run of experiment {first}"),
        (too_many, f"give 1 to {CURVE_RUNS} runs"),
        ([0], "a run id is 1 to"),
        ([2**63], "a run id is 1 to"),
    ]:
        refused = api.client.get(
            f"/experiments/{first}/curves", params={"name": "loss", "run": run}
        )
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["detail"]
        assert problem["loc"] == ["query", "run"] and expected in problem["msg"], problem
    missing = api.client.get(f"/experiments/{first}/curves", params={"name": "loss"})
    assert missing.status_code == 422 and "run" in missing.text
    assert (
        api.client.get("/experiments/999/curves", params={"name": "loss", "run": 1}).status_code
        == 404
    )
