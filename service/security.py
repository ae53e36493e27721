"""Hardening of the HTTP surface: optional bearer-token auth and a bound on the request body (an
ASGI middleware), the OpenAPI declaration of the token, and error bodies that hostile input
cannot break.

Both checks of the middleware run before routing, so that an unauthenticated or oversized
request never reaches body parsing, validation or the database; every route, including ones
added later, is covered unless it is listed as public.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Callable, Collection
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BEARER_SCHEME = "bearerAuth"


def _unauthorized(detail: str, error: str | None = None) -> JSONResponse:
    challenge = 'Bearer realm="seedgrid"' + (f', error="{error}"' if error else "")
    return JSONResponse({"detail": detail}, status_code=401,
                        headers={"WWW-Authenticate": challenge})


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        {"detail": f"request body larger than {limit} bytes (SEEDGRID_MAX_REQUEST_BODY_BYTES)"},
        status_code=413,
        headers={"Connection": "close"},
    )


class RequestGuard:
    """Refuses requests without the bearer token (401) and bodies over `max_body_bytes` (413).

    `token` empty turns auth off. `public` holds the (method, path) pairs open without a token.
    The body is read here, counting bytes as they arrive (chunked uploads have no
    Content-Length), and handed on only once it is known to fit: at most `max_body_bytes`
    are ever held.
    """

    def __init__(self, app: ASGIApp, *, token: str, max_body_bytes: int,
                 public: Collection[tuple[str, str]]) -> None:
        self.app = app
        self.token = token.encode()
        self.max_body_bytes = max_body_bytes
        self.public = frozenset(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.token and (scope["method"], scope["path"]) not in self.public:
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

        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks),
                                   "more_body": False}]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    def _check_token(self, headers: Headers) -> JSONResponse | None:
        authorization = headers.get("authorization")
        if authorization is None:
            return _unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return _unauthorized("the Authorization header must be 'Bearer <token>'",
                                 "invalid_request")
        # Header values arrive as latin-1; compare the raw bytes in constant time.
        if not hmac.compare_digest(credentials.strip().encode("latin-1"), self.token):
            return _unauthorized("invalid bearer token", "invalid_token")
        return None


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
                    "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/ErrorDetail"}}},
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
