"""Writes service/analysis/detectable_ratios.json: the primary test's detectable variance ratio
(service.analysis.primary_power.primary_detectable_ratio at the default alpha and power,
uncorrelated seeds) for every n_a, n_b from 2 to MAX_SIMULATED_SEEDS, paired and unpaired.

Each entry is a simulation of SIMULATIONS datasets (0.2-1.2 s of CPU): a comparison whose cells
reached a new size paid for one at every /stats request after a restart. The simulation is
deterministic (PLANNING_SEED), so the table holds exactly what it computes;
tests/service/test_detectable_table.py recomputes a sample of entries and checks they are equal.
Run it again whenever the primary test or its simulation changes (the test then fails):

    python scripts/detectable_ratios.py            # about 20 min of CPU, on every core
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.analysis import primary_power  # noqa: E402


def entry(key: tuple[int, int, bool]) -> tuple[tuple[int, int, bool], float]:
    n_a, n_b, paired = key
    return key, primary_power.simulated_detectable_ratio(n_a, n_b, paired)


def main() -> None:
    top = primary_power.MAX_SIMULATED_SEEDS
    keys = [
        (n_a, n_b, paired)
        for paired in (False, True)
        for n_a in range(2, top + 1)
        for n_b in range(2, top + 1)
    ]
    # the slowest (middle sizes) first, so that the cores end together
    keys.sort(key=lambda k: -min(k[0], k[1]))
    table: dict[str, list[list[float | None]]] = {
        kind: [[None] * (top - 1) for _ in range(top - 1)] for kind in ("unpaired", "paired")
    }
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        for done, ((n_a, n_b, paired), ratio) in enumerate(pool.map(entry, keys, chunksize=4), 1):
            kind = "paired" if paired else "unpaired"
            table[kind][n_a - 2][n_b - 2] = ratio if math.isfinite(ratio) else None
            if done % 200 == 0:
                print(
                    f"{done:,} of {len(keys):,} in {time.monotonic() - started:,.0f} s", flush=True
                )
    out = ROOT / "service" / "analysis" / primary_power.DETECTABLE_TABLE_FILE
    out.write_text(
        json.dumps(
            {
                "about": "primary_detectable_ratio(n_a, n_b, paired) at the default alpha and "
                "power, uncorrelated seeds; [n_a - 2][n_b - 2]; null: infinite "
                "(scripts/detectable_ratios.py)",
                "key": primary_power.detectable_table_key(),
                **table,
            },
            separators=(",", ":"),
        )
        + "\n"
    )
    print(f"wrote {out} ({len(keys):,} entries, {time.monotonic() - started:,.0f} s)")


if __name__ == "__main__":
    main()
