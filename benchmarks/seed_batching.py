"""Seed-batched tasks on a CPU: K seeds of one config in one `run_seeds` task against K solo runs.

For collapse (its default config) and feedback's StudentNet (examples/feedback_studentnet_cpu.yaml
at the first level of its grid: BP, trained blocks), in this process: the same K seeds as K
`trainer.run` calls (today's single-run path) and as one `trainer.run_seeds` task. Each repeat runs
the two back to back (each goes first in turn, so that an order effect cancels in the median) and
times each with the wall clock and with this process's CPU time; the reported ratio is the median
over repeats of the per-repeat ratio of seeds per second, task over solo. Target: at K = 8 the task
gives at least 1.5x the solo runs' seeds per second. A trainer that is not `batched` runs a task's
seeds one after another, so its ratio is about 1.

The script also compares each seed's result in the task with its solo run: the largest relative
difference of a final metric, and how many seeds have the same parameters_sha256.

    python benchmarks/seed_batching.py                        # K = 8, one torch thread
    python benchmarks/seed_batching.py --k 16 --threads 2 --repeats 3 --epochs 10
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# `python benchmarks/seed_batching.py` puts benchmarks/ first; this checkout's trainers must win
# over an installed seedgrid's
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from trainers import NullReporter, RunResult, Trainer, get_trainer  # noqa: E402

TARGET_RATIO = 1.5
STUDENTNET_EXAMPLE = ROOT / "examples" / "feedback_studentnet_cpu.yaml"


def collapse_config(trainer: Trainer, steps: int | None) -> Any:
    """collapse's default config, trained for `steps` full-batch steps (None: its default)."""
    return trainer.Config(steps=steps)


def studentnet_config(trainer: Trainer, epochs: int) -> Any:
    """The StudentNet example's config at the first level of each grid axis, for `epochs`."""
    spec = yaml.safe_load(STUDENTNET_EXAMPLE.read_text())
    level = {axis: values[0] for axis, values in spec["grid"].items()}
    return trainer.Config(**{**spec["config"], **level, "epochs": epochs})


def solo(trainer: Trainer, config: Any, seeds: Sequence[int]) -> list[RunResult]:
    return [trainer.run(config, seed, NullReporter()) for seed in seeds]


def task(trainer: Trainer, config: Any, seeds: Sequence[int]) -> list[RunResult]:
    outcomes = trainer.run_seeds(config, seeds, [NullReporter() for _ in seeds])
    for seed, outcome in zip(seeds, outcomes, strict=True):
        if isinstance(outcome, Exception):
            raise RuntimeError(f"seed {seed} of the task failed: {outcome}") from outcome
    return outcomes  # type: ignore[return-value]


