"""The `seedgrid` command line: serve, submit, status, stats, and `run` (all in one process)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import pydantic
import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.settings import Settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="seedgrid: does an implementation choice change the seed-to-seed variance?",
)
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

ENDED = {"completed", "partial", "cancelled"}
DEFAULT_URL = "http://127.0.0.1:8000"
UrlOpt = Annotated[str, typer.Option("--url", envvar="SEEDGRID_URL", help="seedgrid API address")]


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(code=2)


def load_settings() -> Settings:
    try:
        return Settings()
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = "SEEDGRID_" + str(first["loc"][0]).upper() if first["loc"] else "settings"
        raise _fail(f"{field}: {first['msg']}") from None


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
        raise _fail("the spec was rejected:\n" + "\n".join(lines))
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
            done = c["completed"] + c["failed"] + c["diverged"] + c["cancelled"]
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


def report(client: httpx.Client, experiment_id: int, metric: str | None = None) -> None:
    detail = _request(client, "GET", f"/experiments/{experiment_id}")
    params = {"metric": metric} if metric else {}
    stats = _request(client, "GET", f"/experiments/{experiment_id}/stats", params=params)
    console.print(
        f"experiment {experiment_id} [bold]{detail['name']}[/bold]: {detail['status']} "
        f"({', '.join(f'{k} {v}' for k, v in detail['counts'].items() if v)})"
    )
    print_stats(stats)
    failed = [
        r
        for r in _request(client, "GET", f"/experiments/{experiment_id}/runs")
        if r["status"] in {"failed", "diverged"}
    ]
    for r in failed[:10]:
        console.print(
            f"[yellow]run {r['id']} ({r['condition_key']}, seed {r['seed']}) "
            f"{r['status']}:[/yellow] {r['error']}"
        )


@app.command()
def serve(
    dispatch: Annotated[bool, typer.Option(help="run the dispatcher in this process")] = True,
) -> None:
    """Serve the REST API (and, by default, the dispatcher) with uvicorn."""
    import uvicorn

    from service.app import create_app

    settings = load_settings()
    uvicorn.run(
        create_app(settings, dispatch=dispatch),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
    )


@app.command()
def submit(
    spec_file: Path,
    url: UrlOpt = DEFAULT_URL,
    wait: Annotated[bool, typer.Option(help="follow progress, then print the stats")] = False,
) -> None:
    """Submit an experiment spec (JSON or YAML) to a running service."""
    spec = load_spec(spec_file)
    with httpx.Client(base_url=url, timeout=60) as client:
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
    with httpx.Client(base_url=url, timeout=60) as client:
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
    with httpx.Client(base_url=url, timeout=120) as client:
        report(client, experiment_id, metric)


@app.command()
def run(
    spec_file: Path, metric: Annotated[str | None, typer.Option(help="metric to compare")] = None
) -> None:
    """Start the service in this process, run one spec to completion, print its statistics."""
    from service.server import BackgroundServer

    settings = load_settings()
    spec = load_spec(spec_file)
    started = time.perf_counter()
    console.print(
        f"database {settings.database_url}; Ray {settings.ray_address or 'local (started here)'}"
    )
    with (
        BackgroundServer(settings) as server,
        httpx.Client(base_url=server.url, timeout=120) as client,
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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
