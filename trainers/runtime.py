"""One run's set-up and loop contract, shared by every trainer.

A trainer subclasses `TrainerBase` and writes `train(config, run) -> TrainOutput`. Before
`train` starts, `TrainerBase.run` has set the run up in one place: the device, deterministic
algorithms on a CPU, the torch thread count, and the run's named random sources. Inside
`train`, the trainer talks to seedgrid only through the `RunContext`:

    for step in range(steps):
        ...one optimisation step...
        if run.should_stop():        # cancelled or diverged: at least once per step
            break
        if step % log_every == 0 and run.log(step, {"loss": loss, ...}):
            break                    # log() answers should_stop() after logging

Divergence is the declared metric (`Trainer.divergence_metric`, "loss" unless a trainer says
otherwise) turning non-finite in a logged point or in the final metrics: the run then stops, and
its result keeps the last finite point's metrics and records the step.

A trainer with checks of its own (feedback's D1 and D2) declares them in `stop_checks` and
reports each evaluation's fired checks through `run.checks_fired({name: reason}, step=...,
epoch=...)`: when the spec asked to stop on one of them, the run stops there (should_stop()
answers True from then on) and its result carries the stop (`RunResult.stop`).

Every loop must reach `should_stop()` or `log()` about once a second of work, so that a cancel
ends any run within about a second.

Seed-batched tasks: `TrainerBase.run_seeds(config, seeds, reporters)` runs K seeds of one config
in one task. Each seed gets its own `RunContext` (its own random sources, reporter, divergence
and stop state), so what it draws does not depend on which seeds share its task. Its result may
still: a batched computation adds and multiplies in another order than a solo run does, and
float32 training can amplify that rounding (feedback's StudentNet, K = 8: some seeds' test
accuracy moved by several points), as running the same seed on 2 threads instead of 1 does.
Such a result is another valid draw of the same run, not a copy of its solo run; the provenance
records the task's size and the seed's place in it (`task_size`, `task_index`) beside
`torch_threads`, and tests/trainers/test_batching_distribution.py checks that the seeds'
distribution (mean and variance) is the same at K = 1 and K = 8. A trainer that overrides
`train_seeds(config, runs)` computes the K seeds as one batched computation (`batched = True`;
a task of one seed trains through `train`, as a run of its own, so that it costs what a solo
run costs): it must mask a seed whose context has stopped (diverged or stopped by a check) and
go on with the others, and return one `TrainOutput` per run. The default
`train_seeds` trains the seeds one after another in the same process (a trainer's data caches
then load the data once per task), reporting each seed's result as soon as it ends.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import platform
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import pydantic
import torch

from trainers.base import (
    CheckStop,
    PreflightProblem,
    Reporter,
    ResourceEstimate,
    RunResult,
    RunWarning,
    TrainerConfig,
)
from trainers.data import TORCHVISION_DATASETS, DataConfig, dataset_problems
from trainers.random_sources import RandomSources, random_sources
from trainers.reports import CrossRunReport

TRAINERS_PACKAGE = Path(__file__).resolve().parent


@cache
def seedgrid_version() -> str:
    """The installed package's version: pyproject.toml is its one source."""
    try:
        return importlib.metadata.version("seedgrid")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (seedgrid is not installed)"


