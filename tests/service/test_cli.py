"""The `seedgrid` command: clear one-line errors for bad settings and bad spec files, where
the client commands look for the service, the tables' factor abbreviations, and what `stats`
and `compare` show of the primary variance test (against a stats payload of service.analysis.stats,
served by a mock transport)."""

from __future__ import annotations

import csv
import email.utils
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from rich.console import Console
from sqlmodel import Session
from typer.testing import CliRunner

from api_schemas import Comparison, ConditionStats, ExperimentStatus, RunStatus
from api_schemas.stats_fields import COMPARISON_FIELDS, CONDITION_FIELDS
from service import cli
from service.analysis.stats import compare, experiment_stats
from service.cli import abbreviations, remote, render
from service.cli.runlog import run_log_lines
from service.client import Client
from service.experiments.views import experiment_detail
from service.storage.db import Experiment, Run, make_engine, upgrade_database
from tests.seedgrid_process import SeedgridProcess


def seedgrid(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_bad_database_url_stops_with_the_variable_named() -> None:
    result = seedgrid("serve", env={"SEEDGRID_DATABASE_URL": "mysql://db/x"})
    assert result.returncode == 2
    assert "SEEDGRID_DATABASE_URL" in result.stderr and "Traceback" not in result.stderr


def test_bad_spec_files_are_named(tmp_path: Path) -> None:
    missing = seedgrid("submit", str(tmp_path / "none.yaml"))
    assert missing.returncode == 2 and "none.yaml" in missing.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = seedgrid("submit", str(broken))
    assert result.returncode == 2 and "broken.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_service_is_a_clear_error(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\ntrainer: collapse\n")
    result = seedgrid("submit", str(spec), "--url", "http://127.0.0.1:9")
    assert result.returncode == 2 and "cannot reach the seedgrid API" in result.stderr


def test_a_file_that_is_not_a_spec_names_the_types_expected(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# not a spec\n")
    result = seedgrid("submit", str(readme))
    assert result.returncode == 2
    assert "expected a .json, .yaml or .yml spec file, got README.md" in result.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_port_listens_where_asked_and_clients_find_it_via_seedgrid_port(
    tmp_path: Path,
) -> None:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_")}
    env = {**clean, "SEEDGRID_DATABASE_URL": f"sqlite:///{tmp_path / 'seedgrid.db'}"}
    # the API alone: no dispatcher, so no Ray to start
    server = SeedgridProcess(
        "serve", ["serve", "--no-dispatch", "--port", str(port)], env, tmp_path
    )
    server.port, server.url = port, f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy()
        found = subprocess.run(
            [sys.executable, "-m", "service.cli", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**clean, "SEEDGRID_PORT": str(port)},
        )
        assert found.returncode == 0, found.stderr
        assert "no experiments" in found.stdout
        # a wildcard SEEDGRID_HOST (what `serve` listens on) is reached on loopback
        wildcard = subprocess.run(
            [sys.executable, "-m", "service.cli", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**clean, "SEEDGRID_HOST": "0.0.0.0", "SEEDGRID_PORT": str(port)},
        )
        assert wildcard.returncode == 0 and wildcard.stdout.strip() == "[]", wildcard.stderr
        # elsewhere, the error says which address was tried and where it came from
        other = free_port()
        missed = subprocess.run(
            [sys.executable, "-m", "service.cli", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**clean, "SEEDGRID_PORT": str(other)},
        )
        assert missed.returncode == 2
        assert f"http://127.0.0.1:{other}" in missed.stderr
        assert "from SEEDGRID_PORT" in missed.stderr
    finally:
        server.stop()
    bad = subprocess.run(
        [sys.executable, "-m", "service.cli", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "SEEDGRID_PORT": "80000"},
    )
    assert bad.returncode == 2 and "SEEDGRID_PORT" in bad.stderr


def test_factor_abbreviations_are_short_and_distinct() -> None:
    short = abbreviations(["stop_gradient", "frustration_spread", "r", "step_growth", "lr"])
    assert short == {"stop_gradient": "sg", "frustration_spread": "fs", "step_growth": "stgr"}
    assert len(set(short.values())) == len(short)


def stats_payload(seeds: int = 8) -> dict[str, Any]:
    """/stats of a 2 x 2 grid whose lr=0.1 cells spread 10 times wider, every cell on the same
    seeds (so its comparisons pair up), as the API serves it."""
    grid = {"lr": [0.1, 0.2], "wd": [0, 1]}
    rng = np.random.default_rng(0)
    runs, run_seeds = [], []
    for lr in grid["lr"]:
        for wd in grid["wd"]:
            for seed, value in enumerate(rng.normal(1 + wd, 1.0 if lr == 0.1 else 0.1, seeds)):
                runs.append(({"lr": lr, "wd": wd}, f"lr={lr},wd={wd}", float(value)))
                run_seeds.append(seed)
    stats = experiment_stats(metric="loss", grid=grid, runs=runs, seeds=run_seeds)
    return json.loads(stats.model_dump_json())


def comparison_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The compact comparison table's header and rows, cell by cell (cells are apart by two
    spaces or more, and hold single spaces only)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pair "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or line.startswith(("primary test:", "factors:", "!n:")):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return header, rows


