"""The two heavy reads, stored and paged, against computing them in full on every request (what
the routes did before the statistics were stored and the curves paged), in one process on one
SQLite file.

The database holds a 1,000-run experiment (10 x 10 conditions x 10 seeds, every run completed)
and one run with a 100,000-point curve (10 metrics x 10,000 steps). Measured, median of
--repeats:

- /stats: the full computation from the stored runs (ORM rows -> scipy statistics of every
  comparison -> JSON), against GET /experiments/{id}/stats over HTTP once stored (warm), and
  the first GET (cold: it computes and stores);
- /metrics: the whole curve as ORM rows and one response model per point (the old route),
  against GET /runs/{id}/metrics over HTTP for one page of 10,000 points.

- /protocol: the audit report of 1,000 and of 4,000 runs (in process): linear work takes about
  4x as long for 4x the runs, quadratic work 16x.

Targets: a warm /stats in <= 200 ms; a 10,000-point page in <= 100 ms; /protocol linear.

    python benchmarks/read_paths.py --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import insert
from sqlmodel import Session, select

from api_schemas import MetricPoint, RunStatus
from service.analysis.reports import declared_report, experiment_record, run_record
from service.analysis.stats import experiment_stats
from service.api.server import BackgroundServer
from service.settings import Settings
from service.specs import condition_key
from service.storage.db import Experiment, Run, make_engine, upgrade_database, utcnow
from service.storage.db import RunMetric as MetricRow

GRID = {"r": [round(0.02 * i, 2) for i in range(10)], "dim": list(range(4, 14))}
SEEDS = 10
CURVE_STEPS = 10_000
CURVE_METRICS = [f"metric_{i}" for i in range(10)]


def fill(database_url: str) -> tuple[int, int]:
    """The 1,000-run experiment and the long curve; their ids."""
    upgrade_database(database_url)
    engine = make_engine(database_url)
    rng = np.random.default_rng(0)
    spec = {
        "name": "read-bench",
        "trainer": "collapse",
        "config": {"steps": 50},
        "grid": GRID,
        "seeds": SEEDS,
        "metric": "min_l2",
        "resources": {},
        "max_retries": 2,
        "priority": 0,
    }
    with Session(engine) as session:
        experiment = Experiment(
            name="read-bench",
            trainer="collapse",
            spec=spec,
            metric="min_l2",
            status="completed",
            n_conditions=len(GRID["r"]) * len(GRID["dim"]),
            n_runs=len(GRID["r"]) * len(GRID["dim"]) * SEEDS,
            # the per-status counts the runs store keeps (a bulk insert of runs skips it): a
            # stored page is served while it counts as many completed runs
            runs_completed=len(GRID["r"]) * len(GRID["dim"]) * SEEDS,
        )
        session.add(experiment)
        session.flush()
        rows = []
        for r in GRID["r"]:
            for dim in GRID["dim"]:
                condition = {"r": r, "dim": dim}
                for seed in range(SEEDS):
                    rows.append(
                        {
                            # the columns a bulk insert does not fill from the model
                            "cancel_requested": False,
                            "diagnostics": {},
                            "warnings": [],
                            "provenance": {},
                            "created_at": utcnow(),
                            "experiment_id": experiment.id,
                            "condition_key": condition_key(condition),
                            "condition": condition,
                            "seed": seed,
                            "trainer": "collapse",
                            "status": RunStatus.completed.value,
                            "attempts": 1,
                            "priority": 0,
                            "max_retries": 2,
                            "num_cpus": 1.0,
                            "num_gpus": 0.0,
                            "metrics": {"min_l2": float(rng.gamma(2.0, 1.0 + r))},
                        }
                    )
        session.execute(insert(Run), rows)
        run_id = session.exec(
            select(Run.id).where(Run.experiment_id == experiment.id).order_by(Run.id)
        ).first()
        points = [
            {"run_id": run_id, "step": step, "epoch": None, "name": name, "value": float(step)}
            for step in range(CURVE_STEPS)
            for name in CURVE_METRICS
        ]
        session.execute(insert(MetricRow), points)
        session.commit()
        assert experiment.id is not None and run_id is not None
        ids = experiment.id, run_id
    engine.dispose()
    return ids


def stats_computed_every_time(database_url: str, experiment_id: int) -> str:
    """The statistics of every comparison from the stored runs, as the route computed them on
    every request before they were stored."""
    engine = make_engine(database_url)
    with Session(engine) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        runs = session.exec(
            select(Run)
            .where(Run.experiment_id == experiment_id, Run.status == RunStatus.completed.value)
            .order_by(Run.id)
        ).all()
        values = [(r.condition, r.condition_key, float(r.metrics["min_l2"])) for r in runs]
        payload = experiment_stats(
            metric="min_l2",
            grid=experiment.spec["grid"],
            runs=values,
            seeds=[r.seed for r in runs],  # the seeds pair the conditions, as the route's do
        ).model_dump_json()
    engine.dispose()
    return payload


def whole_curve_as_models(database_url: str, run_id: int) -> str:
    """Every point of the curve as an ORM row and a response model, as the old route did."""
    engine = make_engine(database_url)
    with Session(engine) as session:
        rows = session.exec(
            select(MetricRow)
            .where(MetricRow.run_id == run_id)
            .order_by(MetricRow.step, MetricRow.id)
        ).all()
        points = [MetricPoint(step=r.step, epoch=r.epoch, name=r.name, value=r.value) for r in rows]
    engine.dispose()
    return json.dumps([p.model_dump() for p in points])


def protocol_seconds(n_runs: int) -> float:
    """The protocol report of n_runs feedback runs (half of them frozen-block baselines)."""
    grid = {"method": ["bp", "dfa"], "frozen_blocks": [False, True]}
    experiment = Experiment(
        id=1,
        name="p",
        trainer="feedback",
        metric="test_accuracy",
        spec={"name": "p", "trainer": "feedback", "grid": grid},
        n_conditions=4,
        n_runs=n_runs,
    )
    runs = []
    for i in range(n_runs):
        condition = {"method": grid["method"][i % 2], "frozen_blocks": bool(i // 2 % 2)}
        runs.append(
            Run(
                id=i + 1,
                experiment_id=1,
                condition=condition,
                condition_key=condition_key(condition),
                seed=i // 4,
                trainer="feedback",
                status="completed",
                metrics={"test_accuracy": 0.5},
                diagnostics={},
            )
        )
    report = declared_report(experiment, "protocol")
    gc.collect()
    gc.disable()  # the collector's passes over every live object would blur the scaling
    try:
        started = time.perf_counter()
        record = experiment_record(experiment)
        report.build(record, [run_record(r, base_config=record.config) for r in runs])
        return time.perf_counter() - started
    finally:
        gc.enable()


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a 3 x 3 x 2-run experiment, a 10,000-point curve, /protocol of 100 and 400 runs: "
        "checks that the benchmark runs (CI), measures nothing worth reading",
    )
    args = parser.parse_args(argv)
    sizes = (1000, 4000)
    if args.smoke:
        globals().update(GRID={"r": [0.0, 0.02, 0.04], "dim": [4, 5, 6]}, SEEDS=2, CURVE_STEPS=1000)
        sizes, args.repeats = (100, 400), 1
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        experiment_id, run_id = fill(url)
        settings = Settings(database_url=url, api_token="")
        with (
            BackgroundServer(settings, dispatch=False) as server,
            httpx.Client(base_url=server.url, timeout=600) as client,
        ):
            stats_url = f"/experiments/{experiment_id}/stats"
            started = time.perf_counter()
            cold = client.get(stats_url)
            cold_s = time.perf_counter() - started
            assert cold.status_code == 200, cold.text
            n_comparisons = len(cold.json()["comparisons"])
            warm_s, warm = timed(lambda: client.get(stats_url), args.repeats)
            assert warm.content == cold.content  # type: ignore[attr-defined]
            full_s, full = timed(
                lambda: stats_computed_every_time(url, experiment_id), max(1, args.repeats // 2)
            )
            assert json.loads(full)["comparisons"] == cold.json()["comparisons"]  # type: ignore[arg-type]

            page_s, page = timed(lambda: client.get(f"/runs/{run_id}/metrics"), args.repeats)
            assert len(page.json()) == 10_000  # type: ignore[attr-defined]
            curve_s, curve = timed(
                lambda: whole_curve_as_models(url, run_id), max(1, args.repeats // 2)
            )
            assert len(json.loads(curve)) == CURVE_STEPS * len(CURVE_METRICS)  # type: ignore[arg-type]

    small = statistics.median(protocol_seconds(sizes[0]) for _ in range(args.repeats))
    large = statistics.median(protocol_seconds(sizes[1]) for _ in range(args.repeats))

    n_runs = len(GRID["r"]) * len(GRID["dim"]) * SEEDS
    print(f"/stats of a {n_runs:,}-run experiment ({n_comparisons} comparisons):")
    print(f"  computed on every request (before): {full_s * 1e3:9.1f} ms")
    print(f"  GET, first (computes and stores):   {cold_s * 1e3:9.1f} ms")
    print(
        f"  GET, stored (warm, HTTP):           {warm_s * 1e3:9.1f} ms   "
        f"target <= 200 ms; {full_s / warm_s:,.0f}x faster than before"
    )
    print(f"/metrics of a {CURVE_STEPS * len(CURVE_METRICS):,}-point curve:")
    print(f"  whole curve as models (before):     {curve_s * 1e3:9.1f} ms")
    print(
        f"  GET one page of 10,000 (HTTP):      {page_s * 1e3:9.1f} ms   "
        f"target <= 100 ms; {curve_s / page_s:,.1f}x less time than the whole curve"
    )
    print(
        f"/protocol: {sizes[0]:,} runs {small * 1e3:.1f} ms, {sizes[1]:,} runs "
        f"{large * 1e3:.1f} ms: "
        f"{large / small:.1f}x for 4x the runs (linear: 4x, quadratic: 16x)"
    )


if __name__ == "__main__":
    main()
