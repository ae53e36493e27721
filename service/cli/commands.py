"""The client commands that submit, follow, list and change experiments: submit, import,
status, add-seeds, list, runs, watch, cancel, delete and export. Each talks to the service through
service.cli.remote (a service.client.Client)."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

import service.cli.remote as remote
import service.cli.render as render
from api_schemas import RunStatus, first_line
from api_schemas.pages import EXPERIMENTS_PAGE, RUNS_PAGE
from service.cli.common import CsvOpt, JsonOpt, UrlOpt, fail, load_spec, output_mode
from service.cli.follow import exit_on_trouble, report, trouble_summary, watch
from service.cli.render import (
    counts_line,
    fmt,
    key_factors,
    print_csv,
    print_json,
    print_message,
    print_table,
    spaced,
)
from service.client import Client


def submit(
    spec_file: Path,
    url: UrlOpt = None,
    wait: Annotated[bool, typer.Option(help="follow progress, then print the stats")] = False,
) -> None:
    """Submit an experiment spec (JSON or YAML) to a running service."""
    spec = load_spec(spec_file)
    with remote.connect(url, 60) as client:
        created = remote.ask(client, "POST", "/experiments", json=spec)
        render.console.print(
            f"experiment {created['id']} {created['name']}: {created['n_conditions']} "
            f"conditions, {created['n_runs']} runs"
        )
        render.print_seed_warnings(created.get("seed_warnings", []))
        if wait:
            watch(client, created["id"])
            exit_on_trouble(report(client, created["id"]))


def import_results(
    results_file: Annotated[
        Path, typer.Argument(help="a .csv run table (W&B and MLflow exports too) or .json runs")
    ],
    url: UrlOpt = None,
    name: Annotated[
        str | None, typer.Option(help="the new experiment's name [default: the file's]")
    ] = None,
    into: Annotated[
        int | None, typer.Option(help="add the runs to this imported experiment instead")
    ] = None,
    seed_column: Annotated[
        str | None, typer.Option(help="the seed column [default: seed, config.seed, params.seed]")
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(
            help="a plain CSV's metric columns, comma-separated [default: those after the seed]"
        ),
    ] = None,
    metric: Annotated[
        str | None, typer.Option(help="the primary metric [default: the first metric column]")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Import per-seed results you already have as an ended experiment (or into one)."""
    with remote.connect(url, 60) as client:
        imported = remote.import_results(
            client,
            results_file,
            into=into,
            name=name,
            seed_column=seed_column,
            metrics=[m.strip() for m in metrics.split(",")] if metrics else None,
            metric=metric,
        )
    if as_json:
        print_json(imported.model_dump(mode="json"))
        return
    render.console.print(
        f"experiment {imported.id} {imported.name}: {imported.runs_added} runs imported "
        f"({imported.source}; {imported.n_conditions} conditions, {imported.n_runs} runs in "
        f"all); factors: {', '.join(imported.factors) or 'none'}; metrics: "
        f"{', '.join(imported.metrics)} (primary {imported.metric})",
        markup=False,
    )
    if imported.ignored_columns:
        render.console.print(
            f"ignored columns: {', '.join(imported.ignored_columns)}", markup=False
        )


