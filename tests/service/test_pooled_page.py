"""GET /stats?pooled=true: only the pooled comparisons, the headlines of a grid too large for
one page (issue 38/39: a 200 x 10 grid's first page held factor a's comparisons only, so the
dashboard's first screen stated no answer for b). The pooled page must be the pooled rows of
the whole list, Holm p-values included (adjusted over the whole families), counted and paged
among themselves."""

from __future__ import annotations

from pathlib import Path

from service.analysis.stats import ComparisonPlan
from service.storage.db import upgrade_database
from tests.service.test_stats_store import served, store_collapse_experiment

GRID = {"stop_gradient": [False, True], "r": [0.0, 0.05, 0.1, 0.2], "loss": ["mse", "cosine"]}


def test_the_pooled_page_is_the_pooled_rows_of_every_comparison(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    experiment_id = store_collapse_experiment(url, 0, 4, 38, grid=GRID)
    everything = served(url, experiment_id)
    pooled_rows = [c for c in everything["comparisons"] if c["within"] is None]
    # 1 pair of stop_gradient, 6 of r, 1 of loss
    assert len(pooled_rows) == 1 + 6 + 1 < everything["total_comparisons"]
    pooled = served(url, experiment_id, pooled=True)
    assert pooled["pooled"] is True and everything["pooled"] is False
    assert pooled["total_comparisons"] == len(pooled_rows) and pooled["next_offset"] is None
    assert pooled["comparisons"] == pooled_rows  # every field, the Holm p-values among them
    assert any(c["primary_p_holm_factor"] != c["primary_p"] for c in pooled_rows)
    # paged among themselves; one factor's alone
    page = served(url, experiment_id, pooled=True, offset=2, limit=3)
    assert page["comparisons"] == pooled_rows[2:5] and page["next_offset"] == 5
    r_only = served(url, experiment_id, pooled=True, factor="r")
    assert r_only["comparisons"] == [c for c in pooled_rows if c["factor"] == "r"]


def test_a_pooled_slot_keeps_its_place_in_its_family() -> None:
    every = list(ComparisonPlan(GRID).page(0, ComparisonPlan(GRID).total))
    pooled = list(ComparisonPlan(GRID, pooled=True).page(0, 100))
    assert pooled == [slot for slot in every if slot.within is None]
