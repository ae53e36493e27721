"""Hardening of the HTTP surface: optional bearer-token auth, a check of the browser's Origin
(and Host) when there is no token, a bound on the request body and headers on every response
(an ASGI middleware), the OpenAPI declaration of the token, and error bodies that hostile input
can neither break nor blow up.

The checks of the middleware run before routing, so that a refused or oversized request never
reaches body parsing, validation or the database; every route, including ones added later, is
covered unless it is listed as public.

Without a token, what stops another web site from using the API through a visitor's browser
(a cross-site form POST cancelled an experiment) is the Origin header browsers send: a request
whose Origin is not the service's own is refused, and so is an unsafe one that a browser marks
`Sec-Fetch-Site: cross-site`. Bound to loopback, the Host header must name loopback too: a
page of a domain an attacker points at 127.0.0.1 (DNS rebinding) sends its own name. Clients
that are not browsers send no Origin and are not affected. With a token these checks are not
needed: browsers never add the token on their own.
"""

from __future__ import annotations

import hmac
import ipaddress
import itertools
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import MAX_ERRORS_SHOWN

BEARER_SCHEME = "bearerAuth"
# Input echoed in an error is cut to this many characters of its JSON.
MAX_ECHOED_INPUT_CHARS = 200
# Sent with every response: no browser guesses a JSON answer or an export to be HTML.
EVERY_RESPONSE_HEADERS = {"X-Content-Type-Options": "nosniff"}
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def _unauthorized(detail: str, error: str | None = None) -> JSONResponse:
    challenge = 'Bearer realm="seedgrid"' + (f', error="{error}"' if error else "")
    return JSONResponse(
        {"detail": detail}, status_code=401, headers={"WWW-Authenticate": challenge}
    )


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        {"detail": f"request body larger than {limit} bytes (SEEDGRID_MAX_REQUEST_BODY_BYTES)"},
        status_code=413,
        headers={"Connection": "close"},
    )


def _forbidden(detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=403)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 in brackets or not) is this machine's
    loopback: localhost, its subdomains (RFC 6761), 127.0.0.0/8 or ::1."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def _authority(url: str) -> tuple[str, int | None] | None:
    """The host (lower case) and port of `url` ("scheme://host:port" or "//host:port"), or
    None when it has none or is malformed."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def _same_origin(origin: str, host: str | None) -> bool:
    """Whether Origin `origin` names the service this request reached as Host `host`. A port
    left out is the origin's scheme's default on both sides (a proxy may end TLS in front)."""
    theirs = _authority(origin)
    here = _authority(f"//{host}") if host else None
    if theirs is None or here is None:
        return False
    default = DEFAULT_PORTS.get(urlsplit(origin).scheme)
    return theirs[0] == here[0] and (theirs[1] or default) == (here[1] or default)


def foreign_origin(headers: Headers, method: str, *, loopback_only: bool) -> str | None:
    """Why a request without a token looks sent by another site's page, or None (module
    docstring). `loopback_only`: the service listens on loopback only."""
    host = headers.get("host")
    if host is not None and loopback_only:
        here = _authority(f"//{host}")
        if here is None or not is_loopback(here[0]):
            return (
                f"refused: Host {host[:100]!r} is not a loopback name, and this service "
                "listens on loopback without SEEDGRID_API_TOKEN (a page of another site "
                "resolved to it); call it as localhost or 127.0.0.1"
            )
    origin = headers.get("origin")
    if origin is not None:
        if not _same_origin(origin, host):
            return (
                f"refused: a page of another site (Origin {origin[:100]!r}) cannot call "
                "this service without SEEDGRID_API_TOKEN; use its own dashboard at /ui, "
                "a client that sends no Origin, or set a token"
            )
    elif method in UNSAFE_METHODS and headers.get("sec-fetch-site") == "cross-site":
        return (
            "refused: a page of another site (Sec-Fetch-Site: cross-site) cannot call "
            "this service without SEEDGRID_API_TOKEN; use its own dashboard at /ui"
        )
    return None


class RequestGuard:
    """Refuses requests without the bearer token (401), requests from other sites' pages when
    there is no token (403, foreign_origin), and bodies over `max_body_bytes` (413); adds
    EVERY_RESPONSE_HEADERS to every response.

    `token` empty turns auth off. `public` holds the (method, path) pairs open without a token.
    `loopback_only`: the service listens on loopback only (its Host must say so too). The body
    is read here, counting bytes as they arrive (chunked uploads have no Content-Length), and
    handed on only once it is known to fit: at most `max_body_bytes` are ever held.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        max_body_bytes: int,
        public: Collection[tuple[str, str]],
        loopback_only: bool = False,
    ) -> None:
        self.app = app
        self.token = token.encode()
        self.max_body_bytes = max_body_bytes
        self.public = frozenset(public)
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_headers(send)
        headers = Headers(scope=scope)
        if not self.token:
            refused = foreign_origin(headers, scope["method"], loopback_only=self.loopback_only)
            if refused is not None:
                await _forbidden(refused)(scope, receive, send)
                return
        elif (scope["method"], scope["path"]) not in self.public:
            refusal = self._check_token(headers)
            if refusal is not None:
                await refusal(scope, receive, send)
                return

        # Refused before the first byte of the body is read; uvicorn has checked the syntax.
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _too_large(self.max_body_bytes)(scope, receive, send)
            return

        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _too_large(self.max_body_bytes)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break

        pending: list[Message] = [
            {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        ]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    def _check_token(self, headers: Headers) -> JSONResponse | None:
        authorization = headers.get("authorization")
        if authorization is None:
            return _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return _unauthorized(
                "the Authorization header must be 'Bearer <token>'", "invalid_request"
            )
        if not carries_token(headers, self.token):
            return _unauthorized("invalid bearer token", "invalid_token")
        return None


def carries_token(headers: Headers, token: bytes) -> bool:
    """Whether the request's Authorization header is `Bearer <token>`."""
    scheme, _, credentials = (headers.get("authorization") or "").partition(" ")
    # Header values arrive as latin-1; compare the raw bytes in constant time.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        credentials.strip().encode("latin-1"), token
    )


