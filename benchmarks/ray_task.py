"""One seed-batched task through a local Ray, as the dispatcher sends it (seedgrid's worker task,
`workers.task.run_task`, of K seeds of one condition on one GPU or the CPU, its messages streamed
back), against a bare Ray task doing the same training (the trainer's `run_seeds` of the same
K seeds, or `run` of one, with the same resources, returning nothing but the seeds' final
metrics): the cost of seedgrid's worker half at equal work (issue 38, item 4).

It checks the path a GPU cluster runs, end to end below the service: the task lands on a worker
with the GPU it asked for, every seed starts and ends with a Result, the seeds' final metrics and
provenance (device, task size and index) come back. After one untimed bare task (Ray's worker
start, the imports, the data), the two arms run --repeats times each, alternating which goes
first, each timed from submission until its last message (seedgrid) or its return (bare) in
this driver; the medians and their ratio are printed with the goal (at most 1.5x at K > 1,
2x at K = 1).

Data: the dataset's files under the default data root when they are there, else random CIFAR in
torchvision's layout written to a temporary named root (real times, meaningless accuracies).
The config is the case's paper-scale example (benchmarks/gpu_throughput.py's CASES) with
--epochs and --train-size cut down, so that the task ends in seconds.

    python benchmarks/ray_task.py                        # cff, K = 8, on cuda when visible
    python benchmarks/ray_task.py --case feedback_resmlp --k 4 --json ray.json
    python benchmarks/ray_task.py --smoke                # tiny config, CPU, K = 2 (CI)

It imports ray, torch and the trainers, not FastAPI or a database. In a process where Ray is
already initialised (a test's session cluster) it uses that cluster; else it starts a local one
(`address="local"`: never someone else's) and shuts it down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

import gpu_throughput as gt  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402

from api_schemas import environment  # noqa: E402
from trainers import NullReporter, get_trainer  # noqa: E402
from workers.messages import Result, Started, unbundled  # noqa: E402

ROOT = gt.ROOT


@ray.remote
def bare_task(trainer_name: str, config: dict[str, Any], seeds: list[int], threads: int) -> int:
    """The same training as seedgrid's task of `seeds`, with nothing streamed: run_seeds of the
    seeds (run of one), their outcomes dropped but for a count of those that completed."""
    trainer = get_trainer(trainer_name)
    parsed = trainer.Config.model_validate(config)
    if len(seeds) == 1:
        trainer.run(parsed, seeds[0], NullReporter(), threads=threads)
        return 1
    outcomes = trainer.run_seeds(parsed, seeds, [NullReporter() for _ in seeds], threads=threads)
    return sum(not isinstance(o, Exception) for o in outcomes)


def run_bare(
    trainer_name: str, config: Any, seeds: Sequence[int], num_gpus: float, num_cpus: int
) -> float:
    """Seconds from submitting the bare task to its return."""
    started = time.time()
    done = ray.get(
        bare_task.options(num_gpus=num_gpus, num_cpus=num_cpus).remote(
            trainer_name, config.model_dump(mode="json"), list(seeds), num_cpus
        )
    )
    if done != len(seeds):
        raise SystemExit(f"the bare task completed {done} of {len(seeds)} seeds")
    return time.time() - started


def case_named(name: str) -> gt.Case:
    for case in gt.CASES:
        if case.name == name:
            return case
    raise SystemExit(f"--case: no case {name!r}; the cases: {', '.join(gt.CASE_NAMES)}")


def config_for(case: gt.Case, args: argparse.Namespace, device: str, data_root: str | None) -> Any:
    config, _ = gt.case_config(
        case, smoke=args.smoke, device=device, precision=None, data_root=data_root
    )
    changes: dict[str, Any] = {}
    fields = type(config).model_fields
    if "epochs" in fields:
        changes["epochs"] = args.epochs
    if "head_epochs" in fields:
        changes["head_epochs"] = 1
    if "train_size" in fields and args.train_size is not None:
        changes["train_size"] = args.train_size
    if "test_size" in fields and args.train_size is not None:
        changes["test_size"] = max(64, args.train_size // 5)
    return type(config).model_validate({**config.model_dump(), **changes})


def run_through_ray(
    trainer_name: str, config: Any, seeds: Sequence[int], num_gpus: float, num_cpus: int
) -> dict[str, Any]:
    """Send one `run_task` of `seeds` and read its stream to the end."""
    from workers.task import run_task

    started = time.time()
    stream = run_task.options(num_gpus=num_gpus, num_cpus=num_cpus).remote(
        trainer_name, config.model_dump(mode="json"), list(seeds), 0.5
    )
    where: dict[str, Any] = {}
    results: dict[int, Result] = {}
    points = 0
    first_point_s = None
    for ref in stream:
        for message in unbundled(ray.get(ref)):
            if isinstance(message, Started):
                where = {"pid": message.pid, "hostname": message.hostname}
            elif isinstance(message, Result):
                results[message.index] = message
            else:
                points += len(message.points)
                if first_point_s is None:
                    first_point_s = time.time() - started
    wall = time.time() - started
    return {
        "wall_s": wall,
        "first_point_s": first_point_s,
        "points": points,
        "worker": where,
        "seeds": [
            {
                "seed": seed,
                "status": str(results[i].status) if i in results else "no result",
                "error": results[i].error if i in results else "the task sent no Result",
                "metrics": {
                    k: v
                    for k, v in (results[i].metrics if i in results else {}).items()
                    if isinstance(v, (int, float))
                },
                "device": (results[i].provenance.get("device") if i in results else None),
                "task_size": (results[i].provenance.get("task_size") if i in results else None),
                "task_index": (results[i].provenance.get("task_index") if i in results else None),
            }
            for i, seed in enumerate(seeds)
        ],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="cff", help=f"one of {', '.join(gt.CASE_NAMES)}")
    parser.add_argument("--k", type=int, default=None, help="seeds in the task (default 8)")
    parser.add_argument("--epochs", type=int, default=2, help="the config's epochs")
    parser.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="training images (default 10000; --smoke: the smoke config's)",
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--repeats", type=int, default=3, help="timed tasks per arm")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny config on the CPU, K = 2, 2 repeats"
    )
    parser.add_argument("--json", metavar="PATH", default=None)
    args = parser.parse_args(argv)
    if args.k is None:
        args.k = 2 if args.smoke else 8
    if args.train_size is None and not args.smoke:
        args.train_size = 10_000
    if args.smoke:
        args.device = "cpu"
        args.repeats = 2
    if args.k < 1 or args.epochs < 1 or args.repeats < 1:
        parser.error("--k, --epochs and --repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    case = case_named(args.case)
    trainer = gt.trainer_named(case.trainer)
    with tempfile.TemporaryDirectory(prefix="seedgrid-ray-task-") as fake_dir:
        config = config_for(case, args, device, data_root=None)
        fake = gt.missing_datasets([config], smoke=args.smoke)
        path = [str(ROOT), os.environ.get("PYTHONPATH", "")]  # the workers import this checkout
        env_vars = {"PYTHONPATH": os.pathsep.join(filter(None, path))}
        if fake:
            roots = environment.text(environment.DATA_ROOTS)
            value = ",".join(filter(None, [roots, f"{gt.FAKE_ROOT_NAME}={fake_dir}"]))
            os.environ[environment.DATA_ROOTS] = env_vars[environment.DATA_ROOTS] = value
            for dataset in sorted(fake):
                gt.note(f"writing random {dataset} files under {fake_dir}")
                gt.write_fake(Path(fake_dir), dataset, smoke=args.smoke)
            config = config_for(case, args, device, data_root=gt.FAKE_ROOT_NAME)
        seeds = list(range(args.k))
        threads = int(gt.example(case).get("resources", {}).get("num_cpus", 1))
        threads = 1 if args.smoke else min(threads, os.cpu_count() or 1)
        own = not ray.is_initialized()
        if own:
            gt.note("starting a local Ray")
            ray.init(
                address="local",
                num_cpus=max(threads, 1),
                num_gpus=torch.cuda.device_count() if device == "cuda" else 0,
                include_dashboard=False,
                log_to_driver=True,
                runtime_env={"env_vars": env_vars},
            )
        gpus = 1 if device == "cuda" else 0
        timed: dict[str, list[float]] = {"bare": [], "seedgrid": []}
        try:
            gt.note(f"warm-up: one bare task of {args.k} seeds (worker start, imports, data)")
            run_bare(case.trainer, config, seeds, gpus, threads)
            for repeat in range(args.repeats):
                order = ["bare", "seedgrid"] if repeat % 2 == 0 else ["seedgrid", "bare"]
                for arm in order:
                    gt.note(f"repeat {repeat}: {arm} task of {args.k} seeds on {device}")
                    if arm == "bare":
                        timed[arm].append(run_bare(case.trainer, config, seeds, gpus, threads))
                    else:
                        task = run_through_ray(case.trainer, config, seeds, gpus, threads)
                        timed[arm].append(task["wall_s"])
        finally:
            if own:
                ray.shutdown()
    bare_s, seedgrid_s = statistics.median(timed["bare"]), statistics.median(timed["seedgrid"])
    report = {
        "case": case.name,
        "trainer": case.trainer,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "ray": ray.__version__,
        "k": args.k,
        "epochs": args.epochs,
        "train_size": getattr(config, "train_size", None),
        "batched": trainer.batched,
        "repeats": args.repeats,
        "bare_s": timed["bare"],
        "seedgrid_s": timed["seedgrid"],
        # the last seedgrid task's stream: where it ran, each seed's Result
        "task": task,
        "completed": sum(s["status"] == "completed" for s in task["seeds"]),
        # seedgrid's worker task against a bare Ray task of the same seeds, medians
        "vs_bare": seedgrid_s / bare_s,
        "goal": 1.5 if args.k > 1 else 2.0,
    }
    if args.json is not None:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report))
    return report


def summary(report: dict[str, Any]) -> str:
    task = report["task"]
    lines = [
        f"{report['case']} ({report['trainer']}, batched: {report['batched']}) on "
        f"{report['device']}, torch {report['torch']}, ray {report['ray']}: one task of "
        f"K = {report['k']} seeds, {report['epochs']} epochs, train_size {report['train_size']}",
        "  repeats (alternating first): bare "
        + ", ".join(f"{t:.2f}" for t in report["bare_s"])
        + " s; seedgrid "
        + ", ".join(f"{t:.2f}" for t in report["seedgrid_s"])
        + " s",
        f"  median: bare Ray task {statistics.median(report['bare_s']):.2f} s, seedgrid's task "
        f"{statistics.median(report['seedgrid_s']):.2f} s (last: first point after "
        f"{task['first_point_s'] or 0:.2f} s, {task['points']} points); seedgrid/bare "
        f"{report['vs_bare']:.2f}x, goal <= {report['goal']:.1f}x: "
        + ("met" if report["vs_bare"] <= report["goal"] else "NOT met")
        + f"; completed {report['completed']}/{report['k']}",
    ]
    for seed in task["seeds"]:
        shown = ", ".join(
            f"{k} {v:.4g}" for k, v in sorted(seed["metrics"].items()) if "accuracy" in k
        )
        lines.append(
            f"  seed {seed['seed']}: {seed['status']} on {seed['device']} "
            f"(task_size {seed['task_size']}, index {seed['task_index']})"
            + (f"; {shown}" if shown else "")
            + (f"; error: {seed['error']}" if seed["error"] else "")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
