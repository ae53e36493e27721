"""The dispatch lock: at most one dispatcher acts on a database at a time.

Every process that would dispatch (`seedgrid dispatcher`, and `seedgrid serve` in embedded mode)
takes this lock first; one that cannot waits as a standby and polls. The lock dies with its
holder, with no timeout to wait out, so a standby takes over as soon as the holder is gone:

- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) on a dedicated connection.
  PostgreSQL frees it when that connection's backend ends: the holder exited or was killed, or
  its connection dropped. The holder runs all its dispatcher transactions on that same
  connection (`bind`), which fences them: a write can only commit while the lock is held, so a
  holder that lost its connection cannot write anything after a successor took over.
- SQLite: an exclusive `flock` on a file next to the database (`<database>-dispatcher.lock`).
  Every process that opens a SQLite database in WAL mode is on its machine (WAL needs shared
  memory), so a file lock reaches all of them; the kernel releases it when the holder's process
  ends, kill -9 included, and it cannot be lost while the process lives (nothing deletes the
  file), so the dispatcher's transactions need no further fence.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
from abc import ABC, abstractmethod
from pathlib import Path

from sqlalchemy import pool, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, PendingRollbackError
from sqlmodel import create_engine

from service.storage.db import CONNECT_TIMEOUT_S

log = logging.getLogger("seedgrid.lease")

# Any fixed 64-bit number, not the migration lock's (service.storage.db.MIGRATION_LOCK_KEY).
DISPATCH_LOCK_KEY = 0x5EED_6121_D000_0002
# PostgreSQL reads a bigint advisory key as two 32-bit halves in pg_locks (objsubid 1).
_KEY_HIGH, _KEY_LOW = DISPATCH_LOCK_KEY >> 32, DISPATCH_LOCK_KEY & 0xFFFF_FFFF
# Both ends of the lock connection probe it, so that a holder whose machine vanished without
# closing its socket loses the lock in about idle + interval x count = 25 s, not hours.
TCP_KEEPALIVE = {"idle": 10, "interval": 5, "count": 3}
TCP_USER_TIMEOUT_MS = 25_000


class LockLost(Exception):
    """This process no longer holds the dispatch lock (or never did)."""


def dispatcher_identity() -> str:
    """host:pid:nonce; the nonce tells apart processes that reuse a pid (PID 1 in containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class DispatchLock(ABC):
    """The lock of one database. Used by one thread at a time (the dispatcher's)."""

    identity: str
    held: bool = False

    @abstractmethod
    def try_acquire(self) -> bool:
        """Take the lock if it is free (or already ours); never waits. Database errors raise."""

    @abstractmethod
    def holder(self) -> str | None:
        """Who holds the lock, as far as this database can tell; for standby logs."""

    @abstractmethod
    def check(self) -> None:
        """Raise LockLost unless this process still holds the lock."""

    def bind(self, engine: Engine) -> Engine | Connection:
        """What the holder's dispatcher sessions run on."""
        if not self.held:
            raise LockLost("this process does not hold the dispatch lock")
        return engine

    def drop(self) -> None:
        """Forget a lock that is gone (no database round trip)."""
        self.held = False

    @abstractmethod
    def release(self) -> None:
        """Give the lock up, so that a standby takes over now."""

    def close(self) -> None:
        self.release()


class PostgresLock(DispatchLock):
    def __init__(self, database_url: str, identity: str) -> None:
        self.identity = identity
        self._engine = create_engine(
            database_url,
            poolclass=pool.NullPool,
            connect_args={
                "connect_timeout": CONNECT_TIMEOUT_S,
                # pg_stat_activity shows who holds the lock (standbys log it).
                "application_name": f"seedgrid-dispatcher {identity}"[:63],
                "keepalives": 1,
                "keepalives_idle": TCP_KEEPALIVE["idle"],
                "keepalives_interval": TCP_KEEPALIVE["interval"],
                "keepalives_count": TCP_KEEPALIVE["count"],
                "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
            },
        )
        self._connection: Connection | None = None

    def _connect(self) -> Connection:
        if self._connection is None:
            connection = self._engine.connect()
            try:
                for name, value in TCP_KEEPALIVE.items():
                    connection.exec_driver_sql(f"SET tcp_keepalives_{name} = {int(value)}")
                connection.exec_driver_sql(f"SET tcp_user_timeout = {TCP_USER_TIMEOUT_MS}")
                connection.commit()
            except BaseException:
                connection.invalidate()
                connection.close()
                raise
            self._connection = connection
        return self._connection

    def try_acquire(self) -> bool:
        if self.held:
            return True
        try:
            connection = self._connect()
            acquired = connection.execute(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": DISPATCH_LOCK_KEY}
            ).scalar_one()
            connection.commit()  # the lock is the session's: it outlives the transaction
        except DBAPIError:
            self._discard_connection()
            raise
        self.held = bool(acquired)
        return self.held

    def holder(self) -> str | None:
        try:
            row = (
                self._connect()
                .execute(
                    text(
                        "SELECT a.application_name, a.client_addr, a.pid FROM pg_locks l "
                        "JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :high "
                        "AND l.objid = :low AND l.objsubid = 1 "
                        "AND l.database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())"
                    ),
                    {"high": _KEY_HIGH, "low": _KEY_LOW},
                )
                .first()
            )
            self._connect().rollback()
        except DBAPIError:
            self._discard_connection()
            return None
        if row is None:
            return None
        name, address, pid = row
        origin = address or "a local socket"
        return f"{name or 'an unnamed session'} (PostgreSQL backend {pid}, from {origin})"

    def check(self) -> None:
        if not self.held or self._connection is None:
            raise LockLost("this process does not hold the dispatch lock")
        try:
            still_held = self._connection.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND pid = pg_backend_pid() AND classid = :high AND objid = :low "
                    "AND objsubid = 1"
                ),
                {"high": _KEY_HIGH, "low": _KEY_LOW},
            ).scalar_one()
            self._connection.rollback()
        except (DBAPIError, PendingRollbackError) as exc:
            # PendingRollbackError: the connection died inside a dispatcher transaction on it
            self.drop()
            raise LockLost(f"the lock's database connection failed: {_first_line(exc)}") from None
        if not still_held:
            self.drop()
            raise LockLost("the database no longer shows the lock as this session's")

    def bind(self, engine: Engine) -> Connection:
        if not self.held or self._connection is None:
            raise LockLost("this process does not hold the dispatch lock")
        return self._connection

    def drop(self) -> None:
        self.held = False
        self._discard_connection()

    def release(self) -> None:
        if self.held and self._connection is not None:
            try:
                self._connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": DISPATCH_LOCK_KEY}
                )
                self._connection.commit()
            except (DBAPIError, PendingRollbackError):
                pass  # the connection is gone, and the lock with it
        self.held = False
        self._discard_connection()

    def close(self) -> None:
        self.release()
        self._engine.dispose()

    def _discard_connection(self) -> None:
        # Closing the connection ends the session, which frees a lock it might still hold.
        if self._connection is not None:
            try:
                self._connection.invalidate()
                self._connection.close()
            except DBAPIError:
                pass
            self._connection = None


