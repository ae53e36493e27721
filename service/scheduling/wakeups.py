"""Waking this process's idle dispatchers when there is new work.

An idle dispatcher (nothing in flight, nothing claimed) waits longer and longer between passes
over the database (service.scheduling.dispatcher: up to IDLE_POLL_MAX_S), so that a service
nobody uses does not query its database 20 times a second. The commands that queue runs or
cancel them (service.experiments.commands) call `work_changed()` after their commit, which ends
the wait of every dispatcher of this process at once; a dispatcher in another process (`seedgrid
dispatcher` beside an API) sees the new runs within its current wait."""

from __future__ import annotations

import threading
import weakref

_waiting: weakref.WeakSet[threading.Event] = weakref.WeakSet()
_guard = threading.Lock()


def listen(event: threading.Event) -> None:
    """`event` is set whenever work changes, until it is garbage."""
    with _guard:
        _waiting.add(event)


def work_changed() -> None:
    with _guard:
        events = list(_waiting)
    for event in events:
        event.set()
