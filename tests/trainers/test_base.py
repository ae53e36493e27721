"""The trainer interface's serialisation of results."""

from __future__ import annotations

import math

from trainers.base import RunResult, RunWarning


def test_results_serialise_non_finite_values_as_null_at_any_depth() -> None:
    result = RunResult(
        metrics={"loss": math.inf, "acc": 0.5},
        diagnostics={"peak": math.nan, "curve": [1.0, -math.inf], "nested": {"x": math.inf}},
        warnings=[RunWarning("loss", math.inf, 1.0, "diverged")],
    )
    out = result.as_dict()
    assert out["metrics"] == {"loss": None, "acc": 0.5}
    assert out["diagnostics"] == {"peak": None, "curve": [1.0, None], "nested": {"x": None}}
    assert out["warnings"][0]["value"] is None
