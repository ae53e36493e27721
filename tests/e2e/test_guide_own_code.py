"""The user guide's "Your own training code" runs as written: its code block is the example
file whole, and its command (`seedgrid run ... --trainers FILE`) runs the example grid of that
function trainer to completion on a local Ray, with the statistics printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from service.api.server import free_port
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "own_code" / "mlp_digits.py"


def section(title: str) -> str:
    guide = (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8")
    start = guide.index(f"\n## {title}\n")
    end = guide.index("\n## ", start + 1)
    return guide[start:end]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_guide_shows_the_example_trainer_whole() -> None:
    (code,) = blocks(section("Your own training code"), "python")
    assert code == EXAMPLE.read_text(encoding="utf-8")


@pytest.mark.timeout(400)
def test_the_guide_command_runs_the_function_trainers_grid(tmp_path: Path) -> None:
    (commands,) = blocks(section("Your own training code"), "bash")
    (command,) = commands.strip().splitlines()
    program, *args = shlex.split(command)
    assert program == "seedgrid", command
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_") and k != "RAY_ADDRESS"
    }
    env.update(
        SEEDGRID_DATABASE_URL=f"sqlite:///{tmp_path / 'seedgrid.db'}",
        SEEDGRID_RAY_NUM_CPUS="2",
        SEEDGRID_PORT=str(free_port()),
        COLUMNS="160",
    )
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 conditions x seeds = 12 runs" in done.stdout, done.stdout
    rows = [line for line in done.stdout.splitlines() if re.search(r"init_scale=(0\.5|2\.0)", line)]
    assert len(rows) >= 2, done.stdout
    # every run completed: the condition table says n = 6 for both levels
    for level in ("0.5", "2.0"):
        row = next(line for line in rows if f"init_scale={level}" in line)
        assert re.search(r"\b6\b", row), row
