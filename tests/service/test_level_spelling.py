"""One condition reads the same everywhere (issue 39: `sg: False vs True` in the CLI,
`stop_gradient=false` in condition keys, `"mse"` quoted on the dashboard): a level is written as
condition keys write it, a string as it is and anything else as JSON, in the CLI's table and
confound lines, the paper tables and the figures' labels (the dashboard:
tests/e2e/test_browser.py)."""

from __future__ import annotations

import json
from typing import Any

from api_schemas.levels import condition_text, format_level, pair_text
from service.analysis import figures
from service.analysis.stats import experiment_stats
from service.cli import paper_tables, render
from service.specs import condition_key


def bool_and_string_stats() -> dict[str, Any]:
    """/stats of a grid over a bool and a string factor, two seeds a cell."""
    grid = {"stop_gradient": [False, True], "loss": ["mse", "cosine"]}
    runs, seeds = [], []
    value = 1.0
    for sg in grid["stop_gradient"]:
        for loss in grid["loss"]:
            condition = {"stop_gradient": sg, "loss": loss}
            for seed in range(3):
                value = value * 1.7 % 5 + 0.1
                runs.append((condition, condition_key(condition), value))
                seeds.append(seed)
    stats = experiment_stats(metric="loss", grid=grid, runs=runs, seeds=seeds)
    payload: dict[str, Any] = json.loads(stats.model_dump_json())
    return payload


def test_levels_are_spelled_as_condition_keys_spell_them() -> None:
    assert [format_level(v) for v in (False, True, "mse", 0.1, [64, 64], None)] == [
        "false",
        "true",
        "mse",
        "0.1",
        "[64, 64]",
        "null",
    ]
    assert condition_key({"stop_gradient": False, "loss": "mse"}) == "loss=mse,stop_gradient=false"
    stats = bool_and_string_stats()
    by_pair = {
        (c["factor"], json.dumps(c["within"], sort_keys=True)): c for c in stats["comparisons"]
    }
    pooled = by_pair[("stop_gradient", "null")]
    within = by_pair[("stop_gradient", json.dumps({"loss": "mse"}))]
    assert pair_text(pooled) == "stop_gradient: false vs true"
    assert condition_text(within["within"]) == "loss=mse"
    # the CLI's compact table, the paper tables and the forest plot's labels
    cli_rows = {(row[0], row[1]) for row in render.comparison_rows(stats)}
    assert ("stop_gradient: false vs true", "pooled") in cli_rows
    assert ("stop_gradient: false vs true", "loss=mse") in cli_rows
    assert ("loss: mse vs cosine", "stop_gradient=false") in cli_rows
    paper = {tuple(row[:2]) for row in paper_tables.comparison_rows(stats, latex=False)}
    assert ("stop_gradient: false vs true", "loss=mse") in paper
    assert figures.comparison_label(within) == "stop_gradient: false vs true (loss=mse)"
    assert not any("False" in text or "True" in text for pair in cli_rows for text in pair)
