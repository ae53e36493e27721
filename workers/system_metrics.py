"""What the hardware did while a task trained: the worker process's CPU use and resident memory,
and its GPU's utilisation and memory through NVML (docs/system-metrics.md). The task's
consuming thread (workers.task.SeedTask) reads a `SystemSampler` at each seed's start and end
and every interval between, and records the values into its running seeds' points under the
names of api_schemas.system_metrics.

NVML is opened with ctypes, as torch.cuda counts GPUs (no pynvml needed). Without a GPU, or
when NVML is missing or fails, there are no GPU series: never an error, at most one debug line
per process."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from functools import cache
from typing import Protocol

import ray

from api_schemas import system_metrics as names

log = logging.getLogger("seedgrid.worker")

# Readings closer together are one (seeds ending at once share it): a CPU figure over a
# shorter window says more about the clock than about the process.
MIN_READING_GAP_S = 0.01

_nvml_trouble_logged = threading.Event()


class Nvml(Protocol):
    """The NVML calls the sampler makes (NvmlLibrary; a test's fake)."""

    def device(self, gpu_id: str) -> object: ...
    def utilization_percent(self, device: object) -> float: ...
    def memory_used_bytes(self, device: object) -> float: ...


class NvmlError(RuntimeError):
    pass


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class NvmlLibrary:
    """libnvidia-ml.so.1 through ctypes: a device handle by index or UUID, its utilisation and
    its memory in use."""

    def __init__(self) -> None:
        self._library = ctypes.CDLL("libnvidia-ml.so.1")  # OSError where there is no driver
        self._check(self._library.nvmlInit_v2(), "nvmlInit_v2")

    def _check(self, code: int, call: str) -> None:
        if code != 0:  # NVML_SUCCESS
            raise NvmlError(f"{call} returned NVML error {code}")

    def device(self, gpu_id: str) -> object:
        handle = ctypes.c_void_p()
        if gpu_id.isdigit():
            code = self._library.nvmlDeviceGetHandleByIndex_v2(
                ctypes.c_uint(int(gpu_id)), ctypes.byref(handle)
            )
        else:
            code = self._library.nvmlDeviceGetHandleByUUID(
                ctypes.c_char_p(gpu_id.encode()), ctypes.byref(handle)
            )
        self._check(code, f"the handle of GPU {gpu_id}")
        return handle

    def utilization_percent(self, device: object) -> float:
        rates = _Utilization()
        code = self._library.nvmlDeviceGetUtilizationRates(device, ctypes.byref(rates))
        self._check(code, "nvmlDeviceGetUtilizationRates")
        return float(rates.gpu)

    def memory_used_bytes(self, device: object) -> float:
        memory = _Memory()
        self._check(
            self._library.nvmlDeviceGetMemoryInfo(device, ctypes.byref(memory)),
            "nvmlDeviceGetMemoryInfo",
        )
        return float(memory.used)


def _nvml_trouble(what: str, exc: BaseException) -> None:
    """No GPU series: said once per process, at debug level (a CPU node is not a problem)."""
    if not _nvml_trouble_logged.is_set():
        _nvml_trouble_logged.set()
        log.debug("no GPU system metrics: %s: %s: %s", what, type(exc).__name__, exc)


@cache
def process_nvml() -> Nvml | None:
    """This process's NVML, opened once; None where it cannot be."""
    try:
        return NvmlLibrary()
    except Exception as exc:  # noqa: BLE001 - any failure means no GPU series
        _nvml_trouble("NVML cannot be opened", exc)
        return None


def assigned_gpu() -> str | None:
    """The first GPU Ray assigned this task (NVML's index or UUID); None outside a Ray task or
    for a task without a GPU."""
    if not ray.is_initialized() or ray.get_runtime_context().get_task_id() is None:
        return None
    gpus = ray.get_gpu_ids()
    return str(gpus[0]) if gpus else None


class GpuProbe:
    """One GPU's utilisation and memory in use; after the first NVML failure, nothing."""

    def __init__(self, nvml: Nvml, gpu_id: str) -> None:
        self._nvml = nvml
        self._gpu_id = gpu_id
        self._device: object | None = None
        self._failed = False

    def read(self) -> dict[str, float]:
        if self._failed:
            return {}
        try:
            if self._device is None:
                self._device = self._nvml.device(self._gpu_id)
            return {
                names.GPU_UTILIZATION_PERCENT: float(self._nvml.utilization_percent(self._device)),
                names.GPU_MEMORY_BYTES: float(self._nvml.memory_used_bytes(self._device)),
            }
        except Exception as exc:  # noqa: BLE001 - any failure means no GPU series
            self._failed = True
            _nvml_trouble(f"GPU {self._gpu_id}", exc)
            return {}


def rss_bytes() -> float | None:
    """This process's resident memory (Linux: /proc/self/statm); None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return float(resident_pages * os.sysconf("SC_PAGE_SIZE"))


class SystemSampler:
    """The process's system values, read when asked: CPU percent over the time since the
    previous reading (or the sampler's making), resident memory, and the GPU's values when
    there is a probe. A reading asked within MIN_READING_GAP_S of the previous one is that
    one."""

    def __init__(self, interval_s: float, gpu: GpuProbe | None = None) -> None:
        self.interval_s = interval_s
        self._gpu = gpu
        self._mark = (time.perf_counter(), time.process_time())
        self._next_at = self._mark[0] + interval_s
        self._last: dict[str, float] | None = None

    @classmethod
    def for_this_task(cls, interval_s: float | None) -> SystemSampler | None:
        """The sampler of this process's task: None when sampling is off (no interval, or 0);
        a GPU probe when Ray gave the task a GPU and NVML answers."""
        if not interval_s:
            return None
        gpu_id = assigned_gpu()
        if gpu_id is None or (nvml := process_nvml()) is None:
            return cls(interval_s)
        return cls(interval_s, GpuProbe(nvml, gpu_id))

    def due(self) -> bool:
        """Whether an interval has passed since the last reading."""
        return time.perf_counter() >= self._next_at

    def read(self) -> dict[str, float]:
        now, cpu = time.perf_counter(), time.process_time()
        marked_at, marked_cpu = self._mark
        if now - marked_at < MIN_READING_GAP_S and self._last is not None:
            return self._last
        self._mark = (now, cpu)
        self._next_at = now + self.interval_s
        values: dict[str, float] = {}
        if now - marked_at >= MIN_READING_GAP_S:  # none when read at once after the making
            values[names.CPU_PERCENT] = 100.0 * (cpu - marked_cpu) / (now - marked_at)
        if (rss := rss_bytes()) is not None:
            values[names.RSS_BYTES] = rss
        if self._gpu is not None:
            values.update(self._gpu.read())
        self._last = values
        return values
