"""A dispatcher's launching (service.scheduling.dispatcher): claim queued runs as whole tasks,
submit one Ray task per group, and fail the runs whose task Ray refused or whose spec cannot make
one."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from api_schemas import ExperimentSpec, storable_text
from service.analysis.sources import SourcePlan
from service.scheduling.dispatcher_base import DispatcherBase
from service.scheduling.flights import (
    InFlight,
    RunTemplate,
    TaskFlight,
    spec_seeds_per_task,
    task_groups,
    task_size,
    tasks_of,
)
from service.scheduling.ray_helpers import error_line, infeasible
from service.scheduling.run_store import AttemptKey, ClaimedRun, RunStore
from service.specs import merged_config
from workers import run_task

log = logging.getLogger("seedgrid.dispatcher")

# How often the dispatcher re-reads the nodes' resources for the feasibility check.
NODE_CHECK_INTERVAL_S = 5.0
# Claims come in batches of at least max_in_flight // CLAIM_BATCH_SHARE tasks: a claim's
# transaction (the queue's head, the specs, the claim, the counts) costs about as much for one
# run as for eight, and claiming each task as its slot freed made it most of the dispatcher's
# time per run with small tasks (benchmarks/dispatch.py). Ray keeps the other 3/4 of
# max_in_flight (at least 3 tasks a CPU by default) queued meanwhile, so no worker waits.
CLAIM_BATCH_SHARE = 4


class Launching(DispatcherBase):
    """Claiming and submitting."""

    def _fill(self) -> int:
        free = self.max_in_flight - len(tasks_of(self.in_flight.values()))
        if free < max(1, self.max_in_flight // CLAIM_BATCH_SHARE):
            return 0
        nodes = self._node_capacities()
        # Only an experiment with runs in flight keeps its template: such an experiment cannot
        # be deleted, so no cached spec outlives its row (the others are read again when their
        # runs are claimed, in the claim's transaction).
        live = {flight.experiment_id for flight in self.in_flight.values()}
        self._templates = {i: t for i, t in self._templates.items() if i in live}
        with self._session() as session:
            store = RunStore(session)
            # max_in_flight counts tasks: room for `free` tasks as large as those of the
            # experiments next in the queue, so that a seed-batched experiment's first claim
            # (after a restart too) makes whole tasks of its seeds_per_task.
            upcoming = self._run_templates(
                store, set(store.next_queued_experiments(free, self.lock.trainers))
            )
            factor = max([task_size(t) for t in upcoming.values()], default=1)

            def whole_tasks(rows: list[Any]) -> list[Any]:
                """The runs of the first `free` tasks the candidates make, no more: one task
                slot is one task, however many seeds it runs."""
                sizes = {
                    i: task_size(t)
                    for i, t in self._run_templates(
                        store, {row.experiment_id for row in rows}
                    ).items()
                }
                return [row for group in task_groups(rows, sizes)[:free] for row in group]

            claimed = store.claim(
                free * factor,
                take=whole_tasks,
                unschedulable=lambda cpus, gpus: infeasible(cpus, gpus, nodes),
                trainers=self.lock.trainers,
            )
            templates = self._run_templates(store, {run.experiment_id for run in claimed})
            store.commit()
        refused: list[tuple[ClaimedRun, str]] = []
        for group in task_groups(claimed, {i: task_size(t) for i, t in templates.items()}):
            try:
                task = self._submit(group, templates[group[0].experiment_id])
            except Exception as exc:  # this task's runs fail; the other tasks go on
                reason = storable_text(
                    f"its task could not be submitted to Ray: "
                    f"{type(exc).__name__}: {error_line(exc)}"
                )
                template = templates[group[0].experiment_id]
                reason = template if isinstance(template, str) else reason
                log.error("runs %s: %s", ",".join(str(run.id) for run in group), reason)
                refused += [(run, reason) for run in group]
                continue
            for index, run in enumerate(group):
                flight = InFlight(
                    run_id=run.id,
                    experiment_id=run.experiment_id,
                    attempt=run.attempt,
                    task=task,
                    index=index,
                )
                task.runs[index] = flight
                self.in_flight[run.id] = flight
        if refused:
            self._refused += [
                (
                    AttemptKey(run_id=run.id, experiment_id=run.experiment_id, attempt=run.attempt),
                    reason,
                )
                for run, reason in refused
            ]
            self._store_refused()
        return len(claimed)

    def _submit(self, group: list[ClaimedRun], template: RunTemplate | str) -> TaskFlight:
        """One Ray task for a group of claimed runs (one condition's seeds); raises when the
        experiment's spec cannot make one or Ray refuses it."""
        if isinstance(template, str):
            raise ValueError(template)
        first = group[0]
        config = merged_config(template.config, first.condition)
        # Ray titles the worker process after its task: "seedgrid-run-7" or, for a
        # seed-batched task, "seedgrid-run-7,8,9,10"
        name = "seedgrid-run-" + ",".join(str(run.id) for run in group)
        generator = run_task.options(
            num_cpus=first.num_cpus, num_gpus=first.num_gpus, name=name
        ).remote(
            first.trainer,
            config,
            [run.seed for run in group],
            self.settings.metrics_batch_interval_s,
            [template.sources.source_seeds(run.condition) for run in group],
            template.stop_on_checks,
            self.settings.system_metrics_interval_s,
        )
        return TaskFlight(generator=generator, trainer=first.trainer, claimed_at=time.monotonic())

    def _store_refused(self) -> None:
        """End the claimed runs Ray refused a task for `failed`, with the reason (not retried:
        the same spec would be refused again), so that none stays pending outside Ray. Kept
        for the next pass when the database does not answer."""
        if not self._refused:
            return
        with self._session() as session:
            store = RunStore(session)
            store.lock_experiments(key.experiment_id for key, _ in self._refused)
            for key, reason in self._refused:
                store.fail(key, reason)
            store.commit()
        self._refused = []

    def _run_templates(
        self, store: RunStore, experiment_ids: set[int]
    ) -> dict[int, RunTemplate | str]:
        """What the runs of each experiment share (from its spec, stored once), read once
        while it has runs in flight: a spec never changes. A spec that cannot make a template
        gives the reason instead, and only that experiment's runs fail."""
        missing = experiment_ids - set(self._templates)
        for i, stored in (store.specs(missing) if missing else {}).items():
            try:
                spec = ExperimentSpec.stored(stored)
                self._templates[i] = RunTemplate(
                    config=dict(spec.config),
                    sources=SourcePlan.of(spec),
                    stop_on_checks=tuple(spec.stop_on_checks),
                    seeds_per_task=spec_seeds_per_task(spec),
                )
            except Exception as exc:  # a spec stored by an older version, say
                self._templates[i] = storable_text(
                    f"its stored spec cannot make a task: {type(exc).__name__}: {error_line(exc)}"
                )
        return {i: self._templates[i] for i in experiment_ids if i in self._templates}

    def _node_capacities(self) -> list[tuple[float, float]]:
        """(CPUs, GPUs) of every alive Ray node, refreshed every few seconds; empty when the
        check is off."""
        if not self.settings.fail_infeasible_runs:
            return []
        now = time.monotonic()
        if now - self._nodes_checked_at > NODE_CHECK_INTERVAL_S:
            self._nodes = [
                (float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)))
                for n in ray.nodes()
                if n.get("Alive")
            ]
            self._nodes_checked_at = now
        return self._nodes