@cache
def source_sha256(path: Path) -> str:
    """sha256 over every .py file under `path` (or of the file itself), by relative path and
    content: two checkouts that differ in a line of the trainer's code give different hashes."""
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path.parent)).encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def git_commit() -> str | None:
    """The commit of the checkout the code runs from, read from .git without running git; None
    for an installed wheel or a copy without .git."""
    git = TRAINERS_PACKAGE.parent / ".git"
    try:
        if git.is_file():  # a worktree: ".git" names the real git directory
            git = (git.parent / git.read_text().split("gitdir:", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[len("ref: ") :]
        common = git / "commondir"
        roots = [git] + ([(git / common.read_text().strip()).resolve()] if common.exists() else [])
        for root in roots:
            if (root / ref).exists():
                return (root / ref).read_text().strip()
            packed = root / "packed-refs"
            if packed.exists():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    except (OSError, IndexError):
        return None
    return None


def trainer_source(trainer: object) -> Path:
    """The module file, or the package folder, that defines `trainer`'s class: a trainer
    package such as trainers/feedback/, or an operator's package (SEEDGRID_TRAINER_MODULES)."""
    from trainers import LOADED_MODULES  # at call time: trainers imports this module

    name = type(trainer).__module__
    module = sys.modules[name]
    file = Path(module.__file__ or "").resolve()
    if file.parent != TRAINERS_PACKAGE and file.parent.parent == TRAINERS_PACKAGE:
        return file.parent
    top = sys.modules.get(name.split(".")[0])
    operators = {loaded.name for loaded in LOADED_MODULES}
    if top is not None and top.__name__ in operators and getattr(top, "__path__", None):
        return Path(list(top.__path__)[0]).resolve()
    return file


@cache
def warm_up() -> None:
    """Pay, once per process, what the first run would pay inside its cancel window: torch's
    first `use_deterministic_algorithms` call imports its compiler stack (about a second).

    An interrupt must not land inside that import: Ray delivers a cancel as KeyboardInterrupt in
    the main thread, and an import it cuts short leaves torch's modules half made, so that every
    later run of the process fails with an AttributeError (`torch._dynamo` has no `utils`). The
    import therefore runs in a thread of its own, which an interrupt cannot reach; an interrupt
    that arrives meanwhile is raised once the import has finished."""
    done = threading.Event()

    def import_then_signal() -> None:
        try:
            _use_deterministic_setting()
        finally:
            done.set()

    # Waited for on an Event, not Thread.join: a join cut short by KeyboardInterrupt marks a
    # running thread as stopped (CPython 3.11), which would end this wait with the import
    # still under way.
    threading.Thread(target=import_then_signal, name="seedgrid-warm-up", daemon=True).start()
    interrupted: KeyboardInterrupt | None = None
    while not done.is_set():
        try:
            done.wait()
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def _use_deterministic_setting() -> None:
    torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled())


def cuda_missing() -> str | None:
    """Why device 'cuda' is not usable in this process (None: it is). Counts the GPUs through
    NVML where it can, so that asking does not initialise CUDA here: a Ray worker whose CUDA
    is initialised keeps the GPUs it saw then, whatever Ray assigns its later tasks."""
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} here is built without CUDA"
    if torch.cuda.device_count() == 0:
        return "no GPU is visible to this process"
    return None


