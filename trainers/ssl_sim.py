"""`ssl_sim`: the two simulations of paper 001 (docs/papers/ssl.md §2.5).

A trainer of its own rather than a mode of `ssl`: the simulations share no config, model or
metric with image SSL training, and a separate name keeps both configs strict and short.

- `convergence`: free embeddings, n positive pairs in d dimensions at initial norm rho, plain
  SGD (lr 10) on -mean cos; the number of steps until mean cos >= 1 - 1e-3 grows as rho^2
  (about 96 rho^2 with these settings), because the angular step shrinks as 1/||z||^2.
  GradScale (grad_scale_power) can be switched on to see it remove the dependence.
- `latent_class`: K latent classes on the sphere S^9 with frequencies in class_weights, observed
  through x = A u (A ~ 10 N(0, 1), 64 x 10); an MLP 64 -> 64 -> ReLU -> 10 trained with the
  notebook's supervised InfoNCE (trainers/losses/latent_class.py: one random same-class pick
  per anchor, made symmetric, t = 1) by SGD; the mean embedding norm of each class is logged
  per epoch (epoch 0: untrained). The paper expects it ordered by class frequency; its figure
  averages 5 runs. Single runs are noisy: the effect shows across seeds, in /stats of
  norm_frequency_spearman and norm_most_over_least_frequent (docs/design-notes.md, `ssl`, has
  the measurements).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from trainers.base import ResourceEstimate, TrainerConfig
from trainers.estimates import FLOAT32, FLOAT64, INT64, Term, peak
from trainers.init import init_linear
from trainers.losses.latent_class import (
    attract_pairs_infonce,
    attract_pairs_terms,
    pick_positives,
    same_class_pairs,
)
from trainers.losses.negative_cosine import negative_cosine
from trainers.random_sources import RandomSources
from trainers.runtime import RunContext, TrainerBase, TrainOutput
from trainers.ssl.model import grad_scale

MAX_SIM_CLASSES = 16


class SSLSimConfig(TrainerConfig):
    simulation: Literal["convergence", "latent_class"] = Field(
        "convergence",
        description=(
            "convergence: SGD steps until n_pairs pairs of free embeddings at norm initial_norm "
            "align under a cosine loss; latent_class: per-class embedding norms of an MLP trained "
            "by supervised InfoNCE on latent classes of frequencies class_weights"
        ),
    )
    initial_norm: float = Field(
        1.0, gt=0.0, le=1000.0, description=("convergence: initial norm rho of every embedding")
    )
    n_pairs: int = Field(500, ge=1, le=1_000_000, description="convergence: pairs")
    dim: int = Field(20, ge=2, le=10_000, description="convergence: dimension")
    lr: float | None = Field(
        None,
        gt=0.0,
        le=1000.0,
        description=("SGD learning rate; None: 10 (convergence), 0.01 (latent_class)"),
    )
    tolerance: float = Field(1e-3, gt=0.0, lt=1.0, description="convergence: tolerance")
    max_steps: int = Field(
        200_000,
        ge=1,
        le=10_000_000,
        description=(
            "convergence: the most steps; a run that has not reached the tolerance by then ends "
            "with steps_to_converge = max_steps and the diagnostic converged false"
        ),
    )
    grad_scale_power: float = Field(
        0.0,
        ge=-4.0,
        le=4.0,
        description=(
            "convergence: GradScale power p, the embeddings' gradient multiplied by ||z||^p (0 = "
            "off; 2 makes the angular step independent of the norm)"
        ),
    )
    class_weights: list[float] = Field(
        default_factory=lambda: [1.0, 2.0, 4.0, 8.0],
        description="latent_class: relative class frequencies",
    )
    n_samples: int = Field(2000, ge=10, le=1_000_000, description="latent_class: samples")
    class_spread: float = Field(1.0, ge=0.0, le=100.0, description=("latent_class: latent spread"))
    input_scale: float = Field(
        10.0,
        gt=0.0,
        le=1000.0,
        description=(
            "latent_class: standard deviation of the entries of the 64 x 10 map A that observes "
            "the latent points as x = A u"
        ),
    )
    epochs: int = Field(100, ge=1, le=100_000, description="latent_class: epochs")
    batch_size: int = Field(128, ge=2, le=65_536, description="latent_class: batch size")

    @property
    def resolved_lr(self) -> float:
        if self.lr is not None:
            return self.lr
        return 10.0 if self.simulation == "convergence" else 0.01

    def resolved_fields(self) -> dict[str, Any]:
        return {**super().resolved_fields(), "lr": self.resolved_lr}

    @model_validator(mode="after")
    def _check(self) -> SSLSimConfig:
        weights = self.class_weights
        if not 2 <= len(weights) <= MAX_SIM_CLASSES or any(w <= 0 for w in weights):
            raise ValueError(f"class_weights needs 2..{MAX_SIM_CLASSES} positive weights")
        return self


class Convergence(NamedTuple):
    """Where the convergence simulation ended: the steps taken, the mean cosine reached and
    the embeddings trained."""

    steps: int
    final_mean_cos: float
    z1: torch.Tensor
    z2: torch.Tensor


def cosine_convergence_steps(
    z1: torch.Tensor,
    z2: torch.Tensor,
    lr: float,
    tolerance: float,
    max_steps: int,
    power: float = 0.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> Convergence:
    """Plain SGD on -mean cos(z1_i, z2_i) over both sets of free embeddings; the steps taken
    until mean cos >= 1 - tolerance (max_steps if never, or the step at which `should_stop`,
    asked before every step, answered True) and the final mean cos."""
    z1 = z1.clone().requires_grad_()
    z2 = z2.clone().requires_grad_()
    for step in range(max_steps + 1):
        loss = negative_cosine(grad_scale(z1, power), grad_scale(z2, power))
        mean_cos = -float(loss.detach())
        if mean_cos >= 1 - tolerance or step == max_steps or should_stop():
            return Convergence(step, mean_cos, z1.detach(), z2.detach())
        g1, g2 = torch.autograd.grad(loss, (z1, z2))
        with torch.no_grad():
            z1 -= lr * g1
            z2 -= lr * g2
    raise AssertionError("unreachable")


def seeds_cosine_convergence(
    z1: torch.Tensor,
    z2: torch.Tensor,
    lr: float,
    tolerance: float,
    max_steps: int,
    power: float,
    should_stop: Sequence[Callable[[], bool]],
) -> list[Convergence]:
    """`cosine_convergence_steps` for the seeds of a batched task: z1 and z2 stacked on a
    leading seed axis (S x n x d), one `should_stop` per seed. Each seed ends at the step its
    own run ends at (converged, max_steps, or its should_stop) with the values it had then,
    and leaves the stack; the others go on. The mean cosines of all seeds are read to the host
    once per step (the solo run reads its own every step too)."""
    z1 = z1.clone().requires_grad_()
    z2 = z2.clone().requires_grad_()
    live = list(range(len(should_stop)))  # the seeds still running, in the stack's order
    outcomes: dict[int, Convergence] = {}
    for step in range(max_steps + 1):
        loss = negative_cosine(grad_scale(z1, power), grad_scale(z2, power))
        mean_cos = [-value for value in loss.detach().tolist()]
        ended = [
            position
            for position, index in enumerate(live)
            if mean_cos[position] >= 1 - tolerance or step == max_steps or should_stop[index]()
        ]
        for position in ended:
            outcomes[live[position]] = Convergence(
                step,
                mean_cos[position],
                z1.detach()[position].clone(),
                z2.detach()[position].clone(),
            )
        if len(ended) == len(live):
            break
        # each seed's gradient of its own loss: the seeds do not interact
        g1, g2 = torch.autograd.grad(loss.sum(), (z1, z2))
        with torch.no_grad():
            z1 -= lr * g1
            z2 -= lr * g2
        if ended:
            keep = [position for position in range(len(live)) if position not in ended]
            live = [live[position] for position in keep]
            rows = torch.tensor(keep)
            z1 = z1.detach().index_select(0, rows).requires_grad_()
            z2 = z2.detach().index_select(0, rows).requires_grad_()
    return [outcomes[index] for index in range(len(should_stop))]


def spherical_latent_data(
    weights: list[float],
    n: int,
    spread: float,
    generator: torch.Generator,
    input_scale: float = 10.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The official SphericalDataset: class centres uniform on S^9, u = centre + N(0, spread^2)
    renormalised to the sphere, x = A u with A ~ 10 N(0, 1) (64 x 10); class sizes multinomial
    in the normalised weights."""
    k = len(weights)
    centres = F.normalize(torch.randn(k, 10, generator=generator, dtype=torch.float64), dim=1)
    p = torch.tensor(weights, dtype=torch.float64)
    labels = torch.multinomial(p / p.sum(), n, replacement=True, generator=generator)
    u = centres[labels] + spread * torch.randn(n, 10, generator=generator, dtype=torch.float64)
    u = F.normalize(u, dim=1)
    a = input_scale * torch.randn(64, 10, generator=generator, dtype=torch.float64)
    return (u @ a.T).float(), labels


