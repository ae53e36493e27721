"""Every `seedgrid ...` command the README and docs/ show runs as written, against a live service
(uvicorn, dispatcher, the session's local Ray, a SQLite file) holding the experiments the docs
speak of: 1 and 2, the bundled example's grid at a tiny config, completed.

The convention the documents follow: a line of a ```bash, ```sh or untagged fence that starts
with `seedgrid `, `$ seedgrid ` or `.venv/bin/seedgrid ` is a command, and is run; output goes in
```console or ```text fences, which are not. A command exits 0 unless its comment starts with
`exit N:` (`seedgrid stats 1 --metric x   # exit 2: not a metric`). The commands are found here,
so a document written later is covered too; those that cannot run in a test are in NOT_RUN,
each with its reason."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_forks import CliForks
from tests.conftest import ROOT, Service
from tests.test_docs import markdown_docs

# Commands that cannot run in a test, by the words they start with, and why.
NOT_RUN = {
    "seedgrid serve": "a long-lived server (the test's own service stands in for it)",
    "seedgrid dispatcher": "a long-lived dispatcher (the test's service has one)",
    "seedgrid run": (
        "starts a service and a Ray of its own; tests/e2e/test_guide_own_code.py runs the "
        "documented one"
    ),
    "seedgrid submit examples/cff_cifar10_paper.yaml": "needs CIFAR-10 on the workers and a GPU",
}
# Words the documents write for a value the reader fills in, and what the test fills in.
PLACEHOLDERS = {"ID": "1"}
# Commands that act on an experiment of their own, not on the documents' experiment 1.
OWN_EXPERIMENT = {"cancel": "running", "delete": "ended"}
# The documents' example specs at a size a test runs in seconds: a tiny config, the first two
# levels of each grid axis, TINY_SEEDS seeds, a condition's seeds in one task (collapse's
# default task holds 8).
TINY: dict[str, dict[str, Any]] = {
    "collapse": {"config": {"n_samples": 64, "steps": 300}},
    "cff": {
        "config": {"image_size": 8, "width": 16, "depth": 2, "epochs": 1, "head_epochs": 1},
        "resources": {"seeds_per_task": 2},
    },
}
TINY_SEEDS = 2
COMMAND_TIMEOUT_S = 90.0
RUN_LANGUAGES = {"", "bash", "sh", "shell"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?(seedgrid .*)$")
EXPECTED_EXIT = re.compile(r"#\s*exit (\d+):")
SHELL_OPERATORS = {"&", "|", "&&", "||", ";"}


@dataclass
class DocCommand:
    text: str  # as written, without its comment: `seedgrid stats 1 --all`
    expected_exit: int
    places: list[str] = field(default_factory=list)  # document:line, every place it is written

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text)


def commands_of(markdown: str) -> list[tuple[int, str, int]]:
    """(line, command without its comment, expected exit status) of each command in the
    document's runnable fences; a line ending in `\\` continues on the next."""
    found = []
    for fence in FENCE.finditer(markdown):
        if fence[1].strip() not in RUN_LANGUAGES:
            continue
        first_line = markdown.count("\n", 0, fence.start(2)) + 1
        lines = fence[2].splitlines()
        number = 0
        while number < len(lines):
            line, start = lines[number].strip(), number
            while line.endswith("\\") and number + 1 < len(lines):
                number += 1
                line = line[:-1].rstrip() + " " + lines[number].strip()
            number += 1
            match = COMMAND.match(line)
            if match is not None:
                exit_code = EXPECTED_EXIT.search(line)
                command = shlex.join(shlex.split(match[1], comments=True))
                found.append((first_line + start, command, int(exit_code[1]) if exit_code else 0))
    return found


def documented_commands() -> list[DocCommand]:
    """Every distinct command of the README's and docs/' runnable fences, in document order."""
    found: dict[str, DocCommand] = {}
    for doc in markdown_docs():
        for line, command, exit_code in commands_of(doc.read_text(encoding="utf-8")):
            entry = found.setdefault(command, DocCommand(command, exit_code))
            entry.places.append(f"{doc.relative_to(ROOT).as_posix()}:{line}")
    return list(found.values())


def not_run_reason(command: DocCommand) -> str | None:
    for prefix, reason in NOT_RUN.items():
        if command.text == prefix or command.text.startswith(prefix + " "):
            return reason
    return None


def test_every_command_not_run_is_still_documented() -> None:
    """NOT_RUN names only commands some document shows: an entry whose command left the docs
    is removed, not kept to excuse a later one."""
    commands = documented_commands()
    assert len(commands) >= 20, [c.text for c in commands]  # the scan finds the docs' commands
    stale = [
        prefix
        for prefix in NOT_RUN
        if not any(c.text == prefix or c.text.startswith(prefix + " ") for c in commands)
    ]
    assert not stale, f"NOT_RUN names commands no document shows: {stale}"


