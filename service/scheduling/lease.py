"""The dispatch locks: the runs of each trainer are dispatched by at most one process at a time.

A dispatcher (`seedgrid dispatcher`, `seedgrid serve` in embedded mode, `seedgrid run`) takes
one lock per trainer it has loaded (its built-ins and the operator's `--trainers` code), and
claims, re-queues and decides only the runs of the trainers whose locks it holds. A trainer
whose lock another process holds waits for it: this process stands by for that trainer and
polls. So a `seedgrid run --trainers FILE` started beside a running `seedgrid serve` dispatches
its own trainer's runs while the service keeps the built-ins', and no process ever claims a run
of a trainer it has not loaded (where it could only fail it as unknown). A lock dies with its
holder, with no timeout to wait out, so a standby takes over as soon as the holder is gone:

- PostgreSQL: session-level advisory locks (`pg_try_advisory_lock(space, key)`, the key a hash
  of the trainer's name) on one dedicated connection. PostgreSQL frees them when that
  connection's backend ends: the holder exited or was killed, or its connection dropped. The
  holder runs all its dispatcher transactions on that same connection (`bind`), which fences
  them: a write can only commit while the locks are held, so a holder that lost its connection
  cannot write anything after a successor took over.
- SQLite: an exclusive `flock` per trainer on a file next to the database
  (`<database>-dispatcher-<hash>.lock`, which names its holder and trainer). Every process that
  opens a SQLite database in WAL mode is on its machine (WAL needs shared memory), so a file
  lock reaches all of them; the kernel releases it when the holder's process ends, kill -9
  included, and it cannot be lost while the process lives (nothing deletes the file), so the
  dispatcher's transactions need no further fence.

Every holder also holds the one lock of versions before trainer locks (PostgreSQL's key
DISPATCH_LOCK_KEY, SQLite's `<database>-dispatcher.lock`) shared: such an older dispatcher,
which takes it exclusively and dispatches every trainer, and the holders of trainer locks
exclude each other.

`holders` tells who holds which trainer's lock (for /healthz and an experiment's status) without
taking any: PostgreSQL's pg_locks, SQLite's lock files.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import secrets
import socket
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import pool, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, PendingRollbackError
from sqlmodel import Session, create_engine

from service.storage.db import CONNECT_TIMEOUT_S

log = logging.getLogger("seedgrid.lease")

# The lock of versions before trainer locks (any fixed 64-bit number, not the migration lock's,
# service.storage.db.MIGRATION_LOCK_KEY), held shared by every holder of trainer locks.
DISPATCH_LOCK_KEY = 0x5EED_6121_D000_0002
# PostgreSQL reads a bigint advisory key as two 32-bit halves in pg_locks (objsubid 1).
_KEY_HIGH, _KEY_LOW = DISPATCH_LOCK_KEY >> 32, DISPATCH_LOCK_KEY & 0xFFFF_FFFF
# The trainer locks' space: the first of their two int4 keys (pg_locks: classid, objsubid 2).
TRAINER_LOCK_SPACE = 0x5EED_6122
# Held while a process takes trainer locks, so that one process takes every free lock it wants
# at once: two dispatchers of the same trainers never split them between them (one acts, the
# other stands by, as with one lock per database).
ACQUIRING_KEY = 0x5EED_6121_D000_0003
# Both ends of the lock connection probe it, so that a holder whose machine vanished without
# closing its socket loses the lock in about idle + interval x count = 25 s, not hours.
TCP_KEEPALIVE = {"idle": 10, "interval": 5, "count": 3}
TCP_USER_TIMEOUT_MS = 25_000
# application_name of a holder's lock connection: this prefix and its identity (63 bytes).
APPLICATION_PREFIX = "seedgrid-dispatcher "


class LockLost(Exception):
    """This process no longer holds its dispatch locks (or never did)."""


def dispatcher_identity() -> str:
    """host:pid:nonce; the nonce tells apart processes that reuse a pid (PID 1 in containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def trainer_key(trainer: str) -> int:
    """A trainer's lock key: the first 4 bytes of the SHA-256 of its name, a signed int4."""
    return int.from_bytes(hashlib.sha256(trainer.encode()).digest()[:4], "big", signed=True)


class DispatchLock(ABC):
    """One process's locks of one database: a lock per wanted trainer. Used by one thread at a
    time (the dispatcher's)."""

    identity: str

    def __init__(self, identity: str, trainers: Iterable[str]) -> None:
        self.identity = identity
        self.wanted: set[str] = set(trainers)
        self.trainers: set[str] = set()  # the trainers whose locks this process holds

    @property
    def held(self) -> bool:
        return bool(self.trainers)

    def want(self, trainers: Iterable[str]) -> None:
        """The trainers this process can run (it loaded more code): their locks are taken by
        the next acquire. A lock already held stays held."""
        self.wanted = set(trainers)

    def try_acquire(self) -> bool:
        """Take every wanted trainer's lock that is free (never waits); whether this process
        now holds all of them. Database errors raise."""
        self.acquire_free()
        return bool(self.wanted) and self.wanted <= self.trainers

    def acquire_free(self) -> set[str]:
        """Take every wanted trainer's lock that is free; the trainers newly taken (none while
        another process is taking locks: the next poll tries again)."""
        missing = sorted(self.wanted - self.trainers)
        if not missing or not self._begin():
            return set()
        try:
            if not self._fence():
                return set()
            taken = {trainer for trainer in missing if self._take(trainer)}
            self.trainers |= taken
            if not self.trainers:
                self._unfence()
        finally:
            self._end()
        return taken

    @abstractmethod
    def _begin(self) -> bool:
        """Take the lock of taking locks (ACQUIRING_KEY) if it is free."""

    @abstractmethod
    def _end(self) -> None:
        """Give the lock of taking locks up."""

    @abstractmethod
    def _fence(self) -> bool:
        """Hold the older versions' lock shared (no-op when held already)."""

    @abstractmethod
    def _unfence(self) -> None:
        """Give the older versions' lock up (this process holds no trainer lock)."""

    @abstractmethod
    def _take(self, trainer: str) -> bool:
        """Take one trainer's lock if it is free."""

    @abstractmethod
    def holder(self) -> str | None:
        """Who holds a wanted trainer's lock that this process does not, as far as this
        database can tell; for standby logs."""

    @abstractmethod
    def check(self) -> None:
        """Raise LockLost unless this process still holds every lock it took."""

    def bind(self, engine: Engine) -> Engine | Connection:
        """What the holder's dispatcher sessions run on."""
        if not self.held:
            raise LockLost("this process holds no dispatch lock")
        return engine

    def drop(self) -> None:
        """Forget locks that are gone."""
        self.release()

    @abstractmethod
    def release(self) -> None:
        """Give every lock up, so that standbys take over now."""

    def close(self) -> None:
        self.release()


class PostgresLock(DispatchLock):
    def __init__(self, database_url: str, identity: str, trainers: Iterable[str]) -> None:
        super().__init__(identity, trainers)
        self._engine = create_engine(
            database_url,
            poolclass=pool.NullPool,
            connect_args={
                "connect_timeout": CONNECT_TIMEOUT_S,
                # pg_stat_activity shows who holds the lock (standbys log it, /healthz lists it).
                "application_name": f"{APPLICATION_PREFIX}{identity}"[:63],
                "keepalives": 1,
                "keepalives_idle": TCP_KEEPALIVE["idle"],
                "keepalives_interval": TCP_KEEPALIVE["interval"],
                "keepalives_count": TCP_KEEPALIVE["count"],
                "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
            },
        )
        self._connection: Connection | None = None
        self._fenced = False

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

    def _locked(self, statement: str, **keys: int) -> bool:
        try:
            connection = self._connect()
            taken = connection.execute(text(statement), keys).scalar_one()
            connection.commit()  # the lock is the session's: it outlives the transaction
        except DBAPIError:
            self.drop()
            raise
        return bool(taken)

    def _begin(self) -> bool:
        return self._locked("SELECT pg_try_advisory_lock(:key)", key=ACQUIRING_KEY)

    def _end(self) -> None:
        if self._connection is not None:
            self._locked("SELECT pg_advisory_unlock(:key)", key=ACQUIRING_KEY)

    def _fence(self) -> bool:
        if not self._fenced:
            self._fenced = self._locked(
                "SELECT pg_try_advisory_lock_shared(:key)", key=DISPATCH_LOCK_KEY
            )
        return self._fenced

    def _unfence(self) -> None:
        if self._fenced and self._connection is not None:
            self._locked("SELECT pg_advisory_unlock_shared(:key)", key=DISPATCH_LOCK_KEY)
        self._fenced = False

    def _take(self, trainer: str) -> bool:
        return self._locked(
            "SELECT pg_try_advisory_lock(:space, :key)",
            space=TRAINER_LOCK_SPACE,
            key=trainer_key(trainer),
        )

    def holder(self) -> str | None:
        try:
            connection = self._connect()
            held = _postgres_holders(connection, self.wanted - self.trainers)
            connection.rollback()
            if not held and not self._fenced:
                row = connection.execute(
                    text(
                        "SELECT a.application_name, a.client_addr, a.pid FROM pg_locks l "
                        "JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' "
                        "AND l.classid = :high AND l.objid = :low AND l.objsubid = 1 "
                        "AND l.database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())"
                    ),
                    {"high": _KEY_HIGH, "low": _KEY_LOW},
                ).first()
                connection.rollback()
                if row is not None:
                    name, address, pid = row
                    origin = address or "a local socket"
                    return (
                        f"{name or 'an unnamed session'} (PostgreSQL backend {pid}, from "
                        f"{origin}; an older seedgrid's lock of every trainer)"
                    )
        except DBAPIError:
            self._discard_connection()
            return None
        return "; ".join(sorted({f"{APPLICATION_PREFIX}{who}" for who in held.values()})) or None

    def check(self) -> None:
        if not self.held or self._connection is None:
            raise LockLost("this process holds no dispatch lock")
        try:
            keys = {
                key
                for (key,) in self._connection.execute(
                    text(
                        "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                        "AND pid = pg_backend_pid() AND classid = :space AND objsubid = 2"
                    ),
                    {"space": TRAINER_LOCK_SPACE},
                )
            }
            self._connection.rollback()
        except (DBAPIError, PendingRollbackError) as exc:
            # PendingRollbackError: the connection died inside a dispatcher transaction on it
            self.drop()
            raise LockLost(f"the lock's database connection failed: {_first_line(exc)}") from None
        lost = sorted(t for t in self.trainers if trainer_key(t) & 0xFFFF_FFFF not in keys)
        if lost:
            self.drop()
            raise LockLost(f"the database no longer shows the lock of {', '.join(lost)} as ours")

    def bind(self, engine: Engine) -> Connection:
        if not self.held or self._connection is None:
            raise LockLost("this process holds no dispatch lock")
        return self._connection

    def drop(self) -> None:
        self.trainers.clear()
        self._fenced = False
        self._discard_connection()

    def release(self) -> None:
        if self._connection is not None and (self.trainers or self._fenced):
            try:
                self._connection.execute(text("SELECT pg_advisory_unlock_all()"))
                self._connection.commit()
            except (DBAPIError, PendingRollbackError):
                pass  # the connection is gone, and the locks with it
        self.drop()

    def close(self) -> None:
        self.release()
        self._engine.dispose()

    def _discard_connection(self) -> None:
        # Closing the connection ends the session, which frees every lock it might still hold.
        if self._connection is not None:
            try:
                self._connection.invalidate()
                self._connection.close()
            except DBAPIError:
                pass
            self._connection = None


def lock_file(database_path: Path, trainer: str) -> Path:
    """The SQLite lock file of one trainer's runs on this database."""
    digest = hashlib.sha256(trainer.encode()).hexdigest()[:16]
    return database_path.with_name(f"{database_path.name}-dispatcher-{digest}.lock")


class FileLock(DispatchLock):
    """flock on a file per trainer next to the database; see the module docstring. `path` is
    the older versions' lock file, held shared."""

    def __init__(self, database_path: Path, identity: str, trainers: Iterable[str]) -> None:
        super().__init__(identity, trainers)
        self.database_path = database_path
        self.path = database_path.with_name(database_path.name + "-dispatcher.lock")
        self._fds: dict[str, int] = {}  # trainer (or "" for the fence) -> its descriptor
        self._taking: int | None = None

    def _flock(self, path: Path, mode: int) -> int | None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _begin(self) -> bool:
        path = self.database_path.with_name(self.database_path.name + "-dispatcher-taking.lock")
        self._taking = self._flock(path, fcntl.LOCK_EX)
        return self._taking is not None

    def _end(self) -> None:
        if self._taking is not None:
            os.close(self._taking)
            self._taking = None

    def _fence(self) -> bool:
        if "" not in self._fds:
            fd = self._flock(self.path, fcntl.LOCK_SH)
            if fd is None:
                return False
            self._fds[""] = fd
        return True

    def _unfence(self) -> None:
        fd = self._fds.pop("", None)
        if fd is not None:
            os.close(fd)

    def _take(self, trainer: str) -> bool:
        fd = self._flock(lock_file(self.database_path, trainer), fcntl.LOCK_EX)
        if fd is None:
            return False
        # Who holds it and for what, for standbys' logs and /healthz; stale once the holder is
        # gone, which is harmless (a lock file nobody holds is read as free).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.identity}\n{trainer}\n".encode(), 0)
        self._fds[trainer] = fd
        return True

    def holder(self) -> str | None:
        held = _file_holders(self.database_path, self.wanted - self.trainers)
        if not held and "" not in self._fds and _file_held(self.path):
            return f"an older seedgrid dispatcher (the lock file {self.path} of every trainer)"
        return "; ".join(sorted(set(held.values()))) or None

    def check(self) -> None:
        if not self.held:
            raise LockLost("this process holds no dispatch lock")
        for trainer, fd in list(self._fds.items()):
            path = lock_file(self.database_path, trainer) if trainer else self.path
            try:
                same_file = os.stat(path).st_ino == os.fstat(fd).st_ino
            except OSError:
                same_file = False
            if not same_file:
                self.drop()
                raise LockLost(f"the lock file {path} was deleted or replaced")

    def release(self) -> None:
        for fd in self._fds.values():
            os.close(fd)  # closing the descriptor releases the flock
        self._fds.clear()
        self.trainers.clear()


class PrivateDatabaseLock(DispatchLock):
    """An in-memory SQLite database: no other process can see it, so every lock is free."""

    def _begin(self) -> bool:
        return True

    def _end(self) -> None:
        pass

    def _fence(self) -> bool:
        return True

    def _unfence(self) -> None:
        pass

    def _take(self, trainer: str) -> bool:
        return True

    def holder(self) -> str | None:
        return self.identity if self.held else None

    def check(self) -> None:
        if not self.held:
            raise LockLost("this process holds no dispatch lock")

    def release(self) -> None:
        self.trainers.clear()


def make_dispatch_lock(database_url: str, identity: str, trainers: Iterable[str]) -> DispatchLock:
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        return PostgresLock(database_url, identity, trainers)
    path = sqlite_file(database_url)
    if path is None:
        return PrivateDatabaseLock(identity, trainers)
    return FileLock(path, identity, trainers)


def sqlite_file(database_url: str) -> Path | None:
    """A SQLite URL's database file; None for an in-memory database."""
    database = make_url(database_url).database or ""
    if database in {"", ":memory:"} or database.startswith("file::memory:"):
        return None
    return Path(database).resolve()


def holders(database_url: str, session: Session, trainers: Iterable[str]) -> dict[str, str]:
    """Which of these trainers' locks are held, and by whom (the holder's identity), taking
    none of them: on PostgreSQL through `session`'s connection (pg_locks), on SQLite from the
    lock files. An in-memory database's locks are its one process's: none here."""
    wanted = set(trainers)
    if not wanted:
        return {}
    if make_url(database_url).get_backend_name() == "postgresql":
        return _postgres_holders(session.connection(), wanted)
    path = sqlite_file(database_url)
    return {} if path is None else _file_holders(path, wanted)


def _postgres_holders(connection: Connection, trainers: Iterable[str]) -> dict[str, str]:
    by_key = {trainer_key(t) & 0xFFFF_FFFF: t for t in trainers}
    if not by_key:
        return {}
    rows = connection.execute(
        text(
            "SELECT l.objid, a.application_name FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :space "
            "AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())"
        ),
        {"space": TRAINER_LOCK_SPACE},
    ).all()
    found: dict[str, str] = {}
    for key, name in rows:
        trainer = by_key.get(int(key))
        if trainer is not None:
            found[trainer] = (name or "").removeprefix(APPLICATION_PREFIX) or "an unnamed session"
    return found


def _file_held(path: Path) -> bool:
    """Whether a process holds this lock file exclusively (a shared flock for an instant)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False  # no file: nobody ever locked it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the shared flock, when it was taken
    return False


def _file_holders(database_path: Path, trainers: Iterable[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for trainer in trainers:
        path = lock_file(database_path, trainer)
        if _file_held(path):
            try:
                identity = path.read_text().split("\n", 1)[0].strip()
            except OSError:
                identity = ""
            found[trainer] = identity or "another process"
    return found


def _first_line(exc: DBAPIError | PendingRollbackError) -> str:
    """The first line of the driver's error (a PendingRollbackError has none: its own)."""
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    text_ = str(cause).strip()
    return text_.splitlines()[0] if text_ else type(cause).__name__
