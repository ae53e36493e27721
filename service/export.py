"""An experiment's runs or metric curves as one CSV or Parquet file (GET
/experiments/{id}/export), for pandas, R or a spreadsheet without one request per run.

Memory stays bounded however large the experiment: the runs are read a page at a time, the
curves a batch of points at a time, each page in its own short session. CSV is streamed as it
is read; Parquet is written batch by batch (one row group each) into a temporary file that is
then sent and removed.

Columns (README, "The API"):
- runs: id, condition_key, one column per grid factor, seed, status, error, then one column per
  final metric any run reported. A factor or metric whose name is taken by an earlier column
  gets the prefix `condition_` or `metric_`.
- curves, a long table: run_id, seed, condition, step, epoch, name, value.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api_schemas import ExportFormat, ExportWhat
from service.db import Experiment, Run, RunMetric
from service.sources import experiment_grid

# Runs per page and metric points per batch read from the database.
RUNS_PAGE = 1000
POINTS_BATCH = 50_000
RUN_COLUMNS = ("id", "condition_key")
RUN_TAIL_COLUMNS = ("seed", "status", "error")
CURVE_COLUMNS = ("run_id", "seed", "condition", "step", "epoch", "name", "value")


def _unique(name: str, taken: set[str], prefix: str) -> str:
    """`name`, or `prefix + name` when an earlier column has that name already."""
    column = name if name not in taken else f"{prefix}{name}"
    taken.add(column)
    return column


def _run_pages(engine: Engine, experiment_id: int, *columns: Any) -> Iterator[list[Any]]:
    """The experiment's runs in id order, a page at a time (keyset on the id), each page read
    in its own session so that no transaction stays open while a slow client reads."""
    last_id = 0
    while True:
        with Session(engine) as session:
            page = session.execute(
                select(Run.id, *columns)
                .where(Run.experiment_id == experiment_id, Run.id > last_id)  # type: ignore[operator]
                .order_by(Run.id).limit(RUNS_PAGE)  # type: ignore[arg-type]
            ).all()
        if not page:
            return
        yield page
        last_id = page[-1].id


class RunsTable:
    """The runs export's columns and rows: the columns need one pass over the runs first, to
    learn every metric name any run reported."""

    def __init__(self, engine: Engine, experiment: Experiment) -> None:
        assert experiment.id is not None
        self.engine = engine
        self.experiment_id = experiment.id
        taken = {*RUN_COLUMNS, *RUN_TAIL_COLUMNS}
        self.factors = {f: _unique(f, taken, "condition_")
                        for f in experiment_grid(experiment.spec)}
        metric_names: dict[str, None] = {}
        for page in _run_pages(engine, self.experiment_id, Run.metrics):
            for row in page:
                metric_names.update(dict.fromkeys(row.metrics))
        self.metrics = {m: _unique(m, taken, "metric_") for m in metric_names}
        self.columns = [*RUN_COLUMNS, *self.factors.values(), *RUN_TAIL_COLUMNS,
                        *self.metrics.values()]

    def pages(self) -> Iterator[list[list[Any]]]:
        for page in _run_pages(self.engine, self.experiment_id, Run.condition_key, Run.condition,
                               Run.seed, Run.status, Run.error, Run.metrics):
            yield [[row.id, row.condition_key, *(row.condition.get(f) for f in self.factors),
                    row.seed, str(row.status), row.error,
                    *(row.metrics.get(m) for m in self.metrics)] for row in page]


class CurvesTable:
    """Every metric point of every run of the experiment, run by run in step order."""

    columns = list(CURVE_COLUMNS)

    def __init__(self, engine: Engine, experiment: Experiment) -> None:
        assert experiment.id is not None
        self.engine = engine
        self.experiment_id = experiment.id

    def pages(self) -> Iterator[list[list[Any]]]:
        for runs in _run_pages(self.engine, self.experiment_id, Run.seed, Run.condition_key):
            for run in runs:
                yield from self._points(run.id, run.seed, run.condition_key)

    def _points(self, run_id: int, seed: int, condition: str) -> Iterator[list[list[Any]]]:
        # keyset on (step, id): the index ix_metric_run_step reads each batch without a sort
        after: tuple[int, int] = (-1, 0)
        while True:
            with Session(self.engine) as session:
                batch = session.execute(
                    select(RunMetric.id, RunMetric.step, RunMetric.epoch, RunMetric.name,
                           RunMetric.value)
                    .where(RunMetric.run_id == run_id,
                           tuple_(RunMetric.step, RunMetric.id) > tuple_(*after))
                    .order_by(RunMetric.step, RunMetric.id)  # type: ignore[arg-type]
                    .limit(POINTS_BATCH)
                ).all()
            if not batch:
                return
            yield [[run_id, seed, condition, p.step, p.epoch, p.name, p.value] for p in batch]
            after = (batch[-1].step, batch[-1].id)


def export_table(engine: Engine, experiment: Experiment, what: ExportWhat
                 ) -> RunsTable | CurvesTable:
    return RunsTable(engine, experiment) if what == ExportWhat.runs else CurvesTable(
        engine, experiment)


def _csv_cell(value: Any) -> Any:
    # lists and mappings (a metric may be one) as JSON, so that a reader can parse them back
    return json.dumps(value) if isinstance(value, list | dict) else value


def csv_chunks(table: RunsTable | CurvesTable) -> Iterator[str]:
    """The table as CSV text, one chunk per page, the header first."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.columns)
    for page in table.pages():
        writer.writerows([_csv_cell(v) for v in row] for row in page)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()


def _arrow_column(values: list[Any]) -> Any:
    """One Parquet column: its values as they are when Arrow finds one type for them (numbers,
    text, booleans), else each as JSON text (a grid factor mixing 1 and "a", say)."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


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
        for page in table.pages():
            columns = list(zip(*page, strict=True))
            batch = pa.table({name: _arrow_column(list(values))
                              for name, values in zip(table.columns, columns, strict=True)})
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
    return path


def _nullable(schema: Any) -> Any:
    """The first page's schema, with a column that page saw only nulls of typed as text."""
    import pyarrow as pa

    return pa.schema([(f.name, pa.string() if pa.types.is_null(f.type) else f.type)
                      for f in schema])


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
            columns.append(pa.array([None if v is None else json.dumps(v)
                                     for v in column.to_pylist()], pa.string()))
    return pa.table(columns, schema=schema)


class ExportTypeError(Exception):
    """A column whose values change type between pages of the Parquet export."""

    def __init__(self, column: str, first: str, later: str) -> None:
        super().__init__(f"column {column!r} holds {first} values in its first rows and "
                         f"{later} values later: export it as CSV (format=csv)")


MEDIA_TYPES: dict[ExportFormat, str] = {
    ExportFormat.csv: "text/csv; charset=utf-8",
    ExportFormat.parquet: "application/vnd.apache.parquet",
}


def filename(experiment_id: int, what: ExportWhat, fmt: ExportFormat) -> str:
    return f"experiment-{experiment_id}-{what.value}.{fmt.value}"

