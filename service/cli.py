"""The `seedgrid` command line: serve, dispatcher, `run` (all in one process), the client
commands (submit, list, status, runs, watch, stats, protocol, compare, cancel, delete, export,
trainers, add-seeds), and `db upgrade` / `db current` (schema migrations).

Every table-printing command takes --json (the API's answer as it is) and --csv (the table's
rows); the tables fold long condition keys at their commas, never cutting a key or a number,
so they stay whole at 80 columns. The client commands ask again after the Retry-After of a 503
or 429, a bounded number of times.

Without SEEDGRID_DATABASE_URL the database is one per user, in the platform's data directory
(service.settings.default_database_path): the commands that write make it, `db current` only
reads. The commands that start Ray (serve, run, dispatcher) shut it down however they end."""

from __future__ import annotations

import csv
import difflib
import email.utils
import ipaddress
import itertools
import json
import logging
import math
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import pydantic
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from api_schemas import first_line
from api_schemas.pages import COMPARE_PAGE
from service.client import http_url
from service.spec_file import SpecFileError, load_spec_file

if TYPE_CHECKING:  # the client commands need no settings: SQLAlchemy's import is 0.2 s
    from service.settings import Settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="seedgrid: does an implementation choice change the seed-to-seed variance?",
)
db_app = typer.Typer(no_args_is_help=True, help="The database schema: apply and show migrations.")
app.add_typer(db_app, name="db")
# A pipe gets 160 columns unless COLUMNS says otherwise (rich reads COLUMNS itself).
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)
err = Console(stderr=True)

ENDED = {"completed", "partial", "failed", "cancelled"}
# Run statuses of a run not ended yet: waiting in the queue, handed to Ray, started by a worker.
ACTIVE = ("queued", "pending", "running")
# Run statuses that mean something went wrong: `submit --wait`, `run` and `watch` exit 1.
TROUBLE = ("failed", "diverged")
# Wildcard listening addresses a client reaches on the same machine's loopback.
UrlOpt = Annotated[str | None, typer.Option(
    "--url", envvar="SEEDGRID_URL", show_default=False,
    help="seedgrid API address [default: SEEDGRID_URL, else http://SEEDGRID_HOST:SEEDGRID_PORT "
         "as `seedgrid serve` listens, else http://127.0.0.1:8000]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the API's JSON answer")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="print the table as CSV")]
DatabaseUrlOpt = Annotated[
    str | None,
    typer.Option("--database-url", help="SQLAlchemy URL [default: SEEDGRID_DATABASE_URL]"),
]


def _fail(message: str) -> typer.Exit:
    # soft_wrap: one line however long, so that log scrapers and tests see the whole message
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code=2)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def log_to_stderr(level: str) -> None:
    """seedgrid's own log lines (the dispatcher's active/standby/take-over) on stderr."""
    logger = logging.getLogger("seedgrid")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())


def load_settings(**options: Any) -> Settings:
    """Settings from the environment, overridden by the command's `options` (None: not given).
    On the default database, a warning when the old default, ./seedgrid.db, is here."""
    from service.settings import Settings

    given = {name: value for name, value in options.items() if value is not None}
    try:
        settings = Settings(**given)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        field = ("--" + name.replace("_", "-")) if name in given else "SEEDGRID_" + name.upper()
        raise _fail(f"{field if name else 'settings'}: {first['msg']}") from None
    warn_of_the_old_default(settings)
    return settings


def on_default_database(settings: Settings) -> bool:
    """Whether the database is the default one (SEEDGRID_DATABASE_URL and --database-url unset)."""
    return "database_url" not in settings.model_fields_set


def sqlite_file(database_url: str) -> Path | None:
    """The file a SQLite URL names; None for another database, or one in memory."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if (url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:")
            or url.query.get("uri")):
        return None
    return Path(url.database)


def warn_of_the_old_default(settings: Settings) -> None:
    """Before the default database moved to the user's data directory, it was ./seedgrid.db
    wherever a command ran: say, once, how to keep using one found here."""
    from service.settings import default_database_path

    old = Path("seedgrid.db").absolute()
    default = default_database_path()
    if not on_default_database(settings) or not old.is_file() or old == default.absolute():
        return
    move = "" if default.exists() else f", or move it to {default}"
    err.print(f"warning: {old} is seedgrid's old default database; the default is now {default}."
              f" To keep using this one, set SEEDGRID_DATABASE_URL=sqlite:///{old}{move}",
              markup=False, soft_wrap=True, style="yellow")


def database_name(settings: Settings) -> str:
    """The database as the commands print it: the default's file, saying it is the default;
    another by its URL (password masked)."""
    from service.settings import default_database_path
    from service.storage.db import masked_url

    if on_default_database(settings):
        return (f"{default_database_path()} (the default; SEEDGRID_DATABASE_URL selects "
                "another)")
    return masked_url(settings.database_url)


def refuse_open_exposure(settings: Settings, insecure: bool, host_option: bool = False) -> None:
    """A service other machines can reach needs the token: without it, anyone who can connect
    submits work to the cluster. Loopback addresses stay open for local use."""
    if settings.api_token.get_secret_value() or insecure or is_loopback(settings.host):
        return
    host = f"--host {settings.host}" if host_option else f"SEEDGRID_HOST={settings.host}"
    raise _fail(f"{host} is reachable from other machines and "
                "SEEDGRID_API_TOKEN is not set: set a token (e.g. `openssl rand -hex 32`), "
                "listen on 127.0.0.1, or pass --insecure to serve it open anyway")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def upgrade_schema(settings: Settings) -> None:
    """Migrate the database to the newest schema (making the default one, and its directory,
    when there is none yet), or stop with one line naming it."""
    from service.settings import default_database_path
    from service.storage.db import INITIAL_REVISION, DatabaseError, upgrade_database

    if on_default_database(settings):
        try:
            default_database_path().parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _fail(f"cannot make the directory of the default database "
                        f"{default_database_path()}: {exc.strerror}") from None
    try:
        done = upgrade_database(settings.database_url)
    except DatabaseError as exc:
        raise _fail(str(exc)) from None
    if done.stamped:
        change = f"tables made before migrations stamped at revision {INITIAL_REVISION}"
        change += f", upgraded to {done.after}" if done.after != INITIAL_REVISION else ""
    elif done.before == done.after:
        change = f"schema at revision {done.after}, up to date"
    else:
        change = f"schema upgraded from {done.before or 'an empty database'} to {done.after}"
    console.print(f"database {database_name(settings)}: {change}", markup=False, soft_wrap=True)


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file, JSON or YAML, as the JSON the API receives (service.spec_file: no alias
    bombs, recursive aliases, non-JSON tags or values); errors name the file."""
    try:
        return load_spec_file(path)
    except SpecFileError as exc:
        raise _fail(str(exc)) from None


def default_url() -> tuple[str, str]:
    """The address `seedgrid serve` listens on by this environment's settings, and where it
    came from: http://SEEDGRID_HOST:SEEDGRID_PORT, a wildcard host reached on loopback."""
    host = os.environ.get("SEEDGRID_HOST", "127.0.0.1").strip()
    port_text = os.environ.get("SEEDGRID_PORT", "8000").strip()
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _fail(f"SEEDGRID_PORT: expected a port number from 1 to 65535, got {port_text!r}")
    given = [name for name in ("SEEDGRID_HOST", "SEEDGRID_PORT") if name in os.environ]
    source = " and ".join(given) if given else "the default address"
    return http_url(host, int(port_text)), source


class ApiClient(httpx.Client):
    """An API client that says where its address came from when the API cannot be reached."""

    url_source = "--url or SEEDGRID_URL"


