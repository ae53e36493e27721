"""A seedgrid command that started a local Ray ends it when it is stopped: SIGTERM to
`seedgrid serve` or `seedgrid run` while a run trains leaves no process of the command's
session (Ray's GCS, raylet and workers, and the dashboard and runtime-env agents the raylet
started, which outlived the command by about a minute when it ended without Ray's shutdown) a
few seconds later. Real subprocesses, each the leader of its own session. (`seedgrid
dispatcher` ends Ray the same way, in its own SIGTERM handling; it left nothing before.)"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from service.api.server import free_port
from tests.cluster import alive_in_sessions, kill_sessions, run_ids_of
from tests.seedgrid_process import SeedgridProcess

# The processes a raylet starts: the ones that outlived the command.
AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}
LONG = {
    "name": "long",
    "trainer": "collapse",
    "config": {"n_samples": 64, "steps": 10**7},
    "seeds": 1,
}
ACTIVE = re.compile(r"dispatcher \S+ is active")
GONE_WITHIN_S = 10.0
# A line of Ray's logger: "2026-12-07 18:56:25,423	INFO worker.py:2038 -- Started a local ..."
RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+[A-Z]+ \S+\.py:\d+ -- ", re.M)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", ["serve", "run"])
def test_sigterm_ends_every_process_the_command_started(command: str, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_") and k != "RAY_ADDRESS"
    }
    env.update(
        SEEDGRID_DATABASE_URL=database_url,
        SEEDGRID_RAY_NUM_CPUS="1",
        SEEDGRID_PORT=str(free_port()),
        SEEDGRID_LOG_LEVEL="info",
    )
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps(LONG))
    args = ["serve"] if command == "serve" else ["run", str(spec)]
    process = SeedgridProcess(command, args, env, tmp_path)
    session = process.process.pid
    try:
        if command == "serve":
            process.wait_for_log(ACTIVE, timeout_s=120)
            process.wait_healthy()
            created = httpx.post(f"{process.url}/experiments", json=LONG, timeout=60)
            assert created.status_code == 201, created.text
        deadline = time.monotonic() + 120
        while not any(run_ids_of(p) for p in alive_in_sessions([session])):
            assert time.monotonic() < deadline, f"no run started:\n{process.log()}"
            time.sleep(0.1)
        titles = {p.title for p in alive_in_sessions([session])}
        assert AGENTS <= titles, titles  # what used to be left behind is there to end

        assert process.terminate(timeout_s=60) in {0, -signal.SIGTERM}, process.log()
        deadline = time.monotonic() + GONE_WITHIN_S
        while left := alive_in_sessions([session]):
            assert time.monotonic() < deadline, (
                f"left {GONE_WITHIN_S:g} s after `seedgrid {command}` ended: "
                f"{[(p.pid, p.title[:60]) for p in left]}\n{process.log()}"
            )
            time.sleep(0.1)
        assert "Traceback" not in process.log()
        # `run`: Ray's own log lines stay out of the command's output (issue 39), which says
        # which Ray in its own words; a server's log keeps Ray's "Started a local Ray instance."
        if command == "run":
            assert not RAY_LOG_LINE.search(process.log()), process.log()
            assert "Ray local (started here)" in process.log()
        else:
            assert RAY_LOG_LINE.search(process.log()), process.log()
    finally:
        kill_sessions([session])
        process.stop()
