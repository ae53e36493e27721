"""The `seedgrid` command: clear one-line errors for bad settings and bad spec files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def seedgrid(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


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
