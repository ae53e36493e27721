"""GET /metrics over real HTTP: Prometheus' own parser reads it, and its counts are those of the
database; the runs' system series (docs/system-metrics.md) are stored with their points and
gauged per trainer while they run. Runs twice: on a SQLite file and on a fresh PostgreSQL
database."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api_schemas import RunStatus
from service.api.server import BackgroundServer
from service.settings import Settings
from tests.conftest import Service

FAST = {"n_samples": 64, "steps": 50}
# Runs that outlast the sampler's MIN_READING_GAP_S (10 ms) many times over, so that each seed's
# end reading is its own and has a CPU figure (workers.system_metrics: a reading within 10 ms of
# the previous one is that one, and the first, at a seed's start, has none). 50 steps took less
# than 10 ms on a fast machine, and a run of a fresh-clone CI had no sys/cpu_percent point.
TIMED = {"n_samples": 64, "steps": 2000, "log_every": 500}
SYSTEM_GAUGES = ("seedgrid_run_cpu_percent", "seedgrid_run_rss_bytes")


@pytest.fixture
def service(start_backend_service: Callable[..., Service]) -> Service:
    return start_backend_service(system_metrics_interval_s=0.5)


def scrape(service: Service) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of GET /metrics by (name, sorted labels)."""
    response = service.client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def database_counts(service: Service) -> dict[str, int]:
    """Runs per status counted over the run rows themselves (the endpoint sums the experiments'
    counters instead)."""
    counts = {status.value: 0 for status in RunStatus}
    counts.update(
        {status: n for status, n in service.sql("SELECT status, count(*) FROM run GROUP BY status")}
    )
    return counts


def test_metrics_count_what_the_database_holds(service: Service) -> None:
    before = scrape(service)
    assert before[("seedgrid_queue_depth", ())] == 0
    assert before[("seedgrid_worker_losses_total", ())] == 0

    done = service.submit(
        {
            "name": "metrics",
            "trainer": "collapse",
            "config": TIMED,
            "grid": {"stop_gradient": [False, True]},
            "seeds": 2,
        }
    )
    assert service.wait(done["id"])["status"] == "completed"
    samples = scrape(service)
    for status, n in database_counts(service).items():
        assert samples[("seedgrid_runs", (("status", status),))] == n, status
    assert samples[("seedgrid_runs", (("status", "completed"),))] == 4
    assert samples[("seedgrid_queue_depth", ())] == 0
    assert samples[("seedgrid_runs_in_flight", ())] == 0
    # one Started per attempt, and one result per finished run, for these four runs
    attempts = service.sql("SELECT sum(attempts) FROM run")[0][0]
    assert samples[("seedgrid_dispatch_latency_seconds_count", ())] == attempts == 4
    assert samples[("seedgrid_run_duration_seconds_count", (("trainer", "collapse"),))] == 4
    latency_sum = samples[("seedgrid_dispatch_latency_seconds_sum", ())]
    assert 0 < latency_sum < 120
    assert samples[("seedgrid_worker_losses_total", ())] == 0
    assert_system_series(service, done["id"])
    # no run in flight: no trainer's system gauges
    assert not [key for key in samples if key[0] in SYSTEM_GAUGES]

    # Queued and cancelled runs are counted too: an experiment too long to finish, cancelled.
    slow = service.submit(
        {
            "name": "metrics-slow",
            "trainer": "collapse",
            "config": {**FAST, "steps": 10**7},
            "grid": {},
            "seeds": 3,
        }
    )
    # while its runs train, the trainer's latest system values
    deadline = time.monotonic() + 60
    while not all((g, (("trainer", "collapse"),)) in samples for g in SYSTEM_GAUGES):
        assert time.monotonic() < deadline, "no system gauges while runs train"
        time.sleep(0.2)
        samples = scrape(service)
    assert samples[("seedgrid_run_rss_bytes", (("trainer", "collapse"),))] > 50 * 2**20
    assert samples[("seedgrid_run_cpu_percent", (("trainer", "collapse"),))] >= 0
    assert not [key for key in samples if "gpu" in key[0]]  # no GPU here
    assert service.client.post(f"/experiments/{slow['id']}/cancel").status_code == 202
    assert service.wait(slow["id"])["status"] == "cancelled"
    samples = scrape(service)
    counts = database_counts(service)
    assert counts["cancelled"] == 3
    for status, n in counts.items():
        assert samples[("seedgrid_runs", (("status", status),))] == n, status
    assert samples[("seedgrid_queue_depth", ())] == counts["queued"] == 0
    assert not [key for key in samples if key[0] in SYSTEM_GAUGES]

    # An API without a dispatcher (--no-dispatch) on the same database: the database's counts,
    # and none of the dispatcher's metrics, which live in the dispatcher's process.
    with BackgroundServer(Settings(database_url=service.database_url), dispatch=False) as api:
        response = httpx.get(f"{api.url}/metrics", timeout=30)
    assert response.status_code == 200
    names = {s.name for f in text_string_to_metric_families(response.text) for s in f.samples}
    assert names == {"seedgrid_runs", "seedgrid_queue_depth"}
    api_only = {
        tuple(s.labels.values()): s.value
        for f in text_string_to_metric_families(response.text)
        for s in f.samples
        if s.name == "seedgrid_runs"
    }
    assert api_only == {(status,): n for status, n in counts.items()}


def assert_system_series(service: Service, experiment_id: int) -> None:
    """Each run has the worker's CPU and memory among its points, at its steps, and none of
    them in its final metrics or among the metrics the statistics compare."""
    runs = service.client.get(f"/experiments/{experiment_id}/runs").json()
    for run in runs:
        points = service.client.get(f"/runs/{run['id']}/metrics").json()
        by_name: dict[str, list[dict[str, float]]] = {}
        for p in points:
            by_name.setdefault(p["name"], []).append(p)
        logged_steps = {p["step"] for p in by_name["loss"]}
        assert by_name["sys/cpu_percent"] and by_name["sys/rss_bytes"], sorted(by_name)
        for p in by_name["sys/cpu_percent"] + by_name["sys/rss_bytes"]:
            assert p["step"] in logged_steps and p["value"] >= 0, p
        assert all(p["value"] > 50 * 2**20 for p in by_name["sys/rss_bytes"])  # torch alone
        assert not [name for name in run["metrics"] if name.startswith("sys/")]
    refused = service.client.get(
        f"/experiments/{experiment_id}/stats", params={"metric": "sys/cpu_percent"}
    )
    assert refused.status_code == 422
    assert "'sys/cpu_percent' is a system series" in refused.text


def test_metrics_need_the_token_when_one_is_set(
    start_backend_service: Callable[..., Service],
) -> None:
    guarded = start_backend_service(api_token="metrics-token-0123456789abcdef")
    assert guarded.client.get("/metrics").status_code == 401
    guarded.client.headers["Authorization"] = "Bearer metrics-token-0123456789abcdef"
    assert guarded.client.get("/metrics").status_code == 200
