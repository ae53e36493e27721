"""Seed-epochs per second of every trainer at paper scale: one run, K processes, K seeds a task.

Each trainer runs its paper-scale example config (the example's `config` plus the first level of
each grid axis) on one device, measured three ways:

    single     today's single-run path, `trainer.run` of one seed;
    processes  K worker processes of this script on the device, one seed each (what K runs
               packed onto one GPU by a fractional `num_gpus` do);
    run_seeds  `trainer.run_seeds` of K seeds in one process, a seed-batched task (a trainer that
               is not `batched` runs the K seeds there one after another).

A run or a task gets the torch threads a worker gives it, the example's resources.num_cpus
(--threads overrides); each of K processes gets that many, at most the machine's cores / K.

It prints seed-epochs per second, seconds per seed-epoch, the speed-up over `single`, and the
fraction of the time the GPU is busy. collapse trains by full-batch gradient descent: its epoch
is one step.

A measurement is bounded: every seed's reporter records the wall time and the epochs done at
each logged point, and cancels the seed once it has trained --epochs epochs (--steps for
collapse) past its first logged point, or once --max-seconds have passed since the measurement
began. The configs keep the paper's epochs: the cancel, not a shorter schedule, ends the run.
The headline figure is the steady state: the epochs done between consecutive logged points of
every seed, over the length of the union of those time intervals. Set-up (with the first epoch
for cff and ssl, which log an epoch once it is trained), an epoch cut short by the cancel and
the final evaluation are left out; "incl. set-up" divides every epoch done by the whole
measurement's wall time. An epoch includes what the trainer does every epoch (cff's validation pass,
feedback's protocol audit and test accuracy); ssl's kNN monitor, every eval_every (8) epochs,
is not reached. Before a trainer is measured, one run in this process and one in each worker
trains an epoch, so that the dataset is decoded and the device and its kernels are loaded.

GPU busy: on a CUDA device, one more run of --profile-epochs steady epochs under torch.profiler
(CUDA activity only) gives the GPU's kernel, copy and fill time per seed-epoch; times the
unprofiled seed-epochs per second that is the fraction of the wall time the GPU is busy (the
profiler's own host cost slows a launch-bound step, so its wall time is not used). `processes`, and
`run_seeds` of a trainer that is not batched, repeat `single`'s computation per seed, so they use
`single`'s kernel time per seed-epoch; a batched `run_seeds` is profiled itself. On a CPU: n/a.

Data: the CIFAR files under the default data root ($SEEDGRID_DATA_ROOT) when they are there,
else random full-size CIFAR-10 / CIFAR-100 in torchvision's layout (tests/fake_datasets.py),
written to a temporary named data root: real times, meaningless accuracies.

The script imports `trainers` (torch, torchvision, numpy, scipy, scikit-learn, pydantic), pyyaml
and tests/fake_datasets.py; no Ray, FastAPI or database. It runs from a checkout on a bare GPU
machine:

    python benchmarks/gpu_throughput.py                          # every trainer, K = 1 4 8 16
    python benchmarks/gpu_throughput.py --trainers cff --k 4 8 --epochs 3 --json cff.json
    python benchmarks/gpu_throughput.py --modes run_seeds --k 1 8  # no worker processes
    python benchmarks/gpu_throughput.py --smoke                  # tiny configs, CPU, K = 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
# `python benchmarks/gpu_throughput.py` puts benchmarks/ first; this checkout's trainers must win
# over an installed seedgrid's
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from api_schemas import environment  # noqa: E402
from trainers import get_trainer  # noqa: E402
from trainers.data import load_for  # noqa: E402
from trainers.data.catalogue import TORCHVISION_DATASETS  # noqa: E402
from trainers.data.sources import DatasetUnavailable  # noqa: E402
from trainers.runtime import TrainerBase  # noqa: E402

MODES = ("single", "processes", "run_seeds")
FAKE_ROOT_NAME = "bench-fake"
# The activities of the GPU's own timeline: kernels, copies and fills (not annotations).
DEVICE_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


@dataclass(frozen=True)
class Case:
    """One trainer at its paper-scale example config, and how its progress is counted."""

    name: str
    trainer: str
    example: str
    # "epoch": progress is a logged point's epoch + epoch_offset (cff and ssl log epoch e once
    # it is trained, feedback and ssl_sim log epoch 0 before training); "step": its step.
    unit: str
    epoch_offset: int = 0
    # --smoke: config changes for a tiny run on a CPU
    smoke: dict[str, Any] = field(default_factory=dict)


CASES = (
    Case(
        "cff",
        "cff",
        "examples/cff_cifar10_paper.yaml",
        "epoch",
        1,
        {"width": 16, "depth": 1, "heads": 2, "patch": 8, "batch_size": 32, "train_size": 64},
    ),
    Case(
        "feedback_resmlp",
        "feedback",
        "examples/feedback_resmlp_cifar10_audit.yaml",
        "epoch",
        0,
        {"width": 16, "depth": 1, "batch_size": 32, "eval_batch_size": 32},
    ),
    Case(
        "ssl",
        "ssl",
        "examples/ssl_cifar100_cut_gradscale.yaml",
        "epoch",
        1,
        {"backbone": "resnet_small", "batch_size": 16, "image_size": 8, "train_size": 32},
    ),
    Case(
        "collapse",
        "collapse",
        "examples/collapse_stopgrad.yaml",
        "step",
        0,
        {"n_samples": 40, "steps": 200},
    ),
    Case(
        "ssl_sim",
        "ssl_sim",
        "examples/ssl_sim_latent_class.yaml",
        "epoch",
        0,
        {"n_samples": 128, "batch_size": 64},
    ),
    Case(
        "feedback_studentnet",
        "feedback",
        "examples/feedback_studentnet_cpu.yaml",
        "epoch",
        0,
        {
            "width": 16,
            "depth": 1,
            "student_train_size": 128,
            "student_test_size": 64,
            "eval_batch_size": 32,
            "batch_size": 32,
        },
    ),
)
CASE_NAMES = tuple(case.name for case in CASES)


# ---------------------------------------------------------------------------------------------
# timing


def progress_of(unit: str, epoch_offset: int) -> Callable[[int, int | None], float | None]:
    """The units done at a logged point (step, epoch); None for a point that is not an epoch's."""
    if unit == "step":
        return lambda step, epoch: float(step)
    return lambda step, epoch: None if epoch is None else float(epoch + epoch_offset)


