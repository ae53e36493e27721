"""Admission to the queue: every way runs enter it (a submission, seeds added, an adaptive
round) counts it first and is refused past SEEDGRID_MAX_QUEUED_RUNS."""

from __future__ import annotations

from sqlalchemy import text
from sqlmodel import Session

from service.errors import (
    QueueFull,
)
from service.scheduling.run_store import RunStore
from service.settings import Settings

# Any fixed 64-bit number: the PostgreSQL advisory lock submissions take to count the queue.
SUBMIT_LOCK_KEY = 0x5EED_6121_D000_0003


def count_queue(session: Session, store: RunStore, adding: int, settings: Settings) -> int:
    """The queued runs now, or QueueFull when `adding` more would pass the cap: every way runs
    enter the queue (a submission, seeds added, an adaptive round) goes through it."""
    if session.get_bind().dialect.name == "postgresql":
        # Submissions count the queue one at a time, or two could each fit under the cap.
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SUBMIT_LOCK_KEY})
    queued = store.queued_runs()
    if queued + adding > settings.max_queued_runs:
        raise QueueFull(queued, adding, settings.max_queued_runs)
    return queued


def recount_queue(
    session: Session, store: RunStore, queued: int, adding: int, settings: Settings
) -> None:
    # On SQLite the insert holds the database's write lock: counted again now, the queue
    # includes every submission that committed meanwhile.
    if store.queued_runs() > settings.max_queued_runs:
        session.rollback()
        raise QueueFull(queued, adding, settings.max_queued_runs)
