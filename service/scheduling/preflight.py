"""The pre-flight of a submission: before an experiment's runs are queued, the problems that
would fail every run before it trains (a dataset's files missing, `device: cuda` where there is
no GPU) become one 422 naming the config field.

What is knowable from the cluster's resources is answered here: `cuda` on a cluster with no GPU
at all, and a CPU task whose memory estimate (the trainer's, from the config) is more than the
largest alive node gives its tasks. The rest is the trainer's own `preflight`
(trainers.runtime.TrainerBase: the data layer's file checks, the device check), run where the
runs will go: one Ray task
(workers.preflight) that asks for no CPU, so that it never waits behind busy workers, placed on
a node that has the CPUs and GPUs the runs ask for. The grid's conditions are checked once per
distinct `preflight_inputs` (a grid over learning rates is one check), and a spec whose configs
have none (digits, synthetic data, `device: auto`) sends no task at all.

The wait is bounded (SEEDGRID_PREFLIGHT_TIMEOUT_S). When Ray does not answer in time, the
process has no Ray connection, or no node can hold the runs, the runs are queued unchecked and
that is logged: the runs store then stops an experiment whose first runs all fail
(service.scheduling.run_store.failure_stop).

The pre-flight uses the process's Ray connection: the embedded service's dispatcher holds one;
an API started with --no-dispatch joins the cluster in the background when SEEDGRID_RAY_ADDRESS
is set (`join_cluster`; a driver needs a Ray node on its machine, as the dispatcher's container
has) and checks nothing until it has joined.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from api_schemas import ExperimentSpec
from service.scheduling.ray_helpers import ensure_ray
from service.settings import Settings
from service.specs import Refusals, merged_config, seeds_per_task
from trainers import Trainer
from workers.preflight import preflight_task

log = logging.getLogger("seedgrid.preflight")


@dataclass(frozen=True)
class Node:
    """An alive Ray node and what it has."""

    node_id: str
    address: str
    hostname: str
    cpus: float
    gpus: float
    memory: float = 0.0  # bytes Ray gives its tasks there (its `memory` resource)

    def __str__(self) -> str:
        return f"Ray node {self.address} ({self.hostname})"


def alive_nodes() -> list[Node]:
    return [
        Node(
            node_id=n["NodeID"],
            address=n.get("NodeManagerAddress", "?"),
            hostname=n.get("NodeManagerHostname", "?"),
            cpus=float(n["Resources"].get("CPU", 0)),
            gpus=float(n["Resources"].get("GPU", 0)),
            memory=float(n["Resources"].get("memory", 0)),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


def pick_node(nodes: list[Node], num_cpus: float, num_gpus: float, wants_gpu: bool) -> Node | None:
    """A node where the runs can go (it has their CPUs and GPUs), one with a GPU first when a
    config asks for `device: cuda`; None when no node can hold them."""
    fits = [n for n in nodes if n.cpus >= num_cpus and n.gpus >= num_gpus]
    if wants_gpu:
        fits.sort(key=lambda n: n.gpus == 0)
    return fits[0] if fits else None


@dataclass
class Check:
    """One distinct check: the inputs it reads, a config that has them, and the conditions
    whose configs have them too."""

    inputs: dict[str, Any]
    config: dict[str, Any]
    conditions: list[dict[str, Any]] = field(default_factory=list)


def distinct_checks(
    trainer: Trainer, spec: ExperimentSpec, conditions: list[dict[str, Any]]
) -> list[Check]:
    """The conditions grouped by what the trainer's pre-flight reads of their configs; the
    conditions with nothing to check are left out."""
    checks: dict[str, Check] = {}
    for condition in conditions:
        config = trainer.Config.model_validate(merged_config(spec.config, condition))
        inputs = trainer.preflight_inputs(config)
        if inputs:
            key = json.dumps(inputs, sort_keys=True)
            check = checks.setdefault(key, Check(inputs, config.model_dump(mode="json")))
            check.conditions.append(condition)
    return list(checks.values())


def no_gpu_errors(
    spec: ExperimentSpec, checks: list[Check], nodes: list[Node]
) -> list[dict[str, Any]]:
    """`device: cuda` on a cluster none of whose nodes has a GPU: known without a task."""
    refusals = Refusals(spec)
    for check in checks:
        if check.inputs.get("device") == "cuda":
            for condition in check.conditions:
                refusals.add(
                    "device",
                    "device",
                    f"device 'cuda' requested but no node of the Ray cluster has a GPU "
                    f"({len(nodes)} alive nodes); use device 'auto' or 'cpu', or add "
                    "GPU nodes",
                    condition,
                )
    return refusals.errors()


def memory_errors(
    trainer: Trainer, spec: ExperimentSpec, conditions: list[dict[str, Any]], nodes: list[Node]
) -> list[dict[str, Any]]:
    """Conditions whose task needs more memory (the trainer's estimate from the config, times
    the seeds of a seed-batched task) than the largest alive node gives its tasks (Ray's
    `memory` resource): no node could hold such a task, which would die of memory, or swap,
    on any. Only for tasks that ask for no GPU: a GPU task's memory is mostly the device's,
    which Ray does not report (SEEDGRID_MAX_RUN_MEMORY_GB bounds those)."""
    largest = max(nodes, key=lambda n: n.memory, default=None)
    if spec.resources.num_gpus > 0 or largest is None or largest.memory <= 0:
        return []
    per_task = seeds_per_task(trainer, spec)
    refusals = Refusals(spec)
    for condition in conditions:
        estimate = trainer.estimate(
            trainer.Config.model_validate(merged_config(spec.config, condition))
        )
        need = estimate.memory_bytes * per_task
        if need <= largest.memory:
            continue
        what = (
            "one run needs"
            if per_task == 1
            else f"one task of {per_task} seeds (resources.seeds_per_task) needs"
        )
        refusals.add(
            "node memory",
            refusals.named(estimate.memory_fields),
            f"{what} about {need / 1e9:,.1f} GB (estimated from "
            f"{', '.join(estimate.memory_fields)}), more than the largest node of the Ray "
            f"cluster gives its tasks: {largest.memory / 1e9:,.1f} GB on {largest}",
            condition,
        )
    return refusals.errors()


def report_errors(
    spec: ExperimentSpec, checks: list[Check], problems: list[list[tuple[str, str]]], node: Node
) -> list[dict[str, Any]]:
    """The problems a pre-flight task found, one error per field and message, each naming the
    node it was found on and (for a grid) the conditions it hits."""
    refusals = Refusals(spec)
    for check, found in zip(checks, problems, strict=True):
        for config_field, message in found:
            for condition in check.conditions:
                refusals.add(message, config_field, f"{message} (checked on {node})", condition)
    return refusals.errors()


def _last_line(exc: BaseException) -> str:
    """A Ray task's error ends with the exception the task raised."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else ""


