"""At submission, what the seeds per condition cannot let the primary test say (issue 39: a
4x4x2 grid with 3 seeds gave 48 comparisons of [0, inf] and submit said nothing). The smallest
p-values are counted by hand from the test's documented layouts (docs/api.md): unpaired, an
odd cell's structural zero and one of a 4-seed cell's middle pair left out, then every split;
paired from 6 shared seeds, every sign flip."""

from __future__ import annotations

import math

import pytest

from api_schemas import ExperimentSpec
from service.analysis.seed_warnings import smallest_p, submission_warnings


@pytest.mark.parametrize(
    ("seeds", "assignments"),
    [
        (2, math.comb(4, 2)),  # 2 + 2 values
        (3, math.comb(4, 2)),  # 2 + 2 once each zero is out
        (4, math.comb(6, 3)),  # 3 + 3
        (5, math.comb(8, 4)),  # 4 + 4
        (6, 2**6),  # paired: sign flips
        (8, 2**8),
    ],
)
def test_the_smallest_p_is_two_over_the_tests_reassignments(seeds: int, assignments: int) -> None:
    assert smallest_p(seeds) == pytest.approx(2 / assignments, rel=1e-12)


def spec(grid: dict[str, list[object]], seeds: int, **extra: object) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {"name": "w", "trainer": "collapse", "grid": grid, "seeds": seeds, **extra}
    )


SIXTEEN = {"loss": ["mse", "cosine"], "r": [0.05, 0.1, 0.2, 0.3], "stop_gradient": [False, True]}


def test_three_seeds_say_no_cell_can_reach_005_and_how_many_would() -> None:
    (warning,) = submission_warnings(spec(SIXTEEN, 3))
    assert warning.startswith("3 seeds per condition: a comparison within one cell cannot reach")
    assert "smallest possible p is 0.333" in warning and "5 seeds per condition would" in warning
    assert "comparisons pooled over the other factors can" in warning
    (alone,) = submission_warnings(spec({"stop_gradient": [False, True]}, 3))
    assert "no comparison of this grid can" in alone


def test_the_bundled_examples_five_seeds_cannot_pass_holm_within_a_cell() -> None:
    grid = {"stop_gradient": [False, True], "r": [0.0, 0.05, 0.1, 0.2]}
    warnings = submission_warnings(spec(grid, 5))
    # stop_gradient: 1 pooled + 4 within; Holm multiplies a within p >= 2/70 by 4 or more
    assert warnings[0].startswith(
        "factor stop_gradient: after Holm over its 5 comparisons none of its 4 within-cell"
    )
    assert "8 seeds per condition would" in warnings[0]  # 4 x 2/256 <= 0.05 < 4 x 2/128
    assert warnings[1].startswith("factor r: after Holm over its 18 comparisons none of its 12")
    assert submission_warnings(spec(grid, 10)) == []


def test_an_adaptive_experiment_or_a_grid_without_factors_gets_none() -> None:
    adaptive = {
        "comparison": {"factor": "stop_gradient", "a": False, "b": True},
        "min_seeds": 4,
        "step": 2,
        "max_seeds": 12,
    }
    assert submission_warnings(spec({"stop_gradient": [False, True]}, 3)) != []
    assert submission_warnings(spec({}, 3)) == []
    assert submission_warnings(spec({"stop_gradient": [False, True]}, 4, adaptive=adaptive)) == []
