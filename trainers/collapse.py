"""`collapse`: the minimal model of representation collapse (paper 004, arXiv:2604.09979).

Specification: docs/papers/collapse.md. The model is seedgrid's reconstruction of the
paper's stated properties (its equations are not published): free sample embeddings x_i and
label embeddings y_c trained by full-batch gradient descent on

    L = (1/2N) sum_i sum_c p_ic ||x_i - y_c||^2            (mse)
    L = (1/N)  sum_i sum_c p_ic (1 - cos(x_i, y_c))        (cosine)

where a fraction r of samples is "frustrated" (p_i uniform over the labels). Without
stop-gradient the classes align fast, then collapse slowly at a rate ~ r/(K+1); with a shared
linear head W and stop-gradient, non-collapsed fixed points exist and MinL2 stays finite.

Time scaling (spec section 7): the sample update uses N * dL/dx_i (per-sample rate 1), the label
and head updates use the plain gradient; time is t = lr * step.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import torch
from pydantic import Field, model_validator

from trainers.base import ResourceEstimate, RunWarning, TrainerConfig
from trainers.estimates import FLOAT64, INT64, Term, peak
from trainers.losses.collapse_pair import mse_gradients, pair_loss
from trainers.random_sources import RandomSources
from trainers.runtime import RunContext, TrainerBase, TrainOutput


class CollapseConfig(TrainerConfig):
    model: Literal["embedding", "teacher_student"] = Field(
        "embedding",
        description="embedding: free sample embeddings; teacher_student: "
        "x_i = A u_i with a learned linear A",
    )
    stop_gradient: bool = Field(
        False,
        description="Shared linear head W on the samples, with stop-gradient on the "
        "targets of both updates",
    )
    r: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description=("Fraction of frustrated samples; exactly round(r * n_samples) are frustrated"),
    )
    frustration_spread: Literal["all", "others"] = Field(
        "all",
        description=(
            "all: frustrated samples are uniform over all K labels (lambda_r = 1 - r); others: "
            "uniform over the K - 1 other labels (lambda_r = 1 - rK/(K-1))"
        ),
    )
    loss: Literal["mse", "cosine"] = Field(
        "mse",
        description=(
            "mse: L = (1/2N) sum_i sum_c p_ic ||x_i - y_c||^2, trained by its closed-form "
            "gradients; cosine: L = (1/N) sum_i sum_c p_ic (1 - cos(x_i, y_c)), by autograd (it "
            "ignores norms, so accuracy takes the nearest label by angle)"
        ),
    )
    n_samples: int = Field(
        400,
        ge=2,
        le=1_000_000,
        description=(
            "N: samples, sample i of nominal class i mod n_classes (balanced classes); at least "
            "n_classes"
        ),
    )
    n_classes: int = Field(
        4, ge=2, le=10_000, description=("K: classes, each with a learned label embedding y_c")
    )
    dim: int = Field(
        8,
        ge=1,
        le=100_000,
        description=("d: dimension of the sample and label embeddings (the head W is d x d)"),
    )
    input_dim: int = Field(
        32,
        ge=1,
        le=100_000,
        description=(
            "Teacher-student model: inputs u_i = mu_c(i) + input_noise * xi_i in input_dim "
            "dimensions, teacher class means mu_c ~ N(0, I/input_dim) (unit norm on average) and "
            "xi_i ~ N(0, I/input_dim), so that gradient descent at the default lr stays stable"
        ),
    )
    input_noise: float = Field(
        0.0,
        ge=0.0,
        description=(
            "Noise > 0 makes samples of a class unfittable by a linear map: it acts as extra "
            "frustration"
        ),
    )
    lr: float | None = Field(
        None,
        gt=0.0,
        description=(
            "Learning rate; None: 0.5 without stop-gradient, 0.2 with it (the spec's numerical "
            "check)"
        ),
    )
    steps: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description=(
            "Optimisation steps; None: 4000 without stop-gradient, 20000 with it (several collapse "
            "times (K+1)/r)"
        ),
    )
    log_every: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description=("Steps between logged points; None: about 200 logged points per run"),
    )
    init_x_scale: float = Field(
        1.0,
        ge=0.0,
        description=(
            "Standard deviation of the initial sample embeddings x_i ~ N(0, s^2 I) "
            "(teacher_student: of the entries of the initial map A); the head W starts at the "
            "identity"
        ),
    )
    init_y_scale: float = Field(
        3.0,
        ge=0.0,
        description=("Standard deviation of the initial label embeddings y_c ~ N(0, s^2 I)"),
    )

    @model_validator(mode="after")
    def _sizes(self) -> CollapseConfig:
        if self.n_samples < self.n_classes:
            raise ValueError("n_samples must be at least n_classes")
        return self

    @property
    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else (0.2 if self.stop_gradient else 0.5)

    @property
    def resolved_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        return 20_000 if self.stop_gradient else 4_000

    @property
    def resolved_log_every(self) -> int:
        return self.log_every or max(1, self.resolved_steps // 200)

    def resolved_fields(self) -> dict[str, Any]:
        return {
            **super().resolved_fields(),
            "lr": self.resolved_lr,
            "steps": self.resolved_steps,
            "log_every": self.resolved_log_every,
        }


def frustration_matrix(
    n: int, k: int, r: float, spread: str, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Label distributions P (N x K), nominal classes and the frustrated mask.

    Exactly round(r N) samples are frustrated (spec section 7: independent coin flips made the
    realised r drift from the nominal one).
    """
    cls = np.arange(n) % k
    p = np.eye(k)[cls]
    frustrated = np.zeros(n, dtype=bool)
    frustrated[rng.choice(n, size=round(r * n), replace=False)] = True
    if spread == "all":
        p[frustrated] = 1.0 / k
    else:
        p[frustrated] = (1.0 - np.eye(k)[cls[frustrated]]) / (k - 1)
    return p, cls, frustrated