class ClusterPreflight:
    """The pre-flight of one process's submissions (see the module's docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._said: set[str] = set()
        # set once a join started by join_cluster has ended (None: none was started)
        self._joined: threading.Event | None = None

    def join_cluster(self) -> None:
        """Join SEEDGRID_RAY_ADDRESS's cluster in the background (an API without a dispatcher
        has no Ray connection of its own): start-up never waits on it, and a failure is
        logged once; a submission meanwhile waits for it within its bounded wait."""
        if not self.settings.ray_address or ray.is_initialized():
            return
        joined = self._joined = threading.Event()

        def join() -> None:
            try:
                ensure_ray(self.settings)
                log.info(
                    "joined Ray at %s for the pre-flight of submissions", self.settings.ray_address
                )
            except Exception as exc:  # noqa: BLE001 - logged; the runs store covers it
                log.warning(
                    "pre-flight checks are off in this process: cannot join Ray at %s (%s: %s)",
                    self.settings.ray_address,
                    type(exc).__name__,
                    exc,
                )
            finally:
                joined.set()

        threading.Thread(target=join, name="seedgrid-preflight-join", daemon=True).start()

    def check(
        self, trainer: Trainer, spec: ExperimentSpec, conditions: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The errors (SpecError's, a 422) that would fail every run of some conditions; empty
        when there are none, or when the cluster cannot tell in time (logged)."""
        if self.settings.preflight_timeout_s == 0:
            return []
        checks = distinct_checks(trainer, spec, conditions)
        if self._joined is not None:
            self._joined.wait(self.settings.preflight_timeout_s)
        if not ray.is_initialized():
            self._skipped("this process is not connected to Ray", once=True)
            return []
        try:
            nodes = alive_nodes()
            # An autoscaling cluster may still add a larger node (FAIL_INFEASIBLE_RUNS=false).
            if self.settings.fail_infeasible_runs and (
                errors := memory_errors(trainer, spec, conditions, nodes)
            ):
                return errors
            if not checks:
                return []
            return self._on_cluster(trainer, spec, checks, nodes)
        except Exception as exc:  # noqa: BLE001 - the task failed, or Ray is in trouble
            self._skipped(f"{type(exc).__name__}: {_last_line(exc)}")
            return []

    def _on_cluster(
        self, trainer: Trainer, spec: ExperimentSpec, checks: list[Check], nodes: list[Node]
    ) -> list[dict[str, Any]]:
        wants_gpu = any(c.inputs.get("device") == "cuda" for c in checks)
        # An autoscaling cluster may still add a GPU node (SEEDGRID_FAIL_INFEASIBLE_RUNS=false).
        if wants_gpu and self.settings.fail_infeasible_runs and not any(n.gpus for n in nodes):
            if errors := no_gpu_errors(spec, checks, nodes):
                return errors
        node = pick_node(nodes, spec.resources.num_cpus, spec.resources.num_gpus, wants_gpu)
        if node is None:
            self._skipped(
                f"no alive node has num_cpus={spec.resources.num_cpus:g} and "
                f"num_gpus={spec.resources.num_gpus:g}"
            )
            return []
        task = preflight_task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            name=f"seedgrid-preflight-{trainer.name}",
        ).remote(trainer.name, [c.config for c in checks])
        try:
            report = ray.get(task, timeout=self.settings.preflight_timeout_s)
        except GetTimeoutError:
            ray.cancel(task)
            self._skipped(
                f"{node} did not answer within {self.settings.preflight_timeout_s:g} "
                "s (SEEDGRID_PREFLIGHT_TIMEOUT_S)"
            )
            return []
        return report_errors(spec, checks, report.problems, node)

    def _skipped(self, why: str, *, once: bool = False) -> None:
        if once:
            if why in self._said:
                return
            self._said.add(why)
        log.warning("pre-flight skipped, runs queued unchecked: %s", why)
