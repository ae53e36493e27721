"""The `seedgrid` client commands as a user runs them (real subprocesses) against a real service
(uvicorn, dispatcher, local Ray, a SQLite file): watch, the exit status of an experiment whose
runs all failed, the errors that name what to type instead, tables at 80 columns, and delete's
confirmation."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import yaml

from tests.conftest import ROOT, Service

QUICK = {"n_samples": 64, "steps": 300}
# lr 50 makes every collapse run's loss overflow within a few steps: each run ends diverged.
DIVERGING = {"lr": 50.0, "steps": 2000, "log_every": 1}


def seedgrid(service: Service, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--url", service.server.url],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, **env},
    )


def spec_file(tmp_path: Path, **spec: object) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "cli", "trainer": "collapse", "config": QUICK, "grid": {}, "seeds": 1, **spec}
        )
    )
    return str(path)


def test_watch_follows_a_running_experiment_to_its_end(service: Service) -> None:
    created = service.submit(
        {
            "name": "watched",
            "trainer": "collapse",
            "config": {"n_samples": 64, "steps": 3000},
            "grid": {"r": [0.0, 0.5]},
            "seeds": 2,
        }
    )
    before = service.client.get(f"/experiments/{created['id']}").json()
    assert before["status"] in {"queued", "running"}
    watched = seedgrid(service, "watch", str(created["id"]), "--poll", "0.2")
    assert watched.returncode == 0, watched.stderr
    after = service.client.get(f"/experiments/{created['id']}").json()
    assert after["status"] == "completed" and after["counts"]["completed"] == 4
    # the last frame: each condition with its 2 runs done, then the experiment's end
    for key in ("r=0.0", "r=0.5"):
        assert re.search(rf"{re.escape(key)}\s.*2/2\s+completed 2", watched.stdout), watched.stdout
    assert f"experiment {created['id']} completed: completed 4" in watched.stdout


def test_ctrl_c_leaves_the_experiment_running_and_says_how_to_re_attach(service: Service) -> None:
    created = service.submit(
        {
            "name": "long",
            "trainer": "collapse",
            "config": {"n_samples": 64, "steps": 10**7},
            "grid": {},
            "seeds": 1,
        }
    )
    experiment_id = created["id"]
    deadline = time.monotonic() + 60
    while service.client.get(f"/experiments/{experiment_id}").json()["status"] != "running":
        assert time.monotonic() < deadline, "the experiment never started"
        time.sleep(0.1)
    # The watcher writes to a terminal, as a user's does, so that it draws its progress at
    # once; Ctrl-C comes once that names the experiment: the watcher is then in its watch loop.
    # Sent a fixed second after the experiment started, it once found the watcher elsewhere
    # on a loaded machine (it did not exit in 30 s).
    controller, terminal = pty.openpty()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "watch", str(experiment_id)]
        + ["--url", service.server.url],
        cwd=ROOT,
        text=True,
        stdout=terminal,
        stderr=subprocess.PIPE,
        # SIGINT at its default, as under a user's terminal: a test run started in the
        # background by a non-interactive shell passes SIGINT ignored to its children, and the
        # watcher (rightly) honours that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(terminal)
    drawn, watching = bytearray(), threading.Event()

    def read_terminal() -> None:  # until the watcher closes it (EIO), so that it never blocks
        with contextlib.suppress(OSError):
            while chunk := os.read(controller, 4096):
                drawn.extend(chunk)
                if b"long" in drawn:
                    watching.set()

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        assert watching.wait(120), bytes(drawn)
        watcher.send_signal(signal.SIGINT)
        _, stderr = watcher.communicate(timeout=30)
    finally:
        watcher.kill()  # nothing once it has exited
        watcher.wait(10)
        reader.join(10)
        os.close(controller)
    assert watcher.returncode == 130, stderr
    assert f"experiment {experiment_id} continues" in stderr
    assert f"`seedgrid watch {experiment_id}` re-attaches" in stderr
    assert service.client.get(f"/experiments/{experiment_id}").json()["status"] == "running"
    cancelled = seedgrid(service, "cancel", str(experiment_id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert service.wait(experiment_id)["status"] == "cancelled"
    again = seedgrid(service, "cancel", str(experiment_id))
    assert again.returncode == 2 and "409" in again.stderr


def test_an_all_failed_experiment_is_failed_and_submit_wait_exits_non_zero(
    service: Service, tmp_path: Path
) -> None:
    result = seedgrid(
        service,
        "submit",
        spec_file(tmp_path, name="diverging", config=DIVERGING, seeds=3),
        "--wait",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    (experiment,) = service.client.get("/experiments", params={"name": "diverging"}).json()
    assert experiment["status"] == "failed" and experiment["counts"]["diverged"] == 3
    errors = Counter(r["error"].splitlines()[0] for r in service.runs(experiment["id"]))
    # each distinct error once, with the number of runs it ended, not once per run
    for error, n in errors.items():
        assert result.stdout.count(f"{error}\n") == 1, result.stdout
        assert f"{n} run{'s' if n > 1 else ''} diverged: {error}\n" in result.stdout
    assert "nothing to compare" in result.stdout
    # cancel refuses a failed experiment as ended
    refused = service.client.post(f"/experiments/{experiment['id']}/cancel")
    assert refused.status_code == 409 and "already ended (failed)" in refused.json()["detail"]


def test_a_field_typo_names_the_closest_field_and_a_diagnostic_is_named_as_one(
    service: Service, tmp_path: Path
) -> None:
    typo = seedgrid(service, "submit", spec_file(tmp_path, config={"n_sample": 64}))
    assert typo.returncode == 2
    assert "body.config.n_sample: unknown config field 'n_sample'" in typo.stderr
    assert "did you mean 'n_samples'?" in typo.stderr and "valid fields: " in typo.stderr
    # a top-level key of the spec too
    top = seedgrid(service, "submit", spec_file(tmp_path, seed=3))
    assert top.returncode == 2
    assert "body.seed: unknown field 'seed' (did you mean 'seeds'?)" in top.stderr
    response = service.client.post(
        "/experiments",
        json={"name": "x", "trainer": "collapse", "grid": {"stop_gradiant": [False, True]}},
    )
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "grid", "stop_gradiant"]
    assert "did you mean 'stop_gradient'?" in error["msg"]

    created = service.submit(
        {"name": "metrics", "trainer": "collapse", "config": QUICK, "grid": {}, "seeds": 1}
    )
    service.wait(created["id"])
    unknown = seedgrid(service, "stats", str(created["id"]), "--metric", "min_l3")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert f"GET /experiments/{created['id']}/stats was refused" in unknown.stderr
    assert "did you mean 'min_l2'?" in unknown.stderr
    assert "known metrics: loss, train_accuracy" in unknown.stderr
    diagnostic = service.client.get(
        f"/experiments/{created['id']}/stats", params={"metric": "min_l2_peak"}
    )
    assert diagnostic.status_code == 422
    assert "'min_l2_peak' is a diagnostic" in diagnostic.json()["detail"][0]["msg"]


def _legend(stdout: str) -> dict[str, str]:
    """The abbreviations a table printed (`factors: sg = stop_gradient, ...`)."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("factors: "):
            for pair in line.removeprefix("factors: ").split(", "):
                short, full = pair.split(" = ")
                found[full] = short
    return found


