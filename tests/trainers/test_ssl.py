"""Paper 001's math (float64), GradScale, Cut-init, the kNN monitor, the schedule, and the
`ssl` / `ssl_sim` trainers on tiny CPU configs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.trainers.test_runtime_contract import (
    CANCEL_BOUND_S,
    RUN_BEFORE_CANCEL_S,
    CancelAfter,
    cpu_now,
)
from trainers import MemoryReporter, get_trainer
from trainers.losses.negative_cosine import negative_cosine
from trainers.losses.nt_xent import decoupled_nt_xent
from trainers.losses.simsiam import symmetric_attractive_loss
from trainers.ssl import (
    GradScale,
    SSLConfig,
    SSLModel,
    cut_init,
    knn_accuracy,
    learning_rate,
    ssl_loss,
)
from trainers.ssl_sim import cosine_convergence_steps

TINY = dict(
    dataset="digits",
    image_size=8,
    backbone="resnet_small",
    proj_dim=16,
    pred_hidden=8,
    epochs=2,
    warmup_epochs=1,
    batch_size=256,
    knn_k=20,
    device="cpu",
)


def random_z(n: int = 64, d: int = 8, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(n, d, generator=g, dtype=torch.float64)).requires_grad_()


@pytest.mark.parametrize("loss_name", ["negative_cosine", "nt_xent", "attractive"])
def test_cosine_loss_gradients_are_orthogonal_to_the_embeddings(loss_name: str) -> None:
    z1, z2 = random_z(seed=1), random_z(seed=2)
    if loss_name == "negative_cosine":
        loss = negative_cosine(z1, z2)
    elif loss_name == "nt_xent":
        loss = decoupled_nt_xent(F.normalize(z1, dim=1), F.normalize(z2, dim=1), 0.5)
    else:
        loss = symmetric_attractive_loss(z1, z2, random_z(seed=3), random_z(seed=4), 1.0)
    g1, g2 = torch.autograd.grad(loss, (z1, z2))
    for z, g in ((z1, g1), (z2, g2)):
        inner = (z.detach() * g).sum(dim=1)
        assert inner.abs().max() < 1e-12 * g.norm(dim=1).max().clamp(min=1)
        assert g.abs().max() > 1e-6  # a real gradient, not a zero one


def test_a_plain_gradient_step_never_decreases_the_norm() -> None:
    z1, z2 = random_z(n=500, seed=5), random_z(n=500, seed=6)
    (g1,) = torch.autograd.grad(negative_cosine(z1, z2), (z1,))
    lr = 10.0
    before = z1.detach().norm(dim=1)
    after = (z1.detach() - lr * g1).norm(dim=1)
    assert torch.all(after >= before)
    # ||z'||^2 = ||z||^2 + lr^2 ||g||^2 exactly (the cross term vanishes)
    expected = before**2 + lr**2 * g1.norm(dim=1) ** 2
    assert torch.max(torch.abs(after**2 - expected) / expected) < 1e-12
    # and the gradient falls as 1/||z||: d/dz1 f(4 z1) = 4 f'(4 z1) = 4 f'(z1) / 4 = f'(z1)
    (g_big,) = torch.autograd.grad(negative_cosine(4 * z1, z2), (z1,))
    assert torch.allclose(g_big, g1, rtol=1e-12, atol=0)


@pytest.mark.parametrize("power", [0.0, 1.0, 2.0, -1.0])
def test_grad_scale_multiplies_the_upstream_gradient_by_the_norm_power(power: float) -> None:
    z = random_z(n=16, d=5, seed=7)
    upstream = torch.randn(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    out = GradScale.apply(z, power)
    assert torch.equal(out, z)
    (grad,) = torch.autograd.grad(out, z, upstream)
    expected = upstream * z.detach().norm(dim=1, keepdim=True) ** power
    assert torch.allclose(grad, expected, rtol=1e-14, atol=0)
    if power == 0.0:
        assert torch.equal(grad, upstream)  # exactly the identity


def test_grad_scale_zero_reproduces_the_baseline_model_gradients() -> None:
    config = SSLConfig(**TINY, method="simclr")
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.rand(8, 3, 8, 8, generator=g), torch.rand(8, 3, 8, 8, generator=g)

    def grads(power_applied: bool) -> list[torch.Tensor]:
        model = SSLModel(config, 3, torch.Generator().manual_seed(1))
        if power_applied:
            loss = ssl_loss(model, None, x1, x2, 0.5)
        else:  # the loss written without GradScale at all
            _, z1 = model.embed(x1)
            _, z2 = model.embed(x2)
            loss = decoupled_nt_xent(F.normalize(z1, dim=1), F.normalize(z2, dim=1), 0.5)
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    for a, b in zip(grads(True), grads(False), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("method", ["simclr", "simsiam"])
def test_cut_init_divides_every_parameter_and_no_buffer(method: str) -> None:
    config = SSLConfig(**TINY, method=method)
    model = SSLModel(config, 3, torch.Generator().manual_seed(0))
    for p in model.parameters():  # make every parameter non-trivial (BN weights start at 1)
        p.data.add_(0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    cut_init(model, 3.0)
    kinds = set()
    for name, p in model.named_parameters():
        assert torch.allclose(p, before[name] / 3.0, rtol=1e-6, atol=0), name
        kinds.add(name.rsplit(".", 1)[-1])
    assert {"weight", "bias"} <= kinds
    assert any("bn" in n or isinstance(m, torch.nn.BatchNorm1d) for n, m in model.named_modules())
    for name, b in model.named_buffers():
        assert torch.equal(b, buffers[name]), name
    # and the initial embedding norm shrinks accordingly
    fresh = SSLModel(config, 3, torch.Generator().manual_seed(0)).eval()
    cut = SSLModel(config, 3, torch.Generator().manual_seed(0)).eval()
    cut_init(cut, 3.0)
    x = torch.rand(16, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert cut.embed(x)[1].norm(dim=1).mean() < fresh.embed(x)[1].norm(dim=1).mean()


def test_knn_accuracy_matches_a_hand_written_weighted_vote() -> None:
    g = torch.Generator().manual_seed(0)
    bank, queries = torch.randn(60, 6, generator=g), torch.randn(25, 6, generator=g)
    bank_y, query_y = (
        torch.randint(0, 4, (60,), generator=g),
        torch.randint(0, 4, (25,), generator=g),
    )
    b = bank.numpy() / np.linalg.norm(bank.numpy(), axis=1, keepdims=True)
    q = queries.numpy() / np.linalg.norm(queries.numpy(), axis=1, keepdims=True)
    correct = 0
    for i in range(25):
        sims = b @ q[i]
        top = np.argsort(-sims)[:7]
        votes = np.zeros(4)
        for j in top:
            votes[bank_y[j]] += math.exp(sims[j] / 0.1)
        correct += int(votes.argmax() == query_y[i])
    assert knn_accuracy(bank, bank_y, queries, query_y, 4, k=7, temperature=0.1) == pytest.approx(
        correct / 25
    )


def test_learning_rate_schedule_nominal_and_squared() -> None:
    config = SSLConfig(**{**TINY, "epochs": 10, "warmup_epochs": 2, "lr": 0.6})
    total, per_epoch = 100, 10
    assert learning_rate(config, 19, total, per_epoch) == pytest.approx(0.6)  # end of warm-up
    assert learning_rate(config, 0, total, per_epoch) == pytest.approx(0.6 / 20)
    assert learning_rate(config, total, total, per_epoch) == pytest.approx(0.6e-3)
    squared = config.model_copy(update={"lr_schedule": "squared"})
    assert learning_rate(squared, 19, total, per_epoch) == pytest.approx(0.36)
    assert learning_rate(squared, total, total, per_epoch) == pytest.approx(0.6e-3)


@pytest.mark.parametrize("method", ["simclr", "simsiam", "byol"])
def test_tiny_runs_log_norm_curves_and_knn(method: str) -> None:
    reporter = MemoryReporter()
    result = get_trainer("ssl").run(
        SSLConfig(**TINY, method=method, held_out_classes=2), 0, reporter
    )
    m = result.metrics
    assert len(reporter.curve("norm_mean")) == 2 and len(reporter.curve("knn_accuracy")) == 2
    assert m["knn_accuracy"] > 0.3  # eight kept classes: chance is 0.125
    assert m["norm_q10"] <= m["norm_q50"] <= m["norm_q90"]
    assert {f"norm_class{c}" for c in range(8)} <= set(m) and "norm_class8" not in m
    assert m["norm_heldout_mean"] > 0 and result.diagnostics["n_test_held_out"] > 0
    assert all(b["n"] >= 10 for b in result.diagnostics["knn_by_norm"])


def test_same_seed_same_curves() -> None:
    a, b = MemoryReporter(), MemoryReporter()
    get_trainer("ssl").run(SSLConfig(**TINY), 3, a)
    get_trainer("ssl").run(SSLConfig(**TINY), 3, b)
    assert a.points == b.points


def test_cut_starts_from_smaller_norms_in_training() -> None:
    def first_norm(cut: float) -> float:
        reporter = MemoryReporter()
        get_trainer("ssl").run(SSLConfig(**{**TINY, "epochs": 1}, cut=cut), 0, reporter)
        return reporter.curve("norm_mean")[0][1]

    assert first_norm(3.0) < first_norm(1.0)


def test_convergence_steps_match_the_reference_rerun() -> None:
    # spec section 2.5: 6, 24, 96, 388 steps for rho = 0.25, 0.5, 1, 2 (about 96 rho^2)
    g = torch.Generator().manual_seed(0)
    steps = []
    for rho in (0.25, 0.5, 1.0, 2.0):
        z1 = rho * F.normalize(torch.randn(500, 20, generator=g, dtype=torch.float64), dim=1)
        z2 = rho * F.normalize(torch.randn(500, 20, generator=g, dtype=torch.float64), dim=1)
        steps.append(cosine_convergence_steps(z1, z2, 10.0, 1e-3, 10_000)[0])
    for got, expected in zip(steps, (6, 24, 96, 388), strict=True):
        assert abs(got - expected) <= 0.05 * expected + 1, steps
    # GradScale p = 2 makes the angular step independent of the norm
    z1 = 2.0 * F.normalize(torch.randn(500, 20, generator=g, dtype=torch.float64), dim=1)
    z2 = 2.0 * F.normalize(torch.randn(500, 20, generator=g, dtype=torch.float64), dim=1)
    scaled = cosine_convergence_steps(z1, z2, 10.0, 1e-3, 10_000, power=2.0)[0]
    assert scaled < 0.5 * steps[-1]


# Ten seeds of the latent-class simulation: the paper's claim is about runs averaged over seeds.
LATENT_CLASS_SEEDS = range(10)


def test_latent_class_simulation_gives_frequent_classes_larger_norms_across_seeds() -> None:
    # Spec section 2.5 settings: frequencies 1:2:4:8, 2,000 samples, spread 1, 100 epochs. Per
    # seed the effect is a weak trend (most frequent above rarest in 80 of seeds 0-95, the
    # Spearman correlation ranges down to -0.8), so the paper's figure averages runs and this
    # asserts the seed means. Over seeds 0-95 the per-seed Spearman(frequency, norm) has mean
    # 0.42 and SD 0.46, and most-frequent / rarest mean 1.068 and SD 0.081: a mean over 10
    # seeds sits 2.9 and 2.6 standard errors above 0 and 1. Both bounds hold in each of the 87
    # windows of 10 consecutive seeds in 0-95 (lowest: 0.16 and 1.006, seeds 66-75).
    trainer = get_trainer("ssl_sim")
    config = trainer.Config(simulation="latent_class")
    rhos, most_over_rarest = [], []
    for seed in LATENT_CLASS_SEEDS:
        result = trainer.run(config, seed, MemoryReporter(), threads=1)
        counts = result.diagnostics["class_counts"]
        assert counts == sorted(counts)  # class c has weight 2^c
        rhos.append(result.metrics["norm_frequency_spearman"])
        most_over_rarest.append(result.metrics["norm_most_over_least_frequent"])
    assert np.mean(rhos) > 0, rhos
    assert np.mean(most_over_rarest) > 1, most_over_rarest


def test_a_cancel_ends_a_long_latent_class_run_within_the_bound() -> None:
    trainer = get_trainer("ssl_sim")
    reporter = CancelAfter(RUN_BEFORE_CANCEL_S)
    config = trainer.Config(simulation="latent_class", epochs=100_000)
    result = trainer.run(config, 0, reporter, threads=1)
    ended = cpu_now()
    assert reporter.requested is not None, "the run ended before the cancel: make it longer"
    assert not result.finished
    assert ended - reporter.requested < CANCEL_BOUND_S
