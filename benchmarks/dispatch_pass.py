"""The dispatcher's database work per pass against the number of queued runs.

One pass is what the dispatcher's loop asks of the runs store: claim up to K queued runs,
record that their workers started, store a batch of metric points for each, finish them, and
derive the experiment's status. The script fills a SQLite file with N queued runs (one
experiment, as a large study would), times P passes (the same P for every N), and prints the
median milliseconds per pass for each N and the ratio to the first N. Each round measures every
N, in reverse order every other round, so that an order effect cancels. Flat (ratio close to 1)
means a whole experiment costs O(N) in the dispatcher, not O(N^2).

    python benchmarks/dispatch_pass.py --queued 1000 20000 --passes 25 --claim 32 --rounds 2
    python benchmarks/dispatch_pass.py --smoke        # 64 and 256 queued runs, seconds (CI)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sqlmodel import Session

from api_schemas import ExperimentSpec, RunStatus
from service.experiments import create_experiment
from service.scheduling.run_store import AttemptKey, FinishedAttempt, RunStore, StartedAttempt
from service.settings import Settings
from service.storage.db import make_engine, upgrade_database

POINTS_PER_RUN = 20
# --smoke's defaults: a run of a few seconds, through the same code path
SMOKE = {"queued": [64, 256], "passes": 4, "claim": 8, "rounds": 2}


def one_pass(session: Session, claim: int) -> int:
    store = RunStore(session)
    claimed = store.claim(claim)
    store.commit()
    keys = [
        AttemptKey(run_id=r.id, experiment_id=r.experiment_id, attempt=r.attempt) for r in claimed
    ]
    store.start(
        [StartedAttempt(key=key, node_id="node", worker_id="worker", pid=1) for key in keys]
    )
    store.record_points(
        [
            {"run_id": k.run_id, "step": s, "epoch": None, "name": "loss", "value": 1.0 / (s + 1)}
            for k in keys
            for s in range(POINTS_PER_RUN)
        ]
    )
    store.finish(
        [
            FinishedAttempt(
                key=key,
                status=RunStatus.completed,
                metrics={"loss": 0.1},
                diagnostics={},
                warnings=[],
                provenance={},
                error=None,
            )
            for key in keys
        ]
    )
    store.commit()
    return len(claimed)


def time_passes(queued: int, passes: int, claim: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade_database(url)
        engine = make_engine(url)
        settings = Settings(
            database_url=url, max_runs_per_experiment=queued, max_queued_runs=queued
        )
        spec = ExperimentSpec.model_validate(
            {
                "name": "bench",
                "trainer": "collapse",
                "config": {"steps": 5},
                "grid": {},
                "seeds": queued,
            }
        )
        with Session(engine) as session:
            create_experiment(session=session, spec=spec, settings=settings)
        timings = []
        with Session(engine) as session:
            for _ in range(passes):
                started = time.perf_counter()
                assert one_pass(session, claim) == claim
                timings.append((time.perf_counter() - started) * 1000)
        engine.dispose()
    return statistics.median(timings)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, nargs="+", default=[1000, 20000])
    parser.add_argument(
        "--passes",
        type=int,
        default=25,
        help="passes timed (each claims --claim runs; at most the smallest queued / claim)",
    )
    parser.add_argument("--claim", type=int, default=32, help="runs claimed per pass")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times each size is measured, sizes alternating (the machine is "
        "shared: alternation spreads its noise over every size)",
    )
    parser.add_argument("--smoke", action="store_true", help="small sizes, 4 passes (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    # the same passes for every size, so that each median is over the same work
    passes = min(args.passes, min(args.queued) // args.claim)
    if passes < 1:
        parser.error("every --queued must be at least --claim")
    measured: dict[int, list[float]] = {n: [] for n in args.queued}
    for round_ in range(args.rounds):
        for queued in args.queued if round_ % 2 == 0 else reversed(args.queued):
            ms = time_passes(queued, passes, args.claim)
            measured[queued].append(ms)
            print(
                f"round {round_}: {queued:>7,} queued runs: median {ms:6.2f} ms per pass of "
                f"{args.claim} runs ({passes} passes)",
                flush=True,
            )
    base = statistics.median(measured[args.queued[0]])
    for queued, times in measured.items():
        ms = statistics.median(times)
        print(
            f"{queued:>7,} queued runs: {ms:6.2f} ms per pass (median of {args.rounds} rounds); "
            f"ratio to {args.queued[0]:,}: {ms / base:.2f}"
        )


if __name__ == "__main__":
    main()