def _cells(stdout: str) -> set[str]:
    return set(re.split(r"\s+", stdout))


def test_tables_at_80_columns_show_whole_condition_keys_and_p_values(service: Service) -> None:
    created = service.submit(
        {
            "name": "narrow",
            "trainer": "collapse",
            "config": QUICK,
            "grid": {"stop_gradient": [False, True], "frustration_spread": ["all", "others"]},
            "seeds": 3,
        }
    )
    service.wait(created["id"])
    stats = service.client.get(f"/experiments/{created['id']}/stats").json()
    shown = seedgrid(service, "stats", str(created["id"]), COLUMNS="80")
    assert shown.returncode == 0, shown.stderr
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80
    legend = _legend(shown.stdout)
    cells = _cells(shown.stdout.replace(",", " "))
    for condition in stats["conditions"]:
        for factor, level in condition["condition"].items():
            level_text = level if isinstance(level, str) else str(level).lower()
            # whole, under its name or (in a table too narrow for it) its abbreviation
            names = {factor, legend.get(factor, factor)}
            assert any(f"{n}={level_text}" in cells for n in names), (factor, shown.stdout)
    # the primary test's Holm p (per factor) and its interval's ends, whole; the comparisons
    # that cannot say anything ([0, inf] at 3 seeds a cell) as one line under the table
    assert len(stats["comparisons"]) == 6
    assert all(c["primary_p_holm_factor"] is not None for c in stats["comparisons"])
    silent = [c for c in stats["comparisons"] if c["primary_ci95"] == [0.0, None]]
    shown_rows = [c for c in stats["comparisons"] if c not in silent]
    for c in shown_rows:
        p = c["primary_p_holm_factor"]
        assert f"{p:.3g}" in cells, (p, shown.stdout)
        low, high = c["primary_ci95"]
        assert f"[{low:.2g}" in cells and ("inf]" if high is None else f"{high:.2g}]") in cells
    if len(silent) > 1:
        assert f"{len(silent)} more comparisons cannot say anything" in " ".join(
            shown.stdout.split()
        )

    runs = seedgrid(service, "runs", str(created["id"]), COLUMNS="80")
    assert runs.returncode == 0, runs.stderr
    assert max(len(line) for line in runs.stdout.splitlines()) <= 80
    legend = _legend(runs.stdout)
    cells = _cells(runs.stdout.replace(",", " "))
    for run in service.runs(created["id"]):
        for factor, level in run["condition"].items():
            level_text = level if isinstance(level, str) else str(level).lower()
            names = {factor, legend.get(factor, factor)}
            assert any(f"{n}={level_text}" in cells for n in names), (factor, runs.stdout)
        assert f"{run['metrics']['min_l2']:.4g}" in cells
    # stats as CSV: every filled cell of a number column is a number, at full precision
    stats_csv = seedgrid(service, "stats", str(created["id"]), "--csv")
    assert stats_csv.returncode == 0, stats_csv.stderr
    records = list(csv.DictReader(io.StringIO(stats_csv.stdout)))
    numbers = ("n", "mean", "ci_low", "ci_high", "std", "var_ratio", "primary_ci_low", "primary_p")
    for record in records:
        for column in numbers:
            if record[column]:
                float(record[column])
    means = [float(r["mean"]) for r in records if r["table"] == "condition"]
    assert means == [c["mean"] for c in stats["conditions"]]
    as_csv = seedgrid(service, "runs", str(created["id"]), "--csv")
    assert as_csv.stdout.splitlines()[0].startswith("id,condition,seed,status,min_l2")
    assert len(as_csv.stdout.splitlines()) == 1 + 12


