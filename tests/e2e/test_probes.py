"""The probes of a live service by a careless user and a hostile token holder, re-run through
HTTP: each gets a clear 4xx naming the field (or a 429 with Retry-After) and stores nothing;
one experiment's unstorable run cannot touch another experiment's runs.

Every test runs twice: on a SQLite file and on a fresh PostgreSQL database."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import Service

FAST = {"n_samples": 64, "steps": 50}


@pytest.fixture
def start_service(start_backend_service: Callable[..., Service]) -> Callable[..., Service]:
    return start_backend_service


@pytest.fixture
def service(backend_service: Service) -> Service:
    return backend_service


def spec(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "probe",
        "trainer": "collapse",
        "config": FAST,
        "grid": {},
        "seeds": 1,
        **overrides,
    }


def stored_rows(service: Service) -> tuple[int, ...]:
    return tuple(
        service.sql(f"SELECT count(*) FROM {table}")[0][0]
        for table in ("experiment", "run", "metricpoint", "statscache")
    )


def post_raw(service: Service, body: dict[str, Any]) -> httpx.Response:
    # json.dumps as Python writes it: lone surrogates are escaped and reach the server's parser
    return service.client.post(
        "/experiments", content=json.dumps(body), headers={"content-type": "application/json"}
    )


def assert_names(response: httpx.Response, loc: list[Any], *words: str) -> None:
    assert response.status_code == 422, (response.status_code, response.text[:500])
    errors = response.json()["detail"]
    matching = [e for e in errors if list(e["loc"][: len(loc)]) == loc]
    assert matching, (loc, [e["loc"] for e in errors])
    for word in words:
        assert any(word in e["msg"] for e in matching), (word, matching)


CFF = {"dataset": "cifar10", "epochs": 1, "head_epochs": 1, "width": 16, "depth": 1}
PROBES = [
    # a spec never chooses a path: data_root names one of the operator's roots
    (
        "a path as the data root",
        spec(trainer="cff", config={**CFF, "data_root": "/tmp/evil"}),
        ["body", "config", "data_root"],
        ["not a path"],
    ),
    (
        "a path as a grid level",
        spec(trainer="cff", config=CFF, grid={"data_root": ["fake", "/etc"]}),
        ["body", "grid", "data_root", 1],
        ["not a path"],
    ),
    (
        "a root the operator did not name",
        spec(trainer="cff", config={**CFF, "data_root": "nope"}),
        ["body", "config", "data_root"],
        ["'nope'", "SEEDGRID_DATA_ROOTS: fake"],
    ),
    (
        "download without the operator's leave",
        spec(trainer="cff", config={**CFF, "download": True}),
        ["body", "config", "download"],
        ["SEEDGRID_ALLOW_DOWNLOAD"],
    ),
    (
        "download as a grid level",
        spec(trainer="cff", config=CFF, grid={"download": [False, True]}),
        ["body", "grid", "download"],
        ["SEEDGRID_ALLOW_DOWNLOAD", "download=true"],
    ),
    # one storable-text rule at any depth
    (
        "NUL in a config string",
        spec(trainer="cff", config={**CFF, "data_root": "fake\x00"}),
        ["body", "config"],
        ["config.data_root contains NUL"],
    ),
    (
        "lone surrogate in a config string",
        spec(config={**FAST, "loss": "\udc80"}),
        ["body", "config"],
        ["config.loss contains a lone surrogate"],
    ),
    (
        "lone surrogate deep in the config",
        spec(config={**FAST, "nested": {"deeper": [1, {"deepest": "a\ud800"}]}}),
        ["body", "config"],
        ["config.nested.deeper[1].deepest contains a lone surrogate"],
    ),
    (
        "NUL in a config key",
        spec(config={**FAST, "lo\x00ss": "mse"}),
        ["body", "config"],
        ["a key of config contains NUL"],
    ),
    (
        "an over-long config string",
        spec(config={**FAST, "loss": "m" * 5000}),
        ["body", "config"],
        ["config.loss is 5000 characters long"],
    ),
    (
        "lone surrogate in a grid level",
        spec(grid={"loss": ["mse", "\ud800"]}),
        ["body", "grid", "loss", 1],
        [],
    ),
    ("NUL in the metric", spec(metric="min\x00l2"), ["body", "metric"], []),
    # resources
    (
        "an oversized model",
        spec(config={"n_samples": 1_000_000, "n_classes": 10_000}),
        ["body", "config", "n_samples"],
        ["GB", "n_classes", "SEEDGRID_MAX_RUN_MEMORY_GB=64"],
    ),
    (
        "an oversized model in one condition",
        spec(grid={"n_classes": [4, 10_000]}, config={"n_samples": 1_000_000, "steps": 50}),
        ["body", "grid", "n_classes"],
        ["n_classes=10000", "n_samples"],
    ),
    ("num_cpus 0", spec(resources={"num_cpus": 0}), ["body", "resources", "num_cpus"], []),
    (
        "an over-long log",
        spec(config={"steps": 100_000_000, "log_every": 1}),
        ["body", "config", "steps"],
        ["log_every", "SEEDGRID_MAX_POINTS_PER_RUN=1,000,000"],
    ),
]


def test_each_probe_gets_a_422_naming_the_field_and_stores_nothing(service: Service) -> None:
    before = stored_rows(service)
    for label, body, loc, words in PROBES:
        assert_names(post_raw(service, body), loc, *words)
        assert stored_rows(service) == before, label


def test_the_same_fields_within_limits_are_accepted(service: Service) -> None:
    created = service.submit(
        spec(
            trainer="cff",
            config={**CFF, "data_root": "fake", "select_by_validation": False},
            seeds=1,
        )
    )
    service.client.post(f"/experiments/{created['id']}/cancel")
    assert service.submit(spec(resources={"num_cpus": 0.5}, seeds=1))["n_runs"] == 1
    assert service.submit(spec(config={"steps": 10_000, "log_every": 1}))["n_runs"] == 1


def test_a_queue_over_its_cap_gets_429_with_retry_after(start_service) -> None:
    service = start_service(max_queued_runs=4, max_in_flight=1)
    before = stored_rows(service)
    too_many = service.client.post("/experiments", json=spec(seeds=5))
    assert too_many.status_code == 429, too_many.text
    assert int(too_many.headers["retry-after"]) > 0
    assert "SEEDGRID_MAX_QUEUED_RUNS" in too_many.json()["detail"]
    assert stored_rows(service) == before
    # one slow run in flight and three queued fill the cap; one more does not fit (a task per
    # seed: collapse would otherwise run the four seeds in one task)
    slow = service.submit(
        spec(seeds=4, config={"n_samples": 64, "steps": 10**7}, resources={"seeds_per_task": 1})
    )
    deadline = time.monotonic() + 60
    while service.client.get(f"/experiments/{slow['id']}").json()["counts"]["running"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # the slow run logs metric points all along: the refusal must add no experiment, run or
    # cached statistic (the metric points it could add are those of its own runs)
    before = stored_rows(service)
    refused = service.client.post("/experiments", json=spec(seeds=2))
    assert refused.status_code == 429 and "holds 3 runs" in refused.json()["detail"]
    after = stored_rows(service)
    assert (after[:2], after[3:]) == (before[:2], before[3:])
    assert service.submit(spec(seeds=1))["n_runs"] == 1  # 3 + 1 fits
    service.client.post(f"/experiments/{slow['id']}/cancel")


def test_stats_of_a_thousand_level_factor_are_refused_or_paged(service: Service) -> None:
    levels = [round(i / 1000, 4) for i in range(1000)]
    created = service.submit(spec(grid={"r": levels}, seeds=1, priority=-10))
    assert service.client.post(f"/experiments/{created['id']}/cancel").status_code == 202
    # the runs a worker had started end when the dispatcher's cancel reaches them; until then
    # they may still log points
    assert service.wait(created["id"])["status"] == "cancelled"
    url = f"/experiments/{created['id']}/stats"
    before = stored_rows(service)
    whole = service.client.get(url)
    assert_names(whole, ["query", "limit"], "499,500 comparisons", "?factor=", "?limit=")
    assert_names(service.client.get(url, params={"factor": "lr"}), ["query", "factor"], "'lr'")
    assert_names(service.client.get(url, params={"limit": 5000}), ["query", "limit"])
    assert_names(
        service.client.get(url, params={"limit": 10, "offset": 499_501}),
        ["query", "offset"],
        "past the last",
    )
    assert stored_rows(service) == before
    page = service.client.get(url, params={"factor": "r", "limit": 1000, "offset": 499_000})
    assert page.status_code == 200, page.text
    body = page.json()
    assert (body["total_comparisons"], body["offset"], body["next_offset"]) == (
        499_500,
        499_000,
        None,
    )
    assert len(body["comparisons"]) == 500 and len(page.content) < 2_000_000
    assert (body["comparisons"][-1]["a"], body["comparisons"][-1]["b"]) == (0.998, 0.999)
    first = service.client.get(url, params={"factor": "r", "limit": 2}).json()
    assert [(c["a"], c["b"]) for c in first["comparisons"]] == [(0.0, 0.001), (0.0, 0.002)]
    assert first["next_offset"] == 2


def test_a_run_the_database_refuses_fails_alone(service: Service) -> None:
    """Experiment A's run sends rows the database refuses (a trigger refuses its metric points,
    as a database would refuse a value): it ends failed with the reason, and experiment B,
    running beside it, completes every run on its first attempt."""
    if service.db_path is not None:
        service.sql(
            "CREATE TRIGGER refuse_poisoned BEFORE INSERT ON metricpoint WHEN NEW.run_id IN "
            "(SELECT r.id FROM run r JOIN experiment e ON e.id = r.experiment_id "
            "WHERE e.name = 'poisoned') BEGIN SELECT RAISE(ABORT, 'points refused by the test'); "
            "END"
        )
    else:
        service.sql(
            "CREATE FUNCTION refuse_poisoned() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.run_id IN (SELECT r.id FROM run r JOIN experiment e ON e.id = "
            "r.experiment_id WHERE e.name = 'poisoned') THEN RAISE EXCEPTION "
            "'points refused by the test'; END IF; RETURN NEW; END $$"
        )
        service.sql(
            "CREATE TRIGGER refuse_poisoned BEFORE INSERT ON metricpoint FOR EACH ROW "
            "EXECUTE FUNCTION refuse_poisoned()"
        )
    slow = {"n_samples": 200, "steps": 3000, "r": 0.1}
    a = service.submit(spec(name="poisoned", config=slow, seeds=2, max_retries=2))
    b = service.submit(
        spec(name="healthy", config=slow, grid={"stop_gradient": [False, True]}, seeds=3)
    )
    assert service.wait(a["id"], timeout_s=120)["counts"]["failed"] == 2
    assert service.wait(b["id"], timeout_s=120)["status"] == "completed"
    for run in service.runs(a["id"]):
        assert run["status"] == "failed" and run["attempts"] == 1
        assert "its results could not be stored" in run["error"]
        assert "points refused by the test" in run["error"]
    for run in service.runs(b["id"]):
        assert run["status"] == "completed" and run["attempts"] == 1
    attempts = service.sql(
        "SELECT a.outcome, count(*) FROM runattempt a JOIN run r ON r.id = a.run_id "
        "WHERE r.experiment_id = :id GROUP BY a.outcome",
        id=b["id"],
    )
    assert attempts == [("completed", 6)]
    assert_every_record_reads_back(service)


def assert_every_record_reads_back(service: Service) -> None:
    for experiment in service.client.get("/experiments").json():
        base = f"/experiments/{experiment['id']}"
        for url in (base, f"{base}/runs", f"{base}/stats"):
            response = service.client.get(url)
            assert response.status_code == 200, (url, response.text[:300])
        for run in service.client.get(f"{base}/runs").json():
            for url in (f"/runs/{run['id']}", f"/runs/{run['id']}/metrics"):
                response = service.client.get(url)
                assert response.status_code == 200, (url, response.text[:300])


def test_nul_in_a_workers_error_is_stored_sanitised(service: Service) -> None:
    """A run stored by an older seedgrid whose condition has a key with NUL: the trainer's
    error quotes the key, and that text is stored with the character replaced (PostgreSQL's
    text refuses NUL) instead of failing the write."""
    ((experiment_id,),) = service.sql(
        "INSERT INTO experiment (name, trainer, spec, metric, status, priority, n_conditions, "
        "n_runs, runs_queued, cancel_requested, created_at) VALUES ('old', 'collapse', "
        '\'{"name": "old", "trainer": "collapse", "grid": {}, "config": {}}\', '
        "'min_l2', 'queued', 0, 1, 1, 1, false, '2026-01-01 00:00:00') RETURNING id"
    )
    service.sql(
        "INSERT INTO run (experiment_id, condition_key, condition, seed, trainer, status, "
        "priority, attempts, max_retries, num_cpus, num_gpus, cancel_requested, metrics, "
        "diagnostics, warnings, provenance, created_at) VALUES (:id, '', "
        "'{\"odd\\u0000key\": 1}', 0, 'collapse', 'queued', 0, 0, 0, 1, 0, false, '{}', '{}', "
        "'[]', '{}', '2026-01-01 00:00:00')",
        id=experiment_id,
    )
    healthy = service.submit(spec(name="beside", seeds=2))
    assert service.wait(experiment_id)["counts"]["failed"] == 1
    (run,) = service.runs(experiment_id)
    assert run["attempts"] == 1 and "odd\ufffdkey" in run["error"], run["error"]
    assert "its results could not be stored" not in run["error"]
    assert service.wait(healthy["id"])["status"] == "completed"
    assert_every_record_reads_back(service)
