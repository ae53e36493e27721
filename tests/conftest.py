"""Shared fixtures: one real local Ray per test session, and real seedgrid services over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from service.server import BackgroundServer
from service.settings import Settings


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class Service:
    """A running seedgrid (API + dispatcher) on a real SQLite file, reached through HTTP."""

    def __init__(self, server: BackgroundServer, db_path: Path) -> None:
        self.server = server
        self.db_path = db_path
        self.client = httpx.Client(base_url=server.url, timeout=60)

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/experiments", json=spec)
        assert response.status_code == 201, response.text
        return response.json()

    def wait(self, experiment_id: int, timeout_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            detail = self.client.get(f"/experiments/{experiment_id}").json()
            c = detail["counts"]
            if c["queued"] == 0 and c["running"] == 0:
                return detail
            time.sleep(0.1)
        raise AssertionError(f"experiment {experiment_id} did not end in {timeout_s} s: {detail}")

    def runs(self, experiment_id: int) -> list[dict[str, Any]]:
        response = self.client.get(f"/experiments/{experiment_id}/runs")
        assert response.status_code == 200
        return response.json()


@pytest.fixture
def start_service(ray_cluster: None, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def start(db_name: str = "seedgrid.db", **overrides: Any) -> Service:
        db_path = tmp_path / db_name
        settings = Settings(database_url=f"sqlite:///{db_path}", metrics_batch_interval_s=0.2,
                            **overrides)
        service = Service(BackgroundServer(settings).start(), db_path)
        started.append(service)
        return service

    yield start
    for service in started:
        service.client.close()
        service.server.stop()


@pytest.fixture
def service(start_service: Callable[..., Service]) -> Service:
    return start_service()