class FileLock(DispatchLock):
    """flock on `<database>-dispatcher.lock`; see the module docstring."""

    def __init__(self, database_path: Path, identity: str) -> None:
        self.identity = identity
        self.path = database_path.with_name(database_path.name + "-dispatcher.lock")
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self.held:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        # Who holds it, for the standbys' log; stale once the holder is gone, which is harmless.
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.identity.encode(), 0)
        self._fd, self.held = fd, True
        return True

    def holder(self) -> str | None:
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def check(self) -> None:
        if not self.held or self._fd is None:
            raise LockLost("this process does not hold the dispatch lock")
        try:
            same_file = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except OSError:
            same_file = False
        if not same_file:
            self.drop()
            raise LockLost(f"the lock file {self.path} was deleted or replaced")

    def drop(self) -> None:
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
        self.held = False


class PrivateDatabaseLock(DispatchLock):
    """An in-memory SQLite database: no other process can see it, so the lock is always free."""

    def __init__(self, identity: str) -> None:
        self.identity = identity

    def try_acquire(self) -> bool:
        self.held = True
        return True

    def holder(self) -> str | None:
        return self.identity if self.held else None

    def check(self) -> None:
        if not self.held:
            raise LockLost("this process does not hold the dispatch lock")

    def release(self) -> None:
        self.held = False


def make_dispatch_lock(database_url: str, identity: str) -> DispatchLock:
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        return PostgresLock(database_url, identity)
    database = url.database or ""
    if database in {"", ":memory:"} or database.startswith("file::memory:"):
        return PrivateDatabaseLock(identity)
    return FileLock(Path(database).resolve(), identity)


def _first_line(exc: DBAPIError | PendingRollbackError) -> str:
    """The first line of the driver's error (a PendingRollbackError has none: its own)."""
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    text_ = str(cause).strip()
    return text_.splitlines()[0] if text_ else type(cause).__name__
