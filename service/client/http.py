"""How the client reaches the service and reads its refusals: the address (SEEDGRID_URL, or
SEEDGRID_HOST and SEEDGRID_PORT), the errors, and the wait a 429 or 503 asks for."""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from api_schemas import environment

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# Answers that say "not now, nothing was done": sent again after their Retry-After, up to
# MAX_RETRIES times and MAX_RETRY_WAIT_S of waiting in all; an answer that asks for a longer
# wait than is left is raised at once.
RETRIED_STATUSES = frozenset({429, 503})
MAX_RETRIES = 3
MAX_RETRY_WAIT_S = 60.0
# The wait when such an answer gives no Retry-After that can be read.
DEFAULT_RETRY_AFTER_S = 1.0


class ApiError(Exception):
    """The API refused a request: `status_code` and the API's `detail` (a sentence, or for a
    422 the list of {loc, msg, type} naming each invalid field). A 503 or 429 raised once its
    retries are used up says how many were made (`retries`), how long they waited in all
    (`waited_s`) and the wait the last answer asked for (`retry_after_s`; None for an answer
    that is not retried)."""

    def __init__(
        self,
        method: str,
        path: str,
        status_code: int,
        detail: Any,
        *,
        retries: int = 0,
        waited_s: float = 0.0,
        retry_after_s: float | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.status_code = status_code
        self.detail = detail
        self.retries = retries
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s
        if isinstance(detail, list):
            shown = "; ".join(
                f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}"
                for e in detail
                if isinstance(e, dict)
            )
        else:
            shown = str(detail)
        super().__init__(f"{method} {path}: {status_code} {shown}")


class Unreachable(ConnectionError):
    """No answer from the API at `url` (refused, timed out, cut off): `error` is httpx's."""

    def __init__(self, url: str, error: httpx.HTTPError) -> None:
        self.url = url
        self.error = error
        super().__init__(f"cannot reach the seedgrid API at {url}: {error}")


# A request that only reads, sent on a kept-alive connection the server has just closed (its
# idle timeout, uvicorn's 5 s, passed while the request was on its way: a watch polling every
# few seconds on a busy machine), fails with the connection reset or closed before any answer.
# It is sent once more, on a new connection. A request that writes is not: the server may have
# acted on it before the connection dropped.
RESENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DROPPED_CONNECTION_ERRORS = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


def resend_on_new_connection(method: str, error: httpx.HTTPError) -> bool:
    """Whether a request that failed with `error` is sent again: a read-only one whose
    connection was dropped before an answer came."""
    return method.upper() in RESENT_METHODS and isinstance(error, DROPPED_CONNECTION_ERRORS)


# Called before each retry with the answer retried (its `retries`: the retries made before
# this one) and the seconds that will be waited.
RetryHook = Callable[[ApiError, float], None]


def default_url() -> str:
    """SEEDGRID_URL, else the address `seedgrid serve` listens on (SEEDGRID_HOST and
    SEEDGRID_PORT; a wildcard host is reached on loopback)."""
    return default_address()[0]


def default_address() -> tuple[str, str]:
    """default_url() and where it came from: SEEDGRID_URL, the variables of SEEDGRID_HOST and
    SEEDGRID_PORT that are set, or the default address. A SEEDGRID_PORT that is no port number
    raises environment.BadVariable."""
    url = environment.text(environment.URL)
    if url:
        return url, environment.URL
    host = environment.text(environment.HOST) or DEFAULT_HOST
    port_text = environment.text(environment.PORT) or str(DEFAULT_PORT)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise environment.BadVariable(environment.PORT, port_text, "a port number from 1 to 65535")
    given = [name for name in (environment.HOST, environment.PORT) if environment.is_set(name)]
    source = " and ".join(given) if given else "the default address"
    return http_url(host, int(port_text)), source


# Where a client reaches a service listening on every address (the IPv6 wildcard on IPv6
# loopback: a service bound to :: alone may take no IPv4).
WILDCARD_HOSTS = {"0.0.0.0": DEFAULT_HOST, "::": "::1", "[::]": "::1", "": DEFAULT_HOST}


def http_url(host: str, port: int | str) -> str:
    """The URL of a service listening on `host`:`port`: a wildcard host is reached on
    loopback, an IPv6 address goes in brackets (http://[::1]:8000)."""
    host = host.strip()
    host = WILDCARD_HOSTS.get(host, host).strip("[]")
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def retry_after_s(response: httpx.Response) -> float:
    """The wait an answer asks for: its Retry-After, in seconds or as an HTTP date;
    DEFAULT_RETRY_AFTER_S when it has none that can be read."""
    value = response.headers.get("Retry-After", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else DEFAULT_RETRY_AFTER_S
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER_S
    if when.tzinfo is None:  # "-0000": UTC, the zone of every HTTP date
        when = when.replace(tzinfo=UTC)
    return float(max(0, math.ceil((when - datetime.now(UTC)).total_seconds())))


def error_detail(response: httpx.Response) -> Any:
    """An error answer's `detail`, or the first line of its text when it is not the API's JSON
    (a proxy's page)."""
    try:
        body = response.json()
    except ValueError:
        lines = response.text.strip().splitlines()
        return lines[0] if lines else response.reason_phrase
    return body.get("detail") if isinstance(body, dict) else body
