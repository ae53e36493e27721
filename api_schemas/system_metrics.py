"""The names of the system series a worker samples into its runs' points (workers.system_metrics,
docs/system-metrics.md). They are what the hardware did, not what the trainer measured: the
statistics, the metric pickers and the final metrics never read them."""

from __future__ import annotations

# Every system series' name starts with it; a trainer's own metrics may not.
PREFIX = "sys/"

# The worker process's CPU use over the last interval, all its threads (100 = one core).
CPU_PERCENT = "sys/cpu_percent"
# The worker process's resident memory.
RSS_BYTES = "sys/rss_bytes"
# The task's GPU (the first Ray assigned it), through NVML; absent without one.
GPU_UTILIZATION_PERCENT = "sys/gpu_utilization_percent"
# Memory in use on that GPU, every process's (as nvidia-smi shows it).
GPU_MEMORY_BYTES = "sys/gpu_memory_bytes"
# Wall-clock seconds from the run's start to the sample (metric points carry a step, no time).
ELAPSED_S = "sys/elapsed_s"


def is_system_metric(name: str) -> bool:
    return name.startswith(PREFIX)