def _client(url: str | None, timeout_s: float) -> ApiClient:
    """An API client for `url` (else default_url()) that sends the bearer token of
    SEEDGRID_API_TOKEN when it is set."""
    token = os.environ.get("SEEDGRID_API_TOKEN", "").strip()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    source = ApiClient.url_source
    if url is None:
        url, source = default_url()
    client = ApiClient(base_url=url, timeout=timeout_s, headers=headers)
    client.url_source = source
    return client


# A 503 (the service cannot reach its database now) or a 429 (its queue, or its heavy reads,
# are full) says when to come back (Retry-After): a command asks again that many seconds later,
# up to MAX_RETRIES times and MAX_RETRY_WAIT_S in all, then stops with the answer.
RETRIED_STATUSES = frozenset({429, 503})
MAX_RETRIES = 3
MAX_RETRY_WAIT_S = 60.0
# The wait when such an answer gives no Retry-After it can read.
DEFAULT_RETRY_AFTER_S = 1.0


def retry_after_s(response: httpx.Response) -> float:
    """The wait an answer asks for: its Retry-After, in seconds or as an HTTP date."""
    value = response.headers.get("Retry-After", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER_S
    if when.tzinfo is None:  # "-0000": UTC, the zone of every HTTP date
        when = when.replace(tzinfo=UTC)
    return float(max(0, math.ceil((when - datetime.now(UTC)).total_seconds())))


def _detail(response: httpx.Response) -> Any:
    """An error answer's `detail`, or its text when it is not the API's JSON (a proxy's page)."""
    try:
        body = response.json()
    except ValueError:
        lines = response.text.strip().splitlines()
        return lines[0] if lines else response.reason_phrase
    return body.get("detail") if isinstance(body, dict) else body


def _retry_wait(response: httpx.Response, method: str, path: str, retry: int,
                waited_s: float) -> float | None:
    """How long to wait before asking again (None: the answer is not one to retry); stops the
    command with the answer once the retries or their time are used up."""
    if response.status_code not in RETRIED_STATUSES:
        return None
    wait = retry_after_s(response)
    answer = f"{method} {path}: {response.status_code} {_detail(response)}"
    if retry >= MAX_RETRIES or waited_s + wait > MAX_RETRY_WAIT_S:
        tried = f" (after {retry} retries over {waited_s:.0f} s)" if retry else ""
        raise _fail(f"{answer}{tried}; it asks to retry in {wait:g} s")
    err.print(f"{answer}; retrying in {wait:g} s ({retry + 1} of {MAX_RETRIES})", markup=False,
              soft_wrap=True)
    return wait


def _unreachable(client: httpx.Client, exc: httpx.HTTPError) -> typer.Exit:
    source = getattr(client, "url_source", "--url")
    return _fail(f"cannot reach the seedgrid API at {client.base_url} (from {source}; set "
                 f"--url or SEEDGRID_URL to reach another): {exc}")


def _request(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    """The API's JSON answer; an error answer stops the command with one message, after the
    retries a 503 or 429 asks for."""
    waited_s = 0.0
    for retry in itertools.count():
        try:
            response = client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise _unreachable(client, exc) from None
        wait = _retry_wait(response, method, path, retry, waited_s)
        if wait is None:
            break
        time.sleep(wait)
        waited_s += wait
    if response.status_code == 422:
        detail = _detail(response)
        lines = ([f"  {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in detail]
                 if isinstance(detail, list) else [f"  {detail}"])
        what = ("the spec was rejected" if (method, path) == ("POST", "/experiments")
                else f"{method} {path} was refused")
        raise _fail(f"{what}:\n" + "\n".join(lines))
    if response.status_code >= 400:
        raise _fail(f"{method} {path}: {response.status_code} {_detail(response)}")
    return response.json() if response.content else None


def _pages(client: httpx.Client, path: str, params: dict[str, Any] | None = None,
           page_size: int = 1000) -> Iterator[dict[str, Any]]:
    """Every item of a paged list endpoint, a page at a time."""
    offset = 0
    while True:
        page = _request(client, "GET", path,
                        params={**(params or {}), "limit": page_size, "offset": offset})
        yield from page
        if len(page) < page_size:
            return
        offset += len(page)


def _ended(detail: dict[str, Any]) -> bool:
    c = detail["counts"]
    return detail["status"] in ENDED and not any(c[s] for s in ACTIVE)


# Per-condition progress is shown up to this many conditions (and runs, read each poll).
MAX_WATCHED_CONDITIONS = 24
MAX_WATCHED_RUNS = 2000


def watch(client: httpx.Client, experiment_id: int, poll_s: float = 0.5,
          in_process: str | None = None) -> dict[str, Any]:
    """Progress bars, one over the experiment and one per condition (small grids), until every
    run has ended; the experiment's detail at the end. Ctrl-C stops watching, not the
    experiment, and says how to re-attach; with `in_process` (the database of a service that
    runs in this process, `seedgrid run`), that the runs left wait in its queue instead."""
    try:
        return _follow(client, experiment_id, poll_s)
    except KeyboardInterrupt:
        if in_process is not None:
            err.print(f"stopped: experiment {experiment_id}'s runs left stay queued in "
                      f"{in_process} and run when a `seedgrid serve` on it starts (then "
                      f"`seedgrid watch {experiment_id}` follows them)", markup=False,
                      soft_wrap=True)
        else:
            err.print(f"stopped watching: experiment {experiment_id} continues on the service; "
                      f"`seedgrid watch {experiment_id}` re-attaches, `seedgrid cancel "
                      f"{experiment_id}` stops it", markup=False, soft_wrap=True)
        raise typer.Exit(130) from None


def _follow(client: httpx.Client, experiment_id: int, poll_s: float) -> dict[str, Any]:
    detail = _request(client, "GET", f"/experiments/{experiment_id}")
    per_condition = (detail["n_conditions"] <= MAX_WATCHED_CONDITIONS
                     and detail["n_runs"] <= MAX_WATCHED_RUNS)
    with Progress(
        TextColumn("[bold]{task.description}", table_column=Column(overflow="fold")),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}", table_column=Column(overflow="fold")),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        overall = progress.add_task(escape(detail["name"]), total=detail["n_runs"], counts="")
        conditions: dict[str, Any] = {}
        while True:
            c = detail["counts"]
            done = sum(v for k, v in c.items() if k not in ACTIVE)
            # an adaptive experiment's total grows with each round
            progress.update(overall, total=detail["n_runs"], completed=done,
                            counts=escape(_counts(c)))
            if per_condition:
                by_condition: dict[str, Counter[str]] = {}
                for run in _pages(client, f"/experiments/{experiment_id}/runs"):
                    by_condition.setdefault(run["condition_key"], Counter())[run["status"]] += 1
                for key, statuses in by_condition.items():
                    if key not in conditions:
                        conditions[key] = progress.add_task(f"  {escape(_spaced(key))}", counts="")
                    ended = sum(n for s, n in statuses.items() if s not in ACTIVE)
                    progress.update(conditions[key], total=sum(statuses.values()),
                                    completed=ended, counts=escape(_counts(statuses)))
            if _ended(detail):
                return detail
            time.sleep(poll_s)
            detail = _request(client, "GET", f"/experiments/{experiment_id}")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v)


def _spaced(condition_key: str) -> str:
    """A condition key with a space after each comma, where a narrow table may fold it: each
    `factor=level` stays whole."""
    return condition_key.replace(",", ", ")


def trouble_summary(client: httpx.Client, experiment_id: int) -> int:
    """Each distinct error of the failed and diverged runs once, with how many runs it hit;
    the number of such runs."""
    errors: Counter[tuple[str, str]] = Counter()
    for status in TROUBLE:
        for run in _pages(client, f"/experiments/{experiment_id}/runs", {"status": status}):
            errors[(status, first_line(run["error"]))] += 1
    for (status, error), n in errors.most_common():
        runs = f"{n} run{'s' if n != 1 else ''} {status}"
        console.print(f"{runs}: {error}", style="yellow", markup=False, soft_wrap=True)
    return sum(errors.values())


def _mode(as_json: bool, as_csv: bool) -> str:
    if as_json and as_csv:
        raise _fail("--json and --csv: give one of them")
    return "json" if as_json else "csv" if as_csv else "table"


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def print_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([json.dumps(v) if isinstance(v, list | dict) else v for v in row]
                     for row in rows)


# Longest unbroken word a text column is kept wide enough for; longer ones fold.
MAX_WORD_WIDTH = 40
# Columns apart in a table (its padding either side and the separator).
TABLE_GAP = 3


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]],
                text_columns: set[str], factors: Sequence[str] = (),
                width: int | None = None, *, keep_whole: Collection[str] = ()) -> None:
    """A table that stays readable in a narrow terminal: text columns wrap at spaces (a
    condition key at its commas), the others never wrap and are as wide as their widest cell,
    so that no number is cut. When the words of the text columns are too wide for that with
    the numbers' headers and the cells of `keep_whole` (text columns that wrap only when the
    others cannot make room) whole, the grid factors' names are abbreviated in them
    (stop_gradient -> sg), with a legend."""
    width = width or console.width
    legend: dict[str, str] = {}
    if _min_width(columns, rows, text_columns, keep_whole) > width and factors:
        legend = abbreviations(factors)
        rows = [[_abbreviate(cell, legend) if col in text_columns else cell
                 for col, cell in zip(columns, row, strict=True)] for row in rows]
    widths = _column_widths(columns, rows, text_columns, width, keep_whole)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name, column_width in zip(columns, widths, strict=True):
        table.add_column(name, overflow="fold", width=column_width,
                         justify="left" if name in text_columns else "right")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table, width=width)
    if legend:
        console.print("factors: " + ", ".join(f"{short} = {full}"
                                              for full, short in legend.items()),
                      markup=False, soft_wrap=True)


