"""The `seedgrid` command: clear one-line errors for bad settings and bad spec files, where
the client commands look for the service, and the tables' factor abbreviations."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from service.cli import abbreviations
from tests.seedgrid_process import SeedgridProcess


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
        tmp_path: Path) -> None:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_")}
    env = {**clean, "SEEDGRID_DATABASE_URL": f"sqlite:///{tmp_path / 'seedgrid.db'}"}
    # the API alone: no dispatcher, so no Ray to start
    server = SeedgridProcess("serve", ["serve", "--no-dispatch", "--port", str(port)], env,
                             tmp_path)
    server.port, server.url = port, f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy()
        found = subprocess.run([sys.executable, "-m", "service.cli", "list"], capture_output=True,
                               text=True, timeout=60, env={**clean, "SEEDGRID_PORT": str(port)})
        assert found.returncode == 0, found.stderr
        assert "no experiments" in found.stdout
        # a wildcard SEEDGRID_HOST (what `serve` listens on) is reached on loopback
        wildcard = subprocess.run(
            [sys.executable, "-m", "service.cli", "list", "--json"], capture_output=True,
            text=True, timeout=60,
            env={**clean, "SEEDGRID_HOST": "0.0.0.0", "SEEDGRID_PORT": str(port)})
        assert wildcard.returncode == 0 and wildcard.stdout.strip() == "[]", wildcard.stderr
        # elsewhere, the error says which address was tried and where it came from
        other = free_port()
        missed = subprocess.run([sys.executable, "-m", "service.cli", "list"],
                                capture_output=True, text=True, timeout=60,
                                env={**clean, "SEEDGRID_PORT": str(other)})
        assert missed.returncode == 2
        assert f"http://127.0.0.1:{other}" in missed.stderr
        assert "from SEEDGRID_PORT" in missed.stderr
    finally:
        server.stop()
    bad = subprocess.run([sys.executable, "-m", "service.cli", "list"], capture_output=True,
                         text=True, timeout=60, env={**clean, "SEEDGRID_PORT": "80000"})
    assert bad.returncode == 2 and "SEEDGRID_PORT" in bad.stderr


def test_factor_abbreviations_are_short_and_distinct() -> None:
    short = abbreviations(["stop_gradient", "frustration_spread", "r", "step_growth", "lr"])
    assert short == {"stop_gradient": "sg", "frustration_spread": "fs", "step_growth": "stgr"}
    assert len(set(short.values())) == len(short)
