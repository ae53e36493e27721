"""Imported per-seed results read into rows: a JSON list of runs, or a CSV run table (one row per
run). Nothing here touches the database; every refusal is a SpecError (422) naming the row and
column it is about, and all of a table's problems are found before anything is stored.

A CSV is a W&B or MLflow run-table export when its header has their prefixes: `config.*` and
`params.*` columns are factors, `summary.*` and `metrics.*` columns metrics (the prefix dropped,
so that a W&B and an MLflow export of one study name the same factors), and every other column
(Name, State, run_id, start_time, tags.*, W&B's own summary._runtime ...) is ignored. A plain
CSV names its metric columns with `metrics`, or puts them after the seed column and its factor
columns before it. The seed column is `seed_column`, else the first of SEED_COLUMNS.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from typing import Any

from api_schemas import (
    MAX_LEVEL_LENGTH,
    MAX_SEED,
    SOURCE_FACTOR,
    ExperimentImport,
    ImportSource,
)
from service.errors import MAX_ERRORS_SHOWN, SpecError, body_error
from service.limits import MAX_IMPORT_COLUMNS, MAX_IMPORT_ROWS

SEED_COLUMNS = ("seed", "config.seed", "params.seed")
FACTOR_PREFIXES: dict[str, ImportSource] = {"config.": "wandb", "params.": "mlflow"}
METRIC_PREFIXES: dict[str, ImportSource] = {"summary.": "wandb", "metrics.": "mlflow"}

# ASCII digits only: \d took full-width ones (`１２` read as 12), and Python's int() and float()
# read every script's digits
NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
INTEGER = re.compile(r"[+-]?[0-9]+")
SEED = re.compile(r"[0-9]+(\.0*)?")


@dataclass
class ImportedRow:
    """One run read from the import: where it was (`loc`, `label`), its factors' levels, seed
    and metrics (a metric left empty or null is absent)."""

    loc: list[Any]
    label: str
    factors: dict[str, Any]
    seed: int
    metrics: dict[str, float]


@dataclass
class ImportTable:
    source: ImportSource
    factors: list[str]
    metrics: list[str]
    metric: str
    rows: list[ImportedRow]
    seed_column: str = "seed"
    # factor or metric name -> the column that held it (config.lr -> lr: the same study's W&B
    # and MLflow exports name the same factors)
    columns: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)

    def column(self, name: str) -> str:
        return self.columns.get(name, name)


class Problems:
    """The refusals of one import, the first MAX_ERRORS_SHOWN listed, the rest counted."""

    def __init__(self) -> None:
        self.errors: list[dict[str, Any]] = []
        self.unlisted = 0

    def add(self, loc: list[Any], message: str) -> None:
        if len(self.errors) < MAX_ERRORS_SHOWN:
            self.errors.append(body_error(loc, message))
        else:
            self.unlisted += 1

    def raise_any(self) -> None:
        if self.errors:
            raise SpecError(self.errors, self.unlisted)


def read_import(request: ExperimentImport) -> ImportTable:
    """The rows of `request` (JSON runs or CSV text), checked cell by cell."""
    if request.runs is not None:
        return typed_levels(_read_runs(request))
    assert request.csv is not None
    return typed_levels(_read_csv(request, request.csv))


def _read_runs(request: ExperimentImport) -> ImportTable:
    assert request.runs is not None
    problems = Problems()
    if not request.runs:
        problems.add(["runs"], "no runs: give at least one {condition, seed, metrics}")
    if len(request.runs) > MAX_IMPORT_ROWS:
        problems.add(
            ["runs", MAX_IMPORT_ROWS],
            f"run {MAX_IMPORT_ROWS}: more than {MAX_IMPORT_ROWS:,} runs in one import; "
            "import the rest into the experiment in further imports",
        )
    problems.raise_any()
    factors = list(request.runs[0].condition)
    metrics: dict[str, None] = {}
    rows = []
    for i, run in enumerate(request.runs):
        if set(run.condition) != set(factors):
            problems.add(
                ["runs", i, "condition"],
                f"run {i}: its condition has factors {sorted(run.condition)}, run 0's "
                f"{sorted(factors)}: every run names the same factors",
            )
        values = {name: value for name, value in run.metrics.items() if value is not None}
        metrics.update(dict.fromkeys(run.metrics))
        rows.append(ImportedRow(["runs", i], f"run {i}", dict(run.condition), run.seed, values))
    _check_factor_names(problems, factors, lambda f: ["runs", 0, "condition", f])
    problems.raise_any()
    names = list(metrics)
    metric = _primary(problems, request, names)
    problems.raise_any()
    return ImportTable("json", factors, names, metric, rows)


def _read_csv(request: ExperimentImport, text: str) -> ImportTable:
    problems = Problems()
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")), strict=True)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise SpecError([body_error(["csv"], "the CSV is empty: no header row")]) from None
    except csv.Error as exc:
        raise SpecError([body_error(["csv", "line 1"], f"line 1: not CSV: {exc}")]) from None
    if len(header) > MAX_IMPORT_COLUMNS:
        problems.add(
            ["csv", "header"], f"header: {len(header):,} columns, over {MAX_IMPORT_COLUMNS:,}"
        )
    for i, name in enumerate(header):
        if not name:
            problems.add(["csv", "header", i], f"header: column {i + 1} has no name")
        elif header.index(name) != i:
            problems.add(["csv", "header", name], f"header: column {name!r} appears twice")
    problems.raise_any()
    seed_column = _seed_column(request, header)
    columns = _classify(problems, request, header, seed_column)
    problems.raise_any()
    factors = {name: column for column, name in columns.factors.items()}
    metric = _primary(problems, request, list(columns.metrics.values()))
    problems.raise_any()

    rows: list[ImportedRow] = []
    position = {name: i for i, name in enumerate(header)}
    number = 0
    try:
        for cells in reader:
            if not cells:
                continue  # a blank line
            number += 1
            where = f"row {number} (line {reader.line_num})"
            if number > MAX_IMPORT_ROWS:
                problems.add(
                    ["csv", f"row {number}"],
                    f"{where}: more than {MAX_IMPORT_ROWS:,} rows in one import; import the "
                    "rest into the experiment in further imports",
                )
                break
            row = _read_row(problems, cells, header, position, where, number, seed_column, columns)
            if row is not None:
                rows.append(row)
    except csv.Error as exc:
        problems.add(["csv", f"line {reader.line_num}"], f"line {reader.line_num}: not CSV: {exc}")
    if number == 0 and not problems.errors:
        problems.add(["csv"], "the CSV has a header but no rows")
    problems.raise_any()
    return ImportTable(
        columns.source,
        list(factors),
        list(columns.metrics.values()),
        metric,
        rows,
        seed_column,
        {name: column for column, name in [*columns.factors.items(), *columns.metrics.items()]},
        columns.ignored,
    )


@dataclass
class _Columns:
    source: ImportSource
    factors: dict[str, str]  # column -> factor name
    metrics: dict[str, str]  # column -> metric name
    ignored: list[str]


def _seed_column(request: ExperimentImport, header: list[str]) -> str:
    if request.seed_column is not None:
        if request.seed_column not in header:
            raise SpecError(
                [
                    body_error(
                        ["seed_column"],
                        f"header: no column {request.seed_column!r} (seed_column); its "
                        f"columns: {', '.join(header[:20])}",
                    )
                ]
            )
        return request.seed_column
    found = next((name for name in SEED_COLUMNS if name in header), None)
    if found is None:
        raise SpecError(
            [
                body_error(
                    ["csv", "header"],
                    f"header: no seed column (none of {', '.join(SEED_COLUMNS)}); name the "
                    f"column that holds each run's seed with seed_column (its columns: "
                    f"{', '.join(header[:20])})",
                )
            ]
        )
    return found


def _classify(
    problems: Problems, request: ExperimentImport, header: list[str], seed_column: str
) -> _Columns:
    """Which columns are factors and metrics (under which names), which are ignored."""
    prefixes = {**FACTOR_PREFIXES, **METRIC_PREFIXES}
    asked = set(request.metrics or [])
    if any(h.startswith(tuple(prefixes)) for h in header if h != seed_column):
        metric_prefix = next(
            (p for h in header for p in METRIC_PREFIXES if h.startswith(p)), "summary."
        )
        source = METRIC_PREFIXES[metric_prefix]
        factors, metrics, ignored = {}, {}, []
        for column in header:
            if column == seed_column:
                continue
            prefix = next((p for p in prefixes if column.startswith(p)), None)
            name = column[len(prefix) :] if prefix else ""
            if prefix in FACTOR_PREFIXES and name:
                factors[column] = name
            elif (
                prefix in METRIC_PREFIXES
                and name
                and not name.startswith("_")
                and (not asked or name in asked or column in asked)
            ):
                metrics[column] = name
            else:
                ignored.append(column)
    else:
        source, ignored = "csv", []
        if request.metrics is not None:
            metrics = {c: c for c in header if c in asked and c != seed_column}
            factors = {c: c for c in header if c not in asked and c != seed_column}
        else:
            at = header.index(seed_column)
            factors = {c: c for c in header[:at]}
            metrics = {c: c for c in header[at + 1 :]}
    for name in sorted(asked - set(metrics) - set(metrics.values())):
        problems.add(["metrics", name], f"header: no metric column {name!r}")
    if not metrics:
        problems.add(
            ["csv", "header"],
            "header: no metric columns (a plain CSV has them after the seed column, or named "
            "by metrics; a W&B or MLflow export as summary.* or metrics.*)",
        )
    for names in (factors, metrics):
        seen: dict[str, str] = {}
        for column, name in names.items():
            if name in seen:
                problems.add(
                    ["csv", "header", column],
                    f"header: columns {seen[name]!r} and {column!r} both name {name!r}",
                )
            seen[name] = column
    _check_factor_names(problems, list(factors.values()), lambda f: ["csv", "header", f])
    return _Columns(source, factors, metrics, ignored)


def _check_factor_names(problems: Problems, factors: list[str], loc: Any) -> None:
    if SOURCE_FACTOR in factors:
        problems.add(
            loc(SOURCE_FACTOR),
            f"factor {SOURCE_FACTOR!r} is reserved (the random source of a source "
            "decomposition); rename the column",
        )


def _primary(problems: Problems, request: ExperimentImport, metrics: list[str]) -> str:
    if request.metric is None:
        return metrics[0] if metrics else ""
    if request.metric not in metrics:
        problems.add(
            ["metric"], f"metric {request.metric!r} is not a metric column: {', '.join(metrics)}"
        )
    return request.metric


def _read_row(
    problems: Problems,
    cells: list[str],
    header: list[str],
    position: dict[str, int],
    where: str,
    number: int,
    seed_column: str,
    columns: _Columns,
) -> ImportedRow | None:
    loc = ["csv", f"row {number}"]
    if len(cells) != len(header):
        problems.add(loc, f"{where}: {len(cells)} cells, the header has {len(header)} columns")
        return None
    before = len(problems.errors) + problems.unlisted
    seed_text = cells[position[seed_column]].strip()
    whole = seed_text.split(".")[0]
    seed = int(whole) if SEED.fullmatch(seed_text) and len(whole) <= 10 else -1
    if not 0 <= seed <= MAX_SEED:
        problems.add(
            [*loc, seed_column],
            f"{where}, column {seed_column!r}: the seed {seed_text!r} is not a whole number "
            f"from 0 to {MAX_SEED}",
        )
    factors = {}
    for column, name in columns.factors.items():
        text = cells[position[column]]
        if len(text) > MAX_LEVEL_LENGTH:
            problems.add(
                [*loc, column],
                f"{where}, column {column!r}: a level of {len(text)} characters, over "
                f"{MAX_LEVEL_LENGTH}",
            )
        elif underflows(text):
            problems.add([*loc, column], f"{where}, column {column!r}: {_underflow(text)}")
        else:
            factors[name] = parse_level(text)
    metrics = {}
    for column, name in columns.metrics.items():
        text = cells[position[column]].strip()
        if not text:
            continue  # not recorded for this run
        value = float(text) if NUMBER.fullmatch(text) else math.nan
        if underflows(text):
            problems.add([*loc, column], f"{where}, column {column!r}: {_underflow(text)}")
        elif not math.isfinite(value):
            problems.add(
                [*loc, column], f"{where}, column {column!r}: {text!r} is not a finite number"
            )
        metrics[name] = value
    if len(problems.errors) + problems.unlisted > before:
        return None
    return ImportedRow(loc, where, factors, seed, metrics)


def underflows(text: str) -> bool:
    """A number written with a non-zero digit that a double rounds to 0 (1e-400): read as 0 it
    would be another value than the one written."""
    text = text.strip()
    if not NUMBER.fullmatch(text) or float(text) != 0:
        return False
    mantissa = re.split("[eE]", text)[0]
    return any(c in "123456789" for c in mantissa)


def _underflow(text: str) -> str:
    return (
        f"{text.strip()!r} is too small for a double (below 5e-324, it would read as 0): "
        "write 0 or a value a double holds"
    )


def typed_levels(table: ImportTable) -> ImportTable:
    """Each factor's numbers typed once: where a factor has a non-integer level, its integer
    levels become floats, so `1` and `1.0` are one level (they were two conditions)."""
    for factor in table.factors:
        values = [row.factors.get(factor) for row in table.rows]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if any(isinstance(v, float) for v in numbers):
            for row in table.rows:
                value = row.factors.get(factor)
                if isinstance(value, int) and not isinstance(value, bool):
                    row.factors[factor] = float(value)
    return table


def parse_level(text: str) -> Any:
    """A CSV cell as a factor level: empty is null, true/false a boolean, an integer or a
    finite decimal number a number, anything else the text itself."""
    text = text.strip()
    if not text:
        return None
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    if INTEGER.fullmatch(text):
        return int(text)
    if NUMBER.fullmatch(text) and math.isfinite(value := float(text)):
        return value
    return text
