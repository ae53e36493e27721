"""The body of an import (POST /experiments/import) from a results file: a `.csv` run table,
sent as its text, or a `.json` file holding `{"runs": [...]}` (or the list of runs itself)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A results file is read only up to this size: the service refuses a larger body anyway
# (SEEDGRID_MAX_REQUEST_BODY_BYTES, 1 MiB by default).
MAX_RESULTS_FILE_BYTES = 64 * 2**20


class ResultsFileError(ValueError):
    """A results file that cannot be sent; the message names the file."""


def results_body(
    results: Mapping[str, Any] | str | Path, *, new: bool, **options: Any
) -> dict[str, Any]:
    """The import's JSON body: `results` (a path, or a body with `runs` or `csv`) with the
    options that are not None (name, seed_column, metrics, metric) over it. A `new`
    experiment read from a file it does not name is named after the file (seeds.csv: seeds)."""
    if isinstance(results, str | Path):
        body = _read(Path(results))
        if new and options.get("name") is None and "name" not in body:
            body["name"] = Path(results).stem
    else:
        body = dict(results)
    return {**body, **{k: v for k, v in options.items() if v is not None}}


def _read(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json"):
        raise ResultsFileError(f"expected a .csv or .json results file, got {path.name}")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_RESULTS_FILE_BYTES + 1)
    except OSError as exc:
        raise ResultsFileError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_RESULTS_FILE_BYTES:
        raise ResultsFileError(f"{path}: larger than {MAX_RESULTS_FILE_BYTES // 2**20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if suffix == ".csv":
        return {"csv": text}
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path}: not JSON: {exc}") from None
    if isinstance(loaded, list):
        return {"runs": loaded}
    if not isinstance(loaded, dict):
        raise ResultsFileError(f"{path}: expected an object with runs, or a list of runs")
    return loaded
