"""The `seedgrid` command line: serve, dispatcher, submit, status, stats, `run` (all in one
process), and `db upgrade` / `db current` (schema migrations)."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import pydantic
import typer
import yaml
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.settings import Settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="seedgrid: does an implementation choice change the seed-to-seed variance?",
)
db_app = typer.Typer(no_args_is_help=True, help="The database schema: apply and show migrations.")
app.add_typer(db_app, name="db")
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

ENDED = {"completed", "partial", "failed", "cancelled"}
DEFAULT_URL = "http://127.0.0.1:8000"
SPEC_SUFFIXES = (".json", ".yaml", ".yml")
UrlOpt = Annotated[str, typer.Option("--url", envvar="SEEDGRID_URL", help="seedgrid API address")]
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
    """Settings from the environment, overridden by the command's `options` (None: not given)."""
    given = {name: value for name, value in options.items() if value is not None}
    try:
        return Settings(**given)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        field = ("--" + name.replace("_", "-")) if name in given else "SEEDGRID_" + name.upper()
        raise _fail(f"{field if name else 'settings'}: {first['msg']}") from None


def refuse_open_exposure(settings: Settings, insecure: bool) -> None:
    """A service other machines can reach needs the token: without it, anyone who can connect
    submits work to the cluster. Loopback addresses stay open for local use."""
    if settings.api_token.get_secret_value() or insecure or is_loopback(settings.host):
        return
    raise _fail(f"SEEDGRID_HOST={settings.host} is reachable from other machines and "
                "SEEDGRID_API_TOKEN is not set: set a token (e.g. `openssl rand -hex 32`), "
                "listen on 127.0.0.1, or pass --insecure to serve it open anyway")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def upgrade_schema(database_url: str) -> None:
    """Migrate the database to the newest schema, or stop with one line naming it."""
    from service.db import INITIAL_REVISION, DatabaseError, masked_url, upgrade_database

    try:
        done = upgrade_database(database_url)
    except DatabaseError as exc:
        raise _fail(str(exc)) from None
    if done.stamped:
        change = f"tables made before migrations stamped at revision {INITIAL_REVISION}"
        change += f", upgraded to {done.after}" if done.after != INITIAL_REVISION else ""
    elif done.before == done.after:
        change = f"schema at revision {done.after}, up to date"
    else:
        change = f"schema upgraded from {done.before or 'an empty database'} to {done.after}"
    console.print(f"database {masked_url(database_url)}: {change}", markup=False, soft_wrap=True)


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file, JSON or YAML; errors name the file and, for any other file, the types
    expected (a README passed by mistake is not "invalid YAML")."""
    if path.suffix.lower() not in SPEC_SUFFIXES:
        raise _fail(f"expected a .json, .yaml or .yml spec file, got {path.name}")
    try:
        text = path.read_text()
    except OSError as exc:
        raise _fail(f"cannot read spec file {path}: {exc.strerror}") from None
    try:
        spec = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise _fail(
            f"spec file {path} is not valid {path.suffix.lstrip('.').upper()}: {exc}"
        ) from None
    if not isinstance(spec, dict):
        raise _fail(f"spec file {path} must hold a mapping (name, trainer, config, grid, seeds)")
    return spec


def _client(url: str, timeout_s: float) -> httpx.Client:
    """An API client that sends the bearer token of SEEDGRID_API_TOKEN when it is set."""
    token = os.environ.get("SEEDGRID_API_TOKEN", "").strip()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, timeout=timeout_s, headers=headers)


def _request(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach the seedgrid API at {client.base_url}: {exc}") from None
    if response.status_code == 422:
        detail = response.json().get("detail")
        lines = ([f"  {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in detail]
                 if isinstance(detail, list) else [f"  {detail}"])
        what = ("the spec was rejected" if (method, path) == ("POST", "/experiments")
                else f"{method} {path} was refused")
        raise _fail(f"{what}:\n" + "\n".join(lines))
    if response.status_code >= 400:
        raise _fail(f"{method} {path}: {response.status_code} {response.json().get('detail')}")
    return response.json()


def watch(client: httpx.Client, experiment_id: int, poll_s: float = 0.5) -> dict[str, Any]:
    """A progress bar over the experiment's runs until every run has ended."""
    detail = _request(client, "GET", f"/experiments/{experiment_id}")
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(detail["name"], total=detail["n_runs"], counts="")
        while True:
            c = detail["counts"]
            done = sum(v for k, v in c.items() if k not in ("queued", "running"))
            shown = ", ".join(f"{k} {v}" for k, v in c.items() if v)
            # an adaptive experiment's total grows with each round
            progress.update(task, total=detail["n_runs"], completed=done, counts=shown)
            if detail["status"] in ENDED and c["queued"] == 0 and c["running"] == 0:
                return detail
            time.sleep(poll_s)
            detail = _request(client, "GET", f"/experiments/{experiment_id}")


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


