"""How the dispatcher turns claimed runs into Ray tasks (service.scheduling.flights.task_groups):
consecutive runs of one experiment and condition, up to its seeds_per_task each."""

from __future__ import annotations

from typing import Any

from api_schemas import ExperimentSpec
from service.scheduling.flights import spec_seeds_per_task, task_groups
from service.scheduling.run_store import ClaimedRun


def claimed(run_id: int, experiment: int, condition: dict, cpus: float = 1.0) -> ClaimedRun:
    return ClaimedRun(
        id=run_id,
        experiment_id=experiment,
        attempt=1,
        trainer="collapse",
        condition=condition,
        seed=run_id,
        num_cpus=cpus,
        num_gpus=0.0,
    )


def ids(groups: list[list[ClaimedRun]]) -> list[list[int]]:
    return [[run.id for run in group] for group in groups]


def test_runs_of_one_condition_share_tasks_of_at_most_seeds_per_task() -> None:
    a, b = {"r": 0.1}, {"r": 0.3}
    runs = [claimed(i, 1, a) for i in range(1, 6)] + [claimed(i, 1, b) for i in range(6, 9)]
    assert ids(task_groups(runs, {1: 2})) == [[1, 2], [3, 4], [5], [6, 7], [8]]
    assert ids(task_groups(runs, {1: 4})) == [[1, 2, 3, 4], [5], [6, 7, 8]]
    assert ids(task_groups(runs, {1: 1})) == [[i] for i in range(1, 9)]


def test_experiments_conditions_and_resources_never_share_a_task() -> None:
    # the condition {"r": 0.1} twice, as equal dicts with another key order, and interleaved
    runs = [
        claimed(1, 1, {"r": 0.1, "s": True}),
        claimed(2, 2, {"r": 0.1, "s": True}),
        claimed(3, 1, {"s": True, "r": 0.1}),
        claimed(4, 1, {"r": 0.2, "s": True}),
        claimed(5, 1, {"r": 0.1, "s": True}, cpus=2.0),
    ]
    groups = task_groups(runs, {1: 8, 2: 8})
    assert ids(groups) == [[1, 3], [2], [4], [5]]


def test_a_stored_spec_takes_its_trainers_default_unless_it_says() -> None:
    from trainers import get_trainer

    default = get_trainer("collapse").seeds_per_task_default

    def stored(**spec: Any) -> ExperimentSpec:
        return ExperimentSpec.stored({"name": "t", **spec})

    assert spec_seeds_per_task(stored(trainer="collapse")) == default
    assert spec_seeds_per_task(stored(trainer="collapse", resources={"seeds_per_task": 3})) == 3
    assert spec_seeds_per_task(stored(trainer="collapse", resources={"num_cpus": 1.0})) == default
    assert spec_seeds_per_task(stored(trainer="no-such-trainer")) == 1
