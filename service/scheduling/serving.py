"""Which dispatcher runs which trainer's runs, and which queued runs no dispatcher can run:
what /healthz and an experiment's status say. Read from the dispatch locks
(service.scheduling.lease) without taking any: PostgreSQL's pg_locks, SQLite's lock files, and
this process's own dispatcher (the only one an in-memory database has)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from sqlmodel import Session, col, func, select

from api_schemas import RunStatus, ServingDispatcher
from service.scheduling.lease import holders
from service.scheduling.run_rules import HELD
from service.storage.db import Run
from trainers import REGISTRY


class OwnDispatcher(Protocol):
    identity: str

    @property
    def trainers(self) -> list[str]: ...


def served(
    database_url: str, session: Session, own: OwnDispatcher | None, trainers: Iterable[str]
) -> dict[str, str]:
    """Of these trainers, those some dispatcher runs, each with that dispatcher's identity."""
    found = holders(database_url, session, trainers)
    if own is not None:
        found.update({trainer: own.identity for trainer in own.trainers})
    return found


def queued_by_trainer(session: Session) -> dict[str, int]:
    """Queued runs per trainer."""
    rows = session.exec(
        select(col(Run.trainer), func.count())
        .where(col(Run.status) == RunStatus.queued)
        .group_by(col(Run.trainer))
    ).all()
    return {trainer: int(n) for trainer, n in rows}


def dispatch_overview(
    database_url: str, session: Session, own: OwnDispatcher | None
) -> tuple[list[ServingDispatcher], dict[str, int]]:
    """The dispatchers that hold trainer locks (those of the trainers this process has loaded
    or that have runs queued or in flight), each with its trainers; and the queued runs, per
    trainer, that no dispatcher can run."""
    queued = queued_by_trainer(session)
    in_flight = session.exec(
        select(col(Run.trainer)).where(col(Run.status).in_(HELD)).distinct()
    ).all()
    by_trainer = served(database_url, session, own, {*REGISTRY, *queued, *in_flight})
    dispatchers: dict[str, list[str]] = {}
    for trainer, identity in sorted(by_trainer.items()):
        dispatchers.setdefault(identity, []).append(trainer)
    listed = [
        ServingDispatcher(identity=identity, trainers=trainers)
        for identity, trainers in sorted(dispatchers.items())
    ]
    unserved = {trainer: n for trainer, n in sorted(queued.items()) if trainer not in by_trainer}
    return listed, unserved


def waiting_note(
    database_url: str, session: Session, own: OwnDispatcher | None, trainer: str
) -> str | None:
    """Why an experiment's queued runs wait, when no dispatcher runs its trainer; else None."""
    if served(database_url, session, own, [trainer]):
        return None
    return (
        f"no dispatcher runs trainer {trainer!r}: its queued runs wait for one that has loaded "
        f"it (seedgrid serve or seedgrid dispatcher with --trainers FILE, the file that "
        f"defines {trainer!r}; or seedgrid run SPEC --trainers FILE)"
    )