def label_averaging_eigenvalues(p: np.ndarray) -> np.ndarray:
    """Eigenvalues of M = D^-1 P^T P (descending), via its symmetric similar D^-1/2 P^T P D^-1/2."""
    d = p.sum(0)
    s = (p.T @ p) / np.sqrt(np.outer(d, d))
    return np.sort(np.linalg.eigvalsh(s))[::-1]


def predicted_slow_rate(lambda_r: float, k: int) -> float:
    """Smaller root of s^2 - (1 + 1/K) s + (1 - lambda_r)/K = 0: the exact slow collapse rate."""
    b = 1.0 + 1.0 / k
    c = (1.0 - lambda_r) / k
    return float((b - math.sqrt(max(b * b - 4 * c, 0.0))) / 2.0)


def min_pairwise_distance(y: torch.Tensor) -> float:
    """MinL2: the smallest distance between two label embeddings."""
    d = torch.cdist(y, y)
    d.fill_diagonal_(float("inf"))
    return float(d.min())


def fit_decay_rate(times: np.ndarray, values: np.ndarray) -> float | None:
    """Rate a of values ~ exp(-a t), least squares on log values; None with < 3 usable points."""
    peak = float(np.max(values)) if len(values) else 0.0
    usable = (values > peak * 1e-10) & np.isfinite(values) & (values > 0)
    if usable.sum() < 3:
        return None
    slope = np.polyfit(times[usable], np.log(values[usable]), 1)[0]
    return float(-slope)


def class_subspace_eigenvalues(w: torch.Tensor, y: torch.Tensor) -> list[float]:
    """|eig(W)| restricted to the span of the label embeddings (descending)."""
    q, _ = torch.linalg.qr(y.T)
    sub = q.T @ w @ q
    return sorted((float(v) for v in torch.linalg.eigvals(sub).abs()), reverse=True)


class Problem(NamedTuple):
    """One seed's drawn problem and starting values: label distributions P (numpy for the final
    diagnostics and torch), nominal classes, clean (not frustrated) samples, the
    teacher-student inputs (None for free embeddings), and the trained x (embeddings, or the
    linear map A), y (label embeddings) and w (the head; None without stop-gradient)."""

    p_np: np.ndarray
    frustrated_np: np.ndarray
    p: torch.Tensor
    cls: torch.Tensor
    clean: torch.Tensor
    inputs: torch.Tensor | None
    x: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor | None