def test_trainers_lists_config_fields_with_defaults_and_protocol_needs_a_declaring_trainer(
    service: Service,
) -> None:
    fields = seedgrid(service, "trainers", "collapse", "--csv")
    assert fields.returncode == 0, fields.stderr
    rows = {line.split(",")[0]: line for line in fields.stdout.splitlines()[1:]}
    assert fields.stdout.splitlines()[0] == "field,type,default,meaning"
    assert rows["n_samples"].startswith("n_samples,integer,400,")
    assert rows["stop_gradient"].startswith("stop_gradient,boolean,false,")
    typo = seedgrid(service, "trainers", "colapse")
    assert typo.returncode == 2 and "did you mean 'collapse'?" in typo.stderr
    created = service.submit(
        {"name": "no-protocol", "trainer": "collapse", "config": QUICK, "grid": {}, "seeds": 1}
    )
    refused = seedgrid(service, "protocol", str(created["id"]))
    assert refused.returncode == 2 and "404" in refused.stderr and "Traceback" not in refused.stderr


def answered(service: Service, answer: str, *args: str) -> subprocess.CompletedProcess:
    """A command whose stdin is a terminal where the user types `answer`."""
    controller, terminal = pty.openpty()
    try:
        os.write(controller, answer.encode() + b"\n")
        return subprocess.run(
            [sys.executable, "-m", "service.cli", *args, "--url", service.server.url],
            stdin=terminal,
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
        )
    finally:
        os.close(terminal)
        os.close(controller)


def test_delete_asks_naming_the_experiment_and_its_runs_and_yes_skips_it(service: Service) -> None:
    kept, other = (
        service.submit(
            {
                "name": name,
                "trainer": "collapse",
                "config": {"n_samples": 64, "steps": 50},
                "grid": {},
                "seeds": 2,
            }
        )
        for name in ("kept", "other")
    )
    for created in (kept, other):
        assert service.wait(created["id"])["status"] == "completed"

    def exists(experiment_id: int) -> bool:
        return service.client.get(f"/experiments/{experiment_id}").status_code == 200

    # nobody to ask (a pipe, a script, CI): refused, nothing deleted
    unasked = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "delete",
            str(kept["id"]),
            "--url",
            service.server.url,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert unasked.returncode == 2 and exists(kept["id"])
    assert unasked.stderr == (
        f"error: not deleting experiment {kept['id']} 'kept' (collapse, completed) with its 2 "
        "runs: no one can confirm (stdin is not a terminal); pass --yes to delete it\n"
    )
    declined = answered(service, "n", "delete", str(kept["id"]))
    assert declined.returncode == 1 and exists(kept["id"]), declined.stderr
    assert (
        f"Delete experiment {kept['id']} 'kept' (collapse, completed) with its 2 runs, their "
        "metric points and statistics? [y/N]"
    ) in declined.stdout
    assert "nothing deleted" in declined.stderr
    confirmed = answered(service, "y", "delete", str(kept["id"]))
    assert confirmed.returncode == 0, confirmed.stderr
    assert f"experiment {kept['id']} deleted" in confirmed.stdout and not exists(kept["id"])
    assert seedgrid(service, "delete", str(other["id"]), "--yes").returncode == 0
    assert not exists(other["id"])