def holm_mark(p: float) -> str:
    return "**" if p < 0.01 else "*" if p < 0.05 else ""


def test_the_compact_table_shows_the_primary_test_and_its_holm_p_per_factor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = stats_payload()
    monkeypatch.setattr(render, "console", Console(width=160, record=True))
    cli.print_stats(stats)
    shown = render.console.export_text()
    assert max(len(line) for line in shown.splitlines()) <= cli.COMPACT_WIDTH
    # the title (wrapped at the table's width) names the test and the adjustment
    assert (
        "variance comparisons of loss: var_a / var_b within cells, primary test; Holm p "
        "adjusted per factor"
    ) in " ".join(shown.split())
    header, rows = comparison_table(shown)
    assert header == ["pair", "within", "n", "pairing", "var ratio", "primary ci95", "Holm p", "!"]
    assert len(rows) == len(stats["comparisons"]) == 6
    marks = []
    for row, c in zip(rows, stats["comparisons"], strict=True):
        within = (
            "pooled"
            if c["within"] is None
            else ", ".join(f"{k}={v}" for k, v in c["within"].items())
        )
        assert row[:4] == [
            f"{c['factor']}: {c['a']} vs {c['b']}",
            within,
            f"{c['n_a']}/{c['n_b']}",
            c["pairing"],
        ]
        assert row[4] == f"{c['var_ratio']:.3g}"
        low, high = c["primary_ci95"]
        assert row[5] == f"[{low:.2g}, {high:.2g}]"
        p = c["primary_p_holm_factor"]
        mark = holm_mark(p)
        assert row[6] == f"{p:.3g}" + (f" {mark}" if mark else ""), (row, c)
        marks.append(mark)
    # the data make every mark appear: lr's comparisons pass, wd's do not
    assert set(marks) == {"**", "*", ""}
    assert {c["pairing"] for c in stats["comparisons"]} == {"paired"}

    # 2 seeds: no ratio is rejected, so every interval is [0, inf]: the rows that cannot say
    # anything are one line under the table
    few = stats_payload(seeds=2)
    assert all(c["primary_ci95"] == [0.0, None] for c in few["comparisons"])
    monkeypatch.setattr(render, "console", Console(width=160, record=True))
    cli.print_stats(few)
    shown = render.console.export_text()
    assert comparison_table(shown)[1] == []
    assert "6 more comparisons cannot say anything" in " ".join(shown.split())
    # an interval unbounded above only: its row shows inf
    few["comparisons"][0]["primary_ci95"] = [0.37, None]
    monkeypatch.setattr(render, "console", Console(width=160, record=True))
    cli.print_stats(few)
    _, rows = comparison_table(render.console.export_text())
    assert rows[0][5] == "[0.37, inf]"


Handler = dict[str, Any]


def mock_service(monkeypatch: pytest.MonkeyPatch, answers: Handler) -> list[httpx.Request]:
    """The client commands talk to `answers` (path -> JSON) instead of a service; the requests
    they sent, in order."""
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=answers[request.url.path])

    def client(url: str | None, timeout_s: float) -> Client:
        return Client("http://seedgrid.test", transport=httpx.MockTransport(handle))

    monkeypatch.setattr(remote, "connect", client)
    monkeypatch.setattr(render, "console", Console(width=100, record=True))
    return sent


