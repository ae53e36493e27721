"""The `feedback` trainer: credit rules against independent references, the protocol's
numerics and thresholds, the frozen-block baseline, determinism and config errors."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pydantic
import pytest
import torch
import torch.nn.functional as F

from tests.trainers.test_runtime_contract import (
    CANCEL_BOUND_S,
    RUN_BEFORE_CANCEL_S,
    CancelAfter,
    cpu_now,
)
from trainers import MemoryReporter, NullReporter, get_trainer
from trainers.feedback import FeedbackConfig, build_model, decode_feedback, fit, step_losses
from trainers.feedback import protocol as checks
from trainers.feedback.credit import draw_feedback, output_error
from trainers.feedback.trainer import method_credits
from trainers.random_sources import random_sources

STUDENT = dict(
    arch="studentnet",
    width=16,
    depth=3,
    epochs=2,
    student_input_dim=12,
    student_train_size=256,
    student_test_size=64,
    eval_batch_size=64,
    batch_size=64,
    lr=1e-2,
    device="cpu",
)
DIGITS_MLP = dict(
    arch="resmlp",
    dataset="digits",
    width=32,
    depth=2,
    epochs=3,
    batch_size=32,
    lr=1e-2,
    device="cpu",
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread (two contend with other processes on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(arch: str, *, dtype: torch.dtype = torch.float64, **overrides: object):
    config = FeedbackConfig(
        **{**STUDENT, "arch": arch, "image_size": 8, "patch": 4, "heads": 2, **overrides}
    )
    shape = (12,) if arch == "studentnet" else (3, 8, 8)
    model = build_model(config, shape, 5, random_sources(0).init).to(dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, *shape, generator=g, dtype=dtype)
    y = torch.randint(0, 5, (6,), generator=g)
    return config, model, x, y


# ---------------------------------------------------------------------------------------------
# credits


@pytest.mark.parametrize("arch", ["studentnet", "resmlp", "vit_mini"])
def test_bp_credit_equals_autograd_gradient_of_each_state(arch: str) -> None:
    config, model, x, y = tiny_model(arch)
    states = model.states(x)
    logits = model.readout(states[-1])
    credits = method_credits(
        "bp",
        model=model,
        states=states,
        normed=model.normed(states[-1]),
        logits=logits,
        labels=y,
        matrices=None,
        config=config,
    )
    assert len(credits) == config.depth + 1
    for layer in range(config.depth + 1):
        # reference: a fresh graph that starts at h_l as a leaf and runs the remaining blocks
        h = states[layer].detach().clone().requires_grad_(True)
        out = h
        for branch in model.branches[layer:]:
            out = out + branch(out)
        loss = F.cross_entropy(model.readout(out), y, reduction="sum")
        (reference,) = torch.autograd.grad(loss, h)
        torch.testing.assert_close(credits[layer], reference, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("arch", ["studentnet", "resmlp", "vit_mini"])
def test_bp_in_local_loss_form_updates_every_parameter_by_its_true_gradient(arch: str) -> None:
    config, model, x, y = tiny_model(arch)
    params = list(model.parameters())
    reference = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    local = torch.autograd.grad(step_losses(model, x, y, "bp", None, config).total, params)
    for ours, theirs in zip(local, reference, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("penalty", [0.0, 0.1])
def test_dfa_credit_is_e_times_the_stored_b_and_drives_the_update(penalty: float) -> None:
    config = FeedbackConfig(**{**STUDENT, "method": "dfa", "epochs": 1, "penalty": penalty})
    outcome = fit(config, seed=3, reporter=NullReporter())
    stored = decode_feedback(outcome.result.diagnostics["feedback_matrices"])
    assert list(stored) == [f"B_h{i}" for i in range(config.depth + 1)]
    model = outcome.model.double()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, config.student_input_dim, generator=g, dtype=torch.float64)
    y = torch.randint(0, config.teacher_classes, (7,), generator=g)
    logits = model(x)
    e = logits.softmax(-1) - F.one_hot(y, config.teacher_classes).double()  # by hand
    init = random_sources(3).init  # the run's init stream: parameters first, then the B's
    build_model(config, (config.student_input_dim,), config.teacher_classes, init)
    matrices = draw_feedback("dfa", config.depth, config.width, config.teacher_classes, init)
    assert matrices is not None
    matrices.layers = [b.double() for b in matrices.layers]
    for b, (_, kept) in zip(matrices.layers, stored.items(), strict=True):
        torch.testing.assert_close(b, kept.double())  # stored = what the seed's init drew
    states = model.states(x)
    credits = method_credits(
        "dfa",
        model=model,
        states=states,
        normed=model.normed(states[-1]),
        logits=logits,
        labels=y,
        matrices=matrices,
        config=config,
    )
    for layer, credit in enumerate(credits):
        torch.testing.assert_close(credit, e @ stored[f"B_h{layer}"].double())
    # the update of block l is J_f^T (B_{l+1}^T e + 2 lambda f) / n
    step_config = config.model_copy(update={"penalty": penalty})
    losses = step_losses(model, x, y, "dfa", matrices, step_config)
    for layer, branch in enumerate(model.branches):
        params = list(branch.parameters())
        (ours,) = torch.autograd.grad(losses.total, params[-1:], retain_graph=True)
        h = states[layer].detach()
        f = branch(h)
        credit = (e @ stored[f"B_h{layer + 1}"].double() + 2 * penalty * f).detach()
        (reference,) = torch.autograd.grad(f, params[-1:], grad_outputs=credit / len(y))
        torch.testing.assert_close(ours, reference)


def test_fa_credit_chains_backwards_from_the_top_credit() -> None:
    config, model, x, y = tiny_model("resmlp", method="fa", fa_top_credit="direct")
    matrices = draw_feedback("fa", config.depth, config.width, 5, random_sources(0).init)
    assert matrices is not None and matrices.top is not None
    matrices.layers = [b.double() for b in matrices.layers]
    matrices.top = matrices.top.double()
    states = model.states(x)
    logits = model.readout(states[-1])
    credits = method_credits(
        "fa",
        model=model,
        states=states,
        normed=model.normed(states[-1]),
        logits=logits,
        labels=y,
        matrices=matrices,
        config=config,
    )
    top = output_error(logits, y) @ matrices.top
    torch.testing.assert_close(credits[-1], top)
    for layer in range(config.depth):
        # a_l = B_l a_{l+1} for column vectors; rows here
        torch.testing.assert_close(credits[layer], credits[layer + 1] @ matrices.layers[layer].T)
    skip = method_credits(
        "fa",
        model=model,
        states=states,
        normed=model.normed(states[-1]),
        logits=logits,
        labels=y,
        matrices=matrices,
        config=config.model_copy(update={"fa_skip": True}),
    )
    torch.testing.assert_close(skip[-2], top + top @ matrices.layers[-1].T)
    # through_norm: the head's weight replaced by B_top, backwards through the true LayerNorm
    through = method_credits(
        "fa",
        model=model,
        states=states,
        normed=model.normed(states[-1]),
        logits=logits,
        labels=y,
        matrices=matrices,
        config=config.model_copy(update={"fa_top_credit": "through_norm"}),
    )
    h = states[-1].detach().requires_grad_(True)
    surrogate = (model.out_norm(h) @ matrices.top.T * output_error(logits, y)).sum()
    (reference,) = torch.autograd.grad(surrogate, h)
    torch.testing.assert_close(through[-1], reference)


# ---------------------------------------------------------------------------------------------
# the protocol's numerics


def test_terminal_layernorm_makes_gradient_times_norm_scale_invariant() -> None:
    """With a terminal LN, ||dCE/dh_L|| * ||h_L|| is the same for ||h_L|| over four orders of
    magnitude (the mechanism of reference collapse); without one (StudentNet) it is not."""
    _, model, x, y = tiny_model("resmlp")
    direction = model.states(x)[-1].detach()
    products = []
    for scale in (10.0, 100.0, 1e3, 1e4, 1e5):
        h = (scale * direction / direction.norm(dim=-1, keepdim=True)).requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model.readout(h), y, reduction="sum"), h)
        products.append(g.norm(dim=-1) * h.norm(dim=-1))
        assert h.norm(dim=-1).allclose(torch.full((6,), scale, dtype=torch.float64))
    for p in products[1:]:
        torch.testing.assert_close(p, products[0], rtol=1e-4, atol=0)
    _, student, x, y = tiny_model("studentnet")
    h = student.states(x)[-1].detach()
    (g1,) = torch.autograd.grad(
        F.cross_entropy(student.readout(h.requires_grad_(True)), y, reduction="sum"), h
    )
    h100 = (100 * h.detach()).requires_grad_(True)
    (g100,) = torch.autograd.grad(F.cross_entropy(student.readout(h100), y, reduction="sum"), h100)
    assert not torch.allclose(g100.norm(dim=-1) * 100, g1.norm(dim=-1), rtol=0.1)


def test_cosine_has_no_eps_floor() -> None:
    v = torch.tensor([[3.0, -1.0, 2.0], [1e-30, 2e-30, -1e-30]])
    torch.testing.assert_close(checks.cosine_no_eps(v, v), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(checks.cosine_no_eps(v, -v), -torch.ones(2, dtype=torch.float64))
    # F.cosine_similarity's eps = 1e-8 floor turns the second row's 1 into ~0
    assert F.cosine_similarity(v, v, dim=-1)[1] < 1e-10
    w = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    cos = checks.cosine_no_eps(w, w)
    assert cos[0] == 1 and math.isnan(cos[1])  # a zero vector has no direction
    assert checks.layer_cosines([w], [w]) == [1.0]  # ... and is left out of the mean
    assert checks.layer_cosines([w], [-w]) == [-1.0]


def test_norms_are_per_sample_over_features_and_rho_is_the_largest_block_ratio() -> None:
    t = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])
    torch.testing.assert_close(checks.sample_norms(t), torch.tensor([5.0, 1.0, 10.0]))
    assert checks.median_norm(t) == 5.0
    assert checks.median_norm(t) != float(t.norm(-1))  # the L_-1 "norm" of the whole tensor
    assert checks.scale_growth([2.0, 4.0, 400.0, 40.0]) == 100.0
    assert checks.scale_growth([1.0]) == 1.0
    assert checks.deep_and_aggregate([1.0, 0.5, 0.0]) == (0.25, 0.5)


def test_checks_fire_exactly_past_their_thresholds() -> None:
    assert not checks.scale_check_fires(50.0)
    assert checks.scale_check_fires(math.nextafter(50.0, math.inf))
    assert not checks.reference_check_fires(1e-7)
    assert checks.reference_check_fires(math.nextafter(1e-7, 0.0))
    assert checks.reference_check_fires(math.nan)
    assert not checks.depth_check_fires(2.0)
    assert checks.depth_check_fires(math.nextafter(2.0, 0.0))
    # 0.35 - 0.33 is 1.9999999999999996 in floats: two points are two points
    assert checks.depth_utility_pp(0.35, 0.33) == 2.0
    assert not checks.depth_check_fires(checks.depth_utility_pp(0.35, 0.33))
    assert checks.depth_check_fires(checks.depth_utility_pp(0.35, 0.3301))
    assert checks.verdict([]) == "PASS"
    assert checks.verdict(["D2", "D1"]) == "FAIL(D1+D2)"
    assert checks.verdict(["D3"]) == "FAIL(D3)"
    with pytest.raises(ValueError, match="unknown checks"):
        checks.verdict(["D4"])
    assert checks.first_firing([(0, False), (1, False), (2, True), (3, False)]) == 2
    assert checks.first_firing([(0, False)]) is None


def test_trainer_verdict_uses_the_configured_thresholds() -> None:
    base = FeedbackConfig(**{**STUDENT, "epochs": 1})
    strict = base.model_copy(update={"scale_growth_threshold": 1e-3, "ref_grad_floor": 1e3})
    summary = fit(strict, seed=0, reporter=NullReporter()).result
    protocol = summary.diagnostics["protocol"]
    assert protocol["verdict"] == "FAIL(D1+D2)"
    assert protocol["checks"]["D1"]["first_epoch"] == 0  # fired at initialisation
    assert all(math.isnan(c) for c in protocol["per_layer_cosine"])  # gated by D2
    assert summary.as_dict()["diagnostics"]["protocol"]["per_layer_cosine"] == [None] * 4
    assert {w.diagnostic for w in summary.warnings} == {"residual_growth_max", "ref_grad_norm"}
    relaxed = fit(base, seed=0, reporter=NullReporter()).result
    assert relaxed.diagnostics["protocol"]["verdict"] == "PASS"
    assert relaxed.warnings == []


# ---------------------------------------------------------------------------------------------
# training runs


def test_a_run_logs_the_protocol_every_epoch_from_initialisation() -> None:
    reporter = MemoryReporter()
    result = fit(
        FeedbackConfig(**{**STUDENT, "method": "dfa", "epochs": 3}), seed=0, reporter=reporter
    ).result
    for name in (
        "residual_growth_max",
        "ref_grad_norm",
        "h_norm_layer3",
        "cos_layer0",
        "test_accuracy",
    ):
        assert [s for s, _ in reporter.curve(name)] == [0, 4, 8, 12], name
    assert [s for s, _ in reporter.curve("loss")] == [4, 8, 12]  # no training loss at init
    assert {e for _, e, _, _ in reporter.points} == {0, 1, 2, 3}
    m = result.metrics
    assert set(m) <= set(get_trainer("feedback").metrics)
    assert m["test_accuracy"] > 1 / STUDENT["student_test_size"]
    assert result.diagnostics["epochs_run"] == 3
    assert len(result.diagnostics["protocol"]["per_layer_cosine"]) == 4
    assert result.provenance["config"]["method"] == "dfa"


def test_bp_cosines_are_one_at_every_layer_and_input_pairing_has_one_per_block() -> None:
    result = fit(FeedbackConfig(**{**STUDENT, "epochs": 1}), seed=0, reporter=NullReporter()).result
    assert result.diagnostics["protocol"]["per_layer_cosine"] == pytest.approx([1.0] * 4)
    assert result.metrics["deep_cos"] == pytest.approx(1.0)
    assert result.diagnostics["feedback_matrices"] is None  # BP has none
    shifted = fit(
        FeedbackConfig(**{**STUDENT, "epochs": 1, "cosine_pairing": "input"}),
        seed=0,
        reporter=NullReporter(),
    ).result
    assert len(shifted.diagnostics["protocol"]["per_layer_cosine"]) == 3


def test_frozen_blocks_train_only_embedding_layernorms_and_head_whatever_the_method() -> None:
    config = FeedbackConfig(**{**STUDENT, "method": "dfa", "frozen_blocks": True})
    sources = random_sources(2)
    initial = build_model(config, (12,), config.teacher_classes, sources.init)
    outcome = fit(config, seed=2, reporter=NullReporter())
    trained = dict(outcome.model.named_parameters())
    for name, before in initial.named_parameters():
        changed = not torch.equal(before, trained[name])
        in_branch_weight = name.startswith("branches.") and ".norm." not in name
        assert changed != in_branch_weight, name
    assert outcome.matrices is None
    assert outcome.result.diagnostics["protocol"]["method"] == "bp"
    as_bp = fit(config.model_copy(update={"method": "bp"}), seed=2, reporter=NullReporter())
    assert as_bp.result.metrics == outcome.result.metrics


def test_same_seed_same_curves_and_stored_matrices_other_seed_not() -> None:
    config = FeedbackConfig(**{**STUDENT, "method": "fa"})
    a, b, c = MemoryReporter(), MemoryReporter(), MemoryReporter()
    ra, rb = fit(config, 7, a).result, fit(config, 7, b).result
    rc = fit(config, 8, c).result
    assert a.points == b.points and a.points != c.points
    sha = [r.diagnostics["feedback_matrices"]["sha256"] for r in (ra, rb, rc)]
    assert sha[0] == sha[1] != sha[2]
    digest_only = fit(
        config.model_copy(update={"store_feedback_matrices": False}), 7, NullReporter()
    ).result.diagnostics["feedback_matrices"]
    assert digest_only["sha256"] == sha[0] and "data" not in digest_only
    with pytest.raises(ValueError, match="only the feedback matrices' SHA-256"):
        decode_feedback(digest_only)


def test_resmlp_dfa_on_digits_grows_the_residual_stream_and_bp_does_not() -> None:
    growth = {}
    for method in ("dfa", "bp"):
        reporter = MemoryReporter()
        result = fit(
            FeedbackConfig(**{**DIGITS_MLP, "method": method}), seed=0, reporter=reporter
        ).result
        curve = [v for _, v in reporter.curve("h_norm_layer2")]
        growth[method] = curve[-1] / curve[0]
        assert result.metrics["test_accuracy"] > 0.6  # chance is 0.1
        assert result.diagnostics["n_test"] == 355
    assert growth["dfa"] > 50 and growth["dfa"] > 5 * growth["bp"], growth


@pytest.mark.parametrize("method", ["bp", "fa", "dfa"])
def test_vit_mini_runs_every_method_on_cls_token_diagnostics(method: str) -> None:
    config = FeedbackConfig(
        arch="vit_mini",
        dataset="digits",
        width=16,
        depth=2,
        heads=2,
        patch=4,
        epochs=1,
        batch_size=256,
        method=method,
        device="cpu",
        vit_credit_tokens="cls" if method == "fa" else "all",
    )
    result = fit(config, seed=0, reporter=NullReporter()).result
    protocol = result.diagnostics["protocol"]
    assert len(protocol["h_norms"]) == 3 and all(n > 0 for n in protocol["h_norms"])
    if method == "bp":
        assert protocol["per_layer_cosine"] == pytest.approx([1.0] * 3)
    assert math.isfinite(result.metrics["loss"])


def test_penalty_shrinks_dfa_residual_growth() -> None:
    config = FeedbackConfig(**{**DIGITS_MLP, "method": "dfa"})
    free = fit(config, seed=0, reporter=NullReporter()).result.metrics
    penalised = fit(
        config.model_copy(update={"penalty": 1e-2}), seed=0, reporter=NullReporter()
    ).result.metrics
    assert penalised["h_norm_layer2"] < free["h_norm_layer2"] / 3
    assert penalised["penalty_loss"] > 0 == free["penalty_loss"]


@pytest.mark.parametrize(
    "config, where",
    [
        pytest.param(
            {"arch": "resmlp", "dataset": "digits", "epochs": 100_000, "device": "cpu"},
            "training",
            id="resmlp",
        ),
        pytest.param(
            {**STUDENT, "width": 128, "depth": 4, "epochs": 100_000}, "training", id="studentnet"
        ),
        pytest.param(
            {**STUDENT, "width": 256, "depth": 4, "student_test_size": 200_000},
            "test_evaluation",
            id="studentnet_during_test_evaluation",
        ),
    ],
)
def test_a_cancel_ends_every_architecture_within_the_bound(
    config: dict[str, object], where: str
) -> None:
    """ViT-Mini, the slowest, is tests/trainers/test_runtime_contract.py's case."""
    reporter = CancelAfter(RUN_BEFORE_CANCEL_S)
    result = get_trainer("feedback").run(FeedbackConfig(**config), 0, reporter, threads=1)
    ended = cpu_now()
    assert reporter.requested is not None, "the run ended before the cancel: make it longer"
    assert not result.finished
    assert ended - reporter.requested < CANCEL_BOUND_S
    if where == "test_evaluation":  # cancelled while testing the initialisation
        assert result.diagnostics["optimizer_steps"] == 0
        assert "test_accuracy" not in result.metrics
    else:
        assert result.diagnostics["optimizer_steps"] > 0


