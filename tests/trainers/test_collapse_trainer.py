"""The collapse trainer against independent references: numpy and the spec's physics (its loss:
tests/trainers/test_losses_collapse_pair.py)."""

from __future__ import annotations

import math

import numpy as np
import pydantic
import pytest
import torch

from trainers import MemoryReporter, get_trainer
from trainers.collapse import (
    CollapseConfig,
    frustration_matrix,
    label_averaging_eigenvalues,
    predicted_slow_rate,
)
from trainers.random_sources import derive_seed, random_sources

TRAINER = get_trainer("collapse")


def run(seed: int = 0, **config):
    reporter = MemoryReporter()
    result = TRAINER.run(CollapseConfig(**config), seed, reporter)
    return result, reporter


def test_exactly_round_r_n_samples_are_frustrated() -> None:
    p, cls, frustrated = frustration_matrix(400, 4, 0.165, "all", np.random.default_rng(0))
    assert frustrated.sum() == round(0.165 * 400)
    np.testing.assert_allclose(p[frustrated], 0.25)
    np.testing.assert_array_equal(p[~frustrated].argmax(1), cls[~frustrated])
    np.testing.assert_allclose(p.sum(1), 1.0)


@pytest.mark.parametrize("r", [0.0, 0.1, 0.2])
def test_label_averaging_spectrum_is_one_and_one_minus_r(r: float) -> None:
    # Frustrated samples balanced across classes give M = (1 - r) I + (r/K) 11^T exactly.
    n, k = 400, 4
    cls = np.arange(n) % k
    p = np.eye(k)[cls]
    p[: round(r * n)] = 1.0 / k
    m = np.diag(1 / p.sum(0)) @ p.T @ p
    hand = np.sort(np.linalg.eigvals(m).real)[::-1]
    got = label_averaging_eigenvalues(p)
    np.testing.assert_allclose(got, hand, atol=1e-12)
    np.testing.assert_allclose(got, [1.0] + [1.0 - r] * (k - 1), atol=1e-12)


def test_predicted_slow_rate_is_the_smaller_root() -> None:
    lam, k = 0.8, 4
    roots = np.roots([1.0, -(1 + 1 / k), (1 - lam) / k])
    assert predicted_slow_rate(lam, k) == pytest.approx(min(roots.real), rel=1e-12)
    assert predicted_slow_rate(1.0, k) == 0.0


def test_collapse_physics_over_training() -> None:
    """MinL2 at the end vs its value at 10% of training (after the fast alignment)."""
    no_frustration, _ = run(r=0.0, steps=2000)
    collapsing, _ = run(r=0.2, steps=2000)
    protected, _ = run(r=0.2, stop_gradient=True, steps=6000)

    finite = no_frustration.diagnostics
    assert math.isfinite(finite["min_l2"]) and finite["min_l2"] > 1.0
    assert finite["min_l2_ratio_10pct"] > 0.99

    assert collapsing.diagnostics["min_l2"] < 0.01 * collapsing.diagnostics["min_l2_at_10pct"]
    assert collapsing.warnings and collapsing.warnings[0].diagnostic == "min_l2_ratio_10pct"

    assert protected.diagnostics["min_l2"] > 0.5 * protected.diagnostics["min_l2_at_10pct"]
    # The head absorbs the frustration: |eig(W)| on the class subspace ~ {1, 1 - r, ...}.
    eig_w = protected.diagnostics["eig_w_class"]
    assert eig_w[0] == pytest.approx(1.0, abs=0.02)
    for value in eig_w[1:]:
        assert value == pytest.approx(0.8, abs=0.05)


def test_fitted_slow_rate_tracks_the_exact_slow_root() -> None:
    for r in (0.05, 0.1):
        result, _ = run(r=r, steps=3000)
        d = result.diagnostics
        assert d["realised_r"] == r
        assert d["slow_rate"] == pytest.approx(d["predicted_slow_rate"], rel=0.15)


def test_teacher_student_collapses_only_with_frustration() -> None:
    clean, _ = run(r=0.0, model="teacher_student", steps=2000)
    frustrated, _ = run(r=0.2, model="teacher_student", steps=2000)
    assert clean.diagnostics["min_l2_ratio_10pct"] > 0.9
    assert frustrated.diagnostics["min_l2_ratio_10pct"] < 0.01


def test_cosine_loss_trains_with_autograd() -> None:
    result, reporter = run(r=0.0, loss="cosine", steps=300)
    losses = [v for _, v in reporter.curve("loss")]
    assert losses[-1] < losses[0]
    assert result.metrics["train_accuracy"] > 0.9


def test_same_config_and_seed_give_identical_metrics() -> None:
    a, rep_a = run(seed=7, r=0.1, stop_gradient=True, steps=500)
    b, rep_b = run(seed=7, r=0.1, stop_gradient=True, steps=500)
    c, _ = run(seed=8, r=0.1, stop_gradient=True, steps=500)
    assert rep_a.points == rep_b.points
    assert a.metrics == b.metrics
    assert a.metrics != c.metrics


def test_logged_curves_carry_every_metric() -> None:
    _, reporter = run(r=0.1, steps=100, log_every=10)
    steps = [s for s, _ in reporter.curve("min_l2")]
    assert steps == list(range(0, 101, 10))
    assert {n for _, _, n, _ in reporter.points} == set(TRAINER.metrics)


def test_config_rejects_unknown_fields_and_wrong_types() -> None:
    with pytest.raises(pydantic.ValidationError, match="extra"):
        CollapseConfig(rr=0.1)
    with pytest.raises(pydantic.ValidationError):
        CollapseConfig(r="0.1")
    with pytest.raises(pydantic.ValidationError):
        CollapseConfig(r=1.5)
    with pytest.raises(pydantic.ValidationError, match="n_samples"):
        CollapseConfig(n_samples=3, n_classes=4)


def test_random_sources_are_independent_named_streams() -> None:
    a, b = random_sources(0), random_sources(0)
    assert torch.equal(torch.randn(5, generator=a.init), torch.randn(5, generator=b.init))
    c = random_sources(0)
    assert not torch.equal(torch.randn(5, generator=c.init), torch.randn(5, generator=c.data))
    pinned = random_sources(1, overrides={"data": 0})
    assert torch.equal(
        torch.randn(5, generator=pinned.data), torch.randn(5, generator=random_sources(0).data)
    )
    assert derive_seed(0, "init") != derive_seed(1, "init")
    with pytest.raises(ValueError, match="unknown random source"):
        derive_seed(0, "dropout")