def status(experiment_id: int, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """An experiment's status and run counts."""
    with remote.connect(url, 60) as client:
        d = remote.ask(client, "GET", f"/experiments/{experiment_id}")
    if as_json:
        print_json(d)
        return
    counts = ", ".join(f"{k} {v}" for k, v in d["counts"].items() if v)
    render.console.print(
        f"experiment {d['id']} {d['name']} ({d['trainer']}): {d['status']}; "
        f"{d['n_runs']} runs: {counts}",
        markup=False,
    )
    waiting = render.queue_line(d)
    if waiting:
        render.console.print(waiting, markup=False)
    print_message(d)
    adaptive = d.get("adaptive")
    if adaptive:
        render.console.print(f"adaptive: {adaptive['rule']}", markup=False)
        for look in adaptive["looks"]:
            interval = (
                "none"
                if look["interval"] is None
                else f"[{fmt(look['interval'][0])}, {fmt(look['interval'][1])}]"
            )
            note = f" ({look['note']})" if look["note"] else ""
            render.console.print(
                f"  look {look['look']}: {look['seeds_per_condition']} seeds, "
                f"estimate {fmt(look['estimate'])}, {look['confidence']:.2%} "
                f"interval {interval}{note}",
                markup=False,
            )
        render.console.print(
            f"  {adaptive['stop_reason'] or 'next look when the round ends'}", markup=False
        )


def add_seeds(
    experiment_id: int,
    seeds: Annotated[int, typer.Argument(help="how many seeds to add to every condition")],
    url: UrlOpt = None,
    wait: Annotated[bool, typer.Option(help="follow progress, then print the stats")] = False,
) -> None:
    """Add seeds to every condition of an experiment; their runs join its statistics."""
    with remote.connect(url, 60) as client:
        added = remote.ask(
            client, "POST", f"/experiments/{experiment_id}/seeds", json={"seeds": seeds}
        )
        render.console.print(
            f"experiment {experiment_id}: seeds {added['seeds'][0]} to "
            f"{added['seeds'][-1]} added, {added['runs_added']} runs queued "
            f"({added['n_runs']} in all)",
            markup=False,
        )
        if wait:
            watch(client, experiment_id)
            exit_on_trouble(report(client, experiment_id))


def list_experiments(
    url: UrlOpt = None,
    name: Annotated[
        str | None,
        typer.Option(help="only experiments whose name contains this (case-insensitive)"),
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            help="only experiments in this status (queued, running, completed, partial, failed, "
            "cancelled)"
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(help="only experiments with this tag (repeat: with every one of them)"),
    ] = None,
    trainer: Annotated[str | None, typer.Option(help="only experiments of this trainer")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="only experiments created on or after this date (YYYY-MM-DD, UTC)"),
    ] = None,
    search: Annotated[
        str | None,
        typer.Option(help="only experiments with this text in their name, note, tags or trainer"),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=EXPERIMENTS_PAGE, help="how many, newest first")
    ] = 50,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """The experiments, newest first: status, progress, trainer, tags, created and finished."""
    mode = output_mode(as_json, as_csv)
    if since is not None:
        try:
            datetime.fromisoformat(since)
        except ValueError:
            raise fail(f"--since {since!r} is not a date: give YYYY-MM-DD") from None
    params: dict[str, Any] = {"limit": limit, "tag": tag or []}
    filters = (
        ("name", name),
        ("status", status),
        ("trainer", trainer),
        ("created_after", since),
        ("q", search),
    )
    params |= {k: v for k, v in filters if v is not None}
    with remote.connect(url, 60) as client:
        experiments = remote.ask(client, "GET", "/experiments", params=params)
    if mode == "json":
        print_json(experiments)
        return
    columns = ("id", "name", "trainer", "status", "done", "tags", "created", "finished")
    rows = [
        [
            str(e["id"]),
            e["name"],
            e["trainer"],
            e["status"],
            f"{sum(v for k, v in e['counts'].items() if k not in RunStatus.active())}"
            f"/{e['n_runs']}",
            " ".join(e["tags"]) if mode == "table" else ",".join(e["tags"]),
            _when(e["created_at"]),
            _when(e["finished_at"]),
        ]
        for e in experiments
    ]
    if mode == "csv":
        print_csv(columns, rows)
    elif rows:
        print_table(
            None, columns, rows, {"name", "trainer", "status", "tags", "created", "finished"}
        )
    else:
        filtered = any(v for _, v in filters) or tag
        render.console.print("no experiments" + (" match" if filtered else ""), markup=False)


def _when(timestamp: str | None) -> str:
    """An API timestamp to the minute (UTC), `-` when there is none."""
    return timestamp[:16].replace("T", " ") if timestamp else "-"