DETAIL = {
    "name": "grid",
    "status": "running",
    "message": None,
    "counts": {
        "queued": 0,
        "pending": 0,
        "running": 8,
        "completed": 32,
        "failed": 0,
        "diverged": 0,
        "cancelled": 0,
        "stopped": 0,
    },
}


def test_stats_asks_for_the_scale_and_says_first_that_p_values_are_interim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = {
        **stats_payload(),
        "scale": "log",
        "interim": True,
        "interim_note": "interim look: the adaptive rule is still adding seeds",
    }
    sent = mock_service(monkeypatch, {"/experiments/7": DETAIL, "/experiments/7/stats": stats})
    result = CliRunner().invoke(cli.app, ["stats", "7", "--scale", "log"])
    assert result.exit_code == 0, result.output
    (asked,) = [r for r in sent if r.url.path.endswith("/stats")]
    assert asked.url.params["scale"] == "log"
    shown = render.console.export_text()
    assert shown.index(stats["interim_note"]) < shown.index("per-condition loss")
    assert "variance comparisons of loss (log scale)" in shown

    # --all: every p-value says whether it is raw or which family Holm adjusted it over
    monkeypatch.setattr(render, "console", Console(width=200, record=True))
    assert CliRunner().invoke(cli.app, ["stats", "7", "--all"]).exit_code == 0
    everything = render.console.export_text()
    first = stats["comparisons"][0]
    assert f"  primary_p: {first['primary_p']:.6g} (raw)" in everything
    assert (
        f"  primary_p_holm_factor: {first['primary_p_holm_factor']:.6g} "
        "(Holm, over the factor's comparisons)"
    ) in everything
    assert (
        f"  f_test_p_holm_all: {first['f_test_p_holm_all']:.6g} (Holm, over every comparison)"
    ) in everything
    assert f"  mean_p: {first['mean_p']:.6g} (raw)" in everything
    assert everything.index(stats["interim_note"]) < everything.index("comparison lr:")

    refused = CliRunner().invoke(cli.app, ["stats", "7", "--scale", "cubic"])
    assert refused.exit_code == 2 and "--scale: expected raw or log" in refused.output


def test_compare_shows_the_primary_and_mean_tests_with_raw_p_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(1, 1.0, 8), rng.normal(1, 0.1, 8)
    seeds = list(range(8))
    comparison = Comparison(
        factor="experiment", a=1, b=2, within={"lr": 0.1}, **compare(list(a), list(b), seeds, seeds)
    )
    side = {
        "condition": {"lr": 0.1},
        "condition_key": "lr=0.1",
        "condition_b": {"lr": 0.1},
        "condition_key_b": "lr=0.1",
        "a": {"mean": float(a.mean())},
        "b": {"mean": float(b.mean())},
        "comparison": json.loads(comparison.model_dump_json()),
    }
    body = {
        "a": 1,
        "b": 2,
        "trainer": "toy",
        "metric": "loss",
        "total_conditions": 1,
        "offset": 0,
        "next_offset": None,
        "conditions": [side],
        "only_in_a": [],
        "only_in_b": [],
        "config_differences": [{"field": "steps", "a": "300", "b": "600"}],
    }
    mock_service(monkeypatch, {"/compare": body})
    result = CliRunner().invoke(cli.app, ["compare", "1", "2"])
    assert result.exit_code == 0, result.output
    shown = render.console.export_text()
    assert "raw p-values, not adjusted for the conditions compared" in shown
    assert "config steps: 300 in 1, 600 in 2" in shown
    assert "metric loss (raw scale: the metric itself tested; means shown raw)" in " ".join(
        shown.split()
    )
    t = side["comparison"]
    assert t["pairing"] == "paired" and t["mean_test"] == "paired t"
    (row,) = [
        re.split(r"\s{2,}", line.strip())
        for line in shown.splitlines()
        if line.startswith("lr=0.1")
    ]
    low, high = t["primary_ci95"]
    assert row == [
        "lr=0.1",
        "8/8",
        f"{a.mean():.4g}",
        f"{b.mean():.4g}",
        "paired t",
        f"{t['mean_p']:.3g}",
        f"{t['var_ratio']:.3g}",
        f"[{low:.2g}, {high:.2g}]",
        f"{t['primary_p']:.3g}",
    ]
    assert "F p" not in shown and "welch p" not in shown


Answer = tuple[int, dict[str, str], Any]  # status, headers, JSON body (a str: sent as text)


