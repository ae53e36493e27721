"""A dispatcher claims only the runs of the trainers it has loaded (issue 37, item 2): one lock
per trainer (service.scheduling.lease), so that a dispatcher with the operator's own code beside
a service without it runs that code's runs and the service the rest, and neither fails a run it
cannot run as unknown. /healthz lists every dispatcher of the database with its trainers and
the queued runs no dispatcher can run; an experiment whose trainer no dispatcher has loaded says
so in its status. On a SQLite file and on a fresh PostgreSQL database.

On 674b730 one lock covered every trainer: the dispatcher that held it claimed a run of a
trainer it had not loaded and failed it (UnknownTrainerError), and the process that had the
code stood by."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import pool
from sqlmodel import Session, create_engine

from service.api.server import BackgroundServer
from service.scheduling.dispatcher import Dispatcher
from service.scheduling.lease import DISPATCH_LOCK_KEY, holders, make_dispatch_lock
from service.settings import Settings
from service.storage.db import make_engine
from tests.conftest import PostgresDatabases, Service, assert_no_runaway_runs
from tests.e2e.test_toy_trainer import wait_for
from tests.e2e.toy_trainer import ToyTrainer
from trainers import REGISTRY


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'seedgrid.db'}"
    databases: PostgresDatabases = request.getfixturevalue("pg_databases")
    return databases.url()


def held_by(url: str, trainers: list[str]) -> dict[str, str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with Session(engine) as session:
            return holders(url, session, trainers)
    finally:
        engine.dispose()


def test_each_trainer_has_its_own_lock_and_its_holder_is_named(database_url: str) -> None:
    every = ["collapse", "toy", "mlp_digits", "ssl"]
    service = make_dispatch_lock(database_url, "host-a:1:aaaaaa", ["collapse", "toy"])
    own_code = make_dispatch_lock(database_url, "host-b:2:bbbbbb", ["collapse", "mlp_digits"])
    try:
        assert service.try_acquire() and service.trainers == {"collapse", "toy"}
        # the second process takes its own trainer's lock and waits for the shared one's
        assert not own_code.try_acquire() and own_code.trainers == {"mlp_digits"}
        holder = own_code.holder()
        assert holder is not None and "host-a:1:aaaaaa" in holder, holder
        service.check()
        own_code.check()
        assert held_by(database_url, every) == {
            "collapse": "host-a:1:aaaaaa",
            "toy": "host-a:1:aaaaaa",
            "mlp_digits": "host-b:2:bbbbbb",
        }
        # the holder is gone: the other takes over the trainer they share, and only that one
        service.close()
        assert own_code.acquire_free() == {"collapse"}
        assert own_code.try_acquire()  # every trainer it wants is its own now
        own_code.check()
        assert held_by(database_url, every) == {
            "collapse": "host-b:2:bbbbbb",
            "mlp_digits": "host-b:2:bbbbbb",
        }
        own_code.close()
        assert held_by(database_url, every) == {}
    finally:
        service.close()
        own_code.close()


@contextmanager
def older_version_lock(database_url: str) -> Iterator[None]:
    """The one lock of every trainer that seedgrid took before trainer locks, held
    exclusively by another session or process, as such a version's dispatcher holds it."""
    if database_url.startswith("sqlite"):
        database = Path(database_url.removeprefix("sqlite:///"))
        path = database.with_name(database.name + "-dispatcher.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield
        finally:
            os.close(fd)
    else:
        dsn = database_url.replace("postgresql+psycopg", "postgresql")
        with psycopg.connect(dsn, autocommit=True) as older:
            assert older.execute("SELECT pg_try_advisory_lock(%s)", (DISPATCH_LOCK_KEY,)).fetchone()
            yield


def test_an_older_versions_lock_of_every_trainer_excludes_trainer_locks(
    database_url: str,
) -> None:
    new = make_dispatch_lock(database_url, "host-c:3:cccccc", ["collapse"])
    try:
        assert new.try_acquire()
        new.release()
        with older_version_lock(database_url):
            assert not new.try_acquire() and not new.trainers
            holder = new.holder()
            assert holder is not None and "older seedgrid" in holder, holder
        assert new.try_acquire()
    finally:
        new.close()


def toy_spec(name: str) -> dict[str, Any]:
    return {"name": name, "trainer": "toy", "config": {"steps": 200}, "seeds": 2}


def collapse_spec(name: str) -> dict[str, Any]:
    config = {"n_samples": 64, "steps": 50}
    return {"name": name, "trainer": "collapse", "config": config, "seeds": 2}


@pytest.mark.timeout(240)
def test_a_dispatcher_claims_only_the_runs_of_the_trainers_it_has_loaded(
    ray_cluster: None, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API alone and two dispatchers on one database: the first has only the built-ins,
    the second the toy too (an operator's own code). The toy's runs wait queued, not failed,
    until the second starts, and /healthz and the experiment's status say why; then each
    dispatcher runs its own trainers' runs."""
    monkeypatch.setitem(REGISTRY, "toy", ToyTrainer())  # the API accepts the toy's specs
    settings = Settings(database_url=database_url, metrics_batch_interval_s=0.2)
    builtins = own_code = None
    engines = []
    with BackgroundServer(settings, dispatch=False) as server:
        service = Service(server, None, database_url)
        try:
            engines.append(make_engine(database_url))
            builtins = Dispatcher(
                settings, engines[-1], trainers=lambda: [n for n in REGISTRY if n != "toy"]
            )
            builtins.start()
            assert builtins.state == "active" and "toy" not in builtins.trainers
            toy = service.submit(toy_spec("own code"))
            collapse = service.submit(collapse_spec("built-in"))
            assert service.wait(collapse["id"], timeout_s=120)["status"] == "completed"

            # the toy's runs wait: claimed by nobody, failed by nobody
            detail = service.client.get(f"/experiments/{toy['id']}").json()
            assert detail["status"] == "queued" and detail["counts"]["queued"] == 2, detail
            assert "no dispatcher runs trainer 'toy'" in detail["waiting_for"], detail
            assert "--trainers FILE" in detail["waiting_for"], detail
            health = service.client.get("/healthz").json()
            assert health["queued_without_dispatcher"] == {"toy": 2}, health
            (listed,) = health["dispatchers"]
            assert listed["identity"] == builtins.identity, health
            assert "collapse" in listed["trainers"] and "toy" not in listed["trainers"], health

            engines.append(make_engine(database_url))
            own_code = Dispatcher(settings, engines[-1])  # every trainer of this process
            own_code.start()
            # the built-ins are the first's: this one dispatches the toy alone
            assert own_code.state == "active" and own_code.trainers == ["toy"]
            assert service.wait(toy["id"], timeout_s=120)["status"] == "completed"

            for experiment, dispatcher in ((toy, own_code), (collapse, builtins)):
                for run in service.runs(experiment["id"]):
                    shown = service.client.get(f"/runs/{run['id']}").json()
                    assert shown["provenance"]["dispatcher"] == dispatcher.identity, shown
            health = service.client.get("/healthz").json()
            assert health["queued_without_dispatcher"] == {}, health
            assert {d["identity"]: d["trainers"] for d in health["dispatchers"]} == {
                builtins.identity: builtins.trainers,
                own_code.identity: ["toy"],
            }, health
            assert service.client.get(f"/experiments/{toy['id']}").json()["waiting_for"] is None

            # the first stops: the second takes over the built-ins' runs as well
            builtins.stop()
            wait_for(lambda: "collapse" in own_code.trainers, timeout_s=15)
            again = service.submit(collapse_spec("after the take-over"))
            assert service.wait(again["id"], timeout_s=120)["status"] == "completed"
        finally:
            for dispatcher in (own_code, builtins):
                if dispatcher is not None:
                    dispatcher.stop()
            for engine in engines:
                engine.dispose()
            service.client.close()
    assert_no_runaway_runs()
