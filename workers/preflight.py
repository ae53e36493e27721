"""The pre-flight task: one cheap look, on a node where an experiment's runs will go, at what
would fail every run of its configs before training (the trainer's `preflight`: a dataset's
files, a GPU). The service sends it before it queues the runs (service.scheduling.preflight).

It asks Ray for no CPU, so it never waits behind busy workers, and it reads configs the service
has validated: names (a trainer from the registry, a dataset, a data root of the operator),
never a path or anything it would import or unpickle."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import ray

from trainers import get_trainer
from workers.interrupts import accept_cancels
from workers.messages import PreflightReport


def check_configs(trainer_name: str, configs: Sequence[dict[str, Any]]) -> PreflightReport:
    """The body of the task, usable without Ray: the trainer's problems with each config here."""
    trainer = get_trainer(trainer_name)
    problems = [
        [(p.field, p.message) for p in trainer.preflight(trainer.Config.model_validate(config))]
        for config in configs
    ]
    node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    return PreflightReport(node_id=node_id, hostname=socket.gethostname(), problems=problems)


@ray.remote(num_cpus=0, max_retries=0)
def preflight_task(trainer_name: str, configs: Sequence[dict[str, Any]]) -> PreflightReport:
    accept_cancels()
    return check_configs(trainer_name, configs)
