"""The table of detectable ratios shipped beside service.analysis.primary_power
(scripts/detectable_ratios.py): it covers every n_a, n_b up to MAX_SIMULATED_SEEDS, paired and
unpaired, holds exactly what the simulation computes (a sample of entries recomputed), and
primary_detectable_ratio answers from it without simulating, at the defaults only."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from service.analysis import primary_power
from service.analysis.power import DEFAULT_ALPHA


def test_the_table_covers_every_size_and_was_written_with_the_current_settings() -> None:
    table = primary_power.detectable_table()
    assert table is not None, "detectable_ratios.json missing or written with other settings"
    side = primary_power.MAX_SIMULATED_SEEDS - 1
    for kind in ("unpaired", "paired"):
        assert len(table[kind]) == side and all(len(row) == side for row in table[kind])
        values = [v for row in table[kind] for v in row if v is not None]
        assert all(1.0 <= v <= primary_power.MAX_DETECTABLE_RATIO for v in values)
    # more seeds detect smaller ratios: along the diagonal, none below 5 seeds a side (too few
    # re-assignments: no ratio excluded), then falling, to under 3 at 40 seeds
    for kind in ("unpaired", "paired"):
        diagonal = [table[kind][n - 2][n - 2] for n in range(2, side + 2)]
        assert diagonal[:3] == [None, None, None], diagonal
        finite = diagonal[3:]
        assert all(a >= b for a, b in itertools.pairwise(finite)), diagonal
        assert finite[-1] < 3.0 and finite[0] > 100, diagonal


def test_sampled_entries_equal_the_simulation() -> None:
    """Eight entries drawn at random (a seed of this test's own), each simulated again: the
    table is exactly the simulation, so a change of the test or of its simulation that leaves
    the table stale fails here (rewrite it with scripts/detectable_ratios.py)."""
    rng = np.random.default_rng(38)
    top = primary_power.MAX_SIMULATED_SEEDS
    keys = {(2, 2, False), (3, 3, True), (top, top, True)}
    while len(keys) < 8:
        n_a, n_b = (int(n) for n in rng.integers(2, top + 1, size=2))
        keys.add((n_a, n_b, bool(rng.integers(2))))
    for n_a, n_b, paired in sorted(keys):
        simulated = primary_power.simulated_detectable_ratio(n_a, n_b, paired)
        tabled = primary_power._tabled_detectable_ratio(n_a, n_b, paired)
        assert tabled == simulated or (math.isinf(simulated) and tabled == math.inf), (
            n_a,
            n_b,
            paired,
        )


def test_the_defaults_are_answered_from_the_table_and_other_settings_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    simulated: list[Any] = []
    real = primary_power.null_intervals

    def counted(*args: Any) -> Any:
        simulated.append(args)
        return real(*args)

    monkeypatch.setattr(primary_power, "null_intervals", counted)
    primary_power.primary_detectable_ratio.cache_clear()
    try:
        table = primary_power.detectable_table()
        assert table is not None
        assert primary_power.primary_detectable_ratio(17, 23) == table["unpaired"][15][21]
        assert primary_power.primary_detectable_ratio(9, 9, paired=True) == table["paired"][7][7]
        assert simulated == []
        primary_power.primary_detectable_ratio(9, 9, paired=True, alpha=0.01)
        primary_power.primary_detectable_ratio(9, 9, paired=True, correlation=0.5)
        primary_power.primary_detectable_ratio(9, 10, power=0.9)
        assert simulated == [
            (9, 9, True, 0.0, 0.01),
            (9, 9, True, 0.5, DEFAULT_ALPHA),
            (9, 10, False, 0.0, DEFAULT_ALPHA),
        ]
    finally:
        primary_power.primary_detectable_ratio.cache_clear()