def test_stopping_early_returns_an_unfinished_result() -> None:
    class StopAtOnce(MemoryReporter):
        def should_stop(self) -> bool:
            return True

    result = fit(FeedbackConfig(**STUDENT), seed=0, reporter=StopAtOnce()).result
    assert not result.finished and result.diagnostics["epochs_run"] == 0


def test_a_non_finite_training_loss_ends_the_run_as_diverged_at_the_last_finite_epoch() -> None:
    reporter = MemoryReporter()
    config = FeedbackConfig(**{**STUDENT, "epochs": 5, "optimizer": "sgd", "lr": 10.0})
    result = fit(config, seed=0, reporter=reporter).result
    losses = reporter.curve("loss")
    assert math.isnan(losses[-1][1]) and len(losses) < config.epochs  # stopped there
    assert result.diverged and result.diverged_at_step == losses[-1][0]
    assert result.diagnostics["last_finite_step"] == losses[-2][0]
    assert result.metrics["loss"] == losses[-2][1]


# ---------------------------------------------------------------------------------------------
# early stop on a check (a spec's stop_on_checks)

# DFA with a large step on digits: the terminal LayerNorm turns the exploding residual stream
# into a vanishing reference gradient. Measured (seed 0, one thread): rho passes 50 at epoch 4
# (66), ||g_L|| falls below 1e-7 at epoch 5 (4.8e-8, 2.1e-7 at epoch 4).
RESMLP_D2 = {**DIGITS_MLP, "method": "dfa", "lr": 0.1, "epochs": 6}
# DFA on StudentNet, which has no terminal LayerNorm: rho passes 50 at epoch 11 (53.6) while
# ||g_L|| stays >= 4.8e-5 over the 15 epochs (seed 0, one thread).
STUDENT_D1 = dict(
    arch="studentnet",
    method="dfa",
    width=64,
    depth=4,
    student_input_dim=6,
    teacher_gain=6.0,
    student_train_size=1000,
    student_test_size=500,
    eval_batch_size=256,
    batch_size=64,
    epochs=15,
    lr=0.02,
    embed_credit="none",
    device="cpu",
)


