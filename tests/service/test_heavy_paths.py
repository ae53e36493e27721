"""The export gate (service.limits.HeavyPaths) gives its slot back before the response's last
byte goes to the server, so that a client that read one export to its end and asks for the next
at once finds the slot free; and however the response ends, the slot is given back once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.limits import HeavyPaths, HeavyReads

EXPORT = {"type": "http", "path": "/experiments/1/export", "method": "GET"}


def _run(app: Any, heavy: HeavyReads, scope: dict[str, Any]) -> list[tuple[str, int]]:
    """The messages the gated app sent, each with the slots in use when it reached the server."""
    seen: list[tuple[str, int]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        seen.append((message["type"] + ("+" if message.get("more_body") else ""), heavy.in_use))

    asyncio.run(HeavyPaths(app, heavy=heavy)(scope, receive, send))
    return seen


def test_the_slot_is_free_when_the_last_byte_is_sent_not_only_when_the_app_returns() -> None:
    heavy = HeavyReads(1)
    after_last: list[int] = []

    async def export(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b", "more_body": False})
        after_last.append(heavy.in_use)  # the app still running after its last byte
        await asyncio.sleep(0)

    seen = _run(export, heavy, EXPORT)
    assert seen == [
        ("http.response.start", 1),
        ("http.response.body+", 1),
        ("http.response.body", 0),
    ]
    assert after_last == [0] and heavy.in_use == 0


def test_a_response_cut_short_gives_its_slot_back_once() -> None:
    heavy = HeavyReads(2)

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("client gone")

    with pytest.raises(RuntimeError):
        _run(broken, heavy, EXPORT)
    assert heavy.in_use == 0
    # a full slot answers 503 at once; other paths are not gated
    heavy.in_use = 2

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not run")

    assert _run(never, heavy, EXPORT)[0] == ("http.response.start", 2)
    assert heavy.in_use == 2

    async def other(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    assert _run(other, heavy, {**EXPORT, "path": "/experiments/1/stats"})[-1][1] == 2
