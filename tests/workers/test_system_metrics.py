"""The worker's system metrics (workers.system_metrics, docs/system-metrics.md): CPU and memory
figures that follow what the process does, sys/... points on every seed of a task at the run's
steps, GPU series from NVML (a fake here: these machines have no GPU), and none, silently, when
NVML is missing or fails."""

from __future__ import annotations

import logging
import mmap
import resource
import threading
import time
from typing import Any

import pytest

from api_schemas import RunStatus
from api_schemas import system_metrics as names
from workers import system_metrics
from workers.messages import MetricBatch, Result
from workers.system_metrics import MIN_READING_GAP_S, GpuProbe, NvmlError, SystemSampler
from workers.task import execute_seeds

FAST = {"n_samples": 16, "steps": 40, "log_every": 10}
# Seeds that each outlast MIN_READING_GAP_S many times over (tens of ms here): a seed's end
# reading is then its own, with a CPU figure (40 warm steps take ~2 ms: the reading at their
# end was the one at their start, which has none).
TIMED = {"n_samples": 16, "steps": 2000, "log_every": 500}
# An interval no run here reaches, however loaded the machine: readings at each seed's start
# and end only (at 5 s, a CI machine busy with other work took 7 readings of a 2,000-step run).
NO_MIDDLE_READING_S = 3600.0
GIB = float(2**30)


class FakeNvml:
    """The NVML calls the sampler makes, answering for one GPU (or failing from `fail_at` on)."""

    def __init__(self, fail_at: str | None = None) -> None:
        self.fail_at = fail_at
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_at == name:
            raise NvmlError(f"{name} returned NVML error 3")

    def device(self, gpu_id: str) -> object:
        self._call("device")
        return ("handle", gpu_id)

    def utilization_percent(self, device: object) -> float:
        self._call("utilization_percent")
        assert device == ("handle", "1")
        return 87.0

    def memory_used_bytes(self, device: object) -> float:
        self._call("memory_used_bytes")
        return 3 * GIB


def series(messages: list[Any], index: int) -> dict[str, list[tuple[int, float]]]:
    """A seed's points by name: (step, value) in the order sent."""
    by_name: dict[str, list[tuple[int, float]]] = {}
    for m in messages:
        if isinstance(m, MetricBatch) and m.index == index:
            for step, _, name, value in m.points:
                by_name.setdefault(name, []).append((step, value))
    return by_name