class BoundedReporter:
    """One seed's reporter for a measurement: keeps (time.time(), units done) of every logged
    point and stops the seed once it has done `bound` units past its first logged point or the
    clock passed `deadline`. `on_first_point` is called at the seed's first logged point."""

    def __init__(
        self,
        progress: Callable[[int, int | None], float | None],
        bound: float,
        deadline: float,
        on_first_point: Callable[[], None] | None = None,
    ) -> None:
        self.progress = progress
        self.bound = bound
        self.deadline = deadline
        self.on_first_point = on_first_point
        self.points: list[tuple[float, float]] = []

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> None:
        done = self.progress(step, epoch)
        if done is None:
            return
        self.points.append((time.time(), done))
        if len(self.points) == 1 and self.on_first_point is not None:
            self.on_first_point()

    def should_stop(self) -> bool:
        if self.points and self.points[-1][1] - self.points[0][1] >= self.bound:
            return True
        return time.time() >= self.deadline


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of closed intervals (start, end)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def steady_units(traces: Sequence[Sequence[tuple[float, float]]]) -> tuple[float, float]:
    """(units, seconds): the units done between consecutive logged points of each seed's trace
    of (time, units done), and the length of the union of those time intervals (seeds that
    train at the same time share it; seeds that train one after another add up)."""
    units, intervals = 0.0, []
    for trace in traces:
        for (t0, u0), (t1, u1) in zip(trace, trace[1:], strict=False):
            if u1 > u0:
                units += u1 - u0
                intervals.append((t0, t1))
    return units, union_length(intervals)


