"""`seedgrid` commands in processes forked from one that has imported the CLI already: each
command runs in a fresh process of its own, as a user's does, without paying the CLI's imports
(seconds each on a busy machine) once per command."""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CliResult:
    returncode: int | None  # None: still running at the timeout (then killed)
    stdout: str
    stderr: str


def _run_cli(args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The child: the command's environment, directory and output files, then the CLI's main
    (whose SystemExit is the process's exit status)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
    sys.argv = ["seedgrid", *args]
    from service.cli import main

    main()


class CliForks:
    """Runs `seedgrid ARGS` in a process forked from a server that preloaded `service.cli`."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["service.cli", __name__])
        self.count = 0

    def run(
        self, args: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float
    ) -> CliResult:
        self.count += 1
        stdout = self.output_dir / f"{self.count}.out"
        stderr = self.output_dir / f"{self.count}.err"
        process = self.context.Process(
            target=_run_cli, args=(args, env, str(cwd), str(stdout), str(stderr))
        )
        process.start()
        process.join(timeout_s)
        if process.is_alive():
            process.kill()
            process.join()
            code = None
        else:
            code = process.exitcode
        return CliResult(code, _text(stdout), _text(stderr))


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
