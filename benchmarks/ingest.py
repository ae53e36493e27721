"""Metric ingestion: the points workers stream, stored by seedgrid's harvest path, against raw
sqlite3 inserts of the same rows into the same table, at equal work (issue 38, item 5).

Both arms write the same points, pass by pass, into a fresh SQLite file migrated to seedgrid's
schema (the metricpoint table with its two indexes, WAL, synchronous=NORMAL, as the service
opens it), a transaction per pass:
- seedgrid: each pass's MetricBatch messages (the workers' batches, as Ray hands them to the
  dispatcher) made rows by the harvest (service.scheduling.harvesting.metric_rows) and stored
  by RunStore.record_points (which also keeps each experiment's curve names) on the service's
  engine, then a commit;
- raw sqlite3: the same points as tuples through one `executemany` of a prepared INSERT on a
  sqlite3 connection of its own, then a commit.

The arms alternate which goes first each repeat; the script prints each arm's points per second
(median over repeats), their ratio and the goal (seedgrid >= 0.8x raw sqlite3).

    python benchmarks/ingest.py                      # 200,000 points, 3 repeats
    python benchmarks/ingest.py --points 1000000
    python benchmarks/ingest.py --smoke              # 5,000 points, 2 repeats (CI)
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sqlmodel import Session

from api_schemas import RunStatus
from service.scheduling.harvesting import metric_rows
from service.scheduling.run_store import RunStore
from service.specs import condition_key
from service.storage.db import Experiment, Run, make_engine, upgrade_database
from workers.messages import MetricBatch

RUNS = 64  # runs streaming at once (two passes' worth of the default 32 tasks in flight)
BATCH = 20  # points a batch: a worker's 0.5 s of a few metrics at some steps a second
BATCHES_PER_PASS = 32  # a batch from each task in flight
NAMES = ("loss", "accuracy", "grad_norm", "lr")
GOAL = 0.8
SMOKE = {"points": 5000, "repeats": 2}


def workload(points: int) -> list[list[tuple[int, MetricBatch]]]:
    """`points` points as passes of (run index, batch): each run's steps in order, a few
    metrics a step, the runs taking turns."""
    steps: list[int] = [0] * RUNS
    passes: list[list[tuple[int, MetricBatch]]] = []
    current: list[tuple[int, MetricBatch]] = []
    made = 0
    run = 0
    while made < points:
        batch = []
        while len(batch) < BATCH and made < points:
            for name in NAMES:
                batch.append((steps[run], steps[run] // 100, name, 0.5 + 1e-4 * steps[run]))
                made += 1
            steps[run] += 1
        current.append((run, MetricBatch(points=batch)))
        run = (run + 1) % RUNS
        if len(current) == BATCHES_PER_PASS:
            passes.append(current)
            current = []
    if current:
        passes.append(current)
    return passes


def fresh_database(path: Path) -> tuple[str, int, list[int]]:
    """A migrated SQLite file with one experiment of RUNS running runs; its URL, the
    experiment's id and the run ids."""
    url = f"sqlite:///{path}"
    upgrade_database(url)
    engine = make_engine(url)
    with Session(engine) as session:
        experiment = Experiment(
            name="ingest",
            trainer="collapse",
            metric="min_l2",
            spec={"name": "ingest", "trainer": "collapse", "grid": {}},
            n_conditions=1,
            n_runs=RUNS,
            curve_names=[],
        )
        session.add(experiment)
        session.commit()
        assert experiment.id is not None
        runs = [
            Run(
                experiment_id=experiment.id,
                condition={},
                condition_key=condition_key({}),
                seed=seed,
                trainer="collapse",
                status=RunStatus.running,
            )
            for seed in range(RUNS)
        ]
        session.add_all(runs)
        session.commit()
        ids = [run.id for run in runs]
        experiment_id = experiment.id
    engine.dispose()
    assert all(i is not None for i in ids)
    return url, experiment_id, [int(i) for i in ids if i is not None]


def seedgrid_arm(path: Path, passes: list[list[tuple[int, MetricBatch]]]) -> tuple[float, int]:
    url, experiment_id, run_ids = fresh_database(path)
    engine = make_engine(url)
    started = time.perf_counter()
    for batches in passes:
        with Session(engine) as session:
            rows = [row for run, batch in batches for row in metric_rows(run_ids[run], batch)]
            # the runs' experiment, as the dispatcher's flights give it
            RunStore(session).record_points(rows, {run: experiment_id for run in run_ids})
            session.commit()
    elapsed = time.perf_counter() - started
    engine.dispose()
    return elapsed, count_points(path)


def raw_arm(path: Path, passes: list[list[tuple[int, MetricBatch]]]) -> tuple[float, int]:
    _, _, run_ids = fresh_database(path)
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA foreign_keys=ON")
    statement = "INSERT INTO metricpoint (run_id, step, epoch, name, value) VALUES (?, ?, ?, ?, ?)"
    started = time.perf_counter()
    for batches in passes:
        connection.execute("BEGIN")
        connection.executemany(
            statement,
            [(run_ids[run], *point) for run, batch in batches for point in batch.points],
        )
        connection.execute("COMMIT")
    elapsed = time.perf_counter() - started
    connection.close()
    return elapsed, count_points(path)


def count_points(path: Path) -> int:
    connection = sqlite3.connect(path)
    try:
        return int(connection.execute("SELECT count(*) FROM metricpoint").fetchone()[0])
    finally:
        connection.close()


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="5,000 points, 2 repeats (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    if args.points < 1 or args.repeats < 1:
        parser.error("--points and --repeats must be at least 1")
    passes = workload(args.points)
    rates: dict[str, list[float]] = {"seedgrid": [], "raw sqlite3": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = ["raw sqlite3", "seedgrid"] if repeat % 2 == 0 else ["seedgrid", "raw sqlite3"]
            line = []
            for arm in order:
                path = Path(tmp) / f"{arm.replace(' ', '-')}-{repeat}.db"
                run = seedgrid_arm if arm == "seedgrid" else raw_arm
                elapsed, stored = run(path, passes)
                if stored != args.points:
                    sys.exit(f"unequal work: {arm} stored {stored:,} of {args.points:,} points")
                rates[arm].append(args.points / elapsed)
                line.append(f"{arm} {args.points / elapsed:,.0f} points/s")
            print(f"repeat {repeat} ({order[0]} first): " + "; ".join(line), flush=True)
    seedgrid, raw = statistics.median(rates["seedgrid"]), statistics.median(rates["raw sqlite3"])
    ratio = seedgrid / raw
    print(
        f"{args.points:,} points in {len(passes):,} passes of up to {BATCHES_PER_PASS} batches "
        f"of {BATCH}, {RUNS} runs, SQLite WAL; repeats: {args.repeats}"
    )
    print(f"raw sqlite3: median {raw:,.0f} points/s")
    print(f"seedgrid:    median {seedgrid:,.0f} points/s")
    print(
        f"ratio seedgrid / raw sqlite3: {ratio:.2f}x (goal >= {GOAL:g}x: "
        f"{'met' if ratio >= GOAL else 'NOT met'})"
    )
    return {"seedgrid": seedgrid, "raw": raw, "ratio": ratio}


if __name__ == "__main__":
    main()