def print_stats(stats: dict[str, Any], full: bool = False) -> None:
    """The compact view (a few columns per condition and per comparison, `!n`: n warnings),
    or with `full` every field of every condition, comparison, family and omnibus test."""
    if full:
        print_all_stats(stats)
        return
    bounds = stats.get("metric_bounds")
    title = f"per-condition {stats['metric']}" + (f" (bounded {_fmt(bounds)})" if bounds else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("condition", "n", "mean", "ci95", "std", "noise share", "!"):
        table.add_column(col, justify="left" if col == "condition" else "right",
                         overflow="fold")
    for c in stats["conditions"]:
        table.add_row(c["condition_key"] or "(all)", str(c["n"]), _fmt(c["mean"]),
                      _fmt(c["ci95"]), _fmt(c["std"], 3), _fmt(c.get("noise_floor_share"), 2),
                      _flag(c))
    console.print(table, width=min(console.width, COMPACT_WIDTH))
    comp = Table(title=f"variance comparisons of {stats['metric']} (var_a / var_b; cell ratio: "
                       "within-cell pooled)")
    comp.box, comp.show_edge = box.SIMPLE_HEAD, False
    for col in ("pair", "within", "n", "var ratio", "F ci95", "cell ratio", "Holm F p", "!"):
        comp.add_column(col, justify="left" if col in {"pair", "within"} else "right",
                        overflow="fold")
    for c in stats["comparisons"]:
        comp.add_row(f"{c['factor']}: {c['a']} vs {c['b']}", _within(c), f"{c['n_a']}/{c['n_b']}",
                     _fmt(c["var_ratio"], 3), _fmt(c.get("var_ratio_ci95_f"), 2),
                     _fmt(c.get("within_cell_var_ratio"), 3),
                     _fmt(c.get("f_test_p_holm_factor"), 3), _flag(c))
    console.print(comp, width=min(console.width, COMPACT_WIDTH))
    if stats.get("source_decomposition"):
        print_source_decomposition(stats)
    warned = sum(1 for c in stats["comparisons"] + stats["conditions"] if c.get("warnings"))
    if warned:
        console.print(f"!n: n warnings on {warned} rows (numbers from fewer seeds than they "
                      "need);\n`seedgrid stats ID --all` lists them with every field",
                      markup=False)
    _print_page(stats)


def print_all_stats(stats: dict[str, Any]) -> None:
    """Every field, one per line, grouped per condition, comparison, family and omnibus test."""
    def block(title: str, item: dict[str, Any]) -> None:
        console.print(title, markup=False, style="bold")
        for key, value in item.items():
            if key == "warnings":
                for warning in value:
                    console.print(f"  warning: {warning}", markup=False, soft_wrap=True)
            else:
                console.print(f"  {key}: {_fmt(value, 6)}", markup=False, soft_wrap=True)

    console.print(f"metric {stats['metric']}, bounds {_fmt(stats.get('metric_bounds'))}, "
                  f"{stats['n_completed']} completed runs", markup=False)
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
           full: bool = False) -> None:
    detail = _request(client, "GET", f"/experiments/{experiment_id}")
    params = {"metric": metric} if metric else {}
    stats = _request(client, "GET", f"/experiments/{experiment_id}/stats", params=params)
    console.print(
        f"experiment {experiment_id} [bold]{detail['name']}[/bold]: {detail['status']} "
        f"({', '.join(f'{k} {v}' for k, v in detail['counts'].items() if v)})"
    )
    print_stats(stats, full)
    unfinished = [
        r
        for status in ("failed", "diverged", "stopped")
        for r in _request(client, "GET", f"/experiments/{experiment_id}/runs",
                          params={"status": status, "limit": 10})
    ]
    if any(r["status"] == "stopped" for r in unfinished):
        console.print("stopped runs ended early on a check (stop_on_checks): the statistics "
                      "above leave them out")
    for r in unfinished[:10]:
        why = r["stop"]["reason"] if r["status"] == "stopped" and r["stop"] else r["error"]
        console.print(
            f"[yellow]run {r['id']} ({r['condition_key']}, seed {r['seed']}) "
            f"{r['status']}:[/yellow] {why}"
        )


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
) -> None:
    """Serve the REST API (and, by default, the dispatcher) with uvicorn."""
    import uvicorn

    if workers > 1 and dispatch:
        raise _fail("--workers: more than one worker process needs --no-dispatch (run the "
                    "dispatcher as its own process: `seedgrid dispatcher`)")
    settings = load_settings()
    refuse_open_exposure(settings, insecure)
    log_to_stderr(settings.log_level)
    upgrade_schema(settings.database_url)
    if dispatch:
        from service.app import create_app

        uvicorn.run(create_app(settings, dispatch=True), host=settings.host, port=settings.port,
                    log_level=settings.log_level)
    else:
        # Each worker process builds its app from the same SEEDGRID_* environment.
        uvicorn.run("service.app:create_api_app", factory=True, workers=workers,
                    host=settings.host, port=settings.port, log_level=settings.log_level)


