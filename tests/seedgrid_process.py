"""`seedgrid` commands as real subprocesses for tests: `python -m service.cli ARGS`, each the
leader of its own session, its output in a log file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


class SeedgridProcess:
    """`python -m service.cli ARGS` in its own process group, its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.port = int(env.get("SEEDGRID_PORT", 0))
        self.url = f"http://127.0.0.1:{self.port}"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: re.Pattern[str], timeout_s: float = 45) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = pattern.search(self.log())
            if match:
                return match
            assert self.process.poll() is None, f"{self.name} exited:\n{self.log()}"
            time.sleep(0.05)
        raise AssertionError(f"{self.name} never logged {pattern.pattern!r}:\n{self.log()}")

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/healthz", timeout=10).json()

    def wait_healthy(self, timeout_s: float = 45) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"{self.name} exited:\n{self.log()}"
            try:
                return self.health()
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError(f"{self.name} did not answer /healthz:\n{self.log()}")

    def terminate(self, timeout_s: float = 30) -> int:
        """SIGTERM, as Kubernetes and compose stop a container; the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def stop(self) -> None:
        """Kill what is left of the process group (teardown)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)