def latent_mlp(params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The latent-class MLP of S seeds at once: stacked weights and biases (S x out x in,
    S x out, in `nn.Sequential.parameters()` order) on S x B x 64 inputs; per seed, the same
    products as nn.Linear's addmm."""
    w1, b1, w2, b2 = params
    hidden = torch.relu(torch.baddbmm(b1[:, None, :], x, w1.mT))
    return torch.baddbmm(b2[:, None, :], hidden, w2.mT)


def convergence_start(
    config: SSLSimConfig, sources: RandomSources
) -> tuple[torch.Tensor, torch.Tensor]:
    """The convergence simulation's z1 and z2: n_pairs random directions at norm rho each,
    drawn from the run's init generator."""
    shape = (config.n_pairs, config.dim)
    z1 = config.initial_norm * F.normalize(
        torch.randn(shape, generator=sources.init, dtype=torch.float64), dim=1
    )
    z2 = config.initial_norm * F.normalize(
        torch.randn(shape, generator=sources.init, dtype=torch.float64), dim=1
    )
    return z1, z2


def convergence_output(config: SSLSimConfig, run: RunContext, outcome: Convergence) -> TrainOutput:
    """A convergence run's result: its step count and mean cosine, logged once at the end
    unless the run was stopped."""
    run.track(outcome.z1, outcome.z2)
    metrics = {"steps_to_converge": float(outcome.steps), "final_mean_cos": outcome.final_mean_cos}
    if not run.stopped:  # a cancelled run's step count is not a convergence time
        run.log(outcome.steps, metrics)
    return TrainOutput(
        metrics=metrics,
        diagnostics={
            "converged": outcome.final_mean_cos >= 1 - config.tolerance,
            "lr": config.resolved_lr,
            "expected_steps_96_rho_squared": 96 * config.initial_norm**2,
        },
    )


def latent_class_model(sources: RandomSources) -> nn.Sequential:
    """The latent-class MLP 64 -> 64 -> ReLU -> 10, initialised from the run's init generator."""
    hidden = nn.Linear(LATENT_INPUT, LATENT_HIDDEN)
    embedding = nn.Linear(LATENT_HIDDEN, LATENT_EMBEDDING)
    for layer in (hidden, embedding):
        init_linear(layer, sources.init)
    return nn.Sequential(hidden, nn.ReLU(), embedding)


def class_norm_means(norms: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """The mean of one run's embedding norms, then each class's mean (1 + K values; NaN for a
    class without samples)."""
    return torch.stack([norms.mean(), *(norms[labels == c].mean() for c in range(k))])


def named_norms(values: list[float]) -> dict[str, float]:
    """`class_norm_means` as logged: norm_mean, norm_class0, norm_class1, ..."""
    return {"norm_mean": values[0], **{f"norm_class{c}": v for c, v in enumerate(values[1:])}}


def latent_class_output(
    config: SSLSimConfig, point: dict[str, float], labels: torch.Tensor
) -> TrainOutput:
    """A latent-class run's result from its last logged norms: whether the class norms are
    ordered by class frequency (Spearman's rho, strict order, largest over smallest)."""
    k = len(config.class_weights)
    counts = torch.bincount(labels, minlength=k).tolist()
    class_norms = [point[f"norm_class{c}"] for c in range(k)]
    finite = [
        (n, w) for n, w in zip(class_norms, config.class_weights, strict=True) if math.isfinite(n)
    ]
    # scipy.stats on first use: importing it costs a Ray worker about 1 s of CPU at start
    from scipy import stats as scipy_stats

    rho = scipy_stats.spearmanr([w for _, w in finite], [n for n, _ in finite]).statistic
    by_frequency = [n for _, n in sorted(zip(counts, class_norms, strict=True))]
    ordered = all(a < b for a, b in zip(by_frequency, by_frequency[1:], strict=False))
    metrics = {
        **point,
        "norm_ordered_by_frequency": float(ordered),
        "norm_most_over_least_frequent": by_frequency[-1] / by_frequency[0],
    }
    if np.isfinite(rho):
        metrics["norm_frequency_spearman"] = float(rho)
    return TrainOutput(
        metrics=metrics, diagnostics={"class_counts": counts, "class_norms": class_norms}
    )


class SSLSimTrainer(TrainerBase):
    name: ClassVar[str] = "ssl_sim"
    description: ClassVar[str] = (
        "Paper 001's simulations: steps to converge vs initial embedding norm under a cosine "
        "loss, and per-class embedding norms vs class frequency on latent-class data."
    )
    paper: ClassVar[str] = "Draganov et al., ICML 2025, arXiv:2502.09252 (Simulations.ipynb)"
    Config: ClassVar[type[SSLSimConfig]] = SSLSimConfig
    metrics: ClassVar[tuple[str, ...]] = (
        "steps_to_converge",
        "final_mean_cos",
        "norm_mean",
        "loss",
        "norm_frequency_spearman",
        "norm_ordered_by_frequency",
        "norm_most_over_least_frequent",
        *(f"norm_class{c}" for c in range(MAX_SIM_CLASSES)),
    )
    diagnostics: ClassVar[tuple[str, ...]] = ("class_counts", "class_norms")
    primary_metric: ClassVar[str] = "steps_to_converge"
    # latent_class logs its InfoNCE loss every epoch. convergence logs no loss, only its result
    # once at the end: a run whose embeddings blow up ends with final_mean_cos NaN and
    # `converged` false, which is its answer rather than a divergence to stop early on.
    divergence_metric: ClassVar[str] = "loss"
    # Both simulations are small (a few hundred kB of embeddings, a 4,810-parameter MLP) and
    # spend their time in per-step Python and operator overhead, which a batched task pays
    # once for all its seeds: 8 seeds per task by default, up to 64.
    seeds_per_task_default: ClassVar[int] = 8
    max_seeds_per_task: ClassVar[int] = 64
    batched: ClassVar[bool] = True

    def estimate(self, config: SSLSimConfig) -> ResourceEstimate:
        return ssl_sim_estimate(config)

    def train(self, config: SSLSimConfig, run: RunContext) -> TrainOutput:
        if config.simulation == "convergence":
            return self._convergence(config, run)
        return self._latent_class(config, run)

    def train_seeds(self, config: SSLSimConfig, runs: list[RunContext]) -> list[TrainOutput]:
        """The seeds of a task as one computation on a leading seed axis, each seed drawn from
        its own generators as its solo run draws it. A seed whose run ends (converged, or
        stopped) leaves the stack with the values it had then; the others go on.

        convergence (float64): each seed's result equals its solo run's bit for bit on a CPU
        (the steps are elementwise and per-row sums). latent_class (float32): the MLP's
        batched products sum in another order than the solo run's wherever ATen takes another
        kernel for them: its own loop below 400 multiply-adds per seed (a short last batch),
        and on some CPUs a batched GEMM that is not the solo one (an AVX-512 AMD EPYC: 2.2e-7
        relative after 3 epochs). Float32 rounding, which training can grow."""
        if config.simulation == "convergence":
            return self._convergence_seeds(config, runs)
        return self._latent_class_seeds(config, runs)

    def _convergence(self, config: SSLSimConfig, run: RunContext) -> TrainOutput:
        z1, z2 = convergence_start(config, run.sources)
        lr = config.resolved_lr
        outcome = cosine_convergence_steps(
            z1, z2, lr, config.tolerance, config.max_steps, config.grad_scale_power, run.should_stop
        )
        return convergence_output(config, run, outcome)

    def _convergence_seeds(self, config: SSLSimConfig, runs: list[RunContext]) -> list[TrainOutput]:
        starts = [convergence_start(config, run.sources) for run in runs]
        outcomes = seeds_cosine_convergence(
            torch.stack([z1 for z1, _ in starts]),
            torch.stack([z2 for _, z2 in starts]),
            config.resolved_lr,
            config.tolerance,
            config.max_steps,
            config.grad_scale_power,
            [run.should_stop for run in runs],
        )
        return [
            convergence_output(config, run, outcome)
            for run, outcome in zip(runs, outcomes, strict=True)
        ]

    def _latent_class(self, config: SSLSimConfig, run: RunContext) -> TrainOutput:
        sources = run.sources
        x, labels = spherical_latent_data(
            config.class_weights,
            config.n_samples,
            config.class_spread,
            sources.data,
            config.input_scale,
        )
        model = latent_class_model(sources)
        run.track(model)
        lr = config.resolved_lr
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        k = len(config.class_weights)
        step = 0

        def norm_point() -> dict[str, float]:
            """norm_mean and norm_class{c} over the training set (quirk 8, fixed)."""
            with torch.no_grad():
                norms = model(x).norm(dim=1)
            return named_norms(class_norm_means(norms, labels, k).tolist())

        # epoch 0 is the untrained network, as index 0 of the notebook's norm curves; epoch
        # e + 1 follows training epoch e
        point = norm_point()
        run.log(0, point, epoch=0)
        for epoch in range(config.epochs):
            order = torch.randperm(len(x), generator=sources.data)
            # the epoch's loss sum stays on the device (float64, as the Python float it
            # replaces) and is read once, at the epoch's end: no host read a step
            total: torch.Tensor | None = None
            for start in range(0, len(x), config.batch_size):
                index = order[start : start + config.batch_size]
                if len(index) < 2:
                    continue
                loss = attract_pairs_infonce(model(x[index]), labels[index], sources.augment)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                weighted = loss.detach().double() * len(index)
                total = weighted if total is None else total + weighted
                step += 1
                if run.should_stop():
                    break
            if run.stopped:
                break
            point = {"loss": (0.0 if total is None else float(total)) / len(x), **norm_point()}
            if run.log(step, point, epoch=epoch + 1):
                break
        return latent_class_output(config, point, labels)

    def _latent_class_seeds(
        self, config: SSLSimConfig, runs: list[RunContext]
    ) -> list[TrainOutput]:
        """`_latent_class` for every seed at once: data, MLP and per-epoch order of each seed
        from its own generators, the MLP's parameters stacked (S x ...) and trained by one
        SGD step per batch on the sum of the seeds' losses (each seed's gradient is its own
        loss's). The positive picks are drawn per seed from its augment generator, in its solo
        order; the loss's per-seed means and the norm point's class means are taken seed by
        seed, as the solo run takes them."""
        k = len(config.class_weights)
        lr = config.resolved_lr
        data = [
            spherical_latent_data(
                config.class_weights,
                config.n_samples,
                config.class_spread,
                run.sources.data,
                config.input_scale,
            )
            for run in runs
        ]
        models = [latent_class_model(run.sources) for run in runs]
        n = config.n_samples
        x = torch.stack([inputs for inputs, _ in data])
        labels = torch.stack([seed_labels for _, seed_labels in data])
        params = [
            torch.stack(list(group)).requires_grad_()
            for group in zip(*(model.parameters() for model in models), strict=True)
        ]
        # (weights, biases) of each seed as it leaves the stack, in `model.parameters()` order
        finals: list[list[torch.Tensor]] = [[] for _ in runs]
        live = list(range(len(runs)))  # the seeds still training, in the stack's order
        # the live seeds' sample order of this epoch and their summed batch losses
        order = torch.empty(len(runs), 0, dtype=torch.long)
        totals: list[float] = []

        def norm_points() -> list[dict[str, float]]:
            with torch.no_grad():
                norms = latent_mlp(params, x).norm(dim=-1)
            means = torch.stack(
                [
                    class_norm_means(norms[position], labels[position], k)
                    for position in range(len(live))
                ]
            )
            return [named_norms(values) for values in means.tolist()]

        def leave(positions: list[int]) -> None:
            """The seeds at `positions` stop: their parameters stay as they are now."""
            nonlocal live, x, labels, params, order, totals
            for position in positions:
                finals[live[position]] = [p.detach()[position] for p in params]
            keep = [position for position in range(len(live)) if position not in positions]
            rows = torch.tensor(keep, dtype=torch.long)
            live = [live[position] for position in keep]
            x, labels, order = (t.index_select(0, rows) for t in (x, labels, order))
            params = [p.detach().index_select(0, rows).requires_grad_() for p in params]
            totals = [totals[position] for position in keep]

        points = norm_points()
        for run, point in zip(runs, points, strict=True):
            run.log(0, point, epoch=0)
        step = 0
        for epoch in range(config.epochs):
            order = torch.stack(
                [torch.randperm(n, generator=runs[index].sources.data) for index in live]
            )
            totals = [0.0] * len(live)
            for start in range(0, n, config.batch_size):
                index = order[:, start : start + config.batch_size]
                size = index.shape[1]
                if size < 2:
                    continue
                batch_labels = labels.gather(1, index)
                same = same_class_pairs(batch_labels)
                valid = same.any(dim=-1)
                has_positive = valid.any(dim=-1).tolist()
                # a seed without an anchor to pick for draws nothing, as its solo run
                scores = torch.stack(
                    [
                        torch.rand(size, size, generator=runs[seed].sources.augment)
                        if picks
                        else torch.zeros(size, size)
                        for seed, picks in zip(live, has_positive, strict=True)
                    ]
                )
                z = latent_mlp(params, torch.take_along_dim(x, index[..., None], dim=1))
                terms = attract_pairs_terms(z, pick_positives(same, scores))
                losses = torch.stack(
                    [
                        terms[position][valid[position]].mean()
                        if picks
                        else z[position].sum() * 0.0
                        for position, picks in enumerate(has_positive)
                    ]
                )
                grads = torch.autograd.grad(losses.sum(), params)
                with torch.no_grad():
                    for p, g in zip(params, grads, strict=True):
                        p.add_(g, alpha=-lr)
                for position, value in enumerate(losses.detach().tolist()):
                    totals[position] += value * size
                step += 1
                stopped = [
                    position for position, seed in enumerate(live) if runs[seed].should_stop()
                ]
                if stopped:
                    leave(stopped)
                    if not live:
                        break
            if not live:
                break
            stopping = []
            for position, (seed, norms) in enumerate(zip(live, norm_points(), strict=True)):
                points[seed] = {"loss": totals[position] / n, **norms}
                if runs[seed].log(step, points[seed], epoch=epoch + 1):
                    stopping.append(position)
            if stopping:
                leave(stopping)
                if not live:
                    break
        for position, seed in enumerate(live):
            finals[seed] = [p.detach()[position] for p in params]
        outputs = []
        for run, point, trained, (_, seed_labels) in zip(runs, points, finals, data, strict=True):
            run.track(*trained)
            outputs.append(latent_class_output(config, point, seed_labels))
        return outputs


# ---------------------------------------------------------------------------------------------
# resource estimate (pure arithmetic on the config)

# The latent-class MLP 64 -> 64 -> ReLU -> 10 and its input and embedding widths.
LATENT_INPUT, LATENT_HIDDEN, LATENT_EMBEDDING = 64, 64, 10
# float64 n x d matrices alive in a convergence step: z1 and z2, their trainable clones, the
# cosine's squares, normalised copies and product (about 5), backward's intermediates and both
# gradients (about 4) and the update's scaled copy.
CONVERGENCE_COPIES = 14
# Bytes per pair of the latent-class loss's B x B matrices: about 8 float32 (similarities,
# pick scores and their mask, exp, positive and masked sums, backward's gradients) and 6
# boolean masks (eye, same class, picks, their transpose and union).
INFONCE_BYTES_PER_PAIR = 8 * FLOAT32 + 6


def latent_mlp_parameters() -> int:
    """Linear(64 -> 64) and Linear(64 -> 10): 64 * 64 + 64 + 64 * 10 + 10 = 4,810."""
    return (
        LATENT_INPUT * LATENT_HIDDEN
        + LATENT_HIDDEN
        + LATENT_HIDDEN * LATENT_EMBEDDING
        + LATENT_EMBEDDING
    )


def ssl_sim_logged_points(config: SSLSimConfig) -> int:
    """convergence logs steps_to_converge and final_mean_cos once, however many steps it
    takes; latent_class logs norm_mean and the K class norms for the untrained network, then
    loss, norm_mean and the K class norms every epoch: (1 + K) + epochs (2 + K)."""
    if config.simulation == "convergence":
        return 2
    k = len(config.class_weights)
    return (1 + k) + config.epochs * (2 + k)


def ssl_sim_estimate(config: SSLSimConfig) -> ResourceEstimate:
    """convergence: CONVERGENCE_COPIES float64 n x d matrices. latent_class: the data as
    generated (float64 latents and inputs, 3 n 10 + n 64, and the float32 inputs n 64), then
    the larger of the per-epoch norm pass over all n samples (hidden, ReLU and embedding
    outputs) and a step's B x B loss matrices; the MLP and its gradients (SGD without
    momentum keeps no buffer)."""
    points = ssl_sim_logged_points(config)
    if config.simulation == "convergence":
        memory, fields = peak(
            [[Term(FLOAT64 * CONVERGENCE_COPIES * config.n_pairs * config.dim, ("n_pairs", "dim"))]]
        )
        return ResourceEstimate(memory, fields, points, ())
    n, b = config.n_samples, min(config.batch_size, config.n_samples)
    inputs = Term(FLOAT32 * n * LATENT_INPUT + INT64 * 2 * n, ("n_samples",))
    model = Term(FLOAT32 * 2 * latent_mlp_parameters(), ())
    memory, fields = peak(
        [
            [inputs, Term(FLOAT64 * n * (3 * LATENT_EMBEDDING + LATENT_INPUT), ("n_samples",))],
            [
                inputs,
                model,
                Term(FLOAT32 * n * (2 * LATENT_HIDDEN + 2 * LATENT_EMBEDDING), ("n_samples",)),
            ],
            [
                inputs,
                model,
                Term(
                    INFONCE_BYTES_PER_PAIR * b * b
                    + FLOAT32 * 3 * b * (LATENT_INPUT + LATENT_HIDDEN),
                    ("batch_size",),
                ),
            ],
        ]
    )
    return ResourceEstimate(memory, fields, points, ("epochs", "class_weights"))
