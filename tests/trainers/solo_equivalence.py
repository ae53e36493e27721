"""Run the seeds of one config as one seed-batched task and each seed alone, and compare each
seed's result and curve with its solo run's (the reference of a batched trainer's tests)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from trainers.base import MemoryReporter, RunResult
from trainers.runtime import TrainerBase

# float64 trainers: a seed of a batched task equals its solo run to this relative tolerance.
REL_FLOAT64 = 1e-9

Outcome = tuple[RunResult, MemoryReporter]


def run_both(
    trainer: TrainerBase,
    config: Any,
    seeds: Sequence[int],
    *,
    source_seeds: Sequence[dict[str, int] | None] | None = None,
    reporter: Callable[[], MemoryReporter] = MemoryReporter,
) -> tuple[list[Outcome], list[Outcome]]:
    """(batched, solo): each seed's result and reporter from one `run_seeds` task of all the
    seeds, then from its own `run`, with the same source seeds and a fresh reporter each. One
    torch thread: on a busy machine, threads that wait for each other slow small runs down
    many times over."""
    pins = list(source_seeds) if source_seeds is not None else [None] * len(seeds)
    reporters = [reporter() for _ in seeds]
    results = trainer.run_seeds(config, seeds, reporters, source_seeds=source_seeds, threads=1)
    batched = []
    for result, seed_reporter in zip(results, reporters, strict=True):
        assert isinstance(result, RunResult), result
        batched.append((result, seed_reporter))
    solo = []
    for seed, pinned in zip(seeds, pins, strict=True):
        solo_reporter = reporter()
        solo.append(
            (
                trainer.run(config, seed, solo_reporter, source_seeds=pinned, threads=1),
                solo_reporter,
            )
        )
    return batched, solo


def close(got: Any, want: Any, rel: float) -> bool:
    """Equal values, floats to `rel` (NaN equals NaN), at any depth of lists and dicts."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(close(got[key], want[key], rel) for key in want)
        )
    if isinstance(want, list | tuple):
        return (
            isinstance(got, list | tuple)
            and len(got) == len(want)
            and all(close(g, w, rel) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, float) and not isinstance(got, bool) and isinstance(got, float | int):
        if math.isnan(want):
            return math.isnan(got)
        return got == want or math.isclose(got, want, rel_tol=rel, abs_tol=0.0)
    return type(got) is type(want) and got == want


def assert_same_as_solo(
    batched: Outcome, solo: Outcome, *, rel: float = REL_FLOAT64, same_bits: bool = True
) -> None:
    """The batched seed's curve (every logged step, epoch, name and value), final metrics,
    diagnostics, warnings and ending equal its solo run's; with `same_bits`, its trained
    values too, bit for bit (provenance parameters_sha256)."""
    (got, got_reporter), (want, want_reporter) = batched, solo
    got_points, want_points = got_reporter.points, want_reporter.points
    assert [p[:3] for p in got_points] == [p[:3] for p in want_points], "logged steps differ"
    for got_point, want_point in zip(got_points, want_points, strict=True):
        assert close(got_point[3], want_point[3], rel), (got_point, want_point)
    assert close(got.metrics, want.metrics, rel), (got.metrics, want.metrics)
    assert close(got.diagnostics, want.diagnostics, rel), (got.diagnostics, want.diagnostics)
    assert close([w.as_dict() for w in got.warnings], [w.as_dict() for w in want.warnings], rel)
    assert (got.finished, got.diverged, got.diverged_at_step, got.stop) == (
        want.finished,
        want.diverged,
        want.diverged_at_step,
        want.stop,
    )
    for key in ("seed", "source_seeds", "config"):
        assert got.provenance[key] == want.provenance[key], key
    if same_bits:
        assert got.provenance["parameters_sha256"] is not None
        assert got.provenance["parameters_sha256"] == want.provenance["parameters_sha256"]