def test_the_scan_follows_the_convention() -> None:
    """Output fences and other programs are not run; an `exit N:` comment sets the expected
    status; a continued line is one command; `$ ` and `.venv/bin/` prefixes are dropped."""
    markdown = (
        "# A page\n\n```console\n$ seedgrid stats 9\n```\n\n"
        "```bash\ncurl -s localhost:8000/healthz\nseedgrid stats 1 \\\n"
        "  --metric x   # exit 2: a diagnostic\n"
        "$ seedgrid list   # the experiments\n```\n\n"
        "```\n.venv/bin/seedgrid plan --ratio 2\n```\n\n"
        "```python\nseedgrid = 1\n```\n"
    )
    assert commands_of(markdown) == [
        (9, "seedgrid stats 1 --metric x", 2),
        (11, "seedgrid list", 0),
        (15, "seedgrid plan --ratio 2", 0),
    ]


def tiny(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec at TINY's size: same trainer, factors, metric and analysis."""
    smaller = TINY[spec["trainer"]]
    spec = {
        **spec,
        "config": {**spec.get("config", {}), **smaller["config"]},
        "grid": {key: levels[:2] for key, levels in spec.get("grid", {}).items()},
        "resources": {**spec.get("resources", {}), **smaller.get("resources", {})},
    }
    if "adaptive" not in spec:  # an adaptive spec's rule sets its seeds
        spec["seeds"] = TINY_SEEDS
    return spec


def tiny_examples(workdir: Path) -> None:
    """`examples/` as the commands see it: each spec of a trainer in TINY made tiny,
    everything else as it is."""
    target = workdir / "examples"
    target.mkdir()
    for source in (ROOT / "examples").iterdir():
        if source.suffix in {".yaml", ".yml"}:
            spec = yaml.safe_load(source.read_text(encoding="utf-8"))
            if spec.get("trainer") in TINY:
                (target / source.name).write_text(yaml.safe_dump(tiny(spec)), encoding="utf-8")
                continue
        (target / source.name).symlink_to(source)


def example_spec(**changes: Any) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "examples" / "collapse_stopgrad.yaml").read_text())
    return {**tiny(spec), **changes}


def own_experiment(service: Service, kind: str) -> int:
    """An experiment for a command that ends or deletes one: running (a run that trains until
    cancelled) or ended."""
    if kind == "running":
        created = service.submit(
            example_spec(
                name="to-cancel", grid={}, seeds=1, config={"n_samples": 64, "steps": 10**7}
            )
        )
        return int(created["id"])
    created = service.submit(example_spec(name="to-delete", grid={}, seeds=1))
    service.wait(created["id"])
    return int(created["id"])


def arguments(command: DocCommand, service: Service) -> tuple[list[str], str | None]:
    """The command's arguments with its placeholders and own experiment filled in, and the
    file its stdout is redirected to, if any."""
    words = command.words[1:]
    for index, word in enumerate(words):
        if word in SHELL_OPERATORS:  # `... &`, `... | head`: the seedgrid command alone
            words = words[:index]
            break
    stdout_file = None
    if ">" in words:
        at = words.index(">")
        stdout_file, words = words[at + 1], words[:at]
    words = [PLACEHOLDERS.get(word, word) for word in words]
    if words and words[0] in OWN_EXPERIMENT:
        position = next(i for i, w in enumerate(words) if w.isdigit())
        words[position] = str(own_experiment(service, OWN_EXPERIMENT[words[0]]))
    return words, stdout_file


@pytest.fixture
def documented_experiments(service: Service) -> Iterator[Service]:
    """Experiments 1 and 2: the bundled example made tiny, completed."""
    created = [service.submit(example_spec(name=name)) for name in ("example", "example-again")]
    for experiment in created:
        assert service.wait(experiment["id"], timeout_s=300)["status"] == "completed"
    assert [e["id"] for e in service.client.get("/experiments").json()] == [2, 1]
    yield service


@pytest.mark.timeout(600)
def test_every_documented_command_runs(documented_experiments: Service, tmp_path: Path) -> None:
    service = documented_experiments
    workdir = tmp_path / "work"
    workdir.mkdir()
    tiny_examples(workdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_")}
    env.update(
        SEEDGRID_URL=service.server.url,
        SEEDGRID_DATABASE_URL=service.database_url,
        COLUMNS="160",
    )
    forks = CliForks(tmp_path)
    failures, ran = [], 0
    for command in documented_commands():
        if not_run_reason(command) is not None:
            continue
        args, stdout_file = arguments(command, service)
        result = forks.run(args, env=env, cwd=workdir, timeout_s=COMMAND_TIMEOUT_S)
        ran += 1
        if stdout_file is not None:
            (workdir / stdout_file).write_text(result.stdout)
        if result.returncode != command.expected_exit:
            failures.append(
                f"{command.text} ({', '.join(command.places)}; ran as seedgrid "
                f"{shlex.join(args)}): exit {result.returncode}, expected "
                f"{command.expected_exit}\n{result.stderr[-1500:]}{result.stdout[-500:]}"
            )
    assert ran >= 20
    assert not failures, "documented commands that fail:\n\n" + "\n\n".join(failures)
