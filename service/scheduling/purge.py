"""Deleted experiments' rows removed in the background, one short transaction at a time.

DELETE /experiments/{id} only marks the experiment deleted (one row, one commit): from then on
every read treats it as gone. Its metric points, attempts, runs and stored pages are removed
afterwards by the API process's purger, PURGE_BATCH rows per transaction, children first and its
row last (service.scheduling.run_store.RunStore.purge_step). Removing them in the delete's own
transaction held SQLite's database-wide write lock for as long as that took (28 s for 3M
points), and every other experiment's writes waited for it.

SQLite's busy handler polls for the lock and keeps no queue: a purger that took the lock again
at once after each commit could keep a waiting writer out for its whole run, so it pauses
between batches there, for longer than two of the handler's polls. A pause of just one poll
interval is not enough: a poll that comes late (a busy machine) misses it, and when a batch and
a pause together last a whole number of poll intervals, a writer whose polls fall inside the
batches misses every pause (a CI run measured a 1.03 s wait). A purge cut short (a crash, a
stop) goes on at the next start-up or the next delete: the mark is in the database.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.scheduling.run_store import RunStore

log = logging.getLogger("seedgrid.purge")

# Rows removed per transaction: on SQLite about 30 ms of the write lock (5,000 points).
PURGE_BATCH = 5000
# SQLite only: the pause after each batch, at least 2.5 times the busy handler's longest poll
# interval (100 ms) and at least as long as the batch took (a busy machine slows both), so that
# a writer waiting on the lock polls at least twice inside it and takes the lock before the
# next batch does, even when one of its polls comes late.
SQLITE_PAUSE_S = 0.25
# After a failed purge (the database unreachable, say), the wait before it is tried again.
RETRY_S = 5.0


def purge_deleted(
    engine: Engine, *, batch: int = PURGE_BATCH, stopping: threading.Event | None = None
) -> list[int]:
    """Remove every row of every experiment marked deleted, a batch per transaction; the ids
    of the experiments whose rows are all gone (fewer when `stopping` was set meanwhile)."""
    sqlite = engine.dialect.name == "sqlite"
    with Session(engine) as session:
        pending = RunStore(session).deleted_experiments()
    purged = []
    for experiment_id in pending:
        while not (stopping is not None and stopping.is_set()):
            started = time.monotonic()
            with Session(engine) as session:
                done = RunStore(session).purge_step(experiment_id, batch)
                session.commit()
            if done:
                purged.append(experiment_id)
                break
            if sqlite:
                time.sleep(max(SQLITE_PAUSE_S, time.monotonic() - started))
    return purged


class Purger:
    """The API process's purger: a thread that purges what is marked deleted at start-up and
    whenever `wake` is called (after a delete)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seedgrid-purge", daemon=True)

    def start(self) -> None:
        self._wake.set()  # what an earlier process left marked
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the batch in progress (the rest goes on at the next start-up)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                purged = purge_deleted(self.engine, stopping=self._stopping)
            except Exception:  # noqa: BLE001 - logged and tried again: the marks stay
                log.exception(
                    "could not remove the rows of deleted experiments; trying again in %.0f s",
                    RETRY_S,
                )
                self._stopping.wait(RETRY_S)
                self._wake.set()
                continue
            if purged:
                log.info("removed the rows of deleted experiments %s", purged)
