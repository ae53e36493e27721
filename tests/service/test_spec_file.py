"""Spec files are read strictly (service.spec_file): a YAML alias bomb is refused by the real
`seedgrid submit` process in 100 MB and at no more CPU time than a harmless file of its size
costs the same command, and every YAML or JSON construct that has no JSON
form is one line naming the file, exit status 2, while the YAML a person writes (anchors, merge
keys, quoted dates) and every bundled example read as before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from service import cli
from service.spec_file import MAX_SPEC_CHARS, MAX_SPEC_FILE_BYTES, SpecFileError, load_spec_file

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens there: a spec that got past the loader would fail differently.
NOWHERE = "http://127.0.0.1:9"
# Nine aliases of nine aliases, nine deep: 9^9 (387 million) strings once expanded.
BOMB = "".join(
    [f"a0: &a0 [{', '.join(['lol'] * 9)}]\n"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)]
    + ["name: bomb\ntrainer: collapse\n"]
)


# The bomb with every alias replaced by a plain word of its length: the same bytes to read,
# nothing to expand.
HARMLESS = BOMB
for _level in range(1, 9):
    HARMLESS = HARMLESS.replace(f"*a{_level - 1}", "lol")
assert len(HARMLESS) == len(BOMB)


# Runs a command as its only child: a small parent, so that the child's peak resident memory is
# its own (a child forked from pytest would count pytest's pages), limited to 2 GiB of address
# space (so that a loader without a bound cannot take the machine's memory) and killed after a
# timeout. Prints the exit status, the child's CPU seconds, its peak resident MB and its stderr
# as JSON.
MEASURE = """
import json, resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
try:
    done = subprocess.run(sys.argv[2:], timeout=float(sys.argv[1]), stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    status, stderr = done.returncode, done.stderr
except subprocess.TimeoutExpired as exc:
    status, stderr = None, str(exc)
child = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"status": status, "cpu_s": child.ru_utime + child.ru_stime,
                  "peak_mb": child.ru_maxrss / 1024, "stderr": stderr}))
