"""Annotated dependencies so that handlers read as typed parameters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlmodel import Session

from service.limits import HeavyReads
from service.scheduling.preflight import ClusterPreflight
from service.settings import Settings


def _session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _preflight(request: Request) -> ClusterPreflight:
    return request.app.state.preflight


def _heavy_reads(request: Request) -> HeavyReads:
    return request.app.state.heavy_reads


SessionDep = Annotated[Session, Depends(_session)]
SettingsDep = Annotated[Settings, Depends(_settings)]
PreflightDep = Annotated[ClusterPreflight, Depends(_preflight)]
HeavyReadsDep = Annotated[HeavyReads, Depends(_heavy_reads)]

# The largest integer SQLite stores and PostgreSQL's OFFSET takes; a larger offset is invalid
# input, not a driver overflow.
MAX_DB_INT = 2**63 - 1
# Ids and steps are INTEGER columns: 32 bits on PostgreSQL, which refuses to compare one with a
# larger number ("integer out of range") where SQLite would answer.
MAX_INT_COLUMN = 2**31 - 1

ExperimentId = Annotated[int, Path(ge=1, le=MAX_INT_COLUMN)]
RunId = Annotated[int, Path(ge=1, le=MAX_INT_COLUMN)]