def _per_epoch(reporter: MemoryReporter, name: str) -> list[float]:
    """A metric's value at each audited epoch (0 = initialisation), in epoch order."""
    values = {e: v for _, e, n, v in reporter.points if n == name}
    return [values[e] for e in sorted(values)]


def _comparable(
    points: list[tuple[int, int | None, str, float]], last_epoch: int
) -> list[tuple[int, int | None, str, float | None]]:
    """The points up to `last_epoch`, nan as None (D2 makes the cosines nan, and nan != nan)."""
    return [
        (s, e, n, None if math.isnan(v) else v)
        for s, e, n, v in points
        if e is not None and e <= last_epoch
    ]


def _stopped_against_full(config: FeedbackConfig, stop_on: list[str]):
    """The run stopped on `stop_on` and the same run trained to the end without stopping."""
    trainer = get_trainer("feedback")
    full, stopped = MemoryReporter(), MemoryReporter()
    full_result = trainer.run(config, 0, full, threads=1)
    stopped_result = trainer.run(config, 0, stopped, threads=1, stop_on_checks=stop_on)
    return full, full_result, stopped, stopped_result


def test_resmlp_dfa_on_digits_stops_at_the_epoch_d2_fires() -> None:
    config = FeedbackConfig(**RESMLP_D2)
    full, full_result, stopped, result = _stopped_against_full(config, ["D2"])
    assert full_result.stop is None and full_result.diagnostics["epochs_run"] == config.epochs
    rho, ref = _per_epoch(full, "residual_growth_max"), _per_epoch(full, "ref_grad_norm")
    d1_epoch = next(e for e, v in enumerate(rho) if v > config.scale_growth_threshold)
    d2_epoch = next(e for e, v in enumerate(ref) if v < config.ref_grad_floor)
    assert d1_epoch < d2_epoch < config.epochs  # D1 fired first, but only D2 was asked for
    assert result.stop is not None and result.finished and not result.diverged
    assert (result.stop.checks, result.stop.epoch) == (("D2",), d2_epoch)
    assert result.stop.reason.startswith(
        f"D2 reference validity fired at epoch {d2_epoch}: ref_grad_norm "
    )
    # the run is the full one cut at that epoch: same curves, nothing logged after it
    assert _comparable(stopped.points, d2_epoch) == _comparable(full.points, d2_epoch)
    assert len(stopped.points) == len(_comparable(full.points, d2_epoch))
    assert result.diagnostics["epochs_run"] == d2_epoch
    assert (
        result.stop.step
        == result.diagnostics["optimizer_steps"]
        == max(s for s, _, _, _ in stopped.points)
    )
    assert result.diagnostics["stop"] == result.stop.as_dict()
    protocol = result.diagnostics["protocol"]
    assert protocol["verdict"] == "FAIL(D1+D2)"
    assert (protocol["checks"]["D1"]["first_epoch"], protocol["checks"]["D2"]["first_epoch"]) == (
        d1_epoch,
        d2_epoch,
    )
    assert result.metrics["test_accuracy"] == _per_epoch(full, "test_accuracy")[d2_epoch]
    assert result.metrics["ref_grad_norm"] == ref[d2_epoch]