@app.command()
def dispatcher() -> None:
    """Run the dispatcher alone: the database queue -> Ray, results -> the database.

    Exactly one dispatcher acts per database: this one waits as a standby while another holds
    the dispatch lock (a `seedgrid dispatcher` or an embedded `seedgrid serve`), and takes over
    when it is gone. SIGTERM or SIGINT stops it cleanly: runs in flight go back to the queue.
    """
    import signal
    import threading

    from service.db import make_engine
    from service.dispatcher import Dispatcher, ensure_ray

    settings = load_settings()
    log_to_stderr(settings.log_level)
    upgrade_schema(settings.database_url)
    if settings.ray_address:
        # Connect now: a wrong address fails here, and a standby is ready to take over at once.
        try:
            ensure_ray(settings)
        except Exception as exc:
            raise _fail(f"cannot connect to Ray at SEEDGRID_RAY_ADDRESS={settings.ray_address}: "
                        f"{_first_line(exc)}") from None
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
    if worker.error is not None and not stopping.is_set():
        raise _fail(f"the dispatcher stopped: {_first_line(worker.error)}")


@app.command()
def submit(
    spec_file: Path,
    url: UrlOpt = DEFAULT_URL,
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
            report(client, created["id"])


@app.command()
def status(experiment_id: int, url: UrlOpt = DEFAULT_URL) -> None:
    """An experiment's status and run counts."""
    with _client(url, 60) as client:
        d = _request(client, "GET", f"/experiments/{experiment_id}")
    counts = ", ".join(f"{k} {v}" for k, v in d["counts"].items() if v)
    console.print(
        f"experiment {d['id']} {d['name']} ({d['trainer']}): {d['status']}; "
        f"{d['n_runs']} runs: {counts}", markup=False
    )
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
    url: UrlOpt = DEFAULT_URL,
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
            report(client, experiment_id)


@app.command()
def compare(
    a: Annotated[int, typer.Argument(help="the first experiment's id")],
    b: Annotated[int, typer.Argument(help="the second experiment's id")],
    url: UrlOpt = DEFAULT_URL,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
) -> None:
    """Two experiments of one trainer side by side, condition by condition."""
    params: dict[str, Any] = {"a": a, "b": b, "limit": 200}
    if metric:
        params["metric"] = metric
    table = Table(title=f"experiment {a} vs {b}")
    for column in ("condition", "n a/b", "mean a", "mean b", "welch p", "var a/b",
                   "F 95% interval", "F p"):
        table.add_column(column)
    offset: int | None = 0
    with _client(url, 120) as client:
        while offset is not None:
            body = _request(client, "GET", "/compare", params={**params, "offset": offset})
            for side in body["conditions"]:
                t = side["comparison"]
                interval = t.get("var_ratio_ci95_f") or [None, None]
                table.add_row(escape(side["condition_key"]), f"{t['n_a']}/{t['n_b']}",
                              _fmt(side["a"]["mean"]), _fmt(side["b"]["mean"]),
                              _fmt(t["welch_p"]), _fmt(t["var_ratio"]),
                              escape(f"[{_fmt(interval[0])}, {_fmt(interval[1])}]"),
                              _fmt(t["f_test_p"]))
            offset = body["next_offset"]
    console.print(f"{body['trainer']}, metric {body['metric']}: {body['total_conditions']} "
                  "shared conditions", markup=False)
    console.print(table)
    for side, keys in (("a", body["only_in_a"]), ("b", body["only_in_b"])):
        if keys:
            console.print(f"only in {side}: {', '.join(keys)}", markup=False)


@app.command()
def stats(
    experiment_id: int,
    url: UrlOpt = DEFAULT_URL,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
    show_all: Annotated[bool, typer.Option(
        "--all", help="every field of every condition and comparison, warnings included, "
                      "instead of the compact tables")] = False,
) -> None:
    """Per-condition table and variance comparisons of an experiment (compact; --all for
    every field)."""
    with _client(url, 120) as client:
        report(client, experiment_id, metric, show_all)


@app.command()
def plan(
    ratio: Annotated[float | None, typer.Option(
        help="variance ratio var_a / var_b to detect: prints the seeds per level")] = None,
    seeds: Annotated[int | None, typer.Option(
        help="seeds per level: prints the smallest ratio they detect")] = None,
    alpha: Annotated[float, typer.Option(help="level of the two-sided F-test")] = 0.05,
    power: Annotated[float, typer.Option(help="probability of detecting it")] = 0.8,
) -> None:
    """How many seeds a variance comparison needs (no service needed; GET /planning/seeds
    answers the same)."""
    from service.power import seed_plan

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
    answer = seed_plan(ratio=ratio, seeds=seeds, alpha=alpha, power=power)
    if ratio is not None:
        result = (f"{answer.seeds_per_level} seeds per level" if answer.seeds_per_level
                  else answer.note)
        console.print(f"to detect a variance ratio of {ratio:g} (or 1/{ratio:g}) with power "
                      f"{power:g} at alpha {alpha:g}: {result}", markup=False)
    else:
        result = (f"{answer.ratio:.3g} (or 1/{answer.ratio:.3g})" if answer.ratio
                  else answer.note)
        console.print(f"{seeds} seeds per level detect, with power {power:g} at alpha "
                      f"{alpha:g}, a variance ratio of {result}", markup=False)
    console.print(f"({answer.method})", markup=False)


@app.command()
def run(
    spec_file: Path, metric: Annotated[str | None, typer.Option(help="metric to compare")] = None
) -> None:
    """Start the service in this process, run one spec to completion, print its statistics."""
    from service.server import BackgroundServer

    settings = load_settings()
    refuse_open_exposure(settings, insecure=False)
    spec = load_spec(spec_file)
    started = time.perf_counter()
    upgrade_schema(settings.database_url)
    console.print(
        f"database {settings.database_url}; Ray {settings.ray_address or 'local (started here)'}"
    )
    with (
        BackgroundServer(settings) as server,
        _client(server.url, 120) as client,
    ):
        created = _request(client, "POST", "/experiments", json=spec)
        console.print(
            f"experiment {created['id']} {created['name']}: "
            f"{created['n_conditions']} conditions x seeds = {created['n_runs']} runs "
            f"(API at {server.url})"
        )
        watch(client, created["id"])
        report(client, created["id"], metric)
    console.print(f"wall time {time.perf_counter() - started:.1f} s")


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrlOpt = None) -> None:
    """Apply every migration the database lacks (`alembic upgrade head`); safe to repeat."""
    upgrade_schema(load_settings(database_url=database_url).database_url)


@db_app.command("current")
def db_current(database_url: DatabaseUrlOpt = None) -> None:
    """The schema revision the database is at, and the newest one this seedgrid knows."""
    from service.db import DatabaseError, database_revision, head_revision, masked_url

    url = load_settings(database_url=database_url).database_url
    try:
        revision = database_revision(url)
    except DatabaseError as exc:
        raise _fail(str(exc)) from None
    head = head_revision()
    if revision is None:
        state = f"no alembic_version table (`seedgrid db upgrade` brings it to revision {head})"
    else:
        state = f"revision {revision}" + (" (head)" if revision == head else f", head is {head}")
    console.print(f"database {masked_url(url)}: {state}", markup=False, soft_wrap=True)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