class HeadAsGet:
    """HEAD on every route that answers GET: the request goes on as a GET (the same checks, the
    same status and headers, Content-Length included) and the body is not sent. FastAPI's routes
    answer only the methods they declare, so HEAD was a 405 everywhere but two routes. Where
    GET is not allowed either, the answer is GET's 405 with its Allow header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
            elif not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET"}, receive, headers_only)


def _with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in EVERY_RESPONSE_HEADERS.items():
                headers.setdefault(name, value)
        await send(message)

    return sending


def declare_bearer_auth(app: FastAPI, public: Collection[tuple[str, str]]) -> None:
    """Make the OpenAPI schema say that every operation but the public ones needs the token."""
    build_schema: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build_schema()
        schema.setdefault("components", {}).setdefault("securitySchemes", {})[BEARER_SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "description": "the token in SEEDGRID_API_TOKEN",
        }
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                if (method.upper(), path) in public:
                    operation["security"] = []
                    continue
                operation["security"] = [{BEARER_SCHEME: []}]
                operation.setdefault("responses", {})["401"] = {
                    "description": "Missing or invalid bearer token",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorDetail"}}
                    },
                }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def json_safe(value: Any, depth: int = 0) -> Any:
    """Input echoed back in an error, made encodable: non-finite floats and lone surrogates
    (which Python's JSON parser accepts) become text, and nesting is cut at 32 levels."""
    if depth > 32:
        return "..."
    if isinstance(value, dict):
        return {json_safe(str(k), depth + 1): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if value is None or isinstance(value, bool | int | float):
        return value
    return json_safe(str(value), depth)


def capped_errors(errors: Sequence[Mapping[str, Any]], unlisted: int = 0) -> list[Any]:
    """The body of a 422's `detail`: the first MAX_ERRORS_SHOWN errors, made encodable
    (json_safe) with echoed input cut to MAX_ECHOED_INPUT_CHARS, then one entry counting the
    rest (and the `unlisted` ones the caller counted without building), at the location of the
    first."""
    shown = [_shown(error) for error in errors[:MAX_ERRORS_SHOWN]]
    hidden = len(errors) - len(shown) + unlisted
    if hidden > 0:
        total = len(errors) + unlisted
        where = list(errors[0].get("loc", ()))[:1] if errors else []
        shown.append(
            {
                "loc": where,
                "type": "too_many_errors",
                "msg": f"and {hidden:,} more problems: {len(shown)} of {total:,} are listed",
            }
        )
    return shown


def _shown(error: Mapping[str, Any]) -> Any:
    error = dict(error)
    if "input" in error:
        echoed = json.dumps(json_safe(_head(error["input"])))
        if len(echoed) > MAX_ECHOED_INPUT_CHARS:
            error["input"] = f"{echoed[:MAX_ECHOED_INPUT_CHARS]}..."
    return json_safe(error)


def _head(value: Any, depth: int = 0) -> Any:
    """The start of an echoed input, enough to show its first MAX_ECHOED_INPUT_CHARS: a
    150,000-item list is not walked to show 200 characters of it."""
    if depth > 8:
        return "..."
    if isinstance(value, dict):
        return {
            k: _head(v, depth + 1)
            for k, v in itertools.islice(value.items(), MAX_ECHOED_INPUT_CHARS // 4)
        }
    if isinstance(value, list | tuple):
        return [_head(v, depth + 1) for v in value[: MAX_ECHOED_INPUT_CHARS // 2]]
    if isinstance(value, str):
        return value[: MAX_ECHOED_INPUT_CHARS + 1]
    return value