def stats_factors(stats: dict[str, Any]) -> list[str]:
    """The grid factors a stats page names (its conditions' and comparisons')."""
    names = [f for c in stats["conditions"] for f in c["condition"]]
    names += [f for c in stats["comparisons"] for f in [c["factor"], *(c["within"] or {})]]
    return list(dict.fromkeys(names))


def key_factors(keys: Iterator[str] | Sequence[str]) -> list[str]:
    """The factor names in condition keys (`factor=level,factor=level`)."""
    return list(dict.fromkeys(part.split("=", 1)[0] for key in keys for part in key.split(",")
                              if "=" in part))


def _word_width(header: str, rows: Sequence[Sequence[str]], i: int) -> int:
    words = [w for row in rows for w in row[i].split()] + header.split()
    return min(max((len(w) for w in words), default=1), MAX_WORD_WIDTH)


def _min_widths(columns: Sequence[str], rows: Sequence[Sequence[str]],
                text_columns: set[str]) -> list[int]:
    """Each column's narrowest width with every word of a text column and every number of
    the others whole (a header may wrap at its spaces)."""
    return [_word_width(name, rows, i) if name in text_columns
            else max([len(row[i]) for row in rows] + [len(max(name.split(), key=len))])
            for i, name in enumerate(columns)]


def _min_width(columns: Sequence[str], rows: Sequence[Sequence[str]],
               text_columns: set[str], keep_whole: Collection[str] = ()) -> int:
    """The narrowest the table can be with every word, every number and its header, and every
    cell of `keep_whole` whole."""
    narrowest = _min_widths(columns, rows, text_columns - set(keep_whole))
    widths = [narrowest[i] if name in text_columns
              else max([len(row[i]) for row in rows] + [len(name)])
              for i, name in enumerate(columns)]
    return sum(widths) + TABLE_GAP * (len(columns) - 1)


def _column_widths(columns: Sequence[str], rows: Sequence[Sequence[str]],
                   text_columns: set[str], width: int,
                   keep_whole: Collection[str] = ()) -> list[int | None]:
    """Fixed widths that fit `width`: each column's natural width when all fit, else its
    narrowest whole-word width (the cells of `keep_whole` whole, when that fits) with the room
    left given to the number columns first. None each (rich decides, folding inside words)
    when even the narrowest do not fit."""
    natural = [max([len(row[i]) for row in rows] + [len(name)]) for i, name in enumerate(columns)]
    room = width - TABLE_GAP * (len(columns) - 1)
    if sum(natural) <= room:
        return list(natural)
    widths = _min_widths(columns, rows, text_columns - set(keep_whole))
    if sum(widths) > room:
        widths = _min_widths(columns, rows, text_columns)
    spare = room - sum(widths)
    if spare < 0:
        return [None] * len(columns)
    # numbers' headers whole first (a header that wraps, "var / ratio", reads badly), then the
    # text columns get the room left
    order = sorted(range(len(columns)), key=lambda i: columns[i] in text_columns)
    for i in order:
        grow = min(spare, natural[i] - widths[i])
        widths[i] += grow
        spare -= grow
    return list(widths)


def abbreviations(factors: Sequence[str]) -> dict[str, str]:
    """Short names for factor names of several `_`-separated words: their initials
    (stop_gradient -> sg), made longer until no two factors share one."""
    short: dict[str, str] = {}
    for factor in factors:
        parts = [p for p in factor.split("_") if p]
        if len(parts) < 2:  # one word (lr, steps) stays as it is
            continue
        for extra in range(max(len(p) for p in parts)):
            candidate = "".join(p[: 1 + extra] for p in parts)
            if candidate not in short.values():
                break
        if len(candidate) < len(factor):
            short[factor] = candidate
    return short


def _abbreviate(cell: str, legend: dict[str, str]) -> str:
    for full, short in legend.items():
        cell = re.sub(rf"(?<![\w.]){re.escape(full)}(?=[=:])", short, cell)
    return cell


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v, digits) for v in value) + "]"
    return str(value)


# The compact view's width: its tables fit a 100-column terminal.
COMPACT_WIDTH = 100


def _within(comparison: dict[str, Any]) -> str:
    within = comparison["within"]
    return ", ".join(f"{k}={v}" for k, v in within.items()) if within else "pooled"


def _flag(item: dict[str, Any]) -> str:
    return f"!{len(item['warnings'])}" if item.get("warnings") else ""


CONDITION_COLUMNS = ("condition", "n", "mean", "ci95", "std", "noise share", "!")
COMPARISON_COLUMNS = ("pair", "within", "n", "pairing", "var ratio", "primary ci95", "Holm p",
                      "!")
# The significance marks of a Holm-adjusted p-value, as the dashboard shows them.
SIGNIFICANCE_MARKS = ((0.01, "**"), (0.05, "*"))
# Ratio intervals whose high end is null when it is unbounded (infinity).
RATIO_INTERVALS = {"primary_ci95", "var_ratio_ci95_f"}
# p-values as computed, before any adjustment for multiple comparisons.
RAW_P_VALUES = {"primary_p", "f_test_p", "brown_forsythe_p", "welch_p", "mean_p"}


def _mark(p: float | None) -> str:
    return next((mark for level, mark in SIGNIFICANCE_MARKS if p is not None and p < level), "")


def _ratio_interval(interval: list[float | None] | None, digits: int = 2) -> str:
    """A variance ratio's interval, its null high end shown as inf (no ratio above is
    rejected)."""
    if interval is None:
        return "-"
    low, high = interval
    return f"[{_fmt(low, digits)}, {'inf' if high is None else _fmt(high, digits)}]"


def condition_rows(stats: dict[str, Any]) -> list[list[str]]:
    return [[_spaced(c["condition_key"]) or "(all)", str(c["n"]), _fmt(c["mean"]),
             _fmt(c["ci95"]), _fmt(c["std"], 3), _fmt(c.get("noise_floor_share"), 2), _flag(c)]
            for c in stats["conditions"]]