def draw_problem(config: CollapseConfig, rs: RandomSources) -> Problem:
    """A run's problem and starting values, drawn from its own generators in a fixed order (a
    solo run and its seed in a batched task draw the same numbers)."""
    dtype = torch.float64
    n, k, d = config.n_samples, config.n_classes, config.dim
    p_np, cls_np, frustrated_np = frustration_matrix(
        n, k, config.r, config.frustration_spread, rs.data_np
    )
    p = torch.tensor(p_np, dtype=dtype)
    cls = torch.tensor(cls_np)
    clean = torch.tensor(~frustrated_np)

    y = config.init_y_scale * torch.randn(k, d, generator=rs.init, dtype=dtype)
    if config.model == "embedding":
        inputs = None
        x = config.init_x_scale * torch.randn(n, d, generator=rs.init, dtype=dtype)
    else:
        teacher_means = torch.randn(k, config.input_dim, generator=rs.data, dtype=dtype)
        noise = torch.randn(n, config.input_dim, generator=rs.data, dtype=dtype)
        inputs = (teacher_means[cls] + config.input_noise * noise) / math.sqrt(config.input_dim)
        x = config.init_x_scale * torch.randn(d, config.input_dim, generator=rs.init, dtype=dtype)
    w = torch.eye(d, dtype=dtype) if config.stop_gradient else None
    return Problem(p_np, frustrated_np, p, cls, clean, inputs, x, y, w)


def sample_step_scale(config: CollapseConfig) -> float:
    """Per-sample rate 1: the free embeddings step along N * dL/dx_i; the map A along dL/dA."""
    return float(config.n_samples) if config.model == "embedding" else 1.0


class History(NamedTuple):
    """What a run logged: the time, MinL2 and label spread of every logged step, and the
    last logged point."""

    times: list[float]
    min_l2s: list[float]
    spreads: list[float]
    last: dict[str, float]


def collapse_output(
    config: CollapseConfig,
    problem: Problem,
    history: History,
    y: torch.Tensor,
    w: torch.Tensor | None,
) -> TrainOutput:
    """A run's final metrics, diagnostics and warnings from its logged history and its final
    label embeddings y and head w."""
    lr, steps, k = config.resolved_lr, config.resolved_steps, config.n_classes
    t = np.array(history.times)
    min_l2_arr = np.array(history.min_l2s)
    at_10 = int(np.searchsorted(t, 0.1 * lr * steps))
    at_10 = min(at_10, len(t) - 1)
    eig_m = label_averaging_eigenvalues(problem.p_np)
    lambda_r = float(eig_m[1]) if k > 1 else 1.0
    peak = float(np.nanmax(min_l2_arr)) if np.isfinite(min_l2_arr).any() else float("nan")
    final = float(min_l2_arr[-1])
    ref_10 = float(min_l2_arr[at_10])
    slow = fit_decay_rate(t[at_10:], np.array(history.spreads)[at_10:])
    diagnostics: dict[str, Any] = {
        "min_l2": final,
        "min_l2_peak": peak,
        "min_l2_at_10pct": ref_10,
        "min_l2_ratio": final / peak if peak > 0 else None,
        "min_l2_ratio_10pct": final / ref_10 if ref_10 > 0 else None,
        "slow_rate": slow,
        "predicted_slow_rate": predicted_slow_rate(lambda_r, k),
        "realised_r": float(problem.frustrated_np.mean()),
        "eig_m": [float(v) for v in eig_m],
        "eig_w_class": (
            class_subspace_eigenvalues(w.detach(), y.detach()) if w is not None else None
        ),
        "total_time": lr * steps,
    }
    metrics = dict(history.last)
    for key in (
        "min_l2_peak",
        "min_l2_at_10pct",
        "min_l2_ratio",
        "min_l2_ratio_10pct",
        "slow_rate",
        "realised_r",
    ):
        value = diagnostics[key]
        if value is not None:
            metrics[key] = float(value)
    warnings = []
    ratio = diagnostics["min_l2_ratio_10pct"]
    if ratio is not None and ratio < 0.01:
        warnings.append(
            RunWarning(
                diagnostic="min_l2_ratio_10pct",
                value=float(ratio),
                threshold=0.01,
                message="label embeddings collapsed: MinL2 fell below 1% of its value "
                "at 10% of training",
            )
        )
    return TrainOutput(metrics=metrics, diagnostics=diagnostics, warnings=warnings)


