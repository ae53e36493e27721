"""GET /experiments/{id} at 1,000 and 10,000 runs: whether its time grows with the runs (issue
38 item 3: it should not), over real HTTP from this process to a `seedgrid serve --no-dispatch`
subprocess on one SQLite file.

Two arms per size, each an experiment of the same runs (CONDITIONS conditions, the seeds
making up the size, so that the spec and its grid stay the same size and only the runs grow;
every run completed, 3 curves of 2 points each, stored through the runs store as workers'
points are):

- `kept`: the experiment's curve names are kept in its row as its points are stored (what
  every experiment submitted since migration 0014 has);
- `legacy`: the same experiment with its curve names unset, as one stored before 0014 is: the
  detail reads them from one run per condition (what every experiment had before).

The arms and sizes are interleaved, request by request; each prints its median. Printed: the
10,000-run over 1,000-run ratio of each arm (goal for `kept`: <= 1.5, that is, flat within
noise), and kept / legacy at 10,000 runs.

    python benchmarks/experiment_detail.py --repeats 40
    python benchmarks/experiment_detail.py --smoke     # 40 and 400 runs, 3 repeats (CI)
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlmodel import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from load import free_port, wait_healthy  # noqa: E402

from api_schemas import ExperimentSpec  # noqa: E402
from service.experiments import create_experiment  # noqa: E402
from service.scheduling.run_store import RunStore  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.storage.db import make_engine, upgrade_database  # noqa: E402

GOAL = 1.5  # GET /experiments/{id} at 10x the runs, over its time at 1x
CONDITIONS = 20
CURVES = ("loss", "min_l2", "grad_norm")
ARMS = ("kept", "legacy")


def build(database_url: str, runs: int, arm: str) -> int:
    """An experiment of `runs` completed runs whose points are stored through the runs store;
    for `legacy`, its curve names unset afterwards. Its id."""
    spec = ExperimentSpec.model_validate(
        {
            "name": f"{arm}-{runs}",
            "trainer": "collapse",
            "config": {"steps": 10},
            "grid": {"r": [round(0.001 * (i + 1), 6) for i in range(CONDITIONS)]},
            "seeds": max(1, runs // CONDITIONS),
        }
    )
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            created = create_experiment(
                session=session, spec=spec, settings=Settings(database_url=database_url)
            )
            assert created.id is not None
            session.execute(
                text(
                    "UPDATE run SET status = 'completed', started_at = '2026-01-01 00:00:00', "
                    "finished_at = '2026-01-01 00:01:00' WHERE experiment_id = :e"
                ),
                {"e": created.id},
            )
            session.execute(
                text(
                    "UPDATE experiment SET status = 'completed', runs_queued = 0, "
                    "runs_completed = n_runs WHERE id = :e"
                ),
                {"e": created.id},
            )
            run_ids = [
                row[0]
                for row in session.execute(
                    text("SELECT id FROM run WHERE experiment_id = :e"), {"e": created.id}
                ).all()
            ]
            store = RunStore(session)
            for start in range(0, len(run_ids), 500):
                store.record_points(
                    [
                        {"run_id": r, "step": step, "epoch": None, "name": name, "value": 0.5}
                        for r in run_ids[start : start + 500]
                        for name in CURVES
                        for step in (0, 1)
                    ]
                )
            store.commit()
            if arm == "legacy":
                session.execute(
                    text("UPDATE experiment SET curve_names = NULL WHERE id = :e"),
                    {"e": created.id},
                )
                session.commit()
            return created.id
    finally:
        engine.dispose()


def start_api(db_path: Path, port: int, token: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SEEDGRID_DATABASE_URL": f"sqlite:///{db_path}",
        "SEEDGRID_PORT": str(port),
        "SEEDGRID_API_TOKEN": token,
        "SEEDGRID_LOG_LEVEL": "warning",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--no-dispatch"], env=env
    )


def main(argv: Sequence[str] | None = None) -> dict[tuple[int, str], float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="run counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="40 and 400 runs, 3 repeats (CI)")
    args = parser.parse_args(argv)
    sizes = [40, 400] if args.smoke else [int(s) for s in args.sizes.split(",")]
    repeats = 3 if args.smoke else args.repeats
    token = secrets.token_urlsafe(24)
    port = free_port()
    times: dict[tuple[int, str], list[float]] = {(n, arm): [] for n in sizes for arm in ARMS}
    names: dict[tuple[int, str], list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="seedgrid-detail-") as tmp:
        db_path = Path(tmp) / "detail.db"
        url = f"sqlite:///{db_path}"
        upgrade_database(url)
        began = time.monotonic()
        ids = {(n, arm): build(url, n, arm) for n in sizes for arm in ARMS}
        print(
            f"built {len(ids)} experiments ({', '.join(map(str, sizes))} runs, both arms) "
            f"in {time.monotonic() - began:.1f} s"
        )
        process = start_api(db_path, port, token)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, process)
            with httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ) as client:
                for key, experiment_id in ids.items():  # one untimed request each: warm paths
                    body = client.get(f"/experiments/{experiment_id}").raise_for_status().json()
                    names[key] = body["curve_metrics"]
                for _ in range(repeats):
                    for key, experiment_id in ids.items():
                        start = time.perf_counter()
                        client.get(f"/experiments/{experiment_id}").raise_for_status()
                        times[key].append(time.perf_counter() - start)
        finally:
            process.terminate()
            process.wait(60)
    medians = {key: statistics.median(values) for key, values in times.items()}
    for (n, arm), median in medians.items():
        print(
            f"GET /experiments/{{id}}, {n:,} runs, {arm}: median {1000 * median:.2f} ms "
            f"over {repeats}; curve_metrics {names[(n, arm)]}"
        )
    small, large = min(sizes), max(sizes)
    for arm in ARMS:
        ratio = medians[(large, arm)] / medians[(small, arm)]
        verdict = ("met" if ratio <= GOAL else "not met") if arm == "kept" else "reference"
        print(
            f"{arm}: {large:,} runs / {small:,} runs = {ratio:.2f}x "
            f"(goal for kept <= {GOAL}: {verdict})"
        )
    print(
        f"kept / legacy at {large:,} runs: "
        f"{medians[(large, 'kept')] / medians[(large, 'legacy')]:.2f}x"
    )
    if any(names[(n, "kept")] != names[(n, "legacy")] for n in sizes):
        raise SystemExit("the two arms name different curves")
    return medians


if __name__ == "__main__":
    main()