def test_tag_note_list_filters_and_params(service: Service) -> None:
    """`seedgrid tag`, `note`, `list`'s filters (tags shown) and `params` (the fields that vary,
    --all for every one, --csv at full precision) as a user types them."""
    created = service.submit(
        {"name": "r-sweep", "trainer": "collapse", "config": QUICK, "grid": {"r": [0.0, 0.5]}}
    )
    experiment_id = str(created["id"])
    assert service.wait(created["id"], timeout_s=600)["status"] == "completed"

    tagged = seedgrid(service, "tag", experiment_id, "sweep", "cpu")
    assert tagged.returncode == 0, tagged.stderr
    assert tagged.stdout.strip() == f"experiment {experiment_id} r-sweep: sweep, cpu"
    removed = seedgrid(service, "tag", experiment_id, "--remove", "cpu")
    assert removed.stdout.strip() == f"experiment {experiment_id} r-sweep: sweep"
    bad = seedgrid(service, "tag", experiment_id, "no space")
    # the tag given first (one request: add_tags, the change, not the whole list)
    assert bad.returncode == 2 and "add_tags.0" in bad.stderr and "not a tag" in bad.stderr
    noted = seedgrid(service, "note", experiment_id, "r matters more than I thought")
    assert noted.returncode == 0 and "note set" in noted.stdout
    detail = service.client.get(f"/experiments/{experiment_id}").json()
    assert (detail["tags"], detail["note"]) == (["sweep"], "r matters more than I thought")

    today = time.strftime("%Y-%m-%d", time.gmtime())
    listed = seedgrid(
        service,
        "list",
        "--tag",
        "sweep",
        "--trainer",
        "collapse",
        "--status",
        "completed",
        "--since",
        today,
        "--search",
        "MATTERS",
    )
    assert listed.returncode == 0, listed.stderr
    # the id as the row's first cell (a created time folded onto its own line may start with
    # the same digit: 12:48 under experiment 1)
    (row,) = [
        line for line in listed.stdout.splitlines() if re.match(rf"{experiment_id}\b", line.strip())
    ]
    assert "r-sweep" in row and "sweep" in row.split("r-sweep")[1]
    assert "tags" in listed.stdout
    none = seedgrid(service, "list", "--tag", "sweep", "--tag", "gpu")
    assert none.returncode == 0 and none.stdout.strip() == "no experiments match"
    not_a_date = seedgrid(service, "list", "--since", "last week")
    assert not_a_date.returncode == 2 and "--since 'last week' is not a date" in not_a_date.stderr

    varying = seedgrid(service, "params", experiment_id)
    assert varying.returncode == 0, varying.stderr
    header = varying.stdout.splitlines()[0].split()
    assert header == ["condition", "n", "mean", "min_l2", "std", "r"]
    # --all: a row per field (those that vary first, starred), a column per condition
    every = seedgrid(service, "params", experiment_id, "--all")
    assert every.returncode == 0, every.stderr
    lines = [line.split() for line in every.stdout.splitlines()]
    assert lines[0] == ["field", "#1", "#2"]
    assert ["condition", "r=0.0", "r=0.5"] in lines
    assert ["r", "*", "0.0", "0.5"] in lines and ["n_samples", "64", "64"] in lines
    assert "*: differs between the conditions" in every.stdout
    table = service.client.get(f"/experiments/{experiment_id}/params").json()
    csv_rows = list(
        csv.reader(seedgrid(service, "params", experiment_id, "--csv").stdout.splitlines())
    )
    assert csv_rows[0] == ["condition", "n", "mean min_l2", "std", "r"]
    assert [(r[0], float(r[2]), r[4]) for r in csv_rows[1:]] == [
        (c["condition_key"], c["mean"], str(c["config"]["r"])) for c in table["conditions"]
    ]