"""


def peak_of(args: list[str], timeout_s: float) -> dict[str, Any]:
    """A command's exit status (None: killed at the timeout), CPU seconds, peak resident MB and
    stderr."""
    measured = subprocess.run(
        [sys.executable, "-c", MEASURE, str(timeout_s), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,
    )
    assert measured.returncode == 0, measured.stderr
    return json.loads(measured.stdout)


def submit(path: Path) -> dict[str, Any]:
    return peak_of(
        [sys.executable, "-m", "service.cli", "submit", str(path), "--url", NOWHERE], timeout_s=60
    )


def test_an_alias_bomb_is_refused_in_100_mb_at_the_cost_of_a_harmless_file(
    tmp_path: Path,
) -> None:
    """Measured against the same command on HARMLESS in the same run, in CPU seconds: both
    include the interpreter's start-up (about 0.65 s of CPU here; the harmless file, which goes
    on to its request, about 0.8 s), which an absolute wall-clock bound (2 s) mixed with how
    busy the machine was. An unbounded loader expands 9^9 strings: minutes, or the 2 GiB."""
    bomb, harmless = tmp_path / "bomb.yaml", tmp_path / "harmless.yaml"
    bomb.write_text(BOMB)
    harmless.write_text(HARMLESS)
    baseline = submit(harmless)
    assert baseline["status"] == 2 and "cannot reach" in baseline["stderr"], baseline
    run = submit(bomb)
    stderr = run["stderr"]
    assert run["status"] == 2, run
    assert run["cpu_s"] < 1.5 * baseline["cpu_s"] and run["peak_mb"] < 100, (run, baseline)
    assert stderr.startswith(f"error: spec file {bomb}: line ") and stderr.count("\n") == 1
    assert f"expands to more than {MAX_SPEC_CHARS:,} characters" in stderr


REFUSED = {
    "recursive.yaml": ("name: x\ngrid: &g {r: *g}\n", "line 2: a recursive alias"),
    "recursive_list.yaml": ("name: x\nseeds: &s [1, *s]\n", "line 2: a recursive alias"),
    "binary.yaml": ("name: !!binary aGVsbG8=\n", "line 1: the tag !!binary has no JSON type"),
    "timestamp.yaml": ("name: 2024-05-01\n", "line 1: 2024-05-01 is a YAML timestamp"),
    "set.yaml": ("grid: !!set {a, b}\n", "line 1: the tag !!set has no JSON type"),
    "omap.yaml": ("grid: !!omap [a: 1]\n", "line 1: the tag !!omap has no JSON type"),
    "python.yaml": (
        "name: !!python/object:os.system {}\n",
        "line 1: the tag !!python/object:os.system has no JSON type",
    ),
    "local_tag.yaml": ("config:\n  lr: !float 0.1\n", "line 2: the tag !float has no JSON type"),
    "nan.yaml": ("config: {lr: .nan}\n", "line 1: .nan is not a JSON number"),
    "huge_float.yaml": ("config:\n  lr: 1.0e+400\n", "line 2: 1.0e+400 is not a JSON number"),
    "int_key.yaml": ("grid:\n  1: [a]\n", "line 2: the key 1 is not a string"),
    "bool_key.yaml": ("config: {on: true}\n", "line 1: the key on is not a string"),
    "list_key.yaml": ("? [a, b]\n: 1\n", "line 1: the key a list or mapping is not a string"),
    "deep.yaml": ("x: " + "[" * 5000 + "]" * 5000 + "\n", "is nested too deeply"),
    "two_documents.yaml": ("name: a\n---\nname: b\n", "is not valid YAML: "),
    "nan.json": ('{"config": {"lr": NaN}}', "NaN is not a JSON number"),
    "infinity.json": ('{"config": {"lr": -Infinity}}', "-Infinity is not a JSON number"),
    "deep.json": ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "is nested too deeply"),
    "broken.json": ('{"name": ', "is not valid JSON: "),
    "list.yaml": ("- name: x\n", "must hold a mapping"),
    # on 674b730 the next four were a traceback (Python converts at most 4,300 digits) or a
    # silently kept last key
    "bigint.yaml": ("name: x\nseeds: " + "9" * 5000 + "\n", "line 2: the integer 999999999999"),
    "bigint.json": ('{"seeds": ' + "9" * 5000 + "}", "has 5,000 digits: at most 400 are read"),
    "duplicate.yaml": (
        "name: x\nconfig:\n  lr: 0.1\n  lr: 0.2\n",
        "line 4: the key 'lr' appears twice in one mapping",
    ),
    "duplicate.json": ('{"name": "x", "name": "y"}', "the key 'name' appears twice"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_json_cannot_say_is_one_line_naming_the_file(name: str, tmp_path: Path) -> None:
    text, expected = REFUSED[name]
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(cli.app, ["submit", str(path), "--url", NOWHERE])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: spec file {path}"), result.output
    assert expected in result.output and result.output.count("\n") == 1, result.output
    assert "Traceback" not in result.output and "cannot reach" not in result.output


def test_the_yaml_people_write_reads_as_json_does(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: anchors\n"
        "trainer: collapse\n"
        "base: &base {n_samples: 64, steps: 50, lr: 0.5}\n"
        "config:\n  <<: *base\n  steps: 100\n"
        "grid: {r: &levels [0.0, 0.5], other: *levels}\n"
        "seeds: 3\n"
        "notes: {date: '2024-05-01', none: null, yes_: yes, hex: 0x10,\n"
        "        big: 18446744073709551616}\n"
    )
    assert load_spec_file(path) == {
        "name": "anchors",
        "trainer": "collapse",
        "base": {"n_samples": 64, "steps": 50, "lr": 0.5},
        "config": {"n_samples": 64, "steps": 100, "lr": 0.5},
        "grid": {"r": [0.0, 0.5], "other": [0.0, 0.5]},
        "seeds": 3,
        "notes": {"date": "2024-05-01", "none": None, "yes_": True, "hex": 16, "big": 2**64},
    }
    with pytest.raises(SpecFileError, match=r"^expected a \.json, \.yaml or \.yml spec file"):
        load_spec_file(tmp_path / "README.md")


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_example_reads_as_before(path: Path) -> None:
    assert load_spec_file(path) == yaml.safe_load(path.read_text())


def test_a_file_over_the_size_limit_is_refused_by_its_size_before_it_is_read(
    tmp_path: Path,
) -> None:
    # 20 MB of YAML was refused on 674b730 only once parsed (20 s), as if it expanded too much
    big = tmp_path / "big.yaml"
    with big.open("w") as out:
        out.write("name: big\ntrainer: collapse\nnotes: |\n")
        out.write(("  " + "x" * 1000 + "\n") * (MAX_SPEC_FILE_BYTES // 1000 + 10))
    with pytest.raises(SpecFileError, match=r"bytes: a spec file may be at most 16,777,216"):
        load_spec_file(big)
    result = CliRunner().invoke(cli.app, ["submit", str(big), "--url", NOWHERE])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


def test_the_largest_numbers_a_config_may_hold_still_read(tmp_path: Path) -> None:
    path = tmp_path / "numbers.yaml"
    path.write_text("name: x\nconfig:\n  steps: " + "9" * 400 + "\n  lr: 1.0e+308\n")
    assert load_spec_file(path)["config"] == {"steps": int("9" * 400), "lr": 1e308}
