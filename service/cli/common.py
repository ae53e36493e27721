"""What every `seedgrid` command shares: the options of the client commands, the one-line
error that stops a command (exit 2), the output mode of --json and --csv, and spec files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

import service.cli.render as render
from api_schemas import environment
from service.spec_file import SpecFileError, load_spec_file

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar=environment.URL,
        show_default=False,
        help="seedgrid API address [default: SEEDGRID_URL, else http://SEEDGRID_HOST:SEEDGRID_PORT "
        "as `seedgrid serve` listens, else http://127.0.0.1:8000]",
    ),
]
TrainersOpt = Annotated[
    str | None,
    typer.Option(
        "--trainers",
        help="your own trainer code: .py files, package folders or module names, "
        "comma-separated (added to SEEDGRID_TRAINER_MODULES); files and folders are shipped "
        "to every Ray worker",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the API's JSON answer")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="print the table as CSV")]
DatabaseUrlOpt = Annotated[
    str | None,
    typer.Option("--database-url", help="SQLAlchemy URL [default: SEEDGRID_DATABASE_URL]"),
]


def fail(message: str) -> typer.Exit:
    """The exit (code 2) of a command stopped by `message`, printed on stderr."""
    # soft_wrap: one line however long, so that log scrapers and tests see the whole message
    render.err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code=2)


def output_mode(as_json: bool, as_csv: bool) -> str:
    if as_json and as_csv:
        raise fail("--json and --csv: give one of them")
    return "json" if as_json else "csv" if as_csv else "table"


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file, JSON or YAML, as the JSON the API receives (service.spec_file: no alias
    bombs, recursive aliases, non-JSON tags or values); errors name the file."""
    try:
        return load_spec_file(path)
    except SpecFileError as exc:
        raise fail(str(exc)) from None