def test_studentnet_dfa_stops_on_d1_and_d2_never_fires() -> None:
    config = FeedbackConfig(**STUDENT_D1)
    full, full_result, stopped, result = _stopped_against_full(config, ["D1", "D2"])
    ref = _per_epoch(full, "ref_grad_norm")
    assert len(ref) == config.epochs + 1 and min(ref) >= config.ref_grad_floor  # D2: never
    assert full_result.diagnostics["protocol"]["checks"]["D2"]["first_epoch"] is None
    rho = _per_epoch(full, "residual_growth_max")
    d1_epoch = next(e for e, v in enumerate(rho) if v > config.scale_growth_threshold)
    assert 0 < d1_epoch < config.epochs
    assert result.stop is not None
    assert (result.stop.checks, result.stop.epoch) == (("D1",), d1_epoch)
    assert result.stop.reason == (
        f"D1 scale stability fired at epoch {d1_epoch}: residual_growth_max "
        f"{rho[d1_epoch]:.4g} > 50"
    )
    assert stopped.points == [p for p in full.points if p[1] <= d1_epoch]  # no D2: no nan
    assert result.diagnostics["protocol"]["verdict"] == "FAIL(D1)"


def test_a_check_firing_at_initialisation_stops_before_any_step() -> None:
    config = FeedbackConfig(**{**STUDENT, "scale_growth_threshold": 1e-3})
    reporter = MemoryReporter()
    result = get_trainer("feedback").run(config, 0, reporter, threads=1, stop_on_checks=["D1"])
    assert result.stop is not None and result.stop.epoch == 0 and result.stop.step == 0
    assert result.diagnostics["optimizer_steps"] == 0 == result.diagnostics["epochs_run"]
    assert {e for _, e, _, _ in reporter.points} == {0}
    assert "test_accuracy" in result.metrics


def test_config_errors_name_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="method"):
        FeedbackConfig(method="sgd")
    with pytest.raises(pydantic.ValidationError, match="divisible by heads"):
        FeedbackConfig(arch="vit_mini", width=30, heads=4)
    with pytest.raises(pydantic.ValidationError, match="divisible by patch"):
        FeedbackConfig(arch="vit_mini", dataset="digits", patch=3)
    with pytest.raises(pydantic.ValidationError, match="depth"):
        FeedbackConfig(depth=17)
    with pytest.raises(pydantic.ValidationError, match="penalty"):
        FeedbackConfig(penalty=-1.0)
    with pytest.raises(pydantic.ValidationError, match="frozen_blocks"):
        FeedbackConfig(frozen_blocks="yes")
