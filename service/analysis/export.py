"""An experiment's runs or metric curves as one CSV or Parquet file (GET
/experiments/{id}/export), for pandas, R or a spreadsheet without one request per run.

The whole file is read from one snapshot: one read-only transaction (SQLite in WAL mode, where a
reader never blocks a writer; PostgreSQL at REPEATABLE READ), so that a delete, or runs that end,
while a slow client reads never cut the file short or mix two states of the experiment. Memory
stays bounded however large the experiment: the runs are read a page at a time, the curves a
batch of points at a time. CSV is streamed as it is read; Parquet is written batch by batch (one
row group each) into a temporary file that is then sent and removed.

Columns (README, "The API"):
- runs: id, condition_key, one column per grid factor, seed, status, error, then one column per
  final metric any run reported. A factor or metric whose name is taken by an earlier column
  gets the prefix `condition_` or `metric_`.
- curves, a long table: run_id, seed, condition, step, epoch, name, value.

Every stored value exports: in Parquet, a column holding an integer beyond 64 bits (a JSON
number a spec or a trainer gave) is written as its JSON text. In CSV a text cell that a
spreadsheet would run as a formula (one beginning with = + - @, a tab or a carriage return) gets
a leading single quote, as OWASP's CSV-injection guidance asks; numbers are written as they are.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from api_schemas import ExportFormat, ExportWhat
from service.errors import NotFound
from service.specs import stats_grid
from service.storage.db import Experiment, Run, RunMetric

# Runs per page and metric points per batch read from the database.
RUNS_PAGE = 1000
POINTS_BATCH = 50_000
RUN_COLUMNS = ("id", "condition_key")
RUN_TAIL_COLUMNS = ("seed", "status", "error")
CURVE_COLUMNS = ("run_id", "seed", "condition", "step", "epoch", "name", "value")
# Arrow's integers are 64-bit; a JSON integer outside them is written as text.
INT64 = range(-(2**63), 2**63)


def _unique(name: str, taken: set[str], prefix: str) -> str:
    """`name`, or `prefix + name` when an earlier column has that name already."""
    column = name if name not in taken else f"{prefix}{name}"
    taken.add(column)
    return column


def _wide_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value not in INT64


class Snapshot:
    """One read-only transaction that every read of an export goes through, on a connection
    of the engine's pool held until `close`."""

    def __init__(self, engine: Engine) -> None:
        self.connection = engine.connect()
        if self.connection.dialect.name == "sqlite":
            # pysqlite runs each SELECT in a transaction of its own: BEGIN makes them one
            # (WAL: the snapshot is taken by the first read and never blocks a writer)
            self.connection.exec_driver_sql("BEGIN")
        else:
            self.connection.exec_driver_sql(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
            )
        self.session = Session(bind=self.connection)

    def experiment(self, experiment_id: int) -> Experiment:
        """The experiment as this snapshot sees it; NotFound when it was deleted before."""
        experiment = self.session.get(Experiment, experiment_id)
        if experiment is None or experiment.deleted:
            self.close()
            raise NotFound(f"experiment {experiment_id} not found")
        return experiment

    def close(self) -> None:
        self.session.close()
        self.connection.close()  # rolls the read transaction back


def _run_pages(snapshot: Snapshot, experiment_id: int, *columns: Any) -> Iterator[Sequence[Any]]:
    """The experiment's runs in id order, a page at a time (keyset on the id)."""
    last_id = 0
    while True:
        page = snapshot.session.execute(
            select(col(Run.id), *columns)
            .where(col(Run.experiment_id) == experiment_id, col(Run.id) > last_id)
            .order_by(col(Run.id))
            .limit(RUNS_PAGE)
        ).all()
        if not page:
            return
        yield page
        last_id = page[-1].id


