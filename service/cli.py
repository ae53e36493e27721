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

ENDED = {"completed", "partial", "cancelled"}
DEFAULT_URL = "http://127.0.0.1:8000"
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
    """A spec file, JSON or YAML; errors name the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise _fail(f"cannot read spec file {path}: {exc.strerror}") from None
    try:
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise _fail(
            f"spec file {path} is not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}"
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
        lines = [
            f"  {'.'.join(map(str, e['loc']))}: {e['msg']}"
            for e in response.json().get("detail", [])
        ]
        what = "the spec was rejected" if method == "POST" else f"GET {path} was refused"
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
            progress.update(task, completed=done, counts=shown)
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


def print_stats(stats: dict[str, Any]) -> None:
    table = Table(title=f"per-condition {stats['metric']}")
    for col in ("condition", "n", "mean", "std", "median", "min", "max", "ci95"):
        table.add_column(col, justify="left" if col == "condition" else "right")
    for c in stats["conditions"]:
        table.add_row(
            c["condition_key"] or "(all)",
            str(c["n"]),
            _fmt(c["mean"]),
            _fmt(c["std"]),
            _fmt(c["median"]),
            _fmt(c["min"]),
            _fmt(c["max"]),
            _fmt(c["ci95"]),
        )
    console.print(table)
    comp = Table(title=f"variance comparisons of {stats['metric']} (var_a / var_b)")
    for col in (
        "factor",
        "a vs b",
        "within",
        "n",
        "var ratio",
        "ratio ci95",
        "F p",
        "Brown-Forsythe p",
        "perm p",
        "mean diff",
        "Welch p",
    ):
        comp.add_column(col, justify="left" if col in {"factor", "a vs b", "within"} else "right")
    for c in stats["comparisons"]:
        within = ", ".join(f"{k}={v}" for k, v in c["within"].items()) if c["within"] else "pooled"
        comp.add_row(
            c["factor"],
            f"{c['a']} vs {c['b']}",
            within,
            f"{c['n_a']}/{c['n_b']}",
            _fmt(c["var_ratio"]),
            _fmt(c["var_ratio_ci95"], 3),
            _fmt(c["f_test_p"], 3),
            _fmt(c["brown_forsythe_p"], 3),
            _fmt(c["permutation_p"], 3),
            _fmt(c["mean_diff"]),
            _fmt(c["welch_p"], 3),
        )
    console.print(comp)
    if stats.get("next_offset") is not None:
        console.print(f"showing comparisons {stats['offset'] + 1}-{stats['next_offset']} of "
                      f"{stats['total_comparisons']}")


def report(client: httpx.Client, experiment_id: int, metric: str | None = None) -> None:
    detail = _request(client, "GET", f"/experiments/{experiment_id}")
    params = {"metric": metric} if metric else {}
    stats = _request(client, "GET", f"/experiments/{experiment_id}/stats", params=params)
    console.print(
        f"experiment {experiment_id} [bold]{detail['name']}[/bold]: {detail['status']} "
        f"({', '.join(f'{k} {v}' for k, v in detail['counts'].items() if v)})"
    )
    print_stats(stats)
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
        f"{d['n_runs']} runs: {counts}"
    )


@app.command()
def stats(
    experiment_id: int,
    url: UrlOpt = DEFAULT_URL,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
) -> None:
    """Per-condition table and variance comparisons of an experiment."""
    with _client(url, 120) as client:
        report(client, experiment_id, metric)


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