class GpuClock:
    """Seconds the GPU spends in kernels, copies and fills while it is on (torch.profiler with
    CUDA activity only; the union of those intervals, so that concurrent streams count once)."""

    def __init__(self) -> None:
        self._profiler: torch.profiler.profile | None = None

    def start(self) -> None:
        if self._profiler is not None:
            return
        torch.cuda.synchronize()
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        self._profiler.start()

    @property
    def started(self) -> bool:
        return self._profiler is not None

    def stop(self) -> float | None:
        """The busy seconds; None (and a note) when the profiler saw no kernel."""
        if self._profiler is None:
            raise RuntimeError("the run logged no point: the GPU clock never started")
        torch.cuda.synchronize()
        self._profiler.stop()
        results = self._profiler.profiler.kineto_results if self._profiler.profiler else None
        assert results is not None, "a stopped profiler holds its results"
        events = results.events()  # unparsed: no FunctionEvents are built
        on_gpu = [e for e in events if e.device_type() == torch.autograd.DeviceType.CUDA]
        busy = [
            (e.start_ns(), e.end_ns()) for e in on_gpu if e.activity_type() in DEVICE_ACTIVITIES
        ]
        if not busy:
            seen = sorted({e.activity_type() for e in on_gpu})
            note(f"GPU clock: no kernel in the profile (GPU activities seen: {seen or 'none'})")
            return None
        return union_length(busy) / 1e9


@dataclass
class Measurement:
    """One mode at one K: every seed's trace of (time, units done), the wall time of the whole
    measurement, and the seeds that failed."""

    traces: list[list[tuple[float, float]]]
    wall_s: float
    errors: list[str] = field(default_factory=list)


def run_one(
    trainer: TrainerBase,
    config: Any,
    seed: int,
    progress: Callable[..., float | None],
    bound: float,
    deadline: float,
    threads: int | None = None,
    clock: GpuClock | None = None,
) -> Measurement:
    """`trainer.run` of one seed under a BoundedReporter (the `single` mode and a worker's
    seed); with `clock`, the GPU clock runs from the seed's first logged point to its end."""
    reporter = BoundedReporter(
        progress, bound, deadline, clock.start if clock is not None else None
    )
    started = time.time()
    trainer.run(config, seed, reporter, threads=threads)
    synchronize(trainer.device(config))
    return Measurement([reporter.points], time.time() - started)


def run_batched(
    trainer: TrainerBase,
    config: Any,
    seeds: Sequence[int],
    progress: Callable[..., float | None],
    bound: float,
    deadline: float,
    threads: int | None = None,
    clock: GpuClock | None = None,
) -> Measurement:
    """`trainer.run_seeds` of `seeds` in this process (the `run_seeds` mode)."""
    reporters = [
        BoundedReporter(progress, bound, deadline, clock.start if clock is not None else None)
        for _ in seeds
    ]
    started = time.time()
    outcomes = trainer.run_seeds(config, seeds, reporters, threads=threads)
    synchronize(trainer.device(config))
    errors = [
        f"seed {seed}: {type(o).__name__}: {o}"
        for seed, o in zip(seeds, outcomes, strict=True)
        if isinstance(o, Exception)
    ]
    return Measurement([r.points for r in reporters], time.time() - started, errors)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
# worker processes (the `processes` mode)


def worker_main() -> None:
    """Worker mode: one JSON command a line on stdin, one JSON answer a line on stdout. A
    command runs one seed (`run_one`); anything a trainer prints goes to stderr."""
    answers: TextIO = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command.get("ping"):
                answer: dict[str, Any] = {"pong": True}
            else:
                trainer = trainer_named(command["trainer"])
                config = trainer.Config.model_validate(command["config"])
                measured = run_one(
                    trainer,
                    config,
                    command["seed"],
                    progress_of(*command["progress"]),
                    command["bound"],
                    command["deadline"],
                    threads=command["threads"],
                )
                answer = {"points": measured.traces[0], "ended": time.time()}
        except Exception as exc:  # noqa: BLE001 - the parent reports it for this seed
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