def comparison_rows(stats: dict[str, Any], marks: bool = True) -> list[list[str]]:
    """One row per comparison: its primary test's interval and Holm p (per factor), with `*`
    below 0.05 and `**` below 0.01 when `marks`."""
    rows = []
    for c in stats["comparisons"]:
        holm = c.get("primary_p_holm_factor")
        mark = _mark(holm) if marks else ""
        shown = _fmt(holm, 3) + (f" {mark}" if mark else "")
        rows.append([f"{c['factor']}: {c['a']} vs {c['b']}", _spaced(_within(c)),
                     f"{c['n_a']}/{c['n_b']}", c.get("pairing") or "-", _fmt(c["var_ratio"], 3),
                     _ratio_interval(c.get("primary_ci95")), shown, _flag(c)])
    return rows


def print_interim(stats: dict[str, Any], width: int | None = None) -> None:
    """An adaptive experiment still adding seeds: say that its p-values are interim looks."""
    if stats.get("interim"):
        note = stats.get("interim_note") or (
            "interim: this adaptive experiment is still adding seeds; every p-value and interval "
            "here is an interim look, not adjusted for the looks its rule takes")
        console.print(note, style="yellow", markup=False, width=width)


def print_stats(stats: dict[str, Any], full: bool = False) -> None:
    """The compact view (a few columns per condition and per comparison, `!n`: n warnings),
    or with `full` every field of every condition, comparison, family and omnibus test."""
    if full:
        print_all_stats(stats)
        return
    width = min(console.width, COMPACT_WIDTH)
    print_interim(stats, width)
    bounds = stats.get("metric_bounds")
    title = f"per-condition {stats['metric']}" + (f" (bounded {_fmt(bounds)})" if bounds else "")
    factors = stats_factors(stats)
    print_table(title, CONDITION_COLUMNS, condition_rows(stats), {"condition"}, factors, width)
    scale = " (log scale)" if stats.get("scale") == "log" else ""
    title = (f"variance comparisons of {stats['metric']}{scale}: var_a / var_b within cells, "
             "primary test; Holm p adjusted per factor")
    # The interval wraps at its space only when abbreviations leave too little room.
    print_table(title, COMPARISON_COLUMNS, comparison_rows(stats),
                {"pair", "within", "primary ci95"}, factors, width, keep_whole={"primary ci95"})
    if stats["comparisons"]:
        console.print("primary test: randomisation test of squared deviations from the cell "
                      "medians (paired: signs flipped within each seed; unpaired: permuted "
                      "within cells); ci95: the ratios it does not reject; Holm p: its p "
                      "Holm-adjusted over the factor's comparisons (* < 0.05, ** < 0.01). "
                      "F-test, Brown-Forsythe, the mean test and raw p-values: --all",
                      markup=False, width=width)
    if stats.get("source_decomposition"):
        print_source_decomposition(stats)
    warned = sum(1 for c in stats["comparisons"] + stats["conditions"] if c.get("warnings"))
    if warned:
        console.print(f"!n: n warnings on {warned} rows (numbers from fewer seeds than they "
                      "need);\n`seedgrid stats ID --all` lists them with every field",
                      markup=False)
    _print_page(stats)


def print_stats_csv(stats: dict[str, Any]) -> None:
    """Both compact tables as one CSV: a `table` column says which each row is from, and each
    row leaves the other table's columns empty."""
    columns = ["table", *CONDITION_COLUMNS[:-1], *COMPARISON_COLUMNS[:-1], "warnings"]
    blank_c, blank_p = [""] * (len(CONDITION_COLUMNS) - 1), [""] * (len(COMPARISON_COLUMNS) - 1)
    rows = [["condition", *r[:-1], *blank_p, len(c.get("warnings", []))]
            for r, c in zip(condition_rows(stats), stats["conditions"], strict=True)]
    rows += [["comparison", *blank_c, *r[:-1], len(c.get("warnings", []))]
             for r, c in zip(comparison_rows(stats, marks=False), stats["comparisons"],
                             strict=True)]
    print_csv(columns, rows)


def print_all_stats(stats: dict[str, Any]) -> None:
    """Every field, one per line, grouped per condition, comparison, family and omnibus test;
    each p-value says whether it is raw or Holm-adjusted."""
    def block(title: str, item: dict[str, Any]) -> None:
        console.print(title, markup=False, style="bold")
        for key, value in item.items():
            if key == "warnings":
                for warning in value:
                    console.print(f"  warning: {warning}", markup=False, soft_wrap=True)
            else:
                console.print(f"  {key}: {_field(key, value)}", markup=False, soft_wrap=True)

    print_interim(stats)
    console.print(f"metric {stats['metric']}, scale {stats.get('scale', 'raw')}, bounds "
                  f"{_fmt(stats.get('metric_bounds'))}, {stats['n_completed']} completed runs",
                  markup=False)
    for c in stats["conditions"]:
        block(f"condition {c['condition_key'] or '(all)'}",
              {k: v for k, v in c.items() if k not in {"condition", "condition_key"}})
    for c in stats["comparisons"]:
        block(f"comparison {c['factor']}: {c['a']} vs {c['b']} ({_within(c)})",
              {k: v for k, v in c.items() if k not in {"factor", "a", "b", "within"}})
    for family in stats.get("multiplicity", []):
        name = f"factor {family['factor']}" if family["factor"] is not None else "all"
        block(f"Holm family: {name}", {k: v for k, v in family.items() if k != "factor"})
    for omnibus in stats.get("omnibus", []):
        block(f"omnibus {omnibus['factor']}",
              {k: v for k, v in omnibus.items() if k != "factor"})
    _print_page(stats)


def _field(key: str, value: Any) -> str:
    """One field of --all: unbounded ratio intervals end at inf, and a p-value is labelled
    raw or with the family Holm adjusted it over."""
    if key in RATIO_INTERVALS:
        return _ratio_interval(value, 6)
    shown = _fmt(value, 6)
    if value is None:
        return shown
    if key in RAW_P_VALUES:
        return f"{shown} (raw)"
    if key.endswith("_holm_factor"):
        return f"{shown} (Holm, over the factor's comparisons)"
    if key.endswith("_holm_all"):
        return f"{shown} (Holm, over every comparison)"
    return shown


def _print_page(stats: dict[str, Any]) -> None:
    if stats.get("next_offset") is not None:
        console.print(f"showing comparisons {stats['offset'] + 1}-{stats['next_offset']} of "
                      f"{stats['total_comparisons']}")


def print_source_decomposition(stats: dict[str, Any]) -> None:
    """One row per condition of the other factors: each level's variance and its interval."""
    decompositions = stats["source_decomposition"]
    table = Table(title=f"variance of {stats['metric']} by random source (var [95% interval])")
    table.add_column("within")
    for source in decompositions[0]["sources"]:
        table.add_column(source["source"], justify="right")
    table.add_column("sum / all", justify="right")
    for d in decompositions:
        table.add_row(
            ", ".join(f"{k}={v}" for k, v in d["within"].items()) or "(all)",
            *(f"{_fmt(s['var'], 3)} {_fmt(s['var_ci95'], 2)}" for s in d["sources"]),
            _fmt(d["sum_over_all"], 3),
        )
    console.print(table)