class ScriptedApi(ThreadingHTTPServer):
    """A real HTTP server on loopback standing in for the service (whose 503s and 429s come
    from a locked database or a full queue): each request to a path gets that path's next
    answer, the last one again once they are used up."""

    def __init__(self, answers: dict[str, list[Answer]]) -> None:
        self.answers = answers
        self.requests: list[tuple[float, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?")[0]
                server.requests.append((time.monotonic(), path))
                queue = server.answers[path]
                status, headers, body = queue.pop(0) if len(queue) > 1 else queue[0]
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_port}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __enter__(self) -> ScriptedApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


EXPERIMENT = {**DETAIL, "id": 7, "trainer": "collapse", "n_runs": 40, "adaptive": None}
BUSY = {"detail": "the database is busy; retry after the Retry-After"}


def test_a_503_or_429_is_asked_again_after_its_retry_after(tmp_path: Path) -> None:
    answers: dict[str, list[Answer]] = {
        "/experiments/7": [
            (503, {"Retry-After": "1"}, BUSY),
            (429, {"Retry-After": "1"}, {"detail": "the queue is full"}),
            (200, {}, EXPERIMENT),
        ],
        "/experiments/7/export": [
            (503, {"Retry-After": "0"}, "<html>busy proxy</html>"),
            (200, {}, "id,seed\n1,0\n"),
        ],
    }
    with ScriptedApi(answers) as api:
        started = time.monotonic()
        result = CliRunner().invoke(cli.app, ["status", "7", "--url", api.url])
        assert result.exit_code == 0, result.output
        times = [t for t, path in api.requests if path == "/experiments/7"]
        assert len(times) == 3 and times[1] - times[0] >= 1.0 and times[2] - times[1] >= 1.0
        assert time.monotonic() - started >= 2.0
        assert (
            "GET /experiments/7: 503 the database is busy; retry after the Retry-After; "
            "retrying in 1 s (1 of 3)"
        ) in result.output
        assert "GET /experiments/7: 429 the queue is full; retrying in 1 s (2 of 3)" in (
            result.output
        )
        assert "experiment 7 grid (collapse): running; 40 runs" in result.output

        target = tmp_path / "runs.csv"
        exported = CliRunner().invoke(cli.app, ["export", "7", "--url", api.url, "-o", str(target)])
        assert exported.exit_code == 0, exported.output
        assert "503 <html>busy proxy</html>; retrying in 0 s (1 of 3)" in exported.output
        assert target.read_text() == "id,seed\n1,0\n"


def test_retries_are_bounded_in_number_and_in_time() -> None:
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(hours=1), usegmt=True)
    answers: dict[str, list[Answer]] = {
        "/experiments/1": [(503, {"Retry-After": "0"}, BUSY)],
        "/experiments/2": [(429, {"Retry-After": "3600"}, {"detail": "the queue is full"})],
        "/experiments/3": [(503, {"Retry-After": when}, BUSY)],
        "/experiments/4": [(404, {}, {"detail": "no experiment 4"})],
    }
    with ScriptedApi(answers) as api:
        always = CliRunner().invoke(cli.app, ["status", "1", "--url", api.url])
        assert always.exit_code == 2
        assert [p for _, p in api.requests].count("/experiments/1") == 1 + cli.MAX_RETRIES
        assert always.output.splitlines()[-1] == (
            f"error: GET /experiments/1: 503 {BUSY['detail']} (after {cli.MAX_RETRIES} retries "
            "over 0 s); it asks to retry in 0 s"
        )
        # a wait longer than the retries may take in all is not waited for
        for experiment_id in (2, 3):
            started = time.monotonic()
            later = CliRunner().invoke(cli.app, ["status", str(experiment_id), "--url", api.url])
            assert later.exit_code == 2 and time.monotonic() - started < 5
            assert [p for _, p in api.requests].count(f"/experiments/{experiment_id}") == 1
            assert re.search(r"; it asks to retry in (3600|35\d\d) s$", later.output.strip())
        # other errors are not retried
        missing = CliRunner().invoke(cli.app, ["status", "4", "--url", api.url])
        assert missing.exit_code == 2 and "404 no experiment 4" in missing.output
        assert [p for _, p in api.requests].count("/experiments/4") == 1


