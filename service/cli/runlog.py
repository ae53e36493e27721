"""`seedgrid run-log RUN_ID`: one run as a person debugging it wants it: how it ended, the
one-line error, the frame of the trainer's code it failed at, the full traceback, then its
metrics (final for a completed run, else last logged) and each attempt's outcome."""

from __future__ import annotations

from typing import Any

import service.cli.remote as remote
import service.cli.render as render
from api_schemas import RunStatus
from service.cli.common import JsonOpt, UrlOpt
from service.cli.render import fmt, print_json, spaced


def run_log(run_id: int, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """A run's error, the frame of your code it failed at, its full traceback and attempts."""
    with remote.connect(url, 60) as client:
        run = remote.ask(client, "GET", f"/runs/{run_id}")
    if as_json:
        print_json(run)
        return
    for line in run_log_lines(run):
        render.console.print(line, markup=False, soft_wrap=True, highlight=False)


def run_log_lines(run: dict[str, Any]) -> list[str]:
    """The lines `run-log` prints for a run's GET /runs/{id} answer."""
    tries = "attempt" if run["attempts"] == 1 else "attempts"
    lines = [
        f"run {run['id']} of experiment {run['experiment_id']}: {spaced(run['condition_key'])}, "
        f"seed {run['seed']}: {run['status']} after {run['attempts']} {tries}"
    ]
    if run.get("stop"):
        lines.append(f"stopped by {', '.join(run['stop']['checks'])}: {run['stop']['reason']}")
    if run["error"]:
        lines.append(f"error: {run['error']}")
    if run.get("failed_at"):
        lines.append(f"failed at: {run['failed_at']}")
    if run.get("traceback"):
        lines += ["", run["traceback"].rstrip("\n"), ""]
    if run["metrics"]:
        shown = ", ".join(f"{name} {fmt(value)}" for name, value in run["metrics"].items())
        # only a completed run's values are final; any other kept what it last logged
        label = "final metrics" if run["status"] == RunStatus.completed else "last logged"
        lines.append(f"{label}: {shown}")
    for attempt in run["attempt_history"]:
        where = f"node {attempt['node_id'] or '?'}, pid {attempt['worker_pid'] or '?'}"
        outcome = attempt["outcome"] or "running"
        error = f": {attempt['error']}" if attempt["error"] else ""
        lines.append(f"attempt {attempt['attempt']} ({where}): {outcome}{error}")
    return lines