def report(client: httpx.Client, experiment_id: int, metric: str | None = None,
           full: bool = False, mode: str = "table", scale: str | None = None) -> int:
    """The experiment's statistics (a table, or the stats as JSON or CSV) of `metric` on
    `scale` (None: the spec's), then each distinct reason its runs stopped, failed or
    diverged, once with its count; the number of failed and diverged runs."""
    detail = _request(client, "GET", f"/experiments/{experiment_id}")
    params = {k: v for k, v in (("metric", metric), ("scale", scale)) if v}
    trouble = sum(detail["counts"][s] for s in TROUBLE)
    if mode != "table":
        stats = _request(client, "GET", f"/experiments/{experiment_id}/stats", params=params)
        print_json(stats) if mode == "json" else print_stats_csv(stats)
        return trouble
    console.print(f"experiment {experiment_id} {detail['name']}: {detail['status']} "
                  f"({_counts(detail['counts'])})", markup=False, soft_wrap=True)
    print_message(detail)
    if detail["status"] == "failed":
        console.print("no run completed: there is nothing to compare", markup=False)
    else:
        print_stats(_request(client, "GET", f"/experiments/{experiment_id}/stats",
                             params=params), full)
    if detail["counts"]["stopped"]:
        console.print("stopped runs ended early on a check (stop_on_checks): the statistics "
                      "leave them out", markup=False)
        reasons = Counter(
            r["stop"]["reason"] if r["stop"] else "(no reason stored)"
            for r in _pages(client, f"/experiments/{experiment_id}/runs", {"status": "stopped"}))
        for reason, n in reasons.most_common():
            console.print(f"{n} run{'s' if n != 1 else ''} stopped: {reason}", style="yellow",
                          markup=False, soft_wrap=True)
    return trouble_summary(client, experiment_id) if trouble else 0


def print_message(detail: dict[str, Any]) -> None:
    """Why the experiment stopped before all its runs had run (its first runs all failed)."""
    if detail.get("message"):
        console.print(detail["message"], style="red", markup=False, soft_wrap=True)


def exit_on_trouble(trouble: int) -> None:
    """Exit 1 when runs failed or diverged, so that scripts and CI notice."""
    if trouble:
        raise typer.Exit(1)


def end_ray() -> None:
    """Shut down this process's Ray: the local instance it started, with every process of it
    (the raylet's dashboard and runtime-env agents too), or its connection to a cluster."""
    ray = sys.modules.get("ray")  # never imported: nothing to end, and no import to pay for
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def connect_ray(settings: Settings) -> None:
    """Join SEEDGRID_RAY_ADDRESS's cluster, or start a local Ray, or stop with one line.

    From the main thread, before a dispatcher starts: Ray started from another thread (a
    dispatcher's, when a standby takes over; the server's in `seedgrid run`) installs its own
    SIGTERM handler, which aborts the process 3 s after the signal, before Ray is shut down;
    from the main thread, ensure_ray keeps the command's handler."""
    from service.scheduling.ray_helpers import ensure_ray

    try:
        ensure_ray(settings)
    except Exception as exc:
        where = (f"connect to Ray at SEEDGRID_RAY_ADDRESS={settings.ray_address}"
                 if settings.ray_address else "start a local Ray")
        raise _fail(f"cannot {where}: {_first_line(exc)}") from None


@contextmanager
def ray_ended_on_exit() -> Iterator[None]:
    """Ray ends with the command however the command ends: on return, an error, Ctrl-C or
    SIGTERM. SIGTERM's default action would end the process before Ray's shutdown, leaving the
    agents the raylet started behind; here it raises SystemExit instead (uvicorn, serving,
    shuts down first and then raises the signal again), Ray is shut down, and the process then
    ends by SIGTERM as it would have."""
    terminated: list[int] = []

    def on_sigterm(signum: int, _frame: object) -> None:
        terminated.append(signum)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one does not cut Ray's short
        try:
            end_ray()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if terminated:
            sys.stdout.flush()
            sys.stderr.flush()
            signal.raise_signal(signal.SIGTERM)


@app.command()
def serve(
    dispatch: Annotated[
        bool,
        typer.Option(help="run the dispatcher in this process (embedded mode); --no-dispatch: "
                          "the API only, with `seedgrid dispatcher` running elsewhere"),
    ] = True,
    workers: Annotated[
        int, typer.Option(min=1, help="API worker processes (more than 1 needs --no-dispatch)")
    ] = 1,
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="listen on a non-loopback SEEDGRID_HOST without "
                                        "SEEDGRID_API_TOKEN (anyone who reaches it can submit)"),
    ] = False,
    host: Annotated[str | None, typer.Option(
        help="address to listen on [default: SEEDGRID_HOST, else 127.0.0.1]",
        show_default=False)] = None,
    port: Annotated[int | None, typer.Option(
        help="port to listen on [default: SEEDGRID_PORT, else 8000]; the client commands "
             "find it when SEEDGRID_PORT says the same", show_default=False)] = None,
) -> None:
    """Serve the REST API (and, by default, the dispatcher) with uvicorn."""
    import uvicorn

    if workers > 1 and dispatch:
        raise _fail("--workers: more than one worker process needs --no-dispatch (run the "
                    "dispatcher as its own process: `seedgrid dispatcher`)")
    settings = load_settings(host=host, port=port)
    refuse_open_exposure(settings, insecure, host_option=host is not None)
    log_to_stderr(settings.log_level)
    with ray_ended_on_exit():
        upgrade_schema(settings)
        if dispatch:
            from service.api.app import create_app

            # Ray from the main thread (see connect_ray), also for a standby: it is then ready to
            # take over at once.
            connect_ray(settings)
            uvicorn.run(create_app(settings, dispatch=True), host=settings.host,
                        port=settings.port, log_level=settings.log_level)
        else:
            # Each worker process builds its app from the same SEEDGRID_* environment.
            uvicorn.run("service.api.app:create_api_app", factory=True, workers=workers,
                        host=settings.host, port=settings.port, log_level=settings.log_level)


@app.command()
def dispatcher() -> None:
    """Run the dispatcher alone: the database queue -> Ray, results -> the database.

    Exactly one dispatcher acts per database: this one waits as a standby while another holds
    the dispatch lock (a `seedgrid dispatcher` or an embedded `seedgrid serve`), and takes over
    when it is gone. SIGTERM or SIGINT stops it cleanly: runs in flight go back to the queue.
    """
    import threading

    from service.scheduling.dispatcher import Dispatcher
    from service.storage.db import make_engine

    settings = load_settings()
    log_to_stderr(settings.log_level)
    upgrade_schema(settings)
    # Connect now: a wrong address fails here, and a standby is ready to take over at once.
    connect_ray(settings)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    engine = make_engine(settings.database_url)
    worker = Dispatcher(settings, engine)
    try:
        worker.start()
        while worker.alive and not stopping.wait(0.5):
            pass
    except Exception as exc:
        raise _fail(f"the dispatcher could not start: {_first_line(exc)}") from None
    finally:
        worker.stop()
        engine.dispose()
        end_ray()
    if worker.error is not None and not stopping.is_set():
        raise _fail(f"the dispatcher stopped: {_first_line(worker.error)}")


@app.command()
def submit(
    spec_file: Path,
    url: UrlOpt = None,
    wait: Annotated[bool, typer.Option(help="follow progress, then print the stats")] = False,
) -> None:
    """Submit an experiment spec (JSON or YAML) to a running service."""
    spec = load_spec(spec_file)
    with _client(url, 60) as client:
        created = _request(client, "POST", "/experiments", json=spec)
        console.print(
            f"experiment {created['id']} {created['name']}: {created['n_conditions']} "
            f"conditions, {created['n_runs']} runs"
        )
        if wait:
            watch(client, created["id"])
            exit_on_trouble(report(client, created["id"]))


