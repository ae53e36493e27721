"""The rules the Python client and the CLI share with the server: the URL they build from
SEEDGRID_HOST/SEEDGRID_PORT, and the page sizes they ask for, which are the bounds the server
declares in its OpenAPI schema."""

from __future__ import annotations

import pytest

from api_schemas import pages
from service import cli
from service.api.app import create_app
from service.client import default_url
from service.settings import Settings

OPENAPI = create_app(Settings(database_url="sqlite://"), dispatch=False).openapi()


@pytest.mark.parametrize(("host", "url"), [
    ("::1", "http://[::1]:8123"), ("[::1]", "http://[::1]:8123"), ("::", "http://[::1]:8123"),
    ("0.0.0.0", "http://127.0.0.1:8123"), ("10.0.0.7", "http://10.0.0.7:8123"),
    ("fe80::1", "http://[fe80::1]:8123"), ("seedgrid.internal", "http://seedgrid.internal:8123"),
])
def test_client_and_cli_build_one_url_from_host_and_port(
        host: str, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
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


@pytest.mark.parametrize(("path", "page"), [
    ("/experiments", pages.EXPERIMENTS_PAGE),
    ("/experiments/{experiment_id}/runs", pages.RUNS_PAGE),
    ("/experiments/{experiment_id}/stats", pages.COMPARISONS_PAGE),
    ("/runs/{run_id}/metrics", pages.POINTS_PAGE),
    ("/compare", pages.COMPARE_PAGE),
])
def test_the_page_sizes_clients_ask_for_are_the_servers_bounds(path: str, page: int) -> None:
    assert limit_maximum(path) == page