class RunsTable:
    """The runs export's columns and rows: the columns need one pass over the runs first, to
    learn every metric name any run reported (and which columns hold integers too wide for
    Parquet's)."""

    def __init__(self, snapshot: Snapshot, experiment: Experiment) -> None:
        assert experiment.id is not None
        self.snapshot = snapshot
        self.experiment_id = experiment.id
        taken = {*RUN_COLUMNS, *RUN_TAIL_COLUMNS}
        grid = stats_grid(experiment.stored_spec)
        self.factors = {f: _unique(f, taken, "condition_") for f in grid}
        metric_names: dict[str, None] = {}
        wide_metrics: set[str] = set()
        for page in _run_pages(snapshot, self.experiment_id, Run.metrics):
            for row in page:
                metric_names.update(dict.fromkeys(row.metrics))
                wide_metrics.update(m for m, v in row.metrics.items() if _wide_int(v))
        self.metrics = {m: _unique(m, taken, "metric_") for m in metric_names}
        self.columns = [
            *RUN_COLUMNS,
            *self.factors.values(),
            *RUN_TAIL_COLUMNS,
            *self.metrics.values(),
        ]
        self.text_columns = frozenset(
            {self.factors[f] for f, levels in grid.items() if any(map(_wide_int, levels))}
            | {self.metrics[m] for m in wide_metrics}
        )

    def pages(self) -> Iterator[list[list[Any]]]:
        for page in _run_pages(
            self.snapshot,
            self.experiment_id,
            Run.condition_key,
            Run.condition,
            Run.seed,
            Run.status,
            Run.error,
            Run.metrics,
        ):
            yield [
                [
                    row.id,
                    row.condition_key,
                    *(row.condition.get(f) for f in self.factors),
                    row.seed,
                    str(row.status),
                    row.error,
                    *(row.metrics.get(m) for m in self.metrics),
                ]
                for row in page
            ]


class CurvesTable:
    """Every metric point of every run of the experiment, run by run in step order."""

    columns = list(CURVE_COLUMNS)
    # ids, seeds and steps are database integers and values floats: none is too wide
    text_columns: frozenset[str] = frozenset()

    def __init__(self, snapshot: Snapshot, experiment: Experiment) -> None:
        assert experiment.id is not None
        self.snapshot = snapshot
        self.experiment_id = experiment.id

    def pages(self) -> Iterator[list[list[Any]]]:
        for runs in _run_pages(self.snapshot, self.experiment_id, Run.seed, Run.condition_key):
            for run in runs:
                yield from self._points(run.id, run.seed, run.condition_key)

    def _points(self, run_id: int, seed: int, condition: str) -> Iterator[list[list[Any]]]:
        # keyset on (step, id): the index ix_metric_run_step reads each batch without a sort
        after: tuple[int, int] = (-1, 0)
        while True:
            batch = self.snapshot.session.execute(
                select(
                    col(RunMetric.id),
                    col(RunMetric.step),
                    col(RunMetric.epoch),
                    col(RunMetric.name),
                    col(RunMetric.value),
                )
                .where(
                    col(RunMetric.run_id) == run_id,
                    tuple_(col(RunMetric.step), col(RunMetric.id)) > tuple_(*after),
                )
                .order_by(col(RunMetric.step), col(RunMetric.id))
                .limit(POINTS_BATCH)
            ).all()
            if not batch:
                return
            yield [[run_id, seed, condition, p.step, p.epoch, p.name, p.value] for p in batch]
            after = (batch[-1].step, batch[-1].id)


def export_table(engine: Engine, experiment_id: int, what: ExportWhat) -> RunsTable | CurvesTable:
    """The table of the experiment as one snapshot sees it (NotFound when it is gone); the
    file's writer closes the snapshot when it has read the last page."""
    snapshot = Snapshot(engine)
    try:
        experiment = snapshot.experiment(experiment_id)
        return (
            RunsTable(snapshot, experiment)
            if what == ExportWhat.runs
            else CurvesTable(snapshot, experiment)
        )
    except BaseException:
        snapshot.close()
        raise


