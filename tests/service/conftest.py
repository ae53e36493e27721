"""Fixtures of the service tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session

from service.storage.db import make_engine, upgrade_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database at the schema's head: a SQLite file, or the local PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    else:
        url = request.getfixturevalue("pg_databases").url()
    upgrade_database(url)
    return url


@pytest.fixture
def backend_session(database_url: str) -> Iterator[Session]:
    """A session on `database_url`: once on SQLite and once on PostgreSQL."""
    engine = make_engine(database_url)
    with Session(engine) as session:
        yield session
    engine.dispose()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    """A session on a fresh SQLite file at the schema's head revision."""
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    with Session(engine) as session:
        yield session
    engine.dispose()
