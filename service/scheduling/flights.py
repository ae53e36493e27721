"""What a dispatcher holds of its Ray tasks: the tasks in flight and their runs, what one
pump read from them (a harvest), what an experiment's runs share (a template), and how claimed
runs group into tasks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from api_schemas import ExperimentSpec
from service.analysis.sources import SourcePlan
from service.scheduling.run_records import AttemptKey
from service.specs import seeds_per_task
from trainers import REGISTRY
from workers.messages import Result, Started


@dataclass(eq=False)
class TaskFlight:
    """One Ray task in flight: the seeds of one condition it runs (one, or a seed-batched
    task's), by their index in the task, while they have no result."""

    generator: Any
    trainer: str
    # time.monotonic() at the claim: the dispatch latency (/metrics)
    claimed_at: float
    runs: dict[int, InFlight] = field(default_factory=dict)
    cancel_sent_at: float | None = None
    # the task's first Started (where it runs)
    started: Started | None = None


@dataclass(eq=False)
class InFlight:
    """One run in flight: its attempt, and the task (and place in it) that runs it."""

    run_id: int
    experiment_id: int
    attempt: int
    task: TaskFlight
    index: int = 0
    # time.monotonic() at its seed's Started: the run's duration (/metrics)
    started_at: float | None = None

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(
            run_id=self.run_id, experiment_id=self.experiment_id, attempt=self.attempt
        )

    @property
    def generator(self) -> Any:
        return self.task.generator

    @property
    def started(self) -> Started | None:
        return self.task.started


def tasks_of(flights: Any) -> list[TaskFlight]:
    """The distinct tasks of some flights, in first-seen order."""
    return list({id(f.task): f.task for f in flights}.values())


@dataclass(frozen=True)
class RunTemplate:
    """What every run of one experiment shares: the base config, how its runs seed their
    random sources, the checks on which a run ends early and the seeds one task runs."""

    config: dict[str, Any]
    sources: SourcePlan
    stop_on_checks: tuple[str, ...]
    seeds_per_task: int = 1


@dataclass
class Harvest:
    """What one or more pumps read from Ray, written in one transaction."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    started: list[tuple[InFlight, Started]] = field(default_factory=list)
    results: list[tuple[InFlight, Result]] = field(default_factory=list)
    lost: list[tuple[InFlight, str]] = field(default_factory=list)
    cancelled: list[InFlight] = field(default_factory=list)
    # every flight something above came from, by run id
    flights: dict[int, InFlight] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.metrics or self.started or self.results or self.lost or self.cancelled)

    def extend(self, later: Harvest) -> None:
        """Add what a later pump read (the dispatcher holds a few pumps' harvests for one
        transaction): each run's messages stay in the order they were read."""
        self.metrics += later.metrics
        self.started += later.started
        self.results += later.results
        self.lost += later.lost
        self.cancelled += later.cancelled
        self.flights.update(later.flights)

    def only(self, run_ids: set[int]) -> Harvest:
        """The part of this harvest about the given runs."""
        return Harvest(
            metrics=[m for m in self.metrics if m["run_id"] in run_ids],
            started=[(f, m) for f, m in self.started if f.run_id in run_ids],
            results=[(f, m) for f, m in self.results if f.run_id in run_ids],
            lost=[(f, r) for f, r in self.lost if f.run_id in run_ids],
            cancelled=[f for f in self.cancelled if f.run_id in run_ids],
            flights={i: f for i, f in self.flights.items() if i in run_ids},
        )


class TaskRun(Protocol):
    """What task_groups reads of a run: a ClaimedRun, or a queued run's row before its claim."""

    @property
    def experiment_id(self) -> int: ...
    @property
    def condition(self) -> dict[str, Any]: ...
    @property
    def num_cpus(self) -> float: ...
    @property
    def num_gpus(self) -> float: ...


R = TypeVar("R", bound=TaskRun)


def task_groups(claimed: list[R], sizes: dict[int, int]) -> list[list[R]]:
    """The claimed (or to be claimed) runs as tasks: consecutive runs (claim order) of one
    experiment and condition, up to the experiment's seeds_per_task (`sizes`, by experiment
    id) each; a run's resources are its task's."""
    groups: list[list[R]] = []
    open_groups: dict[tuple[Any, ...], list[R]] = {}
    for run in claimed:
        size = sizes.get(run.experiment_id, 1)
        if size <= 1:
            groups.append([run])
            continue
        key = (
            run.experiment_id,
            json.dumps(run.condition, sort_keys=True),
            run.num_cpus,
            run.num_gpus,
        )
        group = open_groups.get(key)
        if group is None or len(group) >= size:
            group = open_groups[key] = []
            groups.append(group)
        group.append(run)
    return groups


def task_size(template: RunTemplate | str) -> int:
    return template.seeds_per_task if isinstance(template, RunTemplate) else 1


def spec_seeds_per_task(spec: ExperimentSpec) -> int:
    """The spec's seeds per task (1 for a trainer this process does not know: its runs fail
    on the worker anyway)."""
    trainer = REGISTRY.get(spec.trainer)
    return seeds_per_task(trainer, spec) if trainer is not None else 1