def pick_device(name: str) -> torch.device:
    """auto: the GPU Ray assigned to this process if there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and (missing := cuda_missing()) is not None:
        raise RuntimeError(f"device 'cuda' requested but {missing}")
    return torch.device(name)


@dataclass
class TrainOutput:
    """What `train` returns: final metrics, a diagnostics summary and warnings."""

    metrics: dict[str, float]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[RunWarning] = field(default_factory=list)


class RunContext:
    """One run as its trainer sees it: config, seed, device, random sources, and the reporter
    behind the loop contract (`log`, `should_stop`, `checks_fired`)."""

    def __init__(
        self,
        *,
        config: pydantic.BaseModel,
        seed: int,
        reporter: Reporter,
        device: torch.device,
        sources: RandomSources,
        divergence_metric: str | None,
        stop_on_checks: Collection[str] = (),
        index: int = 0,
        task_size: int = 1,
    ) -> None:
        self.config = config
        self.seed = seed
        # The run's place among the seeds of its task (0 for a task of one seed).
        self.index = index
        self.task_size = task_size  # the seeds of its task (1: a run of its own)
        self.device = device
        self.sources = sources
        self.divergence_metric = divergence_metric
        self.stop_on_checks = frozenset(stop_on_checks)
        self._reporter = reporter
        self.cancelled = False
        self.diverged_at_step: int | None = None
        self.stopped_by: CheckStop | None = None
        self.last_finite: dict[str, float] = {}
        self.last_finite_step: int | None = None
        self._trained: list[torch.Tensor] = []

    def track(self, *trained: torch.nn.Module | torch.Tensor) -> None:
        """Declare what the run trains (modules or tensors, in a fixed order): its final values
        are hashed into the provenance's `parameters_sha256`, so that two runs can be compared
        bit for bit (say at two evaluation frequencies, or on two machines)."""
        for item in trained:
            if isinstance(item, torch.nn.Module):
                self._trained.extend(item.state_dict(keep_vars=True).values())
            else:
                self._trained.append(item)

    def parameters_sha256(self) -> str | None:
        if not self._trained:
            return None
        digest = hashlib.sha256()
        for tensor in self._trained:
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def log(self, step: int, metrics: dict[str, float], epoch: int | None = None) -> bool:
        """Send one point to the reporter; True when the run must stop now."""
        values = {name: float(v) for name, v in metrics.items()}
        self._reporter.log(step, values, epoch=epoch)
        if self.diverged_at_step is None:
            if self._diverging(values):
                self.diverged_at_step = step
            else:
                self.last_finite, self.last_finite_step = values, step
        return self.should_stop()

    def checks_fired(self, fired: Mapping[str, str], *, step: int, epoch: int | None) -> bool:
        """The trainer's checks that fired at this evaluation, each with the reason (what fired,
        value against threshold). True when the spec asked to stop on one of them: the run
        then stops here, as for a cancel, but its result is a whole one (status `stopped`)."""
        asked = [name for name in fired if name in self.stop_on_checks]
        if asked and self.stopped_by is None and not self.stopped:
            self.stopped_by = CheckStop(
                checks=tuple(asked),
                epoch=epoch,
                step=step,
                reason="; ".join(fired[name] for name in asked),
            )
        return self.stopped_by is not None

    def should_stop(self) -> bool:
        """True once the run was cancelled, diverged or stopped by a check: the trainer returns
        what it has."""
        if not self.cancelled and self._reporter.should_stop():
            self.cancelled = True
        return self.stopped

    @property
    def stopped(self) -> bool:
        return self.cancelled or self.diverged_at_step is not None or self.stopped_by is not None

    def _diverging(self, values: dict[str, float]) -> bool:
        value = values.get(self.divergence_metric) if self.divergence_metric else None
        return value is not None and not math.isfinite(value)


class TrainerBase(ABC):
    """The shared part of every trainer: set-up, the loop contract and the result.

    A trainer declares its name, paper, `Config`, metric and diagnostic names, its primary
    metric and the metric whose non-finite value means divergence, and writes `train` and
    `estimate`. Trainer-specific reports over the runs of a whole experiment are declared in
    `reports` (see trainers.reports)."""

    name: ClassVar[str]
    description: ClassVar[str]
    paper: ClassVar[str]
    Config: ClassVar[type[pydantic.BaseModel]]
    metrics: ClassVar[tuple[str, ...]]
    diagnostics: ClassVar[tuple[str, ...]]
    primary_metric: ClassVar[str]
    # A logged or final value of this metric that is NaN or infinite ends the run as diverged.
    divergence_metric: ClassVar[str | None] = "loss"
    # The checks a run can stop on (reported through RunContext.checks_fired); none by default.
    stop_checks: ClassVar[tuple[str, ...]] = ()
    reports: ClassVar[tuple[CrossRunReport[Any], ...]] = ()
    # Metrics with a known range, as (low, high): say (0, 1) for an accuracy. /stats keeps a
    # condition's mean interval within them.
    metric_bounds: ClassVar[dict[str, tuple[float, float]]] = {}
    # Seed-batched tasks (a spec's resources.seeds_per_task): the number of seeds one task runs
    # when the spec does not say, and the most it may ask for. `batched`: whether train_seeds
    # computes them as one batched computation (else one after another in the task).
    seeds_per_task_default: ClassVar[int] = 1
    max_seeds_per_task: ClassVar[int] = 16
    batched: ClassVar[bool] = False

    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]:
        """{accuracy-like metric: the number of test examples it averages} for one completed
        run, from the diagnostics the run stored; /stats reports the binomial noise floor of
        these metrics. The size comes from the run, not the config: it depends on the dataset
        the run loaded (its test split, then `test_size`). Empty: no metric has a test set."""
        return {}

    def resolve_config(self, config: Any) -> Any:
        """`config` with its null defaults set to the values a run uses (see the Trainer
        protocol): what `run` and `run_seeds` train with and record in the provenance."""
        if isinstance(config, TrainerConfig):
            return config.model_copy(update=config.resolved_fields())
        return config

    def device(self, config: Any) -> torch.device:
        """Where a run of `config` trains: the config's `device` field, else the CPU."""
        return pick_device(getattr(config, "device", "cpu"))

    def reads_dataset(self, config: Any) -> bool:
        """Whether a run of `config` loads the image dataset its DataConfig fields name."""
        return isinstance(config, DataConfig)

    def preflight_inputs(self, config: Any) -> dict[str, Any]:
        """The config values `preflight` reads where a machine could refuse them: a `cuda`
        device, and the fields of a dataset read from files (or downloaded). Configs with
        equal inputs are checked once; digits, synthetic data and `auto` need no check."""
        inputs: dict[str, Any] = {}
        if getattr(config, "device", None) == "cuda":
            inputs["device"] = "cuda"
        if self.reads_dataset(config) and (
            config.dataset in TORCHVISION_DATASETS or config.download
        ):
            inputs |= {
                "dataset": config.dataset,
                "data_root": config.data_root,
                "download": config.download,
            }
        return inputs

    def preflight(self, config: Any) -> list[PreflightProblem]:
        """What would make every run of `config` on this machine fail before it trains: a
        `cuda` device with no GPU here, the dataset's files missing under the operator's data
        root (trainers.data.dataset_problems). Looks only: nothing is loaded or trained."""
        problems = []
        if getattr(config, "device", None) == "cuda" and (missing := cuda_missing()) is not None:
            problems.append(PreflightProblem("device", f"device 'cuda' requested but {missing}"))
        if self.reads_dataset(config):
            problems += dataset_problems(config)
        return problems

    def run(
        self,
        config: Any,
        seed: int,
        reporter: Reporter,
        *,
        threads: int | None = None,
        source_seeds: dict[str, int] | None = None,
        stop_on_checks: Collection[str] = (),
    ) -> RunResult:
        """Set the run up, train, and package the result with its provenance.

        `threads`: torch's intra-op thread count for this run (the worker passes the run's
        CPUs); None keeps the process's current count. `source_seeds`: random sources pinned
        to another seed than `seed` (a spec's seed_sources, a source decomposition's level).
        `stop_on_checks`: the checks (of `stop_checks`) on which the run ends early; the
        service refuses others in the spec, and a name this trainer does not declare is a
        ValueError here too. The run trains with `resolve_config(config)`."""
        config = self.resolve_config(config)
        device = self._set_up(config, threads, stop_on_checks)
        context = RunContext(
            config=config,
            seed=seed,
            reporter=reporter,
            device=device,
            sources=random_sources(seed, source_seeds),
            divergence_metric=self.divergence_metric,
            stop_on_checks=stop_on_checks,
        )
        output = self.train(config, context)
        return self._result(context, output)

    def run_seeds(
        self,
        config: Any,
        seeds: Sequence[int],
        reporters: Sequence[Reporter],
        *,
        threads: int | None = None,
        source_seeds: Sequence[dict[str, int] | None] | None = None,
        stop_on_checks: Collection[str] = (),
        on_done: Callable[[int, RunResult | Exception], None] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> list[RunResult | Exception]:
        """K seeds of one config in one task (a seed-batched task): one reporter and, when
        given, one `source_seeds` per seed. Each seed is set up as `run` sets up a run of its
        own; `on_start(index)` hears of each seed as it begins training (every seed at once for
        a `batched` trainer, one after another otherwise), and `on_done(index, outcome)` as
        soon as its outcome is known. The outcomes come in the order of
        `seeds`: a result, or the exception that ended that seed alone (a trainer that is not
        batched goes on with the next seed, unless the task was cancelled: then the seeds not
        started get no outcome). An exception of a batched computation ends every seed: it
        propagates. A batched trainer's task of one seed trains it through `train`, as a run
        of its own (its outcome: as a trainer's that is not batched)."""
        if len(reporters) != len(seeds) or (
            source_seeds is not None and len(source_seeds) != len(seeds)
        ):
            raise ValueError("run_seeds needs one reporter (and one source_seeds) per seed")
        config = self.resolve_config(config)
        device = self._set_up(config, threads, stop_on_checks)
        pinned = list(source_seeds) if source_seeds is not None else [None] * len(seeds)
        contexts = [
            RunContext(
                config=config,
                seed=seed,
                reporter=reporter,
                device=device,
                sources=random_sources(seed, pins),
                divergence_metric=self.divergence_metric,
                stop_on_checks=stop_on_checks,
                index=index,
                task_size=len(seeds),
            )
            for index, (seed, reporter, pins) in enumerate(
                zip(seeds, reporters, pinned, strict=True)
            )
        ]
        outcomes: list[RunResult | Exception] = []

        def done(run: RunContext, outcome: RunResult | Exception) -> None:
            outcomes.append(outcome)
            if on_done is not None:
                on_done(run.index, outcome)

        def start(run: RunContext) -> None:
            if on_start is not None:
                on_start(run.index)

        if self.batched and len(contexts) > 1:  # a task of one seed trains as a run of its own
            for run in contexts:
                start(run)
            for run, output in zip(contexts, self.train_seeds(config, contexts), strict=True):
                done(run, self._result(run, output))
            return outcomes
        for run, reporter in zip(contexts, reporters, strict=True):
            if reporter.should_stop():  # cancelled: the task's remaining seeds never start
                break
            start(run)
            try:
                outcome: RunResult | Exception = self._result(run, self.train(config, run))
            except Exception as exc:  # noqa: BLE001 - this seed fails; the next one runs
                outcome = exc
            done(run, outcome)
        return outcomes

    def train_seeds(self, config: Any, runs: list[RunContext]) -> list[TrainOutput]:
        """A batched trainer's K seeds as one computation, one output per run in order (see the
        module's docstring). Only trainers that set `batched = True` override it."""
        raise NotImplementedError(f"trainer {self.name!r} does not batch seeds")

    def _set_up(
        self, config: Any, threads: int | None, stop_on_checks: Collection[str]
    ) -> torch.device:
        """What every run of the process shares: refused checks, device, determinism, threads."""
        unknown = sorted(set(stop_on_checks) - set(self.stop_checks))
        if unknown:
            raise ValueError(
                f"stop_on_checks: trainer {self.name!r} has no check "
                f"{', '.join(map(repr, unknown))}; it can stop on: "
                f"{', '.join(self.stop_checks) or 'none'}"
            )
        device = self.device(config)
        # Same config and seed on one CPU: identical metrics (docs/architecture.md); on a GPU
        # the fast kernels are not all deterministic and the trainers do not ask them to be.
        torch.use_deterministic_algorithms(device.type == "cpu")
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        return device

    @abstractmethod
    def train(self, config: Any, run: RunContext) -> TrainOutput:
        """The trainer's own part of a run: models, loop, evaluation (see the module's
        docstring for the loop contract)."""

    @abstractmethod
    def estimate(self, config: Any) -> ResourceEstimate:
        """Peak memory and logged points of one run, by arithmetic on the config alone (no
        model, no data, no allocation): cheap enough to call for every grid condition."""

    def provenance(self, run: RunContext) -> dict[str, Any]:
        """What identifies the code, the platform and the inputs of a result."""
        return {
            "seedgrid_version": seedgrid_version(),
            "trainer_source_sha256": source_sha256(trainer_source(self)),
            "trainers_sha256": source_sha256(TRAINERS_PACKAGE),
            "git_commit": git_commit(),
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "device": str(run.device),
            "torch_threads": torch.get_num_threads(),
            # a result depends on these as on the thread count (see the module's docstring)
            "task_size": run.task_size,
            "task_index": run.index,
            "seed": run.seed,
            "source_seeds": dict(run.sources.source_seeds),
            "config": run.config.model_dump(mode="json"),
            "parameters_sha256": run.parameters_sha256(),
        }

    def _result(self, run: RunContext, output: TrainOutput) -> RunResult:
        metrics = dict(output.metrics)
        diagnostics = dict(output.diagnostics)
        final = metrics.get(self.divergence_metric) if self.divergence_metric else None
        diverged_at = run.diverged_at_step
        diverged = diverged_at is not None or (final is not None and not math.isfinite(final))
        if diverged:
            # A diverged run's final metrics would be NaN: keep the last finite point's.
            metrics = dict(run.last_finite)
            diagnostics["last_finite_step"] = run.last_finite_step
            diagnostics["diverged_at_step"] = diverged_at
        stop = None if diverged or run.cancelled else run.stopped_by
        if stop is not None:
            diagnostics["stop"] = stop.as_dict()
        return RunResult(
            metrics=metrics,
            diagnostics=diagnostics,
            warnings=output.warnings,
            provenance=self.provenance(run),
            finished=not run.cancelled,
            diverged=diverged,
            diverged_at_step=diverged_at,
            stop=stop,
        )
