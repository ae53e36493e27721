"""An API write that cannot reach the database: while another connection holds the lock it
needs, a cancel is answered 503 with Retry-After within a few seconds (it was a 500 after
32 s on SQLite, and the cancel was lost: the experiment ran to its end), and once the lock
goes, the Python client's retry is honoured and the experiment ends cancelled.

On a SQLite file another connection holds BEGIN EXCLUSIVE for 12 s, past the busy timeout of
the dispatcher's writes (30 s in a service, 8 s here: DISPATCHER_BUSY_TIMEOUT_S); on PostgreSQL
it holds the experiment's row (FOR UPDATE), which the cancel locks first, for 10 s (a wait
PostgreSQL would otherwise never end). Both are twice the API's 5 s lock wait or more.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from service.client import Client
from service.storage import db
from tests.conftest import Service

LONG_RUN = {
    "name": "locked",
    "trainer": "collapse",
    "config": {"n_samples": 64, "steps": 10**7, "stop_gradient": True},
    "grid": {},
    "seeds": 1,
    "resources": {"seeds_per_task": 1},
}
LOCK_S = {"sqlite": 12.0, "postgresql": 10.0}
# service.storage.db.SQLITE_BUSY_TIMEOUT_S for this test's service: the lock outlasts it, as the
# 40 s lock of the bug report outlasted the 30 s one, in a third of the time.
DISPATCHER_BUSY_TIMEOUT_S = 8
# The API waits 5 s for a lock; what it may take beyond that on a busy machine.
ANSWER_WITHIN_S = 15.0


@contextmanager
def database_locked(service: Service, experiment_id: int) -> Iterator[None]:
    """Another connection holds what a cancel of `experiment_id` must lock."""
    if service.db_path is not None:
        connection = sqlite3.connect(service.db_path, timeout=30, isolation_level=None)
        connection.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")
            connection.close()
        return
    dsn = (
        make_url(service.database_url)
        .set(drivername="postgresql")
        .render_as_string(hide_password=False)
    )
    with psycopg.connect(dsn) as connection:
        connection.execute("SELECT id FROM experiment WHERE id = %s FOR UPDATE", (experiment_id,))
        yield
        connection.rollback()


def test_a_cancel_while_the_database_is_locked_is_a_503_and_never_lost(
    start_backend_service: Callable[..., Service], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_S", DISPATCHER_BUSY_TIMEOUT_S)
    service = start_backend_service()
    assert LOCK_S["sqlite"] > DISPATCHER_BUSY_TIMEOUT_S
    experiment_id = service.submit(LONG_RUN)["id"]
    deadline = time.monotonic() + 60
    while service.client.get(f"/experiments/{experiment_id}").json()["counts"]["running"] < 1:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.1)

    retried: dict[str, Any] = {}
    with database_locked(service, experiment_id):
        locked_at = time.monotonic()
        refused = service.client.post(f"/experiments/{experiment_id}/cancel")
        answered_s = time.monotonic() - locked_at
        assert refused.status_code == 503, refused.text
        assert answered_s < ANSWER_WITHIN_S, answered_s
        assert int(refused.headers["retry-after"]) > 0
        assert "locked or unreachable" in refused.json()["detail"]
        # reads still answer while the lock is held
        assert service.client.get(f"/experiments/{experiment_id}").status_code == 200

        def cancel_with_retries() -> None:
            with Client(service.server.url, retries=60) as client:
                try:
                    retried["detail"] = client.cancel(experiment_id)
                except Exception as exc:  # reported by the assertion below
                    retried["error"] = exc

        canceller = threading.Thread(target=cancel_with_retries)
        canceller.start()
        # The hold itself (the lock must outlast the dispatcher's busy timeout), not a wait for
        # a state: the retrying client can only have ended by giving up or by a write that
        # got through the lock.
        time.sleep(max(0.0, LOCK_S[backend] - (time.monotonic() - locked_at)))
        assert canceller.is_alive(), retried  # it kept being refused while the lock held
    canceller.join(120)
    assert "error" not in retried, retried
    assert retried["detail"].id == experiment_id
    ended = service.wait(experiment_id, timeout_s=60)
    assert ended["status"] == "cancelled", ended
    assert ended["counts"]["cancelled"] == 1
