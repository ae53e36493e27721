"""Following an experiment (`watch`: progress bars until every run has ended) and reporting on
it (its statistics, then each distinct reason its runs stopped, failed or diverged), for
`submit --wait`, `add-seeds --wait`, `watch`, `stats` and `run`."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

import service.cli.paper_tables as paper_tables
import service.cli.remote as remote
import service.cli.render as render
from api_schemas import ExperimentStatus, RunStatus, first_line
from api_schemas.pages import RUNS_PAGE
from service.cli.render import (
    counts_line,
    print_json,
    print_message,
    print_stats,
    print_stats_csv,
    spaced,
)
from service.client import Client, has_ended

# Per-condition progress is shown up to this many conditions (and runs, read each poll).
MAX_WATCHED_CONDITIONS = 24
MAX_WATCHED_RUNS = 2000


def watch(
    client: Client, experiment_id: int, poll_s: float = 0.5, in_process: str | None = None
) -> dict[str, Any]:
    """Progress bars, one over the experiment and one per condition (small grids), until every
    run has ended; the experiment's detail at the end. Ctrl-C stops watching, not the
    experiment, and says how to re-attach; with `in_process` (the database of a service that
    runs in this process, `seedgrid run`), that the runs left wait in its queue instead."""
    try:
        return _follow(client, experiment_id, poll_s)
    except KeyboardInterrupt:
        if in_process is not None:
            render.err.print(
                f"stopped: experiment {experiment_id}'s runs left stay queued in "
                f"{in_process} and run when a `seedgrid serve` on it starts (then "
                f"`seedgrid watch {experiment_id}` follows them)",
                markup=False,
                soft_wrap=True,
            )
        else:
            render.err.print(
                f"stopped watching: experiment {experiment_id} continues on the "
                f"service; `seedgrid watch {experiment_id}` re-attaches, `seedgrid "
                f"cancel {experiment_id}` stops it",
                markup=False,
                soft_wrap=True,
            )
        raise typer.Exit(130) from None


def _follow(client: Client, experiment_id: int, poll_s: float) -> dict[str, Any]:
    detail = remote.ask(client, "GET", f"/experiments/{experiment_id}")
    per_condition = (
        detail["n_conditions"] <= MAX_WATCHED_CONDITIONS and detail["n_runs"] <= MAX_WATCHED_RUNS
    )
    with Progress(
        TextColumn("[bold]{task.description}", table_column=Column(overflow="fold")),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}", table_column=Column(overflow="fold")),
        TimeElapsedColumn(),
        console=render.console,
        transient=False,
    ) as progress:
        overall = progress.add_task(escape(detail["name"]), total=detail["n_runs"], counts="")
        conditions: dict[str, Any] = {}
        while True:
            c = detail["counts"]
            done = sum(v for k, v in c.items() if k not in RunStatus.active())
            waiting = render.queue_line(detail)
            # an adaptive experiment's total grows with each round
            progress.update(
                overall,
                total=detail["n_runs"],
                completed=done,
                counts=escape(f"{waiting}; {counts_line(c)}" if waiting else counts_line(c)),
            )
            if per_condition:
                by_condition: dict[str, Counter[str]] = {}
                for run in remote.pages(client, f"/experiments/{experiment_id}/runs", RUNS_PAGE):
                    by_condition.setdefault(run["condition_key"], Counter())[run["status"]] += 1
                for key, statuses in by_condition.items():
                    if key not in conditions:
                        conditions[key] = progress.add_task(f"  {escape(spaced(key))}", counts="")
                    ended = sum(n for s, n in statuses.items() if s not in RunStatus.active())
                    progress.update(
                        conditions[key],
                        total=sum(statuses.values()),
                        completed=ended,
                        counts=escape(counts_line(statuses)),
                    )
            if has_ended(detail["status"], detail["counts"]):
                return detail
            time.sleep(poll_s)
            detail = remote.ask(client, "GET", f"/experiments/{experiment_id}")


def trouble_summary(client: Client, experiment_id: int) -> int:
    """Each distinct error of the failed and diverged runs once, with how many runs it hit;
    the number of such runs."""
    errors: Counter[tuple[str, str]] = Counter()
    for status in RunStatus.went_wrong():
        for run in remote.pages(
            client, f"/experiments/{experiment_id}/runs", RUNS_PAGE, {"status": str(status)}
        ):
            errors[(str(status), first_line(run["error"]))] += 1
    for (ended_as, error), n in errors.most_common():
        runs = f"{n} run{'s' if n != 1 else ''} {ended_as}"
        render.console.print(f"{runs}: {error}", style="yellow", markup=False, soft_wrap=True)
    return sum(errors.values())


def report(
    client: Client,
    experiment_id: int,
    metric: str | None = None,
    full: bool = False,
    mode: str = "table",
    scale: str | None = None,
) -> int:
    """The experiment's statistics (a table, or the stats as JSON or CSV) of `metric` on
    `scale` (None: the spec's), then each distinct reason its runs stopped, failed or
    diverged, once with its count; the number of failed and diverged runs."""
    detail = remote.ask(client, "GET", f"/experiments/{experiment_id}")
    params = {k: v for k, v in (("metric", metric), ("scale", scale)) if v}
    trouble = sum(detail["counts"][s] for s in RunStatus.went_wrong())
    if mode != "table":
        stats = remote.ask(client, "GET", f"/experiments/{experiment_id}/stats", params=params)
        if mode == "json":
            print_json(stats)
        elif mode == "csv":
            print_stats_csv(stats)
        else:  # markdown or latex: plain text, never wrapped
            sys.stdout.write(
                paper_tables.markdown(stats) if mode == "markdown" else paper_tables.latex(stats)
            )
        return trouble
    render.console.print(
        f"experiment {experiment_id} {detail['name']}: {detail['status']} "
        f"({counts_line(detail['counts'])})",
        markup=False,
        soft_wrap=True,
    )
    print_message(detail)
    if detail["status"] == ExperimentStatus.failed:
        render.console.print("no run completed: there is nothing to compare", markup=False)
    else:
        print_stats(
            remote.ask(client, "GET", f"/experiments/{experiment_id}/stats", params=params), full
        )
    if detail["counts"]["stopped"]:
        render.console.print(
            "stopped runs ended early on a check (stop_on_checks): the statistics leave them out",
            markup=False,
        )
        reasons = Counter(
            r["stop"]["reason"] if r["stop"] else "(no reason stored)"
            for r in remote.pages(
                client,
                f"/experiments/{experiment_id}/runs",
                RUNS_PAGE,
                {"status": str(RunStatus.stopped)},
            )
        )
        for reason, n in reasons.most_common():
            render.console.print(
                f"{n} run{'s' if n != 1 else ''} stopped: {reason}",
                style="yellow",
                markup=False,
                soft_wrap=True,
            )
    return trouble_summary(client, experiment_id) if trouble else 0


def exit_on_trouble(trouble: int) -> None:
    """Exit 1 when runs failed or diverged, so that scripts and CI notice."""
    if trouble:
        raise typer.Exit(1)
