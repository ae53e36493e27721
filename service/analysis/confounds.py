"""Confounds: a comparison of two levels of one factor whose runs also differ in another config
field. The levels' resolved run configs (defaults filled in and resolved as the runs train:
service.specs.run_config) are compared where the other factors are held equal, within the
comparison's cell or, pooled, within each cell of the other factors; every field besides the
gridded ones whose values differ is named with both sides' values. A trainer whose defaults
depend on the factor (collapse's stop_gradient sets lr and steps) confounds the comparison
without the spec saying so."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from api_schemas import SOURCE_FACTOR, Comparison, ConfigDifference, ExperimentSpec
from service.specs import condition_key, run_config


class ConditionConfigs:
    """Each condition's resolved run config, resolved once per condition."""

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self._configs: dict[str, dict[str, Any]] = {}

    def __call__(self, condition: dict[str, Any]) -> dict[str, Any]:
        key = condition_key(condition)
        if key not in self._configs:
            self._configs[key] = run_config(self.spec, condition)
        return self._configs[key]


def confounds(
    configs: ConditionConfigs,
    grid: dict[str, list[Any]],
    factor: str,
    a: Any,
    b: Any,
    within: dict[str, Any] | None,
) -> list[ConfigDifference]:
    """The fields besides the gridded ones whose resolved values differ between level `a` and
    level `b` of `factor`, within `within` or (None) within each cell of the other factors;
    each side's distinct values as JSON text, in the order met."""
    others = [f for f in grid if f != factor]
    cells = (
        [within]
        if within is not None
        else [
            dict(zip(others, combo, strict=True))
            for combo in itertools.product(*(grid[f] for f in others))
        ]
    )
    gridded = set(grid) | {SOURCE_FACTOR}
    found: dict[str, tuple[list[str], list[str]]] = {}
    for cell in cells:
        config_a = configs({**cell, factor: a})
        config_b = configs({**cell, factor: b})
        for field in dict.fromkeys([*config_a, *config_b]):
            if field in gridded or config_a.get(field) == config_b.get(field):
                continue
            sides = found.setdefault(field, ([], []))
            for values, config in zip(sides, (config_a, config_b), strict=True):
                text = json.dumps(config.get(field))
                if text not in values:
                    values.append(text)
    return [
        ConfigDifference(field=field, a=" | ".join(values_a), b=" | ".join(values_b))
        for field, (values_a, values_b) in found.items()
    ]


def attach_confounds(
    spec: ExperimentSpec, grid: dict[str, list[Any]], comparisons: Sequence[Comparison]
) -> None:
    """Set each comparison's `confounds` (one resolution per condition, and per level pair and
    cell, shared by the comparisons of a page)."""
    configs = ConditionConfigs(spec)
    memo: dict[str, list[ConfigDifference]] = {}
    for comparison in comparisons:
        key = json.dumps(
            [comparison.factor, comparison.a, comparison.b, comparison.within], sort_keys=True
        )
        if key not in memo:
            memo[key] = confounds(
                configs, grid, comparison.factor, comparison.a, comparison.b, comparison.within
            )
        comparison.confounds = memo[key]