class WorkerPool:
    """Long-lived worker processes of this script, as Ray's workers are: each imports torch and
    the trainers once and keeps its decoded datasets between commands."""

    def __init__(self, size: int, env: dict[str, str]) -> None:
        self.processes = [
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for _ in range(size)
        ]

    def ask(self, commands: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send the i-th command to the i-th worker, all before any answer is read."""
        self.send(commands)
        return self.receive(len(commands))

    def send(self, commands: Sequence[dict[str, Any]]) -> None:
        for process, command in zip(self.processes, commands, strict=False):
            assert process.stdin is not None
            process.stdin.write(json.dumps(command) + "\n")
            process.stdin.flush()

    def receive(self, count: int) -> list[dict[str, Any]]:
        """One answer from each of the first `count` workers."""
        answers = []
        for process in self.processes[:count]:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"worker process {process.pid} exited (code {process.wait()})")
            answers.append(json.loads(line))
        return answers

    def close(self) -> None:
        for process in self.processes:
            if process.stdin is not None:
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def run_processes(
    pool: WorkerPool,
    case: Case,
    config: Any,
    seeds: Sequence[int],
    bound: float,
    max_seconds: float,
    threads: int,
) -> Measurement:
    """One seed in each of len(seeds) workers at once, each with `threads` torch threads; wall
    time until the last one ended."""
    started = time.time()
    commands = [
        {
            "trainer": case.trainer,
            "config": config.model_dump(mode="json"),
            "seed": seed,
            "progress": [case.unit, case.epoch_offset],
            "bound": bound,
            "deadline": started + max_seconds,
            "threads": threads,
        }
        for seed in seeds
    ]
    answers = pool.ask(commands)
    errors = [
        f"seed {seed}: {a['error']}" for seed, a in zip(seeds, answers, strict=True) if "error" in a
    ]
    ended = max((a["ended"] for a in answers if "ended" in a), default=time.time())
    return Measurement(
        [[tuple(p) for p in a.get("points", [])] for a in answers], ended - started, errors
    )


# ---------------------------------------------------------------------------------------------
# configs and data


def trainer_named(name: str) -> TrainerBase:
    """A registered trainer, with TrainerBase's `device(config)` (every built-in one)."""
    trainer = get_trainer(name)
    if not isinstance(trainer, TrainerBase):
        raise TypeError(f"trainer {name!r} is not a trainers.runtime.TrainerBase")
    return trainer


def example(case: Case) -> dict[str, Any]:
    return yaml.safe_load((ROOT / case.example).read_text())


def case_config(
    case: Case, *, smoke: bool, device: str, precision: str | None, data_root: str | None
) -> tuple[Any, dict[str, Any]]:
    """The trainer's Config for a case, and the grid level it took (the first of each axis)."""
    trainer = trainer_named(case.trainer)
    spec = example(case)
    level = {axis: values[0] for axis, values in (spec.get("grid") or {}).items()}
    values = {**spec["config"], **level, **(case.smoke if smoke else {})}
    fields = trainer.Config.model_fields
    if "device" in fields:
        values["device"] = device
    if precision is not None and "precision" in fields:
        values["precision"] = precision
    if data_root is not None and values.get("dataset") in TORCHVISION_DATASETS:
        values["data_root"] = data_root
    return trainer.Config(**values), level


def needs_files(config: Any) -> str | None:
    """The torchvision dataset a config reads from disk, if any (studentnet reads none)."""
    dataset = getattr(config, "dataset", None)
    if dataset not in TORCHVISION_DATASETS or getattr(config, "arch", None) == "studentnet":
        return None
    return dataset


def write_fake(root: Path, dataset: str, *, smoke: bool) -> None:
    """Random CIFAR files in torchvision's layout: full size (CIFAR-10 5 x 10,000 + 10,000,
    CIFAR-100 50,000 + 10,000), or a few hundred images for --smoke."""
    from tests.fake_datasets import write_cifar

    if dataset == "cifar10":
        write_cifar(root, classes=10, per_batch=40 if smoke else 10_000)
    elif dataset == "cifar100":
        write_cifar(
            root,
            classes=100,
            per_batch=200 if smoke else 50_000,
            test_per_batch=40 if smoke else 10_000,
        )
    else:
        raise ValueError(
            f"no fake writer for dataset {dataset!r}; put its files under $SEEDGRID_DATA_ROOT"
        )


def missing_datasets(configs: Iterable[Any], *, smoke: bool) -> set[str]:
    """The datasets the configs read that the default data root lacks (all of them with
    --smoke, which never reads the real files)."""
    missing = set()
    for config in configs:
        dataset = needs_files(config)
        if dataset is None or dataset in missing:
            continue
        if smoke:
            missing.add(dataset)
            continue
        try:
            load_for(config)  # decodes it once for this process, which measures it next
        except DatasetUnavailable:
            missing.add(dataset)
    return missing


# ---------------------------------------------------------------------------------------------
# the benchmark


@dataclass
class Row:
    """One line of the table (and of the JSON's results): a mode at one K, its torch threads
    per run or task, and the figures of the module's docstring."""

    mode: str
    k: int
    threads: int
    seeds_measured: int = 0
    seed_epochs_per_s: float | None = None
    s_per_seed_epoch: float | None = None
    seed_epochs_per_s_incl_setup: float | None = None
    wall_s: float | None = None
    vs_single: float | None = None
    gpu_busy: float | None = None
    error: str | None = None


def summarise(mode: str, k: int, threads: int, measured: Measurement) -> Row:
    units, seconds = steady_units(measured.traces)
    done = sum(trace[-1][1] for trace in measured.traces if trace)
    row = Row(
        mode,
        k,
        threads,
        seeds_measured=sum(1 for t in measured.traces if len(t) > 1),
        wall_s=measured.wall_s,
    )
    if measured.errors:
        row.error = "; ".join(measured.errors)
    if units > 0 and seconds > 0:
        row.seed_epochs_per_s = units / seconds
        row.s_per_seed_epoch = seconds / units
        row.seed_epochs_per_s_incl_setup = done / measured.wall_s
    elif row.error is None:
        row.error = "no whole epoch between two logged points: raise --max-seconds or --epochs"
    return row


def kernel_s_per_unit(measure: Callable[[GpuClock], Measurement]) -> float | None:
    """GPU busy seconds per steady unit of a measurement run under the GPU clock; None (and a
    note) when that run fails."""
    clock = GpuClock()
    try:
        measured = measure(clock)
    except Exception as exc:  # noqa: BLE001 - the row keeps its throughput, without GPU busy
        note(f"the profiled run failed, GPU busy is left out: {type(exc).__name__}: {exc}")
        if clock.started:
            clock.stop()
        return None
    if not clock.started:
        note("the profiled run logged no point before its time was up: GPU busy is left out")
        return None
    kernel_s = clock.stop()
    units, _ = steady_units(measured.traces)
    return kernel_s / units if kernel_s is not None and units > 0 else None


# The share of a GPU's free memory the runs measured at once may take, by their estimates.
MEMORY_SHARE = 0.9


def device_capacity(trainer: TrainerBase, config: Any, device: torch.device) -> int | None:
    """How many runs of `config` fit the device's free memory at once by the trainer's own
    estimate (ResourceEstimate.memory_bytes); None on a CPU (no bound here). A K-seed task of a
    batched trainer holds K runs' memory, as K processes do."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    need = max(1, trainer.estimate(config).memory_bytes)
    return max(1, int(free * MEMORY_SHARE // need))


def measure_case(
    case: Case, config: Any, args: argparse.Namespace, pool: WorkerPool | None
) -> list[Row]:
    """Every mode and K of one case, after a warm-up in this process and in every worker."""
    trainer = trainer_named(case.trainer)
    device = trainer.device(config)
    on_gpu = device.type == "cuda"
    progress = progress_of(case.unit, case.epoch_offset)
    bound = float(args.steps if case.unit == "step" else args.epochs)
    threads = args.threads or int(example(case).get("resources", {}).get("num_cpus", 1))
    cores = os.cpu_count() or 1

    def deadline() -> float:
        return time.time() + args.max_seconds

    capacity = device_capacity(trainer, config, device)
    warmed = len(pool.processes) if pool is not None else 0
    if capacity is not None and capacity < warmed:
        note(
            f"{case.name}: {capacity} runs fit the device by the trainer's estimate "
            f"({trainer.estimate(config).memory_bytes / 2**30:.1f} GiB a run): K above it is "
            "not measured"
        )
        warmed = capacity
    note(f"{case.name}: warm-up")
    # The warm-up ends once a seed has trained an epoch (or a step): at its first logged point
    # where that point follows a trained epoch (cff, ssl), else at its second.
    warm_bound = 0 if case.epoch_offset else 1
    if pool is not None:  # the workers warm up while this process does (as many as fit)
        pool.send(
            [
                {
                    "trainer": case.trainer,
                    "config": config.model_dump(mode="json"),
                    "seed": 0,
                    "progress": [case.unit, case.epoch_offset],
                    "bound": warm_bound,
                    "deadline": deadline(),
                    "threads": 1,
                }
            ]
            * warmed
        )
    run_one(trainer, config, 0, progress, warm_bound, deadline(), threads=threads)
    if pool is not None:
        failed = [a["error"] for a in pool.receive(warmed) if "error" in a]
        if failed:
            note(f"{case.name}: a worker's warm-up failed: {failed[0]}")
    rows: list[Row] = []

    def attempt(mode: str, k: int, threads: int, measure: Callable[[], Measurement]) -> Row:
        batched_at_once = mode == "processes" or (mode == "run_seeds" and trainer.batched)
        if capacity is not None and batched_at_once and k > capacity:
            return Row(
                mode,
                k,
                threads,
                error=f"not measured: {k} runs need more memory "
                f"than the device's free {MEMORY_SHARE:.0%} by the trainer's estimate",
            )
        note(f"{case.name}: {mode} K={k}, {threads} threads")
        try:
            return summarise(mode, k, threads, measure())
        except Exception as exc:  # noqa: BLE001 - say it in this row, measure the rest
            return Row(mode, k, threads, error=f"{type(exc).__name__}: {exc}")

    single = attempt(
        "single",
        1,
        threads,
        partial(run_one, trainer, config, 0, progress, bound, deadline(), threads),
    )
    rows.append(single)
    profile = on_gpu and not args.no_busy
    per_unit_single = None
    if profile and single.error is None:
        per_unit_single = kernel_s_per_unit(
            partial(run_one, trainer, config, 0, progress, args.profile_epochs, deadline(), threads)
        )
    for k in args.k if "run_seeds" in args.modes else ():
        row = attempt(
            "run_seeds",
            k,
            threads,
            partial(
                run_batched, trainer, config, list(range(k)), progress, bound, deadline(), threads
            ),
        )
        per_unit = per_unit_single
        if profile and trainer.batched and row.error is None:
            per_unit = kernel_s_per_unit(
                partial(
                    run_batched,
                    trainer,
                    config,
                    list(range(k)),
                    progress,
                    args.profile_epochs,
                    deadline(),
                    threads,
                )
            )
        row.gpu_busy = busy(per_unit, row)
        rows.append(row)
    if pool is not None:
        if on_gpu:
            torch.cuda.empty_cache()  # this process's cached blocks, for the workers
        for k in args.k:
            each = max(1, min(threads, cores // k))
            row = attempt(
                "processes",
                k,
                each,
                partial(
                    run_processes, pool, case, config, list(range(k)), bound, args.max_seconds, each
                ),
            )
            row.gpu_busy = busy(per_unit_single, row)
            rows.append(row)
    single.gpu_busy = busy(per_unit_single, single)
    for row in rows:
        if row.seed_epochs_per_s is not None and single.seed_epochs_per_s:
            row.vs_single = row.seed_epochs_per_s / single.seed_epochs_per_s
    order = {mode: i for i, mode in enumerate(MODES)}
    return sorted(rows, key=lambda r: (order[r.mode], r.k))


def busy(kernel_s_per_unit: float | None, row: Row) -> float | None:
    if kernel_s_per_unit is None or row.seed_epochs_per_s is None:
        return None
    return kernel_s_per_unit * row.seed_epochs_per_s


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# output


def number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if value < 10**digits else f"{value:.0f}"


def table(report: dict[str, Any]) -> str:
    lines = [
        f"device {report['device']}, torch {report['torch']}, {report['measured']}; "
        f"data: {report['data']}"
    ]
    for case in report["trainers"]:
        level = ", ".join(f"{k}={v}" for k, v in case["grid_level"].items())
        precision = f", precision {case['precision']}" if case["precision"] else ""
        lines += [
            "",
            f"{case['name']}: {case['example']} + {level or 'no grid'} "
            f"(device {case['device']}{precision}, run_seeds batched: "
            f"{'yes' if case['batched'] else 'no, one seed after another'}"
            f"{'; an epoch is one full-batch step' if case['unit'] == 'step' else ''})",
        ]
        lines.append(
            f"  {'mode':<10} {'K':>3} {'threads':>7} {'seed-epochs/s':>14} "
            f"{'s/seed-epoch':>13} {'vs single':>10} {'incl. set-up/s':>15} "
            f"{'GPU busy':>9} {'seeds':>6}"
        )
        for row in case["results"]:
            if row["error"] and row["seed_epochs_per_s"] is None:
                lines.append(
                    f"  {row['mode']:<10} {row['k']:>3} {row['threads']:>7}  failed: {row['error']}"
                )
                continue
            gpu = "n/a" if row["gpu_busy"] is None else f"{100 * row['gpu_busy']:.0f}%"
            ratio = "-" if row["vs_single"] is None else f"{row['vs_single']:.2f}x"
            lines.append(
                f"  {row['mode']:<10} {row['k']:>3} {row['threads']:>7} "
                f"{number(row['seed_epochs_per_s']):>14} "
                f"{number(row['s_per_seed_epoch']):>13} {ratio:>10} "
                f"{number(row['seed_epochs_per_s_incl_setup']):>15} {gpu:>9} "
                f"{row['seeds_measured']:>3}/{row['k']:<2}"
            )
            if row["error"]:
                lines.append(f"  {'':<14} some seeds failed: {row['error']}")
    return "\n".join(line.rstrip() for line in lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trainers",
        nargs="+",
        choices=CASE_NAMES,
        default=list(CASE_NAMES),
        metavar="NAME",
        help=f"of {', '.join(CASE_NAMES)} (default: all)",
    )
    parser.add_argument(
        "--k",
        nargs="+",
        type=int,
        default=None,
        help="seeds a measurement of run_seeds and processes (default 1 4 8 16; --smoke 1 2)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="steady epochs a seed trains per measurement, after its first "
        "logged point (default 2; --smoke 1)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="the same for collapse, whose epoch is a step (default 1000; --smoke 10)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="cancel every seed of a measurement this long after it began (default 60; --smoke 20)",
    )
    parser.add_argument(
        "--profile-epochs",
        type=int,
        default=1,
        help="steady epochs of the profiled run that gives GPU busy",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES[1:],
        default=list(MODES[1:]),
        help="what is measured beside `single`, the baseline (default: both)",
    )
    parser.add_argument("--no-busy", action="store_true", help="skip the profiled runs")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of a run or task (default: the example's "
        "resources.num_cpus; --smoke 1)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: cuda when a GPU is visible (--smoke: always cpu)",
    )
    parser.add_argument(
        "--precision",
        default=None,
        help="the config's `precision`, for trainers whose Config has the field",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny configs and data on the CPU, for a check in seconds",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the results as JSON to PATH, after each trainer ('-': stdout, no table)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = (
        {"k": [1, 2], "epochs": 1, "steps": 10, "max_seconds": 20.0}
        if args.smoke
        else {"k": [1, 4, 8, 16], "epochs": 2, "steps": 1000, "max_seconds": 60.0}
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.smoke:
        args.device = "cpu"
        args.threads = args.threads or 1
    for name in ("epochs", "steps", "profile_epochs", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if any(k < 1 for k in args.k):
        parser.error("--k: every K must be at least 1")
    if args.max_seconds <= 0:
        parser.error("--max-seconds must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is visible to this process")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker_main()
        return
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [case for case in CASES if case.name in args.trainers]
    with tempfile.TemporaryDirectory(prefix="seedgrid-bench-") as fake_dir:
        try:
            plain = {
                case.name: case_config(
                    case, smoke=args.smoke, device=device, precision=args.precision, data_root=None
                )
                for case in cases
            }
        except ValueError as exc:  # pydantic's ValidationError names the field
            sys.exit(f"config: {exc}")
        fake = missing_datasets((config for config, _ in plain.values()), smoke=args.smoke)
        env = dict(os.environ)
        if fake:
            roots = environment.text(environment.DATA_ROOTS)
            env[environment.DATA_ROOTS] = ",".join(
                filter(None, [roots, f"{FAKE_ROOT_NAME}={fake_dir}"])
            )
            os.environ[environment.DATA_ROOTS] = env[environment.DATA_ROOTS]
        if args.precision is not None:
            taking = [n for n, (c, _) in plain.items() if hasattr(c, "precision")]
            note(
                f"--precision {args.precision}: "
                f"{', '.join(taking) if taking else 'no trainer here has a precision field'}"
            )
        configs = {
            name: (
                case_config(
                    case,
                    smoke=args.smoke,
                    device=device,
                    precision=args.precision,
                    data_root=FAKE_ROOT_NAME,
                )
                if needs_files(plain[name][0]) in fake
                else plain[name]
            )
            for name, case in ((c.name, c) for c in cases)
        }
        # the workers import while the fake files are written
        pool = WorkerPool(max(args.k), env) if "processes" in args.modes else None
        try:
            for dataset in sorted(fake):
                note(
                    f"writing random {dataset} files ({'smoke' if args.smoke else 'full'} "
                    f"size) under {fake_dir}"
                )
                write_fake(Path(fake_dir), dataset, smoke=args.smoke)
            if pool is not None:
                pool.ask([{"ping": True}] * len(pool.processes))
            report = {
                "device": (torch.cuda.get_device_name() if device == "cuda" else "cpu"),
                "torch": torch.__version__,
                "measured": (
                    f"{args.epochs} steady epoch{'s' if args.epochs > 1 else ''} "
                    f"({args.steps} steps for collapse) a seed, at most "
                    f"{args.max_seconds:g} s a measurement"
                ),
                "data": (
                    f"random full-size {', '.join(sorted(fake))} (fake)"
                    if fake and not args.smoke
                    else "tiny random CIFAR (smoke)"
                    if fake
                    else "the files under the default data root"
                ),
                "smoke": args.smoke,
                "epochs": args.epochs,
                "steps": args.steps,
                "max_seconds": args.max_seconds,
                "trainers": [],
            }
            for case in cases:
                config, level = configs[case.name]
                trainer = trainer_named(case.trainer)
                rows = measure_case(case, config, args, pool)
                report["trainers"].append(
                    {
                        "name": case.name,
                        "trainer": case.trainer,
                        "example": case.example,
                        "grid_level": level,
                        "device": str(trainer.device(config)),
                        "batched": trainer.batched,
                        "unit": case.unit,
                        "precision": getattr(config, "precision", None),
                        "config": config.model_dump(mode="json"),
                        "results": [vars(row) for row in rows],
                    }
                )
                if args.json not in (None, "-"):  # a run cut short keeps what it measured
                    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        finally:
            if pool is not None:
                pool.close()
    if args.json == "-":
        print(json.dumps(report, indent=2))
        return
    print(table(report))


if __name__ == "__main__":
    main()
