"""Prometheus metrics for a cluster's monitoring, served at GET /metrics.

Two kinds: what the database knows (runs by status and the queue depth, read at each scrape
from the experiments' per-status run counters, so a scrape costs one row per experiment, never
a count over the runs), and what only the dispatcher sees (runs in flight, dispatch latency,
run durations, worker losses, and per trainer the latest system values its workers sampled:
docs/system-metrics.md), which it records in its own `DispatcherMetrics` as they happen.
A service started with --no-dispatch serves the first kind only: the dispatcher's numbers live
in the dispatcher's process.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlmodel import Session, col

from api_schemas import RunStatus
from api_schemas import system_metrics as system
from service.storage.db import Experiment

# The content type of Prometheus' text exposition format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds from a claim to the worker's Started: Ray scheduling, and a worker process start.
LATENCY_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Seconds from Started to the result: from a smoke test to a day of GPU training.
DURATION_BUCKETS_S = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600)

# The gauge of each system series (api_schemas.system_metrics), and what it says.
SYSTEM_GAUGES = {
    system.CPU_PERCENT: (
        "seedgrid_run_cpu_percent",
        "CPU use of a worker process running the trainer (100 = one core), latest sample",
    ),
    system.RSS_BYTES: (
        "seedgrid_run_rss_bytes",
        "Resident memory of a worker process running the trainer, latest sample",
    ),
    system.GPU_UTILIZATION_PERCENT: (
        "seedgrid_run_gpu_utilization_percent",
        "Utilisation of the GPU of a task of the trainer (NVML), latest sample",
    ),
    system.GPU_MEMORY_BYTES: (
        "seedgrid_run_gpu_memory_bytes",
        "Memory in use on the GPU of a task of the trainer (NVML), latest sample",
    ),
}


class DispatcherMetrics:
    """What the dispatcher records as runs move: each process's own registry, so that several
    dispatchers (tests, a process with two apps) never share or collide on a metric."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.dispatch_latency = Histogram(
            "seedgrid_dispatch_latency_seconds",
            "Time from a run's claim by the dispatcher to its worker's Started message",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.run_duration = Histogram(
            "seedgrid_run_duration_seconds",
            "Time from a run's Started message to its result, by trainer (observed when the "
            "result arrives: completed, stopped, failed or diverged)",
            ["trainer"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.worker_losses = Counter(
            "seedgrid_worker_losses",
            "Attempts lost with their worker or node (retried or failed by max_retries)",
            registry=self.registry,
        )
        self.step_errors = Counter(
            "seedgrid_dispatcher_step_errors",
            "Dispatcher passes that failed (the database or Ray did not answer; retried a "
            "second later)",
            registry=self.registry,
        )
        self.system = {
            series: Gauge(name, text, ["trainer"], registry=self.registry)
            for series, (name, text) in SYSTEM_GAUGES.items()
        }
        self._system_trainers: set[str] = set()

    def record_system(self, trainer: str, series: str, value: float) -> None:
        """A system value a worker of `trainer` sampled (others, like sys/elapsed_s, have no
        gauge)."""
        gauge = self.system.get(series)
        if gauge is not None:
            gauge.labels(trainer).set(value)
            self._system_trainers.add(trainer)

    def keep_system_of(self, trainers: set[str]) -> None:
        """Drop the system gauges of the trainers with no run in flight: their values are
        of processes that ended."""
        for trainer in self._system_trainers - trainers:
            for gauge in self.system.values():
                try:
                    gauge.remove(trainer)
                except KeyError:  # a series this trainer's workers never sent (a GPU's)
                    pass
        self._system_trainers &= trainers


class _Snapshot(Collector):
    """Metric families computed before the scrape is written (from the database)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def database_families(session: Session) -> list[Metric]:
    """Runs by status and the queue depth, summed over the experiments' run counters."""
    columns = [
        func.coalesce(func.sum(getattr(Experiment, f"runs_{status.value}")), 0)
        for status in RunStatus
    ]
    totals = session.execute(select(*columns).where(col(Experiment.deleted) == False)).one()  # noqa: E712
    by_status = dict(zip(RunStatus, (int(t) for t in totals), strict=True))
    runs = GaugeMetricFamily(
        "seedgrid_runs", "Runs by status, over every experiment", labels=["status"]
    )
    for status, count in by_status.items():
        runs.add_metric([status.value], count)
    queue = GaugeMetricFamily(
        "seedgrid_queue_depth",
        "Runs queued, not yet handed to Ray",
        value=by_status[RunStatus.queued],
    )
    return [runs, queue]


def exposition(
    session: Session, dispatcher_metrics: DispatcherMetrics | None, in_flight: int | None
) -> bytes:
    """The scrape: the database's families, then (with a dispatcher in this process) runs in
    flight and the dispatcher's histograms and counter."""
    registry = CollectorRegistry(auto_describe=True)
    families = database_families(session)
    if in_flight is not None:
        families.append(
            GaugeMetricFamily(
                "seedgrid_runs_in_flight",
                "Runs this process's dispatcher has handed to Ray",
                value=in_flight,
            )
        )
    registry.register(_Snapshot(families))
    if dispatcher_metrics is not None:
        for metric in (
            dispatcher_metrics.dispatch_latency,
            dispatcher_metrics.run_duration,
            dispatcher_metrics.worker_losses,
            dispatcher_metrics.step_errors,
            *dispatcher_metrics.system.values(),
        ):
            registry.register(metric)
    return generate_latest(registry)
