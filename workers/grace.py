"""A grace period counted in the trainer's own time: wall time less the time its threads waited
for a CPU.

A cancelled trainer gets CANCEL_GRACE_S (workers.task) to reach its next check. On a machine
busy with other work a thread runs only part of each second, and a trainer whose next check is
two seconds of its work away may need ten seconds of wall time to reach it (seen in CI beside two
CPU-bound processes: a seed-batched run of 8 ended by its worker's grace, not by its check). So
the grace does not count the time the process's threads spent runnable but not running: the
kernel's per-thread run-queue delay (the second field of /proc/self/task/<tid>/schedstat). A
thread asleep (a trainer that ignores its cancel in a blocking call) waits for no CPU, so for it
the grace is plain wall time; a starved one gets the time it was denied. MAX_STRETCH bounds the
wall time either way. Where the kernel does not expose schedstat, the grace is plain wall time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# At most this many times the grace in wall time, however starved the process.
MAX_STRETCH = 6.0

_TASKS = Path("/proc/self/task")


def runqueue_waits() -> dict[int, float] | None:
    """Each thread of this process: the seconds it has waited on a run queue (runnable, not
    running) since it started; None where the kernel does not say."""
    waits: dict[int, float] = {}
    try:
        entries = list(os.scandir(_TASKS))
    except OSError:
        return None
    for entry in entries:
        try:
            fields = Path(entry.path, "schedstat").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        except OSError:
            return None
        if len(fields) < 2:
            return None
        waits[int(entry.name)] = int(fields[1]) / 1e9
    return waits


class GraceClock:
    """Started at a cancel: `left()` is how much of `grace_s` remains in the trainer's own time
    (wall time since the start less the longest run-queue wait any thread of the process had
    since then), never more than MAX_STRETCH x grace_s of wall time."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.started = time.monotonic()
        self._waits = runqueue_waits()

    def starved_s(self) -> float:
        """The longest a thread of this process has waited for a CPU since the start (threads
        started since count from zero)."""
        if self._waits is None:
            return 0.0
        now = runqueue_waits()
        if now is None:
            return 0.0
        return max((wait - self._waits.get(tid, 0.0) for tid, wait in now.items()), default=0.0)

    def left(self) -> float:
        wall = time.monotonic() - self.started
        hard = MAX_STRETCH * self.grace_s - wall
        return max(0.0, min(self.grace_s - (wall - self.starved_s()), hard))
