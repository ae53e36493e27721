"""The user guide's "Your own training code" runs as written: its code block is the example
file whole, and its command (`seedgrid run ... --trainers FILE`) runs the example grid of that
function trainer to completion on a local Ray, with the statistics printed."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from service.api.routes.ui import DASHBOARD_URL
from service.api.server import free_port
from tests.conftest import ROOT
from tests.seedgrid_process import SeedgridProcess

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


def guide_env(database: Path) -> dict[str, str]:
    """The environment the guide's command runs in here: this test's database and port."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SEEDGRID_") and k != "RAY_ADDRESS"
    }
    env.update(
        SEEDGRID_DATABASE_URL=f"sqlite:///{database}",
        SEEDGRID_RAY_NUM_CPUS="2",
        SEEDGRID_PORT=str(free_port()),
        COLUMNS="160",
    )
    return env


def run_guide_command(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The guide's one command (`seedgrid run ... --trainers FILE`), run to its end."""
    (commands,) = blocks(section("Your own training code"), "bash")
    (command,) = commands.strip().splitlines()
    program, *args = shlex.split(command)
    assert program == "seedgrid", command
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.timeout(400)
def test_the_guide_command_runs_the_function_trainers_grid(tmp_path: Path) -> None:
    done = run_guide_command(guide_env(tmp_path / "seedgrid.db"))
    assert "2 conditions x 6 seeds = 12 runs" in done.stdout, done.stdout
    rows = [line for line in done.stdout.splitlines() if re.search(r"init_scale=(0\.5|2\.0)", line)]
    assert len(rows) >= 2, done.stdout
    # every run completed: the condition table says n = 6 for both levels
    for level in ("0.5", "2.0"):
        row = next(line for line in rows if f"init_scale={level}" in line)
        assert re.search(r"\b6\b", row), row


@pytest.mark.timeout(400)
def test_experiments_of_own_code_stay_readable_by_a_service_without_that_code(
    tmp_path: Path,
) -> None:
    """The guide's command runs the example trainer's grid twice into one database; then a
    service started without `--trainers` (the user guide's `serve --no-dispatch`, for imports)
    reads both: statistics, params, export, compare, runs, as the dashboard reads them (a 500,
    KeyError on the trainer's name, on 674b730). An experiment stored before its catalogue
    was recorded reads too, from its runs' metrics. Submitting or adding seeds, which need the
    code, is a clear 422/409 naming the trainer and `--trainers`."""
    database = tmp_path / "seedgrid.db"
    env = guide_env(database)
    for _ in range(2):
        run_guide_command(env)
    # the first experiment as one stored before migration 0013 recorded catalogues
    with closing(sqlite3.connect(database)) as db, db:
        db.execute("UPDATE experiment SET catalogue = NULL WHERE id = 1")

    env["SEEDGRID_PORT"] = str(free_port())
    api = SeedgridProcess("api", ["serve", "--no-dispatch"], env, tmp_path)
    try:
        api.wait_healthy(90)
        with httpx.Client(base_url=api.url, timeout=60) as client:
            experiments = client.get("/experiments").json()
            assert sorted(e["id"] for e in experiments) == [1, 2], experiments
            assert {e["trainer"] for e in experiments} == {"mlp_digits"}
            for experiment_id in (1, 2):
                stats = client.get(f"/experiments/{experiment_id}/stats")
                assert stats.status_code == 200, stats.text
                assert stats.json()["metric"] == "accuracy"
                assert sorted(c["n"] for c in stats.json()["conditions"]) == [6, 6]
                assert stats.json()["comparisons"], stats.json()
                loss = client.get(f"/experiments/{experiment_id}/stats", params={"metric": "loss"})
                assert loss.status_code == 200, loss.text
                unknown = client.get(f"/experiments/{experiment_id}/stats", params={"metric": "x"})
                assert unknown.status_code == 422 and "accuracy" in unknown.text, unknown.text
                params = client.get(f"/experiments/{experiment_id}/params")
                assert params.status_code == 200, params.text
                table = params.json()
                assert table["varying"] == ["init_scale"], table
                # the config each condition's runs recorded: the trainer's defaults included
                assert all(
                    {"hidden": 32, "lr": 0.2}.items() <= row["config"].items()
                    for row in table["conditions"]
                ), table["conditions"]
                exported = client.get(f"/experiments/{experiment_id}/export")
                assert exported.status_code == 200, exported.text
                assert exported.text.count("\n") >= 12, exported.text[:500]
                runs = client.get(f"/experiments/{experiment_id}/runs").json()
                assert len(runs) == 12 and all(r["status"] == "completed" for r in runs)
                shown = client.get(f"/runs/{runs[0]['id']}")
                assert shown.status_code == 200, shown.text
                assert client.get(f"/experiments/{experiment_id}").status_code == 200
            compared = client.get("/compare", params={"a": 1, "b": 2})
            assert compared.status_code == 200, compared.text
            assert compared.json()["metric"] == "accuracy"
            assert client.get(DASHBOARD_URL).status_code == 200  # the dashboard's page

            added = client.post("/experiments/2/seeds", json={"seeds": 1})
            assert added.status_code == 409, added.text
            assert "'mlp_digits'" in added.text and "--trainers" in added.text, added.text
            submitted = client.post(
                "/experiments", json={"name": "again", "trainer": "mlp_digits", "seeds": 2}
            )
            assert submitted.status_code == 422, submitted.text
            (error,) = submitted.json()["detail"]
            assert error["loc"] == ["body", "trainer"], error
            assert "'mlp_digits'" in error["msg"] and "--trainers FILE" in error["msg"], error
    finally:
        api.terminate()
        api.stop()


@pytest.mark.timeout(400)
def test_the_guide_command_runs_beside_the_quick_starts_running_service(tmp_path: Path) -> None:
    """The README's step 2 leaves `seedgrid serve` running (the built-ins only); the guide's
    command then runs on the same database. Its grid completes: the service's dispatcher, which
    has not loaded `mlp_digits`, claims none of its runs, the dispatcher inside `seedgrid run`
    runs them all, and the service shows the experiment. On 674b730 the service's dispatcher
    held the database's one lock, claimed every run and failed it (UnknownTrainerError)."""
    env = guide_env(tmp_path / "seedgrid.db")
    serve = SeedgridProcess("serve", ["serve"], env, tmp_path)
    try:
        health = serve.wait_healthy(90)
        assert health["dispatcher"] == "active", health
        (service_dispatcher,) = health["dispatchers"]
        assert "collapse" in service_dispatcher["trainers"], health
        assert "mlp_digits" not in service_dispatcher["trainers"], health

        done = run_guide_command({**env, "SEEDGRID_PORT": str(free_port())})
        assert "2 conditions x 6 seeds = 12 runs" in done.stdout, done.stdout
        with httpx.Client(base_url=serve.url, timeout=60) as client:
            (experiment,) = client.get("/experiments").json()
            assert experiment["trainer"] == "mlp_digits" and experiment["status"] == "completed"
            runs = client.get(f"/experiments/{experiment['id']}/runs").json()
            assert len(runs) == 12 and all(r["status"] == "completed" for r in runs), runs
            dispatchers = {
                client.get(f"/runs/{run['id']}").json()["provenance"]["dispatcher"] for run in runs
            }
            assert len(dispatchers) == 1 and service_dispatcher["identity"] not in dispatchers
            after = client.get("/healthz").json()
            assert after["dispatchers"] == [service_dispatcher], after
            assert after["queued_without_dispatcher"] == {}, after
    finally:
        serve.terminate()
        serve.stop()
