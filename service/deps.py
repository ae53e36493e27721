"""Annotated dependencies so that handlers read as typed parameters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlmodel import Session

from service.settings import Settings


def _session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


def _settings(request: Request) -> Settings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(_session)]
SettingsDep = Annotated[Settings, Depends(_settings)]