def timed(run: Callable[[], list[RunResult]]) -> tuple[list[RunResult], float, float]:
    """The results, wall seconds and this process's CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    results = run()
    return results, time.perf_counter() - wall, time.process_time() - cpu


def largest_relative_difference(a: list[RunResult], b: list[RunResult]) -> float:
    """The largest |x - y| / max(|x|, |y|) over every final metric of every seed (0 where both
    are 0; inf where one is finite and the other not)."""
    largest = 0.0
    for one, other in zip(a, b, strict=True):
        for name in one.metrics.keys() & other.metrics.keys():
            x, y = float(one.metrics[name]), float(other.metrics[name])
            if x == y or (math.isnan(x) and math.isnan(y)):
                continue
            if not (math.isfinite(x) and math.isfinite(y)):
                return math.inf
            largest = max(largest, abs(x - y) / max(abs(x), abs(y)))
    return largest


def same_parameters(a: list[RunResult], b: list[RunResult]) -> int:
    return sum(
        1
        for one, other in zip(a, b, strict=True)
        if one.provenance["parameters_sha256"] == other.provenance["parameters_sha256"]
    )


def compare(
    name: str, trainer: Trainer, config: Any, warm_up: Any, seeds: list[int], repeats: int
) -> float:
    """Print one trainer's repeats and summary; return the median wall-clock ratio."""
    batched = "yes" if trainer.batched else "no (its run_seeds runs one seed after another)"
    print(
        f"{name}: K = {len(seeds)} seeds, torch threads {torch.get_num_threads()}, "
        f"run_seeds batched: {batched}"
    )
    solo(trainer, warm_up, seeds[:1])  # warm-up: first-call costs, allocator
    rows = []
    for repeat in range(repeats):
        sides = {}
        order = ("solo", "task") if repeat % 2 == 0 else ("task", "solo")
        for side in order:
            run = solo if side == "solo" else task
            sides[side] = timed(partial(run, trainer, config, seeds))
        (solo_results, solo_wall, solo_cpu), (task_results, task_wall, task_cpu) = (
            sides["solo"],
            sides["task"],
        )
        k = len(seeds)
        rows.append((k / solo_wall, k / task_wall, k / solo_cpu, k / task_cpu))
        print(
            f"  repeat {repeat}: wall solo {k / solo_wall:7.3f} task {k / task_wall:7.3f} "
            f"seeds/s (ratio {solo_wall / task_wall:.2f});  cpu solo {k / solo_cpu:7.3f} "
            f"task {k / task_cpu:7.3f} seeds/s (ratio {solo_cpu / task_cpu:.2f})"
        )
    ratios = {}
    for clock, s, t in (("wall clock", 0, 1), ("CPU time", 2, 3)):
        ratios[clock] = statistics.median(r[t] / r[s] for r in rows)
        print(
            f"  {clock:>10}: solo median {statistics.median(r[s] for r in rows):.3f} seeds/s, "
            f"task median {statistics.median(r[t] for r in rows):.3f} seeds/s, median ratio "
            f"task/solo {ratios[clock]:.2f}x (target >= {TARGET_RATIO}x: "
            f"{'met' if ratios[clock] >= TARGET_RATIO else 'NOT met'})"
        )
    print(
        f"  task vs solo, last repeat: largest relative difference of a final metric "
        f"{largest_relative_difference(solo_results, task_results):.3g}; parameters_sha256 "
        f"equal for {same_parameters(solo_results, task_results)} of {len(seeds)} seeds"
    )
    return ratios["wall clock"]


def machine_load(threads: int) -> str:
    """The 1-minute load average against this machine's cores, and a warning when other work
    competes for them: the ratio is then noise (StudentNet 2.05x on an idle machine, 1.14-1.66x
    in earlier runs whose load was not recorded)."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    line = f"load average (1 min) {load:.2f} on {cores} cores"
    if load > cores - threads + 0.5:
        line += ": other work competes for the cores; the ratios below read low"
    return line


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=8, help="seeds per task (default 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="collapse's steps (default: its default config's, 4000)",
    )
    # 5: a run's one-time set-up (the teacher's data, the per-seed test pass) is not batched,
    # and at 1 epoch it is a third of the time (1.23x here, against 1.94x at 5 epochs)
    parser.add_argument(
        "--epochs",
        type=int,
        default=5,
        help="StudentNet's epochs (its example trains 30; default 5)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="repeats of the pair, in turn solo first and task first (default 2)",
    )
    args = parser.parse_args(argv)
    for name in ("k", "threads", "steps", "epochs", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    torch.set_num_threads(args.threads)
    print(f"before: {machine_load(args.threads)}")
    seeds = list(range(args.k))
    collapse = get_trainer("collapse")
    feedback = get_trainer("feedback")
    collapse_steps = collapse_config(collapse, args.steps).resolved_steps
    ratios = {
        "collapse": compare(
            f"collapse (default config, {collapse_steps} steps)",
            collapse,
            collapse_config(collapse, args.steps),
            collapse_config(collapse, 10),
            seeds,
            args.repeats,
        ),
        "feedback": compare(
            f"feedback StudentNet ({STUDENTNET_EXAMPLE.name}, BP, "
            f"{args.epochs} epoch{'s' if args.epochs > 1 else ''})",
            feedback,
            studentnet_config(feedback, args.epochs),
            studentnet_config(feedback, 1),
            seeds,
            args.repeats,
        ),
    }
    print(
        "seed-batched task / solo runs, seeds per second (wall clock): "
        + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items())
        + f" (target >= {TARGET_RATIO}x)"
    )
    print(f"after: {machine_load(args.threads)}")


if __name__ == "__main__":
    main()
