"""A comparison whose two levels also differ in another resolved config field is flagged with
the fields and both sides' values (issue 39: the bundled example's stop_gradient=true runs
also train with lr 0.2 instead of 0.5 and 20,000 steps instead of 4,000, the collapse trainer's
defaults for a stop-gradient head, and nothing said so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api_schemas import ExperimentSpec
from service.analysis.confounds import ConditionConfigs, confounds
from service.storage.db import upgrade_database
from tests.service.test_stats_store import served, store_collapse_experiment

GRID = {"stop_gradient": [False, True], "r": [0.0, 0.1]}


def store_grid(url: str, config: dict[str, Any], seeds: int = 4) -> int:
    """A completed collapse experiment over GRID with base `config`, random min_l2 per run."""
    return store_collapse_experiment(url, 0, seeds, 3, grid=GRID, config=config)


def test_the_stop_gradients_default_lr_and_steps_are_named_on_its_comparisons(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    experiment_id = store_grid(url, {"n_samples": 400})
    page = served(url, experiment_id)
    by_factor: dict[str, list[dict[str, Any]]] = {}
    for comparison in page["comparisons"]:
        by_factor.setdefault(comparison["factor"], []).append(comparison)
    assert len(by_factor["stop_gradient"]) == 3  # pooled, and within each r
    for comparison in by_factor["stop_gradient"]:
        named = {c["field"]: (c["a"], c["b"]) for c in comparison["confounds"]}
        assert named["lr"] == ("0.5", "0.2") and named["steps"] == ("4000", "20000"), named
        assert "stop_gradient" not in named and "r" not in named
    for comparison in by_factor["r"]:  # r changes no other field
        assert comparison["confounds"] == []


def test_a_base_config_that_fixes_the_fields_leaves_no_confound(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'seedgrid.db'}"
    upgrade_database(url)
    fixed = {"n_samples": 400, "lr": 0.3, "steps": 1000, "log_every": 10}
    experiment_id = store_grid(url, fixed)
    assert all(c["confounds"] == [] for c in served(url, experiment_id)["comparisons"])


def test_a_pooled_comparison_names_what_its_cells_name() -> None:
    # collapse's defaults depend on stop_gradient alone: every cell of r names the same fields
    # with the same values, pooled as within
    spec = ExperimentSpec.model_validate(
        {"name": "x", "trainer": "collapse", "config": {"n_samples": 400}, "grid": GRID}
    )
    configs = ConditionConfigs(spec)
    pooled = confounds(configs, GRID, "stop_gradient", False, True, None)
    within = confounds(configs, GRID, "stop_gradient", False, True, {"r": 0.1})
    assert [(c.field, c.a, c.b) for c in pooled] == [(c.field, c.a, c.b) for c in within]
    assert {c.field for c in pooled} >= {"lr", "steps"}
    assert confounds(configs, GRID, "r", 0.0, 0.1, None) == []
