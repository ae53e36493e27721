"""Measure the peak memory of trainer runs on CPU, one after another in this process.

    python tests/peak_memory.py < cases.json   # [{"trainer", "warmup", "config"}, ...]

prints one JSON line per case: {"peak_bytes": ...}. Run it with MALLOC_MMAP_THRESHOLD_=65536
in the environment: glibc then serves every allocation of 64 KiB or more (every tensor that
matters) from its own mapping and returns it to the system when it is freed, so the resident
set follows the live memory instead of the heap glibc keeps for reuse. Before each case a tiny
warm-up run of the same trainer and dataset does the lazy imports and first-call set-up; the
dataset cache is cleared (the run decodes its own dataset, as a fresh worker would), the heap is
trimmed and VmHWM reset (/proc/self/clear_refs "5", Linux 4.0+). The peak of the run is VmHWM
at its end minus VmRSS at the reset.
"""

from __future__ import annotations

import ctypes
import gc
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from trainers import NullReporter, get_trainer  # noqa: E402
from trainers.data import sources  # noqa: E402


def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
    assert match is not None, key
    return 1024 * int(match.group(1))


def measure(trainer_name: str, warmup: dict, config: dict) -> int:
    trainer = get_trainer(trainer_name)
    trainer.run(trainer.Config(**warmup), 0, NullReporter())
    sources._cache.clear()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    baseline = _status_bytes("VmRSS")
    trainer.run(trainer.Config(**config), 0, NullReporter())
    return _status_bytes("VmHWM") - baseline


def main() -> None:
    torch.set_num_threads(1)
    for case in json.load(sys.stdin):
        started = time.perf_counter()
        peak = measure(case["trainer"], case["warmup"], case["config"])
        print(json.dumps({"peak_bytes": peak, "s": time.perf_counter() - started}), flush=True)


if __name__ == "__main__":
    main()