def runs(
    experiment_id: int,
    url: UrlOpt = None,
    status: Annotated[
        str | None,
        typer.Option(
            help="only runs in this status (queued, pending, running, completed, failed, "
            "diverged, cancelled, stopped)"
        ),
    ] = None,
    metric: Annotated[
        str | None, typer.Option(help="the final metric shown [default: the experiment's]")
    ] = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """An experiment's runs: condition, seed, status, final metric, and why a run did not
    complete; then every run warning."""
    mode = output_mode(as_json, as_csv)
    params = {"status": status} if status else {}
    with remote.connect(url, 120) as client:
        detail = remote.ask(client, "GET", f"/experiments/{experiment_id}")
        shown = metric or detail["spec"].get("metric") or _primary_metric(client, detail)
        listed = list(remote.pages(client, f"/experiments/{experiment_id}/runs", RUNS_PAGE, params))
    if mode == "json":
        print_json(listed)
        return
    if not listed and mode == "table":
        which = f"{status} runs" if status else "runs"
        render.console.print(f"no {which} in experiment {experiment_id}", markup=False)
        return
    columns = ("id", "condition", "seed", "status", shown, "tries", "why / warnings")
    rows = [
        [
            str(r["id"]),
            spaced(r["condition_key"]),
            str(r["seed"]),
            r["status"],
            fmt(r["metrics"].get(shown)) + ("" if _final(r) or not r["metrics"] else " (last)"),
            str(r["attempts"]),
            _why(r),
        ]
        for r in listed
    ]
    if mode == "csv":
        print_csv(
            [*columns[:-1], "error", "warnings"],
            [
                [
                    *row[:-1],
                    r["error"] or "",
                    "; ".join(w.get("message", str(w)) for w in r["warnings"]),
                ]
                for row, r in zip(rows, listed, strict=True)
            ],
        )
        return
    print_table(
        f"experiment {experiment_id} runs",
        columns,
        rows,
        {"condition", "why / warnings"},
        key_factors(r["condition_key"] for r in listed),
    )
    if any(not _final(r) and r["metrics"] for r in listed):
        render.console.print(
            f"(last): the {shown} last logged before the run failed, diverged, stopped or was "
            "cancelled, not a final value",
            markup=False,
            soft_wrap=True,
        )
    for message, runs_warned in grouped_warnings(listed).items():
        render.console.print(
            f"warning on {_runs_named(runs_warned)}: {message}",
            style="yellow",
            markup=False,
            soft_wrap=True,
        )


# runs named in a grouped warning before the rest are counted
RUNS_NAMED_PER_WARNING = 8


def grouped_warnings(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each distinct warning message (in the order first met) with the runs that carry it: an
    experiment's runs repeat one warning (every collapsed seed, every added seed) many times."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        for warning in r["warnings"]:
            message = str(warning.get("message", warning))
            if r not in grouped.setdefault(message, []):
                grouped[message].append(r)
    return grouped


def _runs_named(runs: list[dict[str, Any]]) -> str:
    """`1 run (3: lr=0.1, seed 0)` or `12 runs (3, 4, ... and 4 more)`."""
    if len(runs) == 1:
        (r,) = runs
        return f"1 run ({r['id']}: {r['condition_key']}, seed {r['seed']})"
    named = ", ".join(str(r["id"]) for r in runs[:RUNS_NAMED_PER_WARNING])
    more = len(runs) - RUNS_NAMED_PER_WARNING
    return f"{len(runs)} runs ({named}{f' and {more} more' if more > 0 else ''})"


def _primary_metric(client: Client, detail: dict[str, Any]) -> str:
    trainers = {t["name"]: t for t in remote.ask(client, "GET", "/trainers")}
    trainer = trainers.get(detail["trainer"])
    return trainer["primary_metric"] if trainer else "-"


def _final(run: dict[str, Any]) -> bool:
    """Whether a run's metrics are final: it completed; a run that failed, diverged, was
    cancelled or stopped keeps the values it last logged."""
    return bool(run["status"] == RunStatus.completed)


def _why(run: dict[str, Any]) -> str:
    """What a row's last column says: the error's first line, the stop's reason, or how many
    warnings the run has (listed under the table)."""
    if run["status"] == "stopped" and run.get("stop"):
        return str(run["stop"]["reason"])
    if run["error"]:
        return first_line(run["error"])
    n = len(run["warnings"])
    return f"{n} warning{'s' if n != 1 else ''}" if n else ""


def watch_command(
    experiment_id: int,
    url: UrlOpt = None,
    poll: Annotated[float, typer.Option(min=0.1, help="seconds between looks")] = 1.0,
) -> None:
    """Follow an experiment's progress, per condition, until every run has ended; exit 1 when
    runs failed or diverged. Ctrl-C stops watching, not the experiment."""
    with remote.connect(url, 60) as client:
        detail = watch(client, experiment_id, poll)
        render.console.print(
            f"experiment {experiment_id} {detail['status']}: {counts_line(detail['counts'])}",
            markup=False,
            soft_wrap=True,
        )
        print_message(detail)
        trouble = trouble_summary(client, experiment_id)
    exit_on_trouble(trouble)


def cancel(experiment_id: int, url: UrlOpt = None) -> None:
    """Cancel an experiment: its queued runs at once, its pending and running ones as soon as
    Ray drops or stops them."""
    with remote.connect(url, 60) as client:
        d = remote.ask(client, "POST", f"/experiments/{experiment_id}/cancel")
    stopping = d["counts"]["pending"] + d["counts"]["running"]
    render.console.print(
        f"experiment {experiment_id} {d['name']}: cancelled; "
        f"{d['counts']['cancelled']} runs cancelled"
        + (f", {stopping} pending or running runs stopping" if stopping else ""),
        markup=False,
        soft_wrap=True,
    )


def delete(
    experiment_id: int,
    url: UrlOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="delete without asking")] = False,
) -> None:
    """Delete an ended experiment with its runs, metric points and statistics (refused while a
    run is queued, pending or running: `seedgrid cancel` it first). Asks first, naming the
    experiment and its runs; --yes does not ask (needed where no one can answer)."""
    with remote.connect(url, 60) as client:
        if not yes:
            d = remote.ask(client, "GET", f"/experiments/{experiment_id}")
            what = (
                f"experiment {experiment_id} {d['name']!r} ({d['trainer']}, {d['status']}) "
                f"with its {d['n_runs']} run{'s' if d['n_runs'] != 1 else ''}"
            )
            if not sys.stdin.isatty():
                raise fail(
                    f"not deleting {what}: no one can confirm (stdin is not a "
                    "terminal); pass --yes to delete it"
                )
            if not typer.confirm(f"Delete {what}, their metric points and statistics?"):
                render.err.print("nothing deleted", markup=False)
                raise typer.Exit(1)
        remote.ask(client, "DELETE", f"/experiments/{experiment_id}")
    render.console.print(f"experiment {experiment_id} deleted", markup=False)


def export(
    experiment_id: int,
    url: UrlOpt = None,
    file_format: Annotated[str, typer.Option("--format", help="csv or parquet")] = "csv",
    curves: Annotated[
        bool,
        typer.Option(
            "--curves", help="the metric curves (a row per logged point) instead of a row per run"
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="file to write [default: experiment-ID-runs.FORMAT, or -curves]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write an experiment's runs (condition, seed, status, final metrics) or its metric
    curves to a CSV or Parquet file."""
    if file_format not in ("csv", "parquet"):
        raise fail(f"--format: expected csv or parquet, got {file_format!r}")
    what = "curves" if curves else "runs"
    target = output or Path(f"experiment-{experiment_id}-{what}.{file_format}")
    with remote.connect(url, 600) as client:
        written = remote.export(client, experiment_id, target, file_format, what)
    render.console.print(f"wrote {target} ({written:,} bytes)", markup=False, soft_wrap=True)
