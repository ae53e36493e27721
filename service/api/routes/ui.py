"""The dashboard at /ui and the offline /docs and /redoc pages.

Everything here is static (the data comes from the JSON API, with the token the page holds), so
these routes are open without the token and left out of the OpenAPI schema. Swagger UI and ReDoc
are the builds the fastapi-offline package ships, served from the service instead of a CDN so
that the pages work on a cluster without internet access.
"""

from __future__ import annotations

import html
import json
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api_schemas import ExperimentStatus, RunStatus

DASHBOARD_URL = "/ui"
DOCS_URL = "/docs"
REDOC_URL = "/redoc"
DOCS_ASSETS_URL = "/docs-assets"

# The dashboard runs its own script and style sheet only, talks to this service only, and is
# never framed (clickjacking): a script injected into it could neither run nor send data away.
# (`data:` for the empty favicon of index.html; app.js sets styles through the CSSOM, which
# style-src does not govern, never as style attributes.)
DASHBOARD_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
# The docs pages run inline scripts of FastAPI's templates, so they get no script policy; they
# are not framed either.
DOCS_HEADERS = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY"}

# Only these files are served (no path from the request reaches the file system).
DASHBOARD_ASSETS = {"app.js": "text/javascript", "app.css": "text/css"}
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}

# The one address outside the service that these builds load from: ReDoc's sidebar footer shows
# Redocly's logo from their CDN (no option turns it off); the local favicon stands in for it.
DOCS_ASSET_REWRITES = {
    "redoc.standalone.js": (
        b"https://cdn.redoc.ly/redoc/logo-mini.svg",
        f"{DOCS_ASSETS_URL}/favicon.png".encode(),
    ),
}


# Where index.html takes the statuses its script needs (a <meta> content: the page's policy runs
# no inline script).
STATUSES_MARKER = "__SEEDGRID_STATUSES__"


def dashboard_statuses() -> dict[str, list[str]]:
    """What the dashboard knows of statuses, from the enums rather than restated in its script:
    every experiment status (its filter), and the active ones of runs and of experiments."""
    return {
        "experiment": [s.value for s in ExperimentStatus],
        "experiment_active": [s.value for s in ExperimentStatus if s in ExperimentStatus.active()],
        "run_active": [s.value for s in RunStatus if s in RunStatus.active()],
    }


@cache
def dashboard_page() -> str:
    """index.html with the statuses written into it."""
    page = _dashboard_file("index.html").read_text(encoding="utf-8")
    return page.replace(STATUSES_MARKER, html.escape(json.dumps(dashboard_statuses())))


def _dashboard_file(name: str) -> Traversable:
    return files("service.api.ui").joinpath("static", name)


def _docs_file(name: str) -> Traversable:
    return files("fastapi_offline").joinpath("static", name)


def public_paths() -> set[tuple[str, str]]:
    """The (method, path) pairs of this module: open without the token (they hold no data)."""
    paths = {DASHBOARD_URL, f"{DASHBOARD_URL}/", DOCS_URL, REDOC_URL}
    paths |= {f"{DASHBOARD_URL}/{name}" for name in DASHBOARD_ASSETS}
    paths |= {f"{DOCS_ASSETS_URL}/{name}" for name in DOCS_ASSETS}
    return {("GET", path) for path in paths}


def ui_router(app: FastAPI) -> APIRouter:
    """The routes of the dashboard and the docs pages of `app` (built with docs_url and
    redoc_url None, so that FastAPI's CDN pages are not registered)."""
    router = APIRouter(include_in_schema=False)
    openapi_url = app.openapi_url or "/openapi.json"

    @router.get(DASHBOARD_URL, response_class=HTMLResponse)
    def dashboard() -> Response:
        return HTMLResponse(dashboard_page(), headers=DASHBOARD_HEADERS)

    @router.get(f"{DASHBOARD_URL}/", response_class=RedirectResponse)
    def dashboard_slash() -> Response:
        return RedirectResponse(DASHBOARD_URL)

    for name, media_type in DASHBOARD_ASSETS.items():
        _add_file_route(router, f"{DASHBOARD_URL}/{name}", _dashboard_file(name), media_type)
    for name, media_type in DOCS_ASSETS.items():
        _add_file_route(
            router,
            f"{DOCS_ASSETS_URL}/{name}",
            _docs_file(name),
            media_type,
            DOCS_ASSET_REWRITES.get(name),
        )

    @router.get(DOCS_URL, response_class=HTMLResponse)
    def swagger_ui() -> Response:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS_URL}/favicon.png",
            # Swagger UI would otherwise send the schema to an online validator.
            swagger_ui_parameters={"validatorUrl": None},
        )
        page.headers.update(DOCS_HEADERS)
        return page

    @router.get(REDOC_URL, response_class=HTMLResponse)
    def redoc() -> Response:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{DOCS_ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
        page.headers.update(DOCS_HEADERS)
        return page

    return router


def _add_file_route(
    router: APIRouter,
    path: str,
    source: Traversable,
    media_type: str,
    rewrite: tuple[bytes, bytes] | None = None,
) -> None:
    @cache
    def content() -> bytes:
        # Read once, on first use, through importlib.resources (works from any install layout).
        data = source.read_bytes()
        return data.replace(*rewrite) if rewrite is not None else data

    def serve() -> Response:
        # no-cache: the browser revalidates, so a dashboard upgraded with the service is
        # picked up at once.
        return Response(content(), media_type=media_type, headers={"Cache-Control": "no-cache"})

    router.add_api_route(path, serve, methods=["GET"], name=f"asset:{path}")
