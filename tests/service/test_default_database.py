"""The default database is one per user, in the platform's data directory, wherever a command
runs: `seedgrid serve` and `seedgrid db upgrade` make it (and its directory) and say where it
is, `seedgrid db current` only reads (it makes no file), and a ./seedgrid.db left from the old
default gets one warning saying how to keep using it. Every command here runs as a user runs
it, a real subprocess, with HOME and XDG_DATA_HOME in the test's own directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.api.server import free_port
from service.cli import warn_of_the_old_default
from service.settings import Settings, data_directory, default_database_path
from service.storage.db import head_revision
from tests.conftest import ROOT
from tests.seedgrid_process import SeedgridProcess


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: no SEEDGRID_ variable, HOME in the test's directory."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SEEDGRID_") and k not in {"XDG_DATA_HOME", "RAY_ADDRESS"}
    }
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT), **extra}


def seedgrid(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


@pytest.mark.skipif(sys.platform in ("darwin", "win32"), reason="the XDG rule is Linux's")
def test_the_default_is_in_the_users_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEEDGRID_DATABASE_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert data_directory() == tmp_path / "home" / ".local" / "share" / "seedgrid"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # not absolute: ignored, as XDG says
    assert data_directory() == tmp_path / "home" / ".local" / "share" / "seedgrid"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_database_path() == tmp_path / "xdg" / "seedgrid" / "seedgrid.db"
    assert Settings().database_url == f"sqlite:///{tmp_path / 'xdg' / 'seedgrid' / 'seedgrid.db'}"
    monkeypatch.chdir(tmp_path)
    assert Settings().database_url != "sqlite:///./seedgrid.db"


def test_db_current_reads_only_and_every_directory_finds_the_same_database(
    tmp_path: Path, home: Path
) -> None:
    env = user_env(home, XDG_DATA_HOME=str(tmp_path / "xdg"))
    default = tmp_path / "xdg" / "seedgrid" / "seedgrid.db"
    elsewhere, other = tmp_path / "elsewhere", tmp_path / "other"
    elsewhere.mkdir()
    other.mkdir()
    before = seedgrid("db", "current", cwd=elsewhere, env=env)
    assert before.returncode == 2, before
    assert before.stderr.startswith(f"error: there is no database at {default} (the default; ")
    assert files_under(tmp_path) == []  # no database made, here or anywhere

    made = seedgrid("db", "upgrade", cwd=elsewhere, env=env)
    assert made.returncode == 0, made.stderr
    assert f"database {default} (the default; SEEDGRID_DATABASE_URL selects another)" in (
        made.stdout
    )
    assert default.is_file() and files_under(elsewhere) == []
    found = seedgrid("db", "current", cwd=other, env=env)
    assert found.returncode == 0, found.stderr
    assert f"database {default} (the default;" in found.stdout
    assert f"revision {head_revision()} (head)" in found.stdout
    assert files_under(other) == [] and found.stderr == ""


def test_an_old_default_database_here_gets_one_warning_saying_how_to_keep_it(
    tmp_path: Path, home: Path
) -> None:
    env = user_env(home, XDG_DATA_HOME=str(tmp_path / "xdg"))
    project = tmp_path / "project"
    project.mkdir()
    old = project / "seedgrid.db"
    made = seedgrid("db", "upgrade", "--database-url", f"sqlite:///{old}", cwd=project, env=env)
    assert made.returncode == 0 and "warning" not in made.stderr, made.stderr  # a URL is set

    warned = seedgrid("db", "current", cwd=project, env=env)
    assert warned.returncode == 2  # the default database, which does not exist yet
    (warning,) = [line for line in warned.stderr.splitlines() if line.startswith("warning:")]
    assert f"warning: {old} is seedgrid's old default database; the default is now " in warning
    keep = re.search(r"set (SEEDGRID_DATABASE_URL)=(\S+), or move it to ", warning)
    assert keep is not None, warning
    kept = seedgrid("db", "current", cwd=project, env={**env, keep[1]: keep[2]})
    assert kept.returncode == 0 and kept.stderr == "", kept.stderr
    assert f"database sqlite:///{old}: revision {head_revision()} (head)" in kept.stdout


def test_no_warning_where_the_old_and_the_new_default_are_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SEEDGRID_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    default_database_path().parent.mkdir()
    default_database_path().touch()
    monkeypatch.chdir(default_database_path().parent)
    warn_of_the_old_default(Settings())
    assert capsys.readouterr().err == ""


def test_serve_makes_the_default_database_and_its_directory_and_says_where(
    tmp_path: Path, home: Path
) -> None:
    port = free_port()
    env = user_env(home, SEEDGRID_PORT=str(port))
    default = home / ".local" / "share" / "seedgrid" / "seedgrid.db"
    # the API alone: no dispatcher, so no Ray to start
    server = SeedgridProcess("serve", ["serve", "--no-dispatch"], env, tmp_path)
    try:
        server.wait_healthy()
        assert (
            f"database {default} (the default; SEEDGRID_DATABASE_URL selects another): "
            "schema upgraded from an empty database" in server.log()
        )
        assert default.is_file()
    finally:
        server.stop()
