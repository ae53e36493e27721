"""GET /stats of a large completed experiment, cold (computed) and warm (the stored page).

The script writes one completed cff experiment of N runs straight into a temporary SQLite file
(a margin_mode x depth grid, accuracies with their test-set sizes, so that the noise floor, the
bounded intervals, the Holm families and the warnings are all computed), then asks the real app
(FastAPI's TestClient, the API without a dispatcher) for its statistics: once cold, then R
times warm. It prints the cold time, the median warm time in ms and the warm/cold ratio. The
goal is 200 ms or less warm for 1,000 runs.

    python benchmarks/stats.py --runs 1000 --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from sqlmodel import Session

from api_schemas import RunStatus
from service.app import create_app
from service.db import Experiment, Run, make_engine, upgrade_database
from service.experiments import condition_key
from service.settings import Settings

GRID = {"margin_mode": ["clamp", "subtract", "none", "soft"], "depth": [1, 2, 3, 4, 5]}
N_TEST = 10_000


def write_experiment(url: str, runs: int) -> int:
    """A completed cff experiment of `runs` runs (seeds spread over the grid's conditions)."""
    conditions = [{"margin_mode": m, "depth": d} for m in GRID["margin_mode"]
                  for d in GRID["depth"]]
    rng = np.random.default_rng(0)
    engine = make_engine(url)
    with Session(engine) as session:
        experiment = Experiment(name="bench-stats", trainer="cff", metric="test_accuracy",
                                spec={"config": {}, "grid": GRID}, n_conditions=len(conditions),
                                n_runs=runs, runs_completed=runs)
        session.add(experiment)
        session.commit()
        assert experiment.id is not None
        for i in range(runs):
            condition = conditions[i % len(conditions)]
            accuracy = float(np.clip(rng.normal(0.6 + 0.05 * condition["depth"], 0.02), 0, 1))
            session.add(Run(experiment_id=experiment.id, condition=condition,
                            condition_key=condition_key(condition), seed=i // len(conditions),
                            trainer="cff", status=RunStatus.completed,
                            metrics={"test_accuracy": accuracy, "loss": 1.0},
                            diagnostics={"n_test": N_TEST}))
        session.commit()
        experiment_id = experiment.id
    engine.dispose()
    return experiment_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20, help="warm requests timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade_database(url)
        experiment_id = write_experiment(url, args.runs)
        app = create_app(Settings(database_url=url), dispatch=False)
        with TestClient(app) as client:
            path = f"/experiments/{experiment_id}/stats"
            started = time.perf_counter()
            cold = client.get(path)
            cold_ms = (time.perf_counter() - started) * 1000
            assert cold.status_code == 200, cold.text
            body = cold.json()
            warm = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                response = client.get(path)
                warm.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200 and response.json() == body
    warm_ms = statistics.median(warm)
    print(f"{args.runs:,} runs, {len(body['conditions'])} conditions, "
          f"{body['total_comparisons']} comparisons, {len(cold.content):,} bytes")
    print(f"cold {cold_ms:,.0f} ms; warm {warm_ms:.1f} ms (median of {args.repeats}, "
          f"max {max(warm):.1f}); warm/cold {warm_ms / cold_ms:.4f}")


if __name__ == "__main__":
    main()
