"""One table of what scripts/device_check.sh measured: throughput on the device beside the CPU
launch gauge, row by row, and the Ray task.

    python benchmarks/device_report.py OUT_DIR      # reads throughput.json, launches.json,
                                                    # ray_task.json there (any may be missing)

A row per trainer, mode and K of benchmarks/gpu_throughput.py (`single` is the solo run,
`run_seeds` a K-seed task), with the launches gauge's ops and syncs per seed-step for the same
trainer and K (`solo` beside `single`, `K=k` beside `run_seeds` at K = k), so that a device's
speed-up can be read against the launches the batching saved.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def load(path: Path) -> Any:
    """The JSON at `path`, or None when the step that writes it did not (it failed or ran out
    of time: its log says why)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def figure(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def gauge_row(launches: list[dict[str, Any]] | None, case: str, mode: str, k: int) -> str:
    if not launches:
        return f"{'-':>9} {'-':>6}"
    wanted = "solo" if mode == "single" else f"K={k}"
    for row in launches:
        if row["case"] == case and row["mode"] == wanted:
            return f"{row['ops']:>9.1f} {row['syncs']:>6.2f}"
    return f"{'-':>9} {'-':>6}"


def report(out: Path) -> str:
    throughput = load(out / "throughput.json")
    launches = load(out / "launches.json")
    ray_task = load(out / "ray_task.json")
    lines: list[str] = []
    if throughput is None:
        lines.append("throughput: no result (see its log)")
    else:
        lines.append(
            f"device {throughput['device']}, torch {throughput['torch']}; "
            f"{throughput['measured']}; data: {throughput['data']}"
        )
        lines.append(
            f"{'trainer':<17} {'mode':<10} {'K':>3} {'seed-ep/s':>10} {'s/seed-ep':>10} "
            f"{'vs single':>9} {'GPU busy':>8} {'ops/s-st':>9} {'syncs':>6}  note"
        )
        for case in throughput["trainers"]:
            for row in case["results"]:
                busy = row["gpu_busy"]
                vs = row["vs_single"]
                note = (row["error"] or "")[:70]
                if not case["batched"] and row["mode"] == "run_seeds":
                    note = note or "not batched: seeds one after another"
                lines.append(
                    f"{case['name']:<17} {row['mode']:<10} {row['k']:>3} "
                    f"{figure(row['seed_epochs_per_s']):>10} {figure(row['s_per_seed_epoch']):>10} "
                    f"{'-' if vs is None else f'{vs:.2f}x':>9} "
                    f"{'n/a' if busy is None else f'{100 * busy:.0f}%':>8} "
                    f"{gauge_row(launches, case['name'], row['mode'], row['k'])}  {note}".rstrip()
                )
        lines.append(
            "ops/s-st, syncs: the launch gauge (benchmarks/launches.py, counted on the CPU) per "
            "seed per training step"
        )
    if launches is None:
        lines.append("launches: no result (see its log)")
    if ray_task is None:
        lines.append("ray task: no result (see its log)")
    else:
        task = ray_task["task"]
        devices = sorted({str(s["device"]) for s in task["seeds"]})
        lines.append(
            f"ray task: {ray_task['case']} K = {ray_task['k']} through a local Ray "
            f"{ray_task['ray']} on {ray_task['device']}: {ray_task['completed']}/{ray_task['k']} "
            f"completed on {', '.join(devices)}; seedgrid's task against a bare Ray task of the "
            f"same seeds (medians of {ray_task['repeats']}): {ray_task['vs_bare']:.2f}x, goal <= "
            f"{ray_task['goal']:.1f}x: "
            + ("met" if ray_task["vs_bare"] <= ray_task["goal"] else "NOT met")
        )
        for seed in task["seeds"]:
            if seed["status"] != "completed":
                lines.append(f"  seed {seed['seed']}: {seed['status']}: {seed['error']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        sys.exit("usage: python benchmarks/device_report.py OUT_DIR")
    print(report(Path(args[0])))


if __name__ == "__main__":
    main()
