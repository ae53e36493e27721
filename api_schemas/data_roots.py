"""Named data roots: a spec's `data_root` is a name the operator maps to a directory
(SEEDGRID_DATA_ROOTS); a spec never gives a path. Shared by the service, which checks names at
submission, and the trainers' data layer, which resolves them on a worker. Pure Python, so that
reading the settings imports no machine-learning library."""

from __future__ import annotations

import re
from pathlib import Path

# A spec selects a root by name only: the operator decides which directories workers read.
ROOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def parse_data_roots(text: str) -> dict[str, Path]:
    """The operator's named roots, `name=/absolute/path,name=/absolute/path` (the value of
    SEEDGRID_DATA_ROOTS). Raises ValueError naming the entry that is not of that form."""
    roots: dict[str, Path] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, path = (part.strip() for part in entry.partition("="))
        if not sep or not ROOT_NAME.fullmatch(name) or not Path(path).is_absolute():
            raise ValueError(
                f"SEEDGRID_DATA_ROOTS entry {entry!r} is not name=/absolute/path "
                "(names: letters, digits, _ and -, up to 64)"
            )
        if name in roots:
            raise ValueError(f"SEEDGRID_DATA_ROOTS names {name!r} twice")
        roots[name] = Path(path)
    return roots
