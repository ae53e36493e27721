"""The `seedgrid` command line: serve, dispatcher, `run` (all in one process), the client
commands (submit, import, list, tag, note, params, status, runs, run-log, watch, stats,
protocol, compare, cancel, delete, export, trainers, add-seeds), `explain` (what a statistics
field means), and `db upgrade` / `db current` (schema migrations).

Every table-printing command takes --json (the API's answer as it is) and --csv (the table's
rows); the tables fold long condition keys at their commas, never cutting a key or a number,
so they stay whole at 80 columns. The client commands reach the service through
service.client.Client, which asks again after the Retry-After of a 503 or 429, a bounded
number of times.

The parts: server (the commands that run the service), commands, inspect and organise (the
client commands), runlog (one run's error, traceback and attempts), follow (watch and the
report after it), remote (the client and its errors as one-line exits), render (what is
printed), common (options and errors every command shares). The commands are registered here,
in the order `seedgrid --help` lists them."""

from __future__ import annotations

import inspect as inspect_module
import sys
from collections.abc import Callable

import typer

from service.cli import commands, inspect, organise, runlog, server
from service.cli.remote import default_url
from service.cli.render import (
    COMPACT_WIDTH,
    abbreviations,
    console,
    err,
    print_all_stats,
    print_stats,
    print_stats_csv,
    print_table,
)
from service.cli.server import warn_of_the_old_default
from service.client import MAX_RETRIES

__all__ = [
    "COMPACT_WIDTH",
    "MAX_RETRIES",
    "abbreviations",
    "app",
    "console",
    "db_app",
    "default_url",
    "err",
    "main",
    "print_all_stats",
    "print_stats",
    "print_stats_csv",
    "print_table",
    "warn_of_the_old_default",
]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="seedgrid: does an implementation choice change the seed-to-seed variance?",
)
db_app = typer.Typer(no_args_is_help=True, help="The database schema: apply and show migrations.")
app.add_typer(db_app, name="db")


def _register(group: typer.Typer, command: Callable[..., None], name: str | None = None) -> None:
    """Add `command` with each paragraph of its docstring on one line: the help then wraps at
    the terminal's width, never at the docstring's line breaks (mid-sentence)."""
    paragraphs = inspect_module.cleandoc(command.__doc__ or "").split("\n\n")
    group.command(name, help="\n\n".join(" ".join(p.split()) for p in paragraphs))(command)


for name, command in (
    ("serve", server.serve),
    ("dispatcher", server.dispatcher),
    ("submit", commands.submit),
    ("import", commands.import_results),
    ("status", commands.status),
    ("add-seeds", commands.add_seeds),
    ("compare", inspect.compare),
    ("stats", inspect.stats),
    ("figure", inspect.figure),
    ("explain", inspect.explain),
    ("list", commands.list_experiments),
    ("tag", organise.tag),
    ("note", organise.note),
    ("params", organise.params),
    ("runs", commands.runs),
    ("run-log", runlog.run_log),
    ("watch", commands.watch_command),
    ("cancel", commands.cancel),
    ("delete", commands.delete),
    ("protocol", inspect.protocol),
    ("export", commands.export),
    ("trainers", inspect.trainers),
    ("plan", inspect.plan),
    ("run", server.run),
):
    _register(app, command, name)
_register(db_app, server.db_upgrade, "upgrade")
_register(db_app, server.db_current, "current")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