# The columns of `stats --csv` that hold numbers: every filled cell converts with float().
CSV_NUMBER_COLUMNS = {
    "n",
    "mean",
    "ci_low",
    "ci_high",
    "std",
    "noise_floor_share",
    "n_a",
    "n_b",
    "var_ratio",
    "primary_ci_low",
    "primary_ci_high",
    "primary_p",
    "primary_p_holm_factor",
    "warnings",
}


def test_stats_csv_is_numbers_at_full_precision_and_json_is_the_api_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = stats_payload(seeds=2)  # 2 seeds: the ratio intervals end at inf
    mock_service(monkeypatch, {"/experiments/7": DETAIL, "/experiments/7/stats": stats})
    result = CliRunner().invoke(cli.app, ["stats", "7", "--csv"])
    assert result.exit_code == 0, result.output
    header, *rows = list(csv.reader(io.StringIO(result.stdout)))
    assert len(header) == len(set(header)), header  # unique headers
    assert CSV_NUMBER_COLUMNS <= set(header)
    records = [dict(zip(header, row, strict=True)) for row in rows]
    for record in records:
        for column in CSV_NUMBER_COLUMNS:
            if record[column] != "":
                float(record[column])
    conditions = [r for r in records if r["table"] == "condition"]
    comparisons = [r for r in records if r["table"] == "comparison"]
    assert len(conditions) == len(stats["conditions"]) and len(comparisons) == 6
    for record, c in zip(conditions, stats["conditions"], strict=True):
        # full precision: each number reads back as the API's, not a display rounding
        assert record["condition"] == c["condition_key"]
        assert float(record["mean"]) == c["mean"] and float(record["std"]) == c["std"]
        assert [float(record["ci_low"]), float(record["ci_high"])] == c["ci95"]
        assert int(record["n"]) == c["n"] == 2
    for record, c in zip(comparisons, stats["comparisons"], strict=True):
        assert float(record["var_ratio"]) == c["var_ratio"]
        assert float(record["primary_ci_low"]) == c["primary_ci95"][0]
        assert c["primary_ci95"][1] is None and float(record["primary_ci_high"]) == float("inf")
        assert float(record["primary_p_holm_factor"]) == c["primary_p_holm_factor"]
        assert (int(record["n_a"]), int(record["n_b"])) == (c["n_a"], c["n_b"])

    as_json = CliRunner().invoke(cli.app, ["stats", "7", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == stats


def test_explain_gives_every_stats_field_a_meaning_and_stats_all_prints_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = stats_payload()
    served = {f for c in stats["conditions"] for f in c} | set(ConditionStats.model_fields)
    compared = {f for c in stats["comparisons"] for f in c} | set(Comparison.model_fields)
    # a field /stats gains without a meaning fails here
    assert served - set(CONDITION_FIELDS) == set()
    assert compared - set(COMPARISON_FIELDS) == set()

    monkeypatch.setattr(render, "console", Console(width=300, record=True))
    explained = CliRunner().invoke(cli.app, ["explain", "noise_floor_share"])
    assert explained.exit_code == 0, explained.output
    assert render.console.export_text().strip() == (
        f"noise_floor_share: {CONDITION_FIELDS['noise_floor_share']}"
    )
    typo = CliRunner().invoke(cli.app, ["explain", "var_ratoi"])
    assert typo.exit_code == 2 and "did you mean 'var_ratio'?" in typo.output

    mock_service(monkeypatch, {"/experiments/7": DETAIL, "/experiments/7/stats": stats})
    assert CliRunner().invoke(cli.app, ["stats", "7", "--all"]).exit_code == 0
    everything = render.console.export_text().splitlines()
    legend = everything[everything.index("legend, per condition:") :]
    assert f"  mean: {CONDITION_FIELDS['mean']}" in legend
    assert "legend, per comparison:" in legend
    assert f"  primary_p_holm_factor: {COMPARISON_FIELDS['primary_p_holm_factor']}" in legend


def test_a_yaml_spec_with_a_control_character_is_refused_naming_the_file(tmp_path: Path) -> None:
    spec = tmp_path / "typed.yaml"
    spec.write_text("name: x\x01\ntrainer: collapse\n")
    result = CliRunner().invoke(cli.app, ["submit", str(spec)])
    assert result.exit_code == 2
    assert f"spec file {spec} is not valid YAML: character #x0001 is not allowed (line 1)" in (
        " ".join(result.output.split())
    )
    assert "<unicode string>" not in result.output and "Traceback" not in result.output


def test_errors_say_the_setting_or_the_command_not_the_http_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conflict = (
        "experiment 8 is running (3 runs queued, pending or running): cancel it "
        "(POST /experiments/8/cancel) and delete it once its runs have ended"
    )
    answers: dict[str, list[Answer]] = {
        "/experiments/5": [(401, {}, {"detail": "missing bearer token"})],
        "/experiments/8": [(409, {}, {"detail": conflict})],
    }
    monkeypatch.delenv("SEEDGRID_API_TOKEN", raising=False)
    with ScriptedApi(answers) as api:
        missing = CliRunner().invoke(cli.app, ["status", "5", "--url", api.url])
        assert missing.exit_code == 2
        assert "set SEEDGRID_API_TOKEN to the token it was started with" in missing.output
        assert "bearer" not in missing.output
        monkeypatch.setenv("SEEDGRID_API_TOKEN", "wrong")
        wrong = CliRunner().invoke(cli.app, ["status", "5", "--url", api.url])
        assert "refused the token in SEEDGRID_API_TOKEN" in wrong.output
        busy = CliRunner().invoke(cli.app, ["status", "8", "--url", api.url])
        assert busy.exit_code == 2
        assert "cancel it (`seedgrid cancel 8`) and delete it" in busy.output
        assert "POST /experiments/8/cancel" not in busy.output


RUN = {
    "id": 3,
    "experiment_id": 7,
    "condition": {"lr": 0.1},
    "condition_key": "lr=0.1",
    "seed": 0,
    "attempts": 1,
    "warnings": [],
    "stop": None,
}


def test_runs_of_no_match_say_so_and_runs_that_ended_badly_show_their_last_logged_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    detail = {**EXPERIMENT, "spec": {"metric": "loss"}}
    mock_service(monkeypatch, {"/experiments/7": detail, "/experiments/7/runs": []})
    none = CliRunner().invoke(cli.app, ["runs", "7", "--status", "failed"])
    assert none.exit_code == 0, none.output
    assert render.console.export_text().strip() == "no failed runs in experiment 7"

    failed = {**RUN, "status": "failed", "metrics": {"loss": 0.5}, "error": "ValueError: bad"}
    done = {**RUN, "id": 4, "seed": 1, "status": "completed", "metrics": {"loss": 0.25}}
    done["error"] = None
    mock_service(monkeypatch, {"/experiments/7": detail, "/experiments/7/runs": [failed, done]})
    assert CliRunner().invoke(cli.app, ["runs", "7"]).exit_code == 0
    shown = render.console.export_text()
    assert re.search(r"\b3\s+lr=0.1\s+0\s+failed\s+0.5 \(last\)\s+1\s+ValueError: bad", shown)
    assert re.search(r"\b4\s+lr=0.1\s+1\s+completed\s+0.25\s+1", shown)
    assert "(last): the loss last logged before the run failed" in shown

    # One line per distinct warning, naming the runs that carry it (12 collapsed seeds: one line).
    collapsed = {"message": "label embeddings collapsed"}
    warned = [
        {**done, "id": 10 + seed, "seed": seed, "warnings": [collapsed]} for seed in range(12)
    ]
    warned[0]["warnings"] = [collapsed, {"message": "min_l2 never rose"}]
    mock_service(monkeypatch, {"/experiments/7": detail, "/experiments/7/runs": warned})
    assert CliRunner().invoke(cli.app, ["runs", "7"]).exit_code == 0
    warning_lines = [
        line for line in render.console.export_text().splitlines() if line.startswith("warning")
    ]
    assert warning_lines == [
        "warning on 12 runs (10, 11, 12, 13, 14, 15, 16, 17 and 4 more): label embeddings "
        "collapsed",
        "warning on 1 run (10: lr=0.1, seed 0): min_l2 never rose",
    ]

    lines = run_log_lines(
        {
            **failed,
            "failed_at": None,
            "traceback": "Traceback ...\nValueError: bad\n",
            "attempt_history": [],
        }
    )
    assert lines[1] == "error: ValueError: bad"
    assert lines.index("last logged: loss 0.5") > lines.index("Traceback ...\nValueError: bad")
    assert not any(line.startswith("final metrics") for line in lines)
    completed = run_log_lines({**done, "attempt_history": []})
    assert "final metrics: loss 0.25" in completed


def store_queue(url: str) -> dict[str, int]:
    """Experiments written straight into a database, each with two runs, in this order: first
    (queued), started (running, a run left queued), urgent (queued at priority 5), last
    (queued), done (completed)."""
    upgrade_database(url)
    engine = make_engine(url)
    plan = [
        ("first", ExperimentStatus.queued, 0, [RunStatus.queued] * 2),
        ("started", ExperimentStatus.running, 0, [RunStatus.running, RunStatus.queued]),
        ("urgent", ExperimentStatus.queued, 5, [RunStatus.queued] * 2),
        ("last", ExperimentStatus.queued, 0, [RunStatus.queued] * 2),
        ("done", ExperimentStatus.completed, 0, [RunStatus.completed] * 2),
    ]
    ids = {}
    with Session(engine) as session:
        for name, status, priority, run_statuses in plan:
            experiment = Experiment(
                name=name,
                trainer="collapse",
                metric="min_l2",
                spec={"name": name, "trainer": "collapse"},
                status=status,
                priority=priority,
                n_conditions=1,
                n_runs=2,
            )
            session.add(experiment)
            session.commit()
            assert experiment.id is not None
            ids[name] = experiment.id
            for seed, run_status in enumerate(run_statuses):
                session.add(
                    Run(
                        experiment_id=experiment.id,
                        condition={},
                        condition_key="",
                        seed=seed,
                        trainer="collapse",
                        status=run_status,
                        priority=priority,
                    )
                )
            session.commit()
    engine.dispose()
    return ids


def test_status_says_where_a_queued_experiment_waits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    ids = store_queue(url)
    engine = make_engine(url)
    with Session(engine) as session:
        details = {
            name: experiment_detail(session=session, experiment_id=experiment_id)
            for name, experiment_id in ids.items()
        }
    engine.dispose()
    # the dispatcher's claim order: higher priority first, then the oldest run
    positions = {name: d.queue_position for name, d in details.items()}
    assert positions == {"urgent": 1, "first": 2, "last": 3, "started": None, "done": None}

    waiting = json.loads(details["last"].model_dump_json())
    mock_service(monkeypatch, {f"/experiments/{ids['last']}": waiting})
    assert CliRunner().invoke(cli.app, ["status", str(ids["last"])]).exit_code == 0
    assert "queue position 3: 2 queued experiments start before it" in (
        render.console.export_text()
    )


def test_a_confounded_comparison_is_marked_and_its_fields_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = stats_payload()
    first = stats["comparisons"][0]
    first["confounds"] = [
        {"field": "steps", "a": "4000", "b": "20000"},
        {"field": "lr", "a": "0.5", "b": "0.2"},
    ]
    monkeypatch.setattr(render, "console", Console(width=160, record=True))
    cli.print_stats(stats)
    shown = render.console.export_text()
    _, rows = comparison_table(shown)
    assert rows[0][-1].startswith("c") and not any(row[-1].startswith("c") for row in rows[1:])
    pair = f"{first['factor']}: {first['a']} vs {first['b']}"
    assert f"{pair} also changes steps 4000 -> 20000, lr 0.5 -> 0.2" in shown
    assert "c: confounded: the two levels also differ in other config fields" in " ".join(
        shown.split()
    )


def test_rows_that_cannot_say_anything_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: a 4x4 grid at 3 seeds gave 48 rows of [0, inf]; they are one line now."""
    stats = stats_payload()
    within = [c for c in stats["comparisons"] if c["within"] is not None]
    for c in within:
        c["primary_ci95"] = [0.0, None]
    monkeypatch.setattr(render, "console", Console(width=160, record=True))
    cli.print_stats(stats)
    shown = render.console.export_text()
    _, rows = comparison_table(shown)
    assert len(rows) == len(stats["comparisons"]) - len(within)
    assert all(row[1] == "pooled" for row in rows)
    assert f"{len(within)} more comparisons cannot say anything" in " ".join(shown.split())
    one = stats_payload()
    one["comparisons"][1]["primary_ci95"] = [0.0, None]  # a single one stays a row
    monkeypatch.setattr(render, "console", Console(width=160, record=True))
    cli.print_stats(one)
    assert len(comparison_table(render.console.export_text())[1]) == len(one["comparisons"])