# What a spreadsheet reads as the start of a formula (OWASP, CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> Any:
    # lists and mappings (a metric may be one) as JSON, so that a reader can parse them back
    if isinstance(value, list | dict):
        return json.dumps(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_chunks(table: RunsTable | CurvesTable) -> Iterator[str]:
    """The table as CSV text, one chunk per page, the header first."""
    try:
        buffer = io.StringIO()
        # CRLF, as RFC 4180 has it: Python's csv quotes a field only for the characters of
        # its line terminator, and with "\n" alone a text holding a CR broke its row in two
        writer = csv.writer(buffer, lineterminator="\r\n")
        writer.writerow([_csv_cell(c) for c in table.columns])
        for page in table.pages():
            writer.writerows([_csv_cell(v) for v in row] for row in page)
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
        yield buffer.getvalue()
    finally:
        table.snapshot.close()


def _as_text(values: list[Any]) -> Any:
    import pyarrow as pa

    return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


def _arrow_column(values: list[Any], as_text: bool = False, kind: Any = None) -> Any:
    """One Parquet column: its values as they are when Arrow finds one type for them (numbers,
    text, booleans), else (or `as_text`) each as JSON text (a grid factor mixing 1 and "a",
    an integer beyond 64 bits). `kind`: the Arrow type the whole column takes, where its pages
    alone would infer different ones (column_kinds)."""
    import pyarrow as pa

    if as_text:
        return _as_text(values)
    try:
        return pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return _as_text(values)


INT64_RANGE = range(-(2**63), 2**63)


def column_kinds(table: RunsTable) -> list[Any]:
    """Each column's type from all of its values, read once before the file is written (a
    factor that held integers in its first page of runs and decimals later was refused as
    changing type): float64 for integers and decimals mixed, None (each page's own inference,
    which then agrees) for one kind, "text" for kinds Arrow cannot hold in one column (numbers
    and text, booleans and numbers, an integer beyond 64 bits)."""
    import pyarrow as pa

    seen: list[set[str]] = [set() for _ in table.columns]
    for page in table.pages():
        for row in page:
            for kinds, value in zip(seen, row, strict=True):
                if value is None:
                    continue
                if isinstance(value, bool):
                    kinds.add("bool")
                elif isinstance(value, int):
                    kinds.add("int" if value in INT64_RANGE else "big")
                elif isinstance(value, float):
                    kinds.add("float")
                elif isinstance(value, str):
                    kinds.add("str")
                else:
                    kinds.add("json")
    planned: list[Any] = []
    for kinds in seen:
        if kinds == {"int", "float"}:
            planned.append(pa.float64())
        elif len(kinds) > 1 or kinds & {"big", "json"}:
            planned.append("text")
        else:
            planned.append(None)
    return planned


def parquet_file(table: RunsTable | CurvesTable) -> str:
    """The table written to a temporary Parquet file, a row group per page; its path (the
    caller removes it). Every row group shares the first page's schema; a later page whose
    values infer another type is cast to it, or written as text when the file is all text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    handle, path = tempfile.mkstemp(suffix=".parquet", prefix="seedgrid-export-")
    os.close(handle)
    writer: Any = None
    try:
        # runs: a factor's type from all its runs (a second, cheap read of the runs); curves
        # have one type per column
        kinds = column_kinds(table) if isinstance(table, RunsTable) else [None] * len(table.columns)
        for page in table.pages():
            columns = list(zip(*page, strict=True))
            batch = pa.table(
                {
                    name: _arrow_column(
                        list(values),
                        as_text=name in table.text_columns or kind == "text",
                        kind=None if kind == "text" else kind,
                    )
                    for name, values, kind in zip(table.columns, columns, kinds, strict=True)
                }
            )
            if writer is None:
                schema = _nullable(batch.schema)
                writer = pq.ParquetWriter(path, schema)
            writer.write_table(_conform(batch, writer.schema))
        if writer is None:  # no rows: the header alone, every column text
            schema = pa.schema([(name, pa.string()) for name in table.columns])
            writer = pq.ParquetWriter(path, schema)
            writer.write_table(schema.empty_table())
        writer.close()
    except BaseException:
        if writer is not None:
            writer.close()
        os.unlink(path)
        raise
    finally:
        table.snapshot.close()
    return path


def _nullable(schema: Any) -> Any:
    """The first page's schema, with a column that page saw only nulls of typed as text."""
    import pyarrow as pa

    return pa.schema(
        [(f.name, pa.string() if pa.types.is_null(f.type) else f.type) for f in schema]
    )


def _conform(batch: Any, schema: Any) -> Any:
    """A later page in the file's schema: cast where Arrow can (an int column read as float),
    else the column's values as JSON text when the file's column is text."""
    import pyarrow as pa

    columns = []
    for field in schema:
        column = batch.column(field.name)
        if column.type == field.type:
            columns.append(column)
            continue
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            if not pa.types.is_string(field.type):
                raise ExportTypeError(field.name, str(field.type), str(column.type)) from exc
            columns.append(
                pa.array(
                    [None if v is None else json.dumps(v) for v in column.to_pylist()], pa.string()
                )
            )
    return pa.table(columns, schema=schema)


class ExportTypeError(Exception):
    """A column whose values change type between pages of the Parquet export."""

    def __init__(self, column: str, first: str, later: str) -> None:
        super().__init__(
            f"column {column!r} holds {first} values in its first rows and "
            f"{later} values later: export it as CSV (format=csv)"
        )


MEDIA_TYPES: dict[ExportFormat, str] = {
    ExportFormat.csv: "text/csv; charset=utf-8",
    ExportFormat.parquet: "application/vnd.apache.parquet",
}


def filename(experiment_id: int, what: ExportWhat, fmt: ExportFormat) -> str:
    return f"experiment-{experiment_id}-{what.value}.{fmt.value}"