def cpu_seconds() -> float:
    """The process's CPU time by getrusage: the reference the sampler's figure is held to."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bracketed_read(sampler: SystemSampler) -> tuple[dict[str, float], tuple[float, ...]]:
    """A reading, with the wall and CPU clocks (getrusage) just before and just after it: the
    sampler takes its own in between."""
    before = (time.perf_counter(), cpu_seconds())
    values = sampler.read()
    return values, (*before, time.perf_counter(), cpu_seconds())


def test_cpu_and_memory_follow_what_the_process_does() -> None:
    sampler = SystemSampler(interval_s=5.0)
    _, first = bracketed_read(sampler)
    began = time.perf_counter()
    while time.perf_counter() < began + 0.3:  # one core busy (as much as the machine gives)
        pass
    busy, last = bracketed_read(sampler)
    # The reference over the sampler's own window, which lies between the two readings'
    # brackets: the least CPU over the most wall time, the most over the least. A window taken
    # apart from the readings differed from theirs by whatever the machine took in the gaps
    # (more than 10 points of 0.3 s on a loaded machine).
    low = 100 * (last[1] - first[3]) / (last[2] - first[0])
    high = 100 * (last[3] - first[1]) / (last[0] - first[2])
    time.sleep(0.3)  # the idle window: next to no CPU used across it
    idle = sampler.read()
    assert low - 10 < busy[names.CPU_PERCENT] < high + 10, (busy, low, high)
    assert busy[names.CPU_PERCENT] > idle[names.CPU_PERCENT] + 10, (busy, idle)
    assert not sampler.due()  # the next reading is an interval away

    # Fresh pages from the kernel, each touched: a malloc of the same size may be carved from
    # heap memory an earlier test freed, already resident, and then the RSS does not move.
    ballast = mmap.mmap(-1, 64 * 2**20)
    for page in range(0, len(ballast), mmap.PAGESIZE):
        ballast[page] = 1
    time.sleep(2 * MIN_READING_GAP_S)  # a reading closer to the last one is that one again
    grown = sampler.read()[names.RSS_BYTES]
    assert grown - idle[names.RSS_BYTES] > 48 * 2**20
    ballast.close()
    time.sleep(2 * MIN_READING_GAP_S)  # a reading closer to the last one is that one again
    with open("/proc/self/status") as status:  # the kernel's own figure, in kB
        vm_rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    assert abs(sampler.read()[names.RSS_BYTES] - vm_rss * 1024) < 16 * 2**20
    assert not any(n.startswith("sys/gpu") for n in idle)  # no GPU probe, no GPU series


def test_every_seed_of_a_task_gets_the_process_series_at_its_steps() -> None:
    messages = list(
        execute_seeds(
            "collapse",
            TIMED,
            [0, 1],
            batch_interval_s=0.01,
            system_metrics_interval_s=NO_MIDDLE_READING_S,
        )
    )
    results = [m for m in messages if isinstance(m, Result)]
    assert [r.status for r in results] == [RunStatus.completed] * 2
    for index, result in enumerate(results):
        points = series(messages, index)
        # one at the seed's start, one at its end, each at the run's latest step then
        steps = [s for s, _ in points[names.RSS_BYTES]]
        assert len(steps) == 2 and steps == sorted(steps) and steps[-1] == 2000, points
        assert {s for s, _ in points["loss"]} >= set(steps)
        start, end = (v for _, v in points[names.ELAPSED_S])
        assert start == 0 and end > 0
        assert all(v > 50 * 2**20 for _, v in points[names.RSS_BYTES])
        assert all(v >= 0 for _, v in points[names.CPU_PERCENT])
        assert points[names.CPU_PERCENT][-1][0] == 2000
        assert not any(n.startswith("sys/gpu") for n in points)
        # what the run measured, never the hardware's
        assert not any(names.is_system_metric(n) for n in result.metrics)


def test_without_an_interval_there_are_no_system_points() -> None:
    messages = list(execute_seeds("collapse", FAST, [0], batch_interval_s=0.01))
    assert not any(names.is_system_metric(n) for n in series(messages, 0))


def test_a_gpu_task_gets_the_gpu_series_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setattr(system_metrics, "assigned_gpu", lambda: "1")
    monkeypatch.setattr(system_metrics, "process_nvml", lambda: nvml)
    messages = list(
        execute_seeds(
            "collapse",
            FAST,
            [0, 1],
            batch_interval_s=0.01,
            system_metrics_interval_s=NO_MIDDLE_READING_S,
        )
    )
    for index in (0, 1):
        points = series(messages, index)
        assert [v for _, v in points[names.GPU_UTILIZATION_PERCENT]] == [87.0, 87.0]
        assert [v for _, v in points[names.GPU_MEMORY_BYTES]] == [3 * GIB, 3 * GIB]
    assert nvml.calls.count("device") == 1  # the handle is looked up once per task


@pytest.mark.parametrize("fail_at", ["device", "utilization_percent", "memory_used_bytes"])
def test_nvml_failing_gives_no_gpu_series_and_one_debug_line(
    fail_at: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(system_metrics, "_nvml_trouble_logged", threading.Event())
    nvml = FakeNvml(fail_at=fail_at)
    monkeypatch.setattr(system_metrics, "assigned_gpu", lambda: "1")
    monkeypatch.setattr(system_metrics, "process_nvml", lambda: nvml)
    with caplog.at_level(logging.DEBUG, logger="seedgrid.worker"):
        messages = list(
            execute_seeds(
                "collapse",
                FAST,
                [0],
                batch_interval_s=0.01,
                system_metrics_interval_s=NO_MIDDLE_READING_S,
            )
        )
    assert messages[-1].status == RunStatus.completed
    points = series(messages, 0)
    assert names.RSS_BYTES in points
    assert not any(n.startswith("sys/gpu") for n in points)
    assert nvml.calls.count(fail_at) == 1  # not asked again once it failed
    (line,) = [r for r in caplog.records if r.name == "seedgrid.worker"]
    assert line.levelno == logging.DEBUG and "NVML error 3" in line.getMessage()


def test_a_machine_without_nvml_has_no_gpu_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    class Missing:
        def __init__(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(system_metrics, "NvmlLibrary", Missing)
    monkeypatch.setattr(system_metrics, "assigned_gpu", lambda: "0")
    system_metrics.process_nvml.cache_clear()
    try:
        sampler = SystemSampler.for_this_task(5.0)
        assert system_metrics.process_nvml() is None
    finally:
        system_metrics.process_nvml.cache_clear()
    assert sampler is not None
    assert not any(n.startswith("sys/gpu") for n in sampler.read())
    assert SystemSampler.for_this_task(0) is None  # 0 turns the sampling off


def test_a_probe_reads_nothing_after_its_first_failure() -> None:
    probe = GpuProbe(FakeNvml(fail_at="utilization_percent"), "1")
    assert probe.read() == {} and probe.read() == {}