# The values `CollapseTrainer._observe` logs at every logged step (before the time), in order.
OBSERVED_METRICS = ("loss", "train_accuracy", "train_accuracy_clean", "min_l2", "label_spread")


class SeedStack(NamedTuple):
    """The seeds of a batched task that are still training: each `Problem` tensor stacked on
    a leading seed axis (S x ...), x, y and w updated in place."""

    p: torch.Tensor
    cls: torch.Tensor
    clean: torch.Tensor
    inputs: torch.Tensor | None
    x: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor | None
    # cosine: x, y and w require grad (the gradients come from autograd)
    autograd: bool

    @staticmethod
    def of(problems: list[Problem], *, autograd: bool) -> SeedStack:
        def stacked(name: str) -> Any:
            values = [getattr(problem, name) for problem in problems]
            return None if values[0] is None else torch.stack(values)

        return SeedStack(
            stacked("p"),
            stacked("cls"),
            stacked("clean"),
            stacked("inputs"),
            stacked("x"),
            stacked("y"),
            stacked("w"),
            autograd,
        ).trainable()

    def trainable(self) -> SeedStack:
        if self.autograd:
            for t in self.trained():
                t.requires_grad_(True)
        return self

    def trained(self) -> list[torch.Tensor]:
        return [t for t in (self.x, self.y, self.w) if t is not None]

    def select(self, positions: list[int]) -> SeedStack:
        """A new stack of the seeds at `positions`: the values of the others, which leave,
        stay as they are in this one."""
        index = torch.tensor(positions)

        def rows(t: Any) -> Any:
            return None if t is None else t.detach().index_select(0, index)

        return SeedStack(
            rows(self.p),
            rows(self.cls),
            rows(self.clean),
            rows(self.inputs),
            rows(self.x),
            rows(self.y),
            rows(self.w),
            self.autograd,
        ).trainable()

    def seed(self, position: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One seed's x, y and w (views into the stack)."""
        x, y = self.x.detach()[position], self.y.detach()[position]
        return x, y, None if self.w is None else self.w.detach()[position]

    def embeddings(self) -> torch.Tensor:
        return self.x if self.inputs is None else self.inputs @ self.x.mT

    def objective(self, kind: str) -> torch.Tensor:
        """Each seed's loss (S): `train`'s objective, slice by slice."""
        emb = self.embeddings()
        if self.w is None:
            return pair_loss(emb, self.y, self.p, kind)
        head = pair_loss(emb @ self.w.mT, self.y.detach(), self.p, kind)
        labels = pair_loss(emb.detach(), self.y, self.p, kind)
        return head + labels

    def gradients(self, kind: str) -> tuple[torch.Tensor, ...]:
        """Each seed's gradients of its own loss: the seeds do not interact, so autograd on
        the sum of their losses gives every seed its own."""
        if kind == "mse":
            return mse_gradients(self.x, self.y, self.w, self.p, self.inputs)
        return torch.autograd.grad(self.objective(kind).sum(), self.trained())


@torch.no_grad()
def observe_seeds(stack: SeedStack, kind: str) -> torch.Tensor:
    """`CollapseTrainer._observe` for every seed of the stack: S x OBSERVED_METRICS."""
    emb = stack.embeddings()
    y = stack.y
    pred = emb if stack.w is None else emb @ stack.w.mT
    if kind == "mse":
        nearest = torch.cdist(pred, y).argmin(dim=-1)
    else:  # the cosine loss ignores norms: classify by angle
        nearest = (pred @ torch.nn.functional.normalize(y, dim=-1).mT).argmax(dim=-1)
    correct = (nearest == stack.cls).double()
    # no clean sample: 0 / 0, NaN as in the solo run
    clean_accuracy = torch.where(stack.clean, correct, 0.0).sum(-1) / stack.clean.sum(-1)
    distances = torch.cdist(y, y)
    distances.diagonal(dim1=-2, dim2=-1).fill_(float("inf"))
    spread = torch.linalg.vector_norm(y - y.mean(-2, keepdim=True), dim=(-2, -1))
    return torch.stack(
        [
            stack.objective(kind),
            correct.mean(-1),
            clean_accuracy,
            distances.amin(dim=(-2, -1)),
            spread,
        ],
        dim=-1,
    )


# ---------------------------------------------------------------------------------------------
# resource estimate (pure arithmetic on the config; every tensor of the run is float64)

# The metrics of every logged step (`CollapseTrainer._observe` and the time).
LOGGED_METRICS = (
    "loss",
    "train_accuracy",
    "train_accuracy_clean",
    "min_l2",
    "label_spread",
    "time",
)


def trained_floats(config: CollapseConfig) -> int:
    """Trained values: sample embeddings N d (embedding) or the linear map d D
    (teacher_student), label embeddings K d, and the head d^2 with stop-gradient."""
    n, k, d = config.n_samples, config.n_classes, config.dim
    first = n * d if config.model == "embedding" else d * config.input_dim
    return first + k * d + (d * d if config.stop_gradient else 0)


def logged_steps(steps: int, log_every: int) -> int:
    """Steps the loop logs: every multiple of log_every from 0 to steps, and the last step:
    floor(steps / e) + 1, + 1 when e does not divide steps."""
    return steps // log_every + 1 + (1 if steps % log_every else 0)


def objective_floats(config: CollapseConfig) -> int:
    """Floats alive while `pair_loss` evaluates the objective without a graph (every logged
    step): mse broadcasts pred_i - y_c into N x K x d and squares it (2 N K d); cosine keeps
    the cosines, 1 - cos and the weighted terms (3 N K)."""
    n, k = config.n_samples, config.n_classes
    return 2 * n * k * config.dim if config.loss == "mse" else 3 * n * k


def gradient_floats(config: CollapseConfig) -> int:
    """Floats of one gradient step. mse: the closed-form gradients (embeddings, predictions,
    P y, residual, the sample gradient and the update's scaled copy: 6 N d). cosine: the
    forward pass of each `pair_loss` holds the cosines, 1 - cos and the weighted terms (3 N K)
    and keeps none of them for backward, which needs about 2 N K; with stop-gradient the two
    losses run one after the other."""
    n, k, d = config.n_samples, config.n_classes, config.dim
    return 6 * n * d if config.loss == "mse" else 3 * n * k


def collapse_estimate(config: CollapseConfig) -> ResourceEstimate:
    """Memory: the label distributions P twice (numpy and torch, 2 N K), the trained values,
    the teacher-student inputs and their noise draw (2 N D), then the largest of the objective
    at a logged step with the nearest-label check (cdist, N K), a gradient step and the final
    eigenvalues of D^-1 P^T P (about 5 K^2). Points: the 6 metrics at every logged step."""
    n, k = config.n_samples, config.n_classes
    inputs = 2 * n * config.input_dim if config.model == "teacher_student" else 0
    persistent = [
        Term(FLOAT64 * 2 * n * k, ("n_samples", "n_classes")),
        Term(FLOAT64 * trained_floats(config), ("n_samples", "dim", "n_classes")),
        Term(FLOAT64 * inputs, ("n_samples", "input_dim")),
        Term(INT64 * 2 * n, ("n_samples",)),
    ]
    objective_fields = (
        ("n_samples", "n_classes", "dim", "loss")
        if config.loss == "mse"
        else ("n_samples", "n_classes")
    )
    observe = FLOAT64 * (n * k + 2 * n * config.dim)
    memory, memory_fields = peak(
        [
            [
                *persistent,
                Term(FLOAT64 * objective_floats(config), objective_fields),
                Term(observe, ("n_samples", "n_classes")),
            ],
            [
                *persistent,
                Term(
                    FLOAT64 * gradient_floats(config),
                    ("n_samples", "dim") if config.loss == "mse" else ("n_samples", "n_classes"),
                ),
            ],
            [*persistent, Term(FLOAT64 * 5 * k * k, ("n_classes",))],
        ]
    )
    points = len(LOGGED_METRICS) * logged_steps(config.resolved_steps, config.resolved_log_every)
    return ResourceEstimate(memory, memory_fields, points, ("steps", "log_every"))


class CollapseTrainer(TrainerBase):
    name: ClassVar[str] = "collapse"
    description: ClassVar[str] = (
        "Minimal model of representation collapse: free sample and label embeddings, a fraction "
        "r of frustrated samples, with or without stop-gradient and a linear head."
    )
    paper: ClassVar[str] = (
        "A Minimal Model of Representation Collapse: Frustration, Stop-Gradient, and Dynamics "
        "(arXiv:2604.09979)"
    )
    Config: ClassVar[type[CollapseConfig]] = CollapseConfig
    metrics: ClassVar[tuple[str, ...]] = (
        "loss",
        "train_accuracy",
        "train_accuracy_clean",
        "min_l2",
        "label_spread",
        "time",
    )
    diagnostics: ClassVar[tuple[str, ...]] = (
        "min_l2",
        "min_l2_peak",
        "min_l2_at_10pct",
        "min_l2_ratio",
        "min_l2_ratio_10pct",
        "slow_rate",
        "predicted_slow_rate",
        "realised_r",
        "eig_m",
        "eig_w_class",
    )
    primary_metric: ClassVar[str] = "min_l2"
    divergence_metric: ClassVar[str] = "loss"
    metric_bounds: ClassVar[dict[str, tuple[float, float]]] = {
        "train_accuracy": (0.0, 1.0),
        "train_accuracy_clean": (0.0, 1.0),
    }
    # A run is small (N x d float64 embeddings, a few hundred kB) and its time goes to per-step
    # Python and operator overhead, which a batched task pays once for all its seeds: 8 seeds
    # per task by default, and up to 64 (still a few tens of MB at the default sizes).
    seeds_per_task_default: ClassVar[int] = 8
    max_seeds_per_task: ClassVar[int] = 64
    batched: ClassVar[bool] = True

    def estimate(self, config: CollapseConfig) -> ResourceEstimate:
        return collapse_estimate(config)

    def train(self, config: CollapseConfig, run: RunContext) -> TrainOutput:
        lr, steps, log_every = config.resolved_lr, config.resolved_steps, config.resolved_log_every
        problem = draw_problem(config, run.sources)
        p, cls, clean, inputs = problem.p, problem.cls, problem.clean, problem.inputs
        x, y, w = problem.x, problem.y, problem.w
        sample_scale = sample_step_scale(config)

        params = [t for t in (x, y, w) if t is not None]
        run.track(*params)
        if config.loss == "cosine":
            for t in params:
                t.requires_grad_(True)

        def embeddings() -> torch.Tensor:
            return x if inputs is None else inputs @ x.T

        def objective() -> torch.Tensor:
            emb = embeddings()
            if w is None:
                return pair_loss(emb, y, p, config.loss)
            head = pair_loss(emb @ w.T, y.detach(), p, config.loss)
            labels = pair_loss(emb.detach(), y, p, config.loss)
            return head + labels

        def gradients() -> tuple[torch.Tensor, ...]:
            if config.loss == "mse":
                return mse_gradients(x, y, w, p, inputs)
            return torch.autograd.grad(objective(), params)

        times: list[float] = []
        min_l2s: list[float] = []
        spreads: list[float] = []
        last: dict[str, float] = {}
        for step in range(steps + 1):
            if step % log_every == 0 or step == steps:
                with torch.no_grad():
                    loss = float(objective())
                last = self._observe(
                    embeddings().detach(), y.detach(), w, cls, clean, loss, config.loss
                )
                last["time"] = lr * step
                times.append(lr * step)
                min_l2s.append(last["min_l2"])
                spreads.append(last["label_spread"])
                if run.log(step, last):
                    break
            if step == steps or run.should_stop():
                break
            grads = gradients()
            with torch.no_grad():
                x -= lr * sample_scale * grads[0]
                y -= lr * grads[1]
                if w is not None:
                    w -= lr * grads[2]

        history = History(times, min_l2s, spreads, last)
        return collapse_output(config, problem, history, y, w)

    def train_seeds(self, config: CollapseConfig, runs: list[RunContext]) -> list[TrainOutput]:
        """The seeds of a task as one float64 computation on a leading seed axis (`SeedStack`),
        each seed's problem drawn from its own generators as its solo run draws it.

        The loop is `train`'s, per seed: a seed logs at the same steps, and a seed whose run
        stops (its log answers True, or should_stop() before a step) leaves the stack at that
        step with the values it had then, while the others go on; the loop ends when every
        seed has stopped or the steps are done. The logged values of all seeds are read to the
        host once per logged step. On a CPU each seed's curve and result equal its solo run's
        bit for bit with the mse loss (its closed-form step) and with the embedding model. The
        cosine loss on the teacher-student model runs autograd through per-seed matrix
        products: ATen's batched product takes its own loop below 400 multiply-adds, and on some
        CPUs another GEMM kernel than the solo run's above (an AVX-512 AMD EPYC: 2.8e-13
        relative after 150 steps), so there they agree to float64 rounding."""
        lr, steps, log_every = config.resolved_lr, config.resolved_steps, config.resolved_log_every
        sample_scale = sample_step_scale(config)
        problems = [draw_problem(config, run.sources) for run in runs]
        stack = SeedStack.of(problems, autograd=config.loss == "cosine")
        live = list(range(len(runs)))  # the seeds still training, in the stack's order
        histories = [History([], [], [], {}) for _ in runs]
        finals: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = [
            (problem.x, problem.y, problem.w) for problem in problems
        ]
        for step in range(steps + 1):
            stopping: set[int] = set()
            if step % log_every == 0 or step == steps:
                rows = observe_seeds(stack, config.loss).tolist()
                for index, row in zip(live, rows, strict=True):
                    point = dict(zip(OBSERVED_METRICS, row, strict=True))
                    point["time"] = lr * step
                    history = histories[index]
                    history.times.append(lr * step)
                    history.min_l2s.append(point["min_l2"])
                    history.spreads.append(point["label_spread"])
                    history.last.clear()
                    history.last.update(point)
                    if runs[index].log(step, point):
                        stopping.add(index)
            if step == steps:
                break
            stopping.update(i for i in live if i not in stopping and runs[i].should_stop())
            if stopping:
                for position, index in enumerate(live):
                    if index in stopping:
                        finals[index] = stack.seed(position)
                keep = [position for position, index in enumerate(live) if index not in stopping]
                live = [live[position] for position in keep]
                if not live:
                    break
                stack = stack.select(keep)
            grads = stack.gradients(config.loss)
            with torch.no_grad():
                stack.x.sub_(lr * sample_scale * grads[0])
                stack.y.sub_(lr * grads[1])
                if stack.w is not None:
                    stack.w.sub_(lr * grads[2])
        for position, index in enumerate(live):
            finals[index] = stack.seed(position)

        outputs = []
        for run, problem, history, (x, y, w) in zip(runs, problems, histories, finals, strict=True):
            run.track(*(t for t in (x, y, w) if t is not None))
            outputs.append(collapse_output(config, problem, history, y, w))
        return outputs

    @staticmethod
    @torch.no_grad()
    def _observe(
        emb: torch.Tensor,
        y: torch.Tensor,
        w: torch.Tensor | None,
        cls: torch.Tensor,
        clean: torch.Tensor,
        loss: float,
        kind: str,
    ) -> dict[str, float]:
        pred = emb if w is None else emb @ w.T
        if kind == "mse":
            nearest = torch.cdist(pred, y).argmin(dim=1)
        else:  # the cosine loss ignores norms: classify by angle
            nearest = (pred @ torch.nn.functional.normalize(y, dim=1).T).argmax(dim=1)
        correct = (nearest == cls).double()
        return {
            "loss": loss,
            "train_accuracy": float(correct.mean()),
            "train_accuracy_clean": float(correct[clean].mean()) if clean.any() else float("nan"),
            "min_l2": min_pairwise_distance(y),
            "label_spread": float((y - y.mean(0)).norm()),
        }
