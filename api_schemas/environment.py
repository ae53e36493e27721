"""The environment variables seedgrid reads outside the service's Settings (service/settings.py):
on the workers, in the trainers and in the client. Each is read here, with the parse rules the
service's settings use, so that one value means the same thing to every process; this module
imports nothing but pydantic, so a worker reads it without the web stack."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from api_schemas.data_roots import parse_data_roots

# Where a run reads datasets: one default root, and named roots a spec may pick.
DATA_ROOT = "SEEDGRID_DATA_ROOT"
DATA_ROOTS = "SEEDGRID_DATA_ROOTS"
ALLOW_DOWNLOAD = "SEEDGRID_ALLOW_DOWNLOAD"
DATASET_CACHE_GB = "SEEDGRID_DATASET_CACHE_GB"
# The operator's own trainer modules, imported by the service and by every worker.
TRAINER_MODULES = "SEEDGRID_TRAINER_MODULES"
# Where the client and the CLI find the service, and the token they send it.
URL = "SEEDGRID_URL"
HOST = "SEEDGRID_HOST"
PORT = "SEEDGRID_PORT"
API_TOKEN = "SEEDGRID_API_TOKEN"

_BOOL = TypeAdapter(bool)


class BadVariable(ValueError):
    """An environment variable whose value cannot be read as the type it holds."""

    def __init__(self, name: str, value: str, expected: str) -> None:
        super().__init__(f"{name}: expected {expected}, got {value!r}")
        self.name, self.value, self.expected = name, value, expected


def text(name: str) -> str:
    """The variable's value without surrounding blanks; "" when it is unset."""
    return os.environ.get(name, "").strip()


def set_text(name: str, value: str) -> None:
    """Set the variable for this process and the processes it starts (a command-line option
    that the workers and the API's worker processes must see too)."""
    os.environ[name] = value


def is_set(name: str) -> bool:
    return name in os.environ


def flag(name: str) -> bool:
    """A boolean as pydantic (and so the service's settings) reads it: 1/0, true/false, yes/no,
    on/off, y/n, t/f; unset or blank is False."""
    value = text(name)
    if not value:
        return False
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        raise BadVariable(name, value, "a boolean (1/0, true/false, yes/no, on/off)") from None


def non_negative(name: str) -> float | None:
    """A number >= 0; None when unset or blank."""
    value = text(name)
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:
        raise BadVariable(name, value, "a number >= 0")
    return number


def default_data_root() -> Path | None:
    """$SEEDGRID_DATA_ROOT, or None when it is unset (the caller's default applies)."""
    value = os.environ.get(DATA_ROOT)
    return Path(value).expanduser() if value else None


def data_roots() -> dict[str, Path]:
    """The operator's named data roots (SEEDGRID_DATA_ROOTS="name=/path,name=/path"); a
    ValueError names what is wrong with the value."""
    return parse_data_roots(os.environ.get(DATA_ROOTS, ""))


def terminal_columns_set() -> bool:
    """Whether the terminal's width is given (COLUMNS), for output that is not a terminal."""
    return "COLUMNS" in os.environ
