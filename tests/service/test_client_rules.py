"""The rules the Python client and the CLI share with the server: the URL they build from
SEEDGRID_HOST/SEEDGRID_PORT, and the page sizes they ask for, which are the bounds the server
declares in its OpenAPI schema."""

from __future__ import annotations

import re

import httpx
import pytest

from api_schemas import pages
from service import cli
from service.api.app import create_app
from service.client import ApiError, Client, default_url
from service.settings import Settings
from tests.conftest import ROOT

OPENAPI = create_app(Settings(database_url="sqlite://"), dispatch=False).openapi()


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("::1", "http://[::1]:8123"),
        ("[::1]", "http://[::1]:8123"),
        ("::", "http://[::1]:8123"),
        ("0.0.0.0", "http://127.0.0.1:8123"),
        ("10.0.0.7", "http://10.0.0.7:8123"),
        ("fe80::1", "http://[fe80::1]:8123"),
        ("seedgrid.internal", "http://seedgrid.internal:8123"),
    ],
)
def test_client_and_cli_build_one_url_from_host_and_port(
    host: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEEDGRID_URL", raising=False)
    monkeypatch.setenv("SEEDGRID_HOST", host)
    monkeypatch.setenv("SEEDGRID_PORT", "8123")
    assert default_url() == url
    assert cli.default_url() == (url, "SEEDGRID_HOST and SEEDGRID_PORT")


def limit_maximum(path: str) -> int:
    (limit,) = [p for p in OPENAPI["paths"][path]["get"]["parameters"] if p["name"] == "limit"]
    schema = limit["schema"]
    bounded = next(s for s in schema.get("anyOf", [schema]) if s.get("type") == "integer")
    return int(bounded["maximum"])


@pytest.mark.parametrize(
    ("path", "page"),
    [
        ("/experiments", pages.EXPERIMENTS_PAGE),
        ("/experiments/{experiment_id}/runs", pages.RUNS_PAGE),
        ("/experiments/{experiment_id}/stats", pages.COMPARISONS_PAGE),
        ("/runs/{run_id}/metrics", pages.POINTS_PAGE),
        ("/compare", pages.COMPARE_PAGE),
    ],
)
def test_the_page_sizes_clients_ask_for_are_the_servers_bounds(path: str, page: int) -> None:
    assert limit_maximum(path) == page


@pytest.mark.parametrize(
    ("constant", "page"),
    [
        ("RUNS_PAGE", pages.RUNS_PAGE),
        ("POINTS_PAGE", pages.POINTS_PAGE),
        ("COMPARISONS_PAGE", pages.COMPARISONS_PAGE),
        ("CURVE_RUNS", pages.CURVE_RUNS),
    ],
)
def test_the_dashboards_page_sizes_are_the_servers_bounds(constant: str, page: int) -> None:
    script = (ROOT / "service" / "api" / "ui" / "static" / "app.js").read_text(encoding="utf-8")
    (value,) = re.findall(rf"^const {constant} = (\d+);$", script, flags=re.M)
    assert int(value) == page
    points = re.findall(r"^const MAX_RUN_POINT_PAGES = (\d+);$", script, flags=re.M)
    assert int(points[0]) * pages.POINTS_PAGE == pages.CURVE_POINTS


def test_the_retry_policy_waits_the_retry_after_and_stops_past_its_time() -> None:
    """The one policy of the client and the CLI: a 503 or 429 is sent again after its
    Retry-After, and raised at once when it asks for more than the retries may wait in all."""
    answers = {
        "/experiments/1": [(503, "0"), (429, "0"), (200, None)],
        "/experiments/2": [(429, "3600")],
    }
    sent: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        queue = answers[request.url.path]
        status, wait = queue.pop(0) if len(queue) > 1 else queue[0]
        headers = {"Retry-After": wait} if wait is not None else {}
        return httpx.Response(
            status, headers=headers, json={"detail": "busy"} if status >= 400 else {"id": 1}
        )

    told: list[tuple[int, int, float]] = []
    with Client(
        "http://seedgrid.test",
        transport=httpx.MockTransport(handle),
        on_retry=lambda error, wait: told.append((error.status_code, error.retries, wait)),
    ) as client:
        assert client.request("GET", "/experiments/1") == {"id": 1}
        assert told == [(503, 0, 0.0), (429, 1, 0.0)]
        with pytest.raises(ApiError) as refused:
            client.request("GET", "/experiments/2")
    assert (refused.value.status_code, refused.value.retries) == (429, 0)
    assert refused.value.retry_after_s == 3600.0
    assert sent.count("/experiments/2") == 1
