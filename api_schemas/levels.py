"""How a grid level is written wherever seedgrid shows one: as condition keys write it
(`stop_gradient=false,r=0.1`): a string as it is, anything else as JSON (false, 0.1, [64, 64],
null). The CLI, the paper tables, the figures and the dashboard (app.js's levelText) all use
this spelling, so one condition reads the same in each."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def format_level(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def condition_text(condition: Mapping[str, Any]) -> str:
    """`field=value, field=value` in the condition's order."""
    return ", ".join(f"{k}={format_level(v)}" for k, v in condition.items())


def pair_text(comparison: Mapping[str, Any]) -> str:
    """A comparison's factor and levels: `stop_gradient: false vs true`."""
    return (
        f"{comparison['factor']}: {format_level(comparison['a'])} vs "
        f"{format_level(comparison['b'])}"
    )
