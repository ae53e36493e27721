"""The service's own bounds on what one request may make it do.

The heavy reads one API process runs at once: a statistics page or a comparison computed cold,
an export. Each holds a CPU (and its memory) for seconds; past SEEDGRID_MAX_HEAVY_READS of
them, one more is refused at once with 503 and Retry-After instead of queueing behind them and
slowing every other request. Stored pages take no slot. The bound is per process (`seedgrid
serve --workers N` has N of them).

An import (POST /experiments/import): at most MAX_IMPORT_ROWS runs and MAX_IMPORT_COLUMNS
columns, within the request body's bound (SEEDGRID_MAX_REQUEST_BODY_BYTES) and the
experiment's (SEEDGRID_MAX_RUNS_PER_EXPERIMENT); past them a 422 names the row or column.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Runs one import may add (about 10,000 rows of a few columns fill the default 1 MiB body).
MAX_IMPORT_ROWS = 10_000
# Columns of an imported CSV (W&B and MLflow exports carry one per config key and summary value).
MAX_IMPORT_COLUMNS = 1_000

# Exports are computed while they stream, after their handler has returned: the gate holds
# their slot for the whole response instead (HeavyPaths).
EXPORT_PATH = re.compile(r"/experiments/[^/]+/export")


class Busy(Exception):
    """Every heavy-read slot is taken: a 503 with Retry-After."""

    RETRY_AFTER_S = 5

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"{limit} heavy reads (statistics or comparisons not stored yet, exports) are "
            f"running in this process, its limit (SEEDGRID_MAX_HEAVY_READS): retry after "
            f"{self.RETRY_AFTER_S} s"
        )


class HeavyReads:
    """At most `limit` heavy reads at once (`in_use` now); `slot()` takes one or raises Busy
    at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        with self._lock:
            if self.in_use >= self.limit:
                return False
            self.in_use += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.in_use -= 1

    @contextmanager
    def slot(self) -> Iterator[None]:
        if not self.try_acquire():
            raise Busy(self.limit)
        try:
            yield
        finally:
            self.release()


class HeavyPaths:
    """ASGI middleware: a request to EXPORT_PATH holds a slot of `heavy` from its first byte
    to its last (released however the response ends, a client gone mid-stream included). The
    slot is given back before the last byte is handed to the server, not after the response
    returns: a client that reads one export to its end and asks for the next must find the
    slot free (on a busy machine the return came after the next request, which got a 503)."""

    def __init__(self, app: ASGIApp, *, heavy: HeavyReads) -> None:
        self.app = app
        self.heavy = heavy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not EXPORT_PATH.fullmatch(scope["path"]):
            await self.app(scope, receive, send)
            return
        if not self.heavy.try_acquire():
            await busy_response(Busy(self.heavy.limit))(scope, receive, send)
            return
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.heavy.release()

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                release()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            release()


def busy_response(busy: Busy) -> JSONResponse:
    return JSONResponse(
        {"detail": str(busy)}, status_code=503, headers={"Retry-After": str(Busy.RETRY_AFTER_S)}
    )
