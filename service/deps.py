"""Annotated dependencies so that handlers read as typed parameters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlmodel import Session

from service.settings import Settings


def _session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


def _settings(request: Request) -> Settings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(_session)]
SettingsDep = Annotated[Settings, Depends(_settings)]

# The largest integer SQLite stores; a larger id, offset or step is invalid input, not a driver
# overflow.
MAX_DB_INT = 2**63 - 1

ExperimentId = Annotated[int, Path(ge=1, le=MAX_DB_INT)]
RunId = Annotated[int, Path(ge=1, le=MAX_DB_INT)]