@app.command()
def status(experiment_id: int, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """An experiment's status and run counts."""
    with _client(url, 60) as client:
        d = _request(client, "GET", f"/experiments/{experiment_id}")
    if as_json:
        print_json(d)
        return
    counts = ", ".join(f"{k} {v}" for k, v in d["counts"].items() if v)
    console.print(
        f"experiment {d['id']} {d['name']} ({d['trainer']}): {d['status']}; "
        f"{d['n_runs']} runs: {counts}", markup=False
    )
    print_message(d)
    adaptive = d.get("adaptive")
    if adaptive:
        console.print(f"adaptive: {adaptive['rule']}", markup=False)
        for look in adaptive["looks"]:
            interval = ("none" if look["interval"] is None
                        else f"[{_fmt(look['interval'][0])}, {_fmt(look['interval'][1])}]")
            console.print(f"  look {look['look']}: {look['seeds_per_condition']} seeds, "
                          f"estimate {_fmt(look['estimate'])}, {look['confidence']:.2%} "
                          f"interval {interval}" + (f" ({look['note']})" if look["note"] else ""),
                          markup=False)
        console.print(f"  {adaptive['stop_reason'] or 'next look when the round ends'}",
                      markup=False)


@app.command("add-seeds")
def add_seeds(
    experiment_id: int,
    seeds: Annotated[int, typer.Argument(help="how many seeds to add to every condition")],
    url: UrlOpt = None,
    wait: Annotated[bool, typer.Option(help="follow progress, then print the stats")] = False,
) -> None:
    """Add seeds to every condition of an experiment; their runs join its statistics."""
    with _client(url, 60) as client:
        added = _request(client, "POST", f"/experiments/{experiment_id}/seeds",
                         json={"seeds": seeds})
        console.print(f"experiment {experiment_id}: seeds {added['seeds'][0]} to "
                      f"{added['seeds'][-1]} added, {added['runs_added']} runs queued "
                      f"({added['n_runs']} in all)", markup=False)
        if wait:
            watch(client, experiment_id)
            exit_on_trouble(report(client, experiment_id))


@app.command()
def compare(
    a: Annotated[int, typer.Argument(help="the first experiment's id")],
    b: Annotated[int, typer.Argument(help="the second experiment's id")],
    url: UrlOpt = None,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """Two experiments of one trainer side by side, condition by condition: the means with
    their test, the variance ratio with the primary test (raw p-values: not adjusted for the
    conditions compared)."""
    params: dict[str, Any] = {"a": a, "b": b, "limit": COMPARE_PAGE}
    if metric:
        params["metric"] = metric
    columns = ("condition", "n a/b", "mean a", "mean b", "mean test", "mean p", "var a/b",
               "primary ci95", "primary p")
    rows: list[list[str]] = []
    pages: list[dict[str, Any]] = []
    offset: int | None = 0
    with _client(url, 120) as client:
        while offset is not None:
            body = _request(client, "GET", "/compare", params={**params, "offset": offset})
            pages.append(body)
            for side in body["conditions"]:
                t = side["comparison"]
                rows.append([_spaced(side["condition_key"]), f"{t['n_a']}/{t['n_b']}",
                             _fmt(side["a"]["mean"]), _fmt(side["b"]["mean"]),
                             t.get("mean_test") or "-",
                             _fmt(t.get("mean_p"), 3), _fmt(t["var_ratio"], 3),
                             _ratio_interval(t.get("primary_ci95")),
                             _fmt(t.get("primary_p"), 3)])
            offset = body["next_offset"]
    mode = _mode(as_json, as_csv)
    if mode == "json":
        print_json(pages[0] if len(pages) == 1 else pages)
        return
    if mode == "csv":
        print_csv(columns, rows)
        return
    console.print(f"{body['trainer']}, metric {body['metric']}: {body['total_conditions']} "
                  "shared conditions", markup=False)
    print_table(f"experiment {a} vs {b}: raw p-values, not adjusted for the conditions compared",
                columns, rows,
                {"condition", "mean test", "primary ci95"},
                key_factors(side["condition_key"] for page in pages for side in page["conditions"]),
                keep_whole={"mean test", "primary ci95"})
    if rows:
        console.print("primary p and ci95: the randomisation test of var a/b and the ratios it "
                      "does not reject (where the seeds pair up, signs flipped within each seed "
                      "and the mean test a paired t; else runs permuted and Welch's t)",
                      markup=False)
    for side, keys in (("a", body["only_in_a"]), ("b", body["only_in_b"])):
        if keys:
            console.print(f"only in {side}: {', '.join(keys)}", markup=False)


@app.command()
def stats(
    experiment_id: int,
    url: UrlOpt = None,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
    show_all: Annotated[bool, typer.Option(
        "--all", help="every field of every condition and comparison, warnings included, "
                      "instead of the compact tables")] = False,
    scale: Annotated[str | None, typer.Option(
        help="raw: variances of the metric; log: of its logarithm (relative spreads, for a "
             "positive metric) [default: the spec's analysis.scale]", show_default=False)] = None,
    as_json: JsonOpt = False,
    as_csv: Annotated[bool, typer.Option(
        "--csv", help="both compact tables as one CSV (its `table` column says which)")] = False,
) -> None:
    """Per-condition table and variance comparisons of an experiment: the primary test of
    each comparison, its p Holm-adjusted per factor (compact; --all for every field)."""
    mode = _mode(as_json, as_csv)
    if scale not in (None, "raw", "log"):
        raise _fail(f"--scale: expected raw or log, got {scale!r}")
    with _client(url, 120) as client:
        report(client, experiment_id, metric, show_all, mode, scale)


@app.command("list")
def list_experiments(
    url: UrlOpt = None,
    name: Annotated[str | None, typer.Option(
        help="only experiments whose name contains this (case-insensitive)")] = None,
    status: Annotated[str | None, typer.Option(
        help="only experiments in this status (queued, running, completed, partial, failed, "
             "cancelled)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="how many, newest first")] = 50,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """The experiments, newest first: status, progress, trainer, created and finished."""
    mode = _mode(as_json, as_csv)
    params: dict[str, Any] = {"limit": limit}
    params |= {k: v for k, v in (("name", name), ("status", status)) if v is not None}
    with _client(url, 60) as client:
        experiments = _request(client, "GET", "/experiments", params=params)
    if mode == "json":
        print_json(experiments)
        return
    columns = ("id", "name", "trainer", "status", "done", "created", "finished")
    rows = [[str(e["id"]), e["name"], e["trainer"], e["status"],
             f"{sum(v for k, v in e['counts'].items() if k not in ACTIVE)}"
             f"/{e['n_runs']}", _when(e["created_at"]), _when(e["finished_at"])]
            for e in experiments]
    if mode == "csv":
        print_csv(columns, rows)
    elif rows:
        print_table(None, columns, rows, {"name", "trainer", "created", "finished"})
    else:
        console.print("no experiments" + (" match" if name or status else ""), markup=False)


def _when(timestamp: str | None) -> str:
    """An API timestamp to the minute (UTC), `-` when there is none."""
    return timestamp[:16].replace("T", " ") if timestamp else "-"


@app.command()
def runs(
    experiment_id: int,
    url: UrlOpt = None,
    status: Annotated[str | None, typer.Option(
        help="only runs in this status (queued, pending, running, completed, failed, "
             "diverged, cancelled, stopped)")] = None,
    metric: Annotated[str | None, typer.Option(
        help="the final metric shown [default: the experiment's]")] = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """An experiment's runs: condition, seed, status, final metric, and why a run did not
    complete; then every run warning."""
    mode = _mode(as_json, as_csv)
    params = {"status": status} if status else {}
    with _client(url, 120) as client:
        detail = _request(client, "GET", f"/experiments/{experiment_id}")
        shown = metric or detail["spec"].get("metric") or _primary_metric(client, detail)
        listed = list(_pages(client, f"/experiments/{experiment_id}/runs", params))
    if mode == "json":
        print_json(listed)
        return
    columns = ("id", "condition", "seed", "status", shown, "tries", "why / warnings")
    rows = [[str(r["id"]), _spaced(r["condition_key"]), str(r["seed"]), r["status"],
             _fmt(r["metrics"].get(shown)), str(r["attempts"]), _why(r)] for r in listed]
    if mode == "csv":
        print_csv([*columns[:-1], "error", "warnings"],
                  [[*row[:-1], r["error"] or "", "; ".join(w.get("message", str(w))
                                                             for w in r["warnings"])]
                   for row, r in zip(rows, listed, strict=True)])
        return
    print_table(f"experiment {experiment_id} runs", columns, rows, {"condition", "why / warnings"},
                key_factors(r["condition_key"] for r in listed))
    for r in listed:
        for warning in r["warnings"]:
            console.print(f"run {r['id']} ({r['condition_key']}, seed {r['seed']}) warning: "
                          f"{warning.get('message', warning)}", style="yellow", markup=False,
                          soft_wrap=True)


def _primary_metric(client: httpx.Client, detail: dict[str, Any]) -> str:
    trainers = {t["name"]: t for t in _request(client, "GET", "/trainers")}
    trainer = trainers.get(detail["trainer"])
    return trainer["primary_metric"] if trainer else "-"


def _why(run: dict[str, Any]) -> str:
    """What a row's last column says: the error's first line, the stop's reason, or how many
    warnings the run has (listed under the table)."""
    if run["status"] == "stopped" and run.get("stop"):
        return str(run["stop"]["reason"])
    if run["error"]:
        return first_line(run["error"])
    n = len(run["warnings"])
    return f"{n} warning{'s' if n != 1 else ''}" if n else ""


@app.command("watch")
def watch_command(
    experiment_id: int,
    url: UrlOpt = None,
    poll: Annotated[float, typer.Option(min=0.1, help="seconds between looks")] = 1.0,
) -> None:
    """Follow an experiment's progress, per condition, until every run has ended; exit 1 when
    runs failed or diverged. Ctrl-C stops watching, not the experiment."""
    with _client(url, 60) as client:
        detail = watch(client, experiment_id, poll)
        console.print(f"experiment {experiment_id} {detail['status']}: "
                      f"{_counts(detail['counts'])}", markup=False, soft_wrap=True)
        print_message(detail)
        trouble = trouble_summary(client, experiment_id)
    exit_on_trouble(trouble)


@app.command()
def cancel(experiment_id: int, url: UrlOpt = None) -> None:
    """Cancel an experiment: its queued runs at once, its pending and running ones as soon as
    Ray drops or stops them."""
    with _client(url, 60) as client:
        d = _request(client, "POST", f"/experiments/{experiment_id}/cancel")
    stopping = d["counts"]["pending"] + d["counts"]["running"]
    console.print(f"experiment {experiment_id} {d['name']}: cancelled; {d['counts']['cancelled']} "
                  f"runs cancelled" + (f", {stopping} pending or running runs stopping"
                                       if stopping else ""),
                  markup=False, soft_wrap=True)


@app.command()
def delete(
    experiment_id: int,
    url: UrlOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="delete without asking")] = False,
) -> None:
    """Delete an ended experiment with its runs, metric points and statistics (refused while a
    run is queued, pending or running: `seedgrid cancel` it first). Asks first, naming the
    experiment and its runs; --yes does not ask (needed where no one can answer)."""
    with _client(url, 60) as client:
        if not yes:
            d = _request(client, "GET", f"/experiments/{experiment_id}")
            what = (f"experiment {experiment_id} {d['name']!r} ({d['trainer']}, {d['status']}) "
                    f"with its {d['n_runs']} run{'s' if d['n_runs'] != 1 else ''}")
            if not sys.stdin.isatty():
                raise _fail(f"not deleting {what}: no one can confirm (stdin is not a "
                            "terminal); pass --yes to delete it")
            if not typer.confirm(f"Delete {what}, their metric points and statistics?"):
                err.print("nothing deleted", markup=False)
                raise typer.Exit(1)
        _request(client, "DELETE", f"/experiments/{experiment_id}")
    console.print(f"experiment {experiment_id} deleted", markup=False)


@app.command()
def protocol(
    experiment_id: int,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """The protocol verdicts of an experiment whose trainer declares them (feedback): per
    condition, then per run."""
    mode = _mode(as_json, as_csv)
    with _client(url, 120) as client:
        body = _request(client, "GET", f"/experiments/{experiment_id}/reports/protocol")
    if mode == "json":
        print_json(body)
        return
    run_columns = ("run", "condition", "seed", "status", "verdict", "depth utility pp")
    run_rows = [[str(r["run_id"]), _spaced(r["condition_key"]), str(r["seed"]), r["status"],
                 r["verdict"], _fmt(r.get("depth_utility_pp"), 3)] for r in body["runs"]]
    if mode == "csv":
        print_csv(run_columns, run_rows)
        return
    console.print(f"experiment {experiment_id}: {body['n_completed']} completed and "
                  f"{body.get('n_stopped', 0)} stopped runs audited of {body['n_runs']}"
                  + (f"; depth utility: {body['d3_reason']}" if body.get("d3_reason") else ""),
                  markup=False, soft_wrap=True)
    columns = ("condition", "n", "verdicts", "fired", "depth utility pp")
    rows = [[_spaced(c["condition_key"]) or "(all)", str(c["n"]), _spaced(_pairs(c["verdicts"])),
             _spaced(_pairs(c["fired"])),
             f"{_fmt(c['depth_utility_pp_mean'], 3)} ± {_fmt(c['depth_utility_pp_std'], 3)}"]
            for c in body["conditions"]]
    factors = key_factors(r["condition_key"] for r in body["runs"])
    print_table("per condition", columns, rows, {"condition", "verdicts", "fired"}, factors)
    print_table("per run", run_columns, run_rows, {"condition", "verdict"}, factors)


def _pairs(counts: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in counts.items()) or "-"


@app.command()
def export(
    experiment_id: int,
    url: UrlOpt = None,
    file_format: Annotated[str, typer.Option(
        "--format", help="csv or parquet")] = "csv",
    curves: Annotated[bool, typer.Option(
        "--curves", help="the metric curves (a row per logged point) instead of a row per "
                         "run")] = False,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="file to write [default: experiment-ID-runs.FORMAT, or "
                               "-curves]", show_default=False)] = None,
) -> None:
    """Write an experiment's runs (condition, seed, status, final metrics) or its metric
    curves to a CSV or Parquet file."""
    if file_format not in ("csv", "parquet"):
        raise _fail(f"--format: expected csv or parquet, got {file_format!r}")
    what = "curves" if curves else "runs"
    target = output or Path(f"experiment-{experiment_id}-{what}.{file_format}")
    path = f"/experiments/{experiment_id}/export"
    waited_s = 0.0
    with _client(url, 600) as client:
        for retry in itertools.count():
            try:
                with client.stream("GET", path,
                                   params={"format": file_format, "what": what}) as rsp:
                    if rsp.status_code >= 400:
                        rsp.read()
                        wait = _retry_wait(rsp, "GET", path, retry, waited_s)
                        if wait is None:
                            raise _fail(f"GET {path}: {rsp.status_code} {_detail(rsp)}")
                    else:
                        written = _write_stream(rsp, target)
                        break
            except httpx.HTTPError as exc:
                raise _fail(f"cannot export from the seedgrid API at {client.base_url}: "
                            f"{exc}") from None
            time.sleep(wait)
            waited_s += wait
    console.print(f"wrote {target} ({written:,} bytes)", markup=False, soft_wrap=True)


def _write_stream(response: httpx.Response, target: Path) -> int:
    """The response body into `target`, through a temporary file beside it, so that a broken
    download never leaves a truncated file under the name asked for."""
    partial = target.with_name(target.name + ".part")
    written = 0
    try:
        with partial.open("wb") as out:
            for chunk in response.iter_bytes():
                written += out.write(chunk)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise _fail(f"cannot write {target}: {exc.strerror}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return written


@app.command()
def trainers(
    name: Annotated[str | None, typer.Argument(help="a trainer: its config fields")] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """The trainers the service runs; with NAME, its config fields, defaults and meanings."""
    mode = _mode(as_json, as_csv)
    with _client(url, 60) as client:
        listed = _request(client, "GET", "/trainers")
    if name is None:
        if mode == "json":
            print_json(listed)
            return
        columns = ("name", "primary metric", "reports", "description")
        rows = [[t["name"], t["primary_metric"], ", ".join(t["reports"]) or "-",
                 t["description"]] for t in listed]
        if mode == "csv":
            print_csv(columns, rows)
        else:
            print_table(None, columns, rows, set(columns))
        return
    found = {t["name"]: t for t in listed}
    trainer = found.get(name)
    if trainer is None:
        close = difflib.get_close_matches(name, found, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _fail(f"unknown trainer {name!r}{hint}; available: {', '.join(found)}")
    if mode == "json":
        print_json(trainer)
        return
    schema = trainer["config_schema"]
    columns = ("field", "type", "default", "meaning")
    rows = [[field, _schema_type(prop, schema), _default(prop), prop.get("description", "")]
            for field, prop in schema.get("properties", {}).items()]
    if mode == "csv":
        print_csv(columns, rows)
        return
    console.print(f"{trainer['name']}: {trainer['description']}", markup=False, soft_wrap=True)
    if trainer["paper"]:
        console.print(f"paper: {trainer['paper']}", markup=False, soft_wrap=True)
    console.print(f"metrics: {', '.join(trainer['metrics'])}", markup=False, soft_wrap=True)
    console.print(f"diagnostics (per run, not compared): {', '.join(trainer['diagnostics'])}",
                  markup=False, soft_wrap=True)
    print_table("config fields", columns, rows, {"field", "type", "default", "meaning"})


def _schema_type(prop: dict[str, Any], schema: dict[str, Any]) -> str:
    """A config field's type from its JSON schema, in a few words."""
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "$ref" in prop:
        target = schema.get("$defs", {}).get(prop["$ref"].rsplit("/", 1)[-1], {})
        return _schema_type(target, schema) if target else prop["$ref"].rsplit("/", 1)[-1]
    for union in ("anyOf", "oneOf"):
        if union in prop:
            return " | ".join(_schema_type(p, schema) for p in prop[union])
    kind = prop.get("type", "any")
    if kind == "array" and "items" in prop:
        return f"list of {_schema_type(prop['items'], schema)}"
    return str(kind)


def _default(prop: dict[str, Any]) -> str:
    return json.dumps(prop["default"]) if "default" in prop else "(required)"


@app.command()
def plan(
    ratio: Annotated[float | None, typer.Option(
        help="variance ratio var_a / var_b to detect: prints the seeds per level")] = None,
    seeds: Annotated[int | None, typer.Option(
        help="seeds per level: prints the smallest ratio they detect")] = None,
    alpha: Annotated[float, typer.Option(help="level of the two-sided primary test")] = 0.05,
    power: Annotated[float, typer.Option(help="probability of detecting it")] = 0.8,
    paired: Annotated[bool, typer.Option(
        "--paired/--unpaired",
        help="the levels run the same seeds (seedgrid's default) or independent ones")] = True,
    correlation: Annotated[float, typer.Option(
        help="how much the two levels' results correlate seed by seed, in [0, 0.99] "
             "(paired only)")] = 0.0,
) -> None:
    """How many seeds a variance comparison needs (no service needed; GET /planning/seeds
    answers the same)."""
    from service.analysis.power import seed_plan

    if (ratio is None) == (seeds is None):
        raise _fail("give exactly one of --ratio (to get the seeds per level) and --seeds (to "
                    "get the detectable ratio)")
    if ratio is not None and ratio <= 0:
        raise _fail(f"--ratio must be above 0, got {ratio}")
    if seeds is not None and seeds < 2:
        raise _fail(f"--seeds must be at least 2 (a variance needs two values), got {seeds}")
    if not (0 < alpha < power < 1):
        raise _fail(f"--alpha and --power must satisfy 0 < alpha < power < 1, got {alpha} and "
                    f"{power}")
    if not 0 <= correlation <= 0.99:
        raise _fail(f"--correlation must be in [0, 0.99], got {correlation}")
    if correlation > 0 and not paired:
        raise _fail("--correlation is for paired seeds: drop it or use --paired")
    answer = seed_plan(ratio=ratio, seeds=seeds, alpha=alpha, power=power, paired=paired,
                       correlation=correlation)
    if ratio is not None:
        result = (f"{answer.seeds_per_level} seeds per level" if answer.seeds_per_level
                  else answer.note)
        console.print(f"to detect a variance ratio of {ratio:g} (or 1/{ratio:g}) with power "
                      f"{power:g} at alpha {alpha:g}: {result}", markup=False, soft_wrap=True)
    else:
        result = (f"{answer.ratio:.3g} (or 1/{answer.ratio:.3g})" if answer.ratio
                  else answer.note)
        console.print(f"{seeds} seeds per level detect, with power {power:g} at alpha "
                      f"{alpha:g}, a variance ratio of {result}", markup=False, soft_wrap=True)
    if answer.f_test_seeds_per_level is not None or answer.f_test_ratio is not None:
        promised = (f"{answer.f_test_seeds_per_level} seeds per level" if ratio is not None
                    else f"a ratio of {answer.f_test_ratio:.3g}")
        console.print(f"(the F-test, if the seeds were normal, would promise {promised})",
                      markup=False, soft_wrap=True)
    console.print(f"({answer.method})", markup=False, soft_wrap=True)


@app.command()
def run(
    spec_file: Path, metric: Annotated[str | None, typer.Option(help="metric to compare")] = None
) -> None:
    """Start the service in this process, run one spec to completion, print its statistics."""
    from service.api.server import BackgroundServer

    settings = load_settings()
    refuse_open_exposure(settings, insecure=False)
    spec = load_spec(spec_file)
    started = time.perf_counter()
    with ray_ended_on_exit():
        upgrade_schema(settings)
        connect_ray(settings)  # from the main thread, not the server's (see connect_ray)
        console.print(f"Ray {settings.ray_address or 'local (started here)'}", markup=False)
        with (
            BackgroundServer(settings) as server,
            _client(server.url, 120) as client,
        ):
            created = _request(client, "POST", "/experiments", json=spec)
            console.print(
                f"experiment {created['id']} {created['name']}: "
                f"{created['n_conditions']} conditions x seeds = {created['n_runs']} runs "
                f"(API at {server.url})", markup=False
            )
            watch(client, created["id"], in_process=database_name(settings))
            trouble = report(client, created["id"], metric)
    console.print(f"wall time {time.perf_counter() - started:.1f} s")
    exit_on_trouble(trouble)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrlOpt = None) -> None:
    """Apply every migration the database lacks (`alembic upgrade head`); safe to repeat."""
    upgrade_schema(load_settings(database_url=database_url))


@db_app.command("current")
def db_current(database_url: DatabaseUrlOpt = None) -> None:
    """The schema revision the database is at, and the newest one this seedgrid knows. Reads
    only: a SQLite file that does not exist is not made."""
    from service.storage.db import DatabaseError, database_revision, head_revision

    settings = load_settings(database_url=database_url)
    name = database_name(settings)
    path = sqlite_file(settings.database_url)
    if path is not None and not path.is_file():
        raise _fail(f"there is no database at {path}" + (
            " (the default; `seedgrid serve` or `seedgrid db upgrade` makes it, "
            "SEEDGRID_DATABASE_URL or --database-url selects another)"
            if on_default_database(settings) else ""))
    try:
        revision = database_revision(settings.database_url)
    except DatabaseError as exc:
        raise _fail(str(exc)) from None
    head = head_revision()
    if revision is None:
        state = f"no alembic_version table (`seedgrid db upgrade` brings it to revision {head})"
    else:
        state = f"revision {revision}" + (" (head)" if revision == head else f", head is {head}")
    console.print(f"database {name}: {state}", markup=False, soft_wrap=True)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
