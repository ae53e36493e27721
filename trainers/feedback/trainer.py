"""The `feedback` training loop, its evaluation and the protocol diagnostics per epoch."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch.func import vmap

from trainers.base import (
    Reporter,
    ResourceEstimate,
    RunResult,
    RunWarning,
    binomial_noise_floor,
)
from trainers.data import ImageSplits, prepare_splits
from trainers.data.augment import device_constant
from trainers.feedback import protocol
from trainers.feedback.config import MAX_DEPTH, FeedbackConfig
from trainers.feedback.credit import (
    FeedbackMatrices,
    bp_credits,
    dfa_credits,
    draw_feedback,
    encode_feedback,
    fa_credits,
    fa_top_credit,
    output_error,
    spread,
)
from trainers.feedback.estimate import TEST_BATCH, feedback_estimate
from trainers.feedback.models import ResidualNet, StackedNet, Teacher, build_model
from trainers.feedback.report import PROTOCOL_REPORT
from trainers.losses.local_credit import local_credit_loss, scale_penalty
from trainers.random_sources import RandomSources
from trainers.reports import CrossRunReport
from trainers.runtime import RunContext, TrainerBase, TrainOutput

Batch = tuple[torch.Tensor, torch.Tensor]


# ---------------------------------------------------------------------------------------------
# tasks: image datasets (the shared data layer) and StudentNet's teacher-student data


class ImageTask:
    """Batches of an image dataset through the shared data layer (augmented only when
    augment_strength > 0)."""

    def __init__(
        self, config: FeedbackConfig, sources: RandomSources, device: torch.device
    ) -> None:
        self.splits: ImageSplits = prepare_splits(config, sources)
        self.sources = sources
        self.device = device
        self.augment = config.augment_strength > 0
        self.num_classes = self.splits.num_classes
        self.input_shape: tuple[int, ...] = self.splits.data.image_shape
        self.n_train, self.n_test = len(self.splits.train), len(self.splits.test)

    def train_batches(self, batch_size: int) -> Iterator[Batch]:
        generator = self.augment_generator
        for positions in self.train_positions(batch_size):
            yield self.splits.images(
                "train", positions, augment_generator=generator, device=self.device
            )

    def train_positions(self, batch_size: int) -> Iterator[torch.Tensor]:
        """The positions of each training batch of an epoch (the data source's shuffle): what
        `train_batches` gathers, for a seed-batched task to gather every seed's at once."""
        return self.splits.train_batches(batch_size, self.sources.data)

    @property
    def augment_generator(self) -> torch.Generator | None:
        return self.sources.augment if self.augment else None

    def test_batches(self, batch_size: int) -> Iterator[Batch]:
        for start in range(0, self.n_test, batch_size):
            positions = torch.arange(start, min(start + batch_size, self.n_test))
            yield self.splits.images("test", positions, device=self.device)

    def eval_batch(self, size: int) -> Batch:
        return self.splits.images("test", torch.arange(min(size, self.n_test)), device=self.device)


class TeacherStudentTask:
    """StudentNet's synthetic task: a fixed test set from the teacher's own seed; training
    inputs from the run's data generator, fresh every epoch when `student_online`."""

    def __init__(
        self, config: FeedbackConfig, sources: RandomSources, device: torch.device
    ) -> None:
        self.teacher = Teacher(config)
        test_x = self.teacher.inputs(config.student_test_size, self.teacher.generator)
        self.test = (test_x.to(device), self.teacher.label(test_x).to(device))
        self.generator = sources.data
        self.device = device
        self.online = config.student_online
        self.train = None if self.online else self._draw(config.student_train_size)
        self.num_classes = config.teacher_classes
        self.input_shape = (config.student_input_dim,)
        self.n_train, self.n_test = config.student_train_size, config.student_test_size

    def _draw(self, n: int) -> Batch:
        x = self.teacher.inputs(n, self.generator)
        return x.to(self.device), self.teacher.label(x).to(self.device)

    def train_batches(self, batch_size: int) -> Iterator[Batch]:
        x, y = self.train if self.train is not None else self._draw(self.n_train)
        order = torch.randperm(self.n_train, generator=self.generator).to(self.device)
        for start in range(0, self.n_train, batch_size):
            chunk = order[start : start + batch_size]
            yield x[chunk], y[chunk]

    def test_batches(self, batch_size: int) -> Iterator[Batch]:
        for start in range(0, self.n_test, batch_size):
            yield self.test[0][start : start + batch_size], self.test[1][start : start + batch_size]

    def eval_batch(self, size: int) -> Batch:
        return self.test[0][:size], self.test[1][:size]


Task = ImageTask | TeacherStudentTask


def load_task(config: FeedbackConfig, sources: RandomSources, device: torch.device) -> Task:
    if config.arch == "studentnet":
        return TeacherStudentTask(config, sources, device)
    return ImageTask(config, sources, device)


# ---------------------------------------------------------------------------------------------
# one training step in the shared local-loss form

Network = ResidualNet | StackedNet


def per_seed(model: Network, loss: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`loss` of one network's batch; for a StackedNet, vmapped over the seed axis, so that each
    seed's loss is reduced over its own batch alone (a vector of K)."""
    return vmap(loss) if isinstance(model, StackedNet) else loss


def cross_entropy_of(
    model: Network, logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """The cross-entropy of one network's batch; for a StackedNet each seed's over its own
    batch (a vector of K), from one loss kernel over every seed's logits (vmap of
    F.cross_entropy took about ten)."""
    if not isinstance(model, StackedNet):
        return F.cross_entropy(logits, y, reduction=reduction)
    each = F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none").view(y.shape)
    return each.mean(-1) if reduction == "mean" else each.sum(-1)


def method_credits(
    method: str,
    *,
    model: Network,
    states: list[torch.Tensor],
    normed: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    matrices: FeedbackMatrices | None,
    config: FeedbackConfig,
) -> list[torch.Tensor]:
    """a_0..a_L of a method. bp needs `states` to be one graph ending in `logits`; fa's
    through_norm top credit needs `normed` = model.normed(states[-1])."""
    if method == "bp":
        return bp_credits(states, logits, labels)
    assert matrices is not None
    error = output_error(logits, labels)
    if method == "dfa":
        return dfa_credits(error, matrices)
    assert matrices.top is not None
    top = fa_top_credit(model, states[-1], normed, error, matrices.top, config.fa_top_credit)
    return fa_credits(top, matrices, skip=config.fa_skip)


@dataclass
class StepLosses:
    total: torch.Tensor  # what is differentiated
    ce: torch.Tensor
    local: torch.Tensor
    penalty: torch.Tensor
    logits: torch.Tensor


def step_losses(
    model: Network,
    x: torch.Tensor,
    y: torch.Tensor,
    method: str,
    matrices: FeedbackMatrices | None,
    config: FeedbackConfig,
) -> StepLosses:
    """CE(head(norm(h_L.detach()))) + <embed(x), a_0> + sum_l <f_l(h_l.detach()), a_{l+1}>
    + lambda sum_l ||f_l(h_l.detach())||^2 (spec section 2.3). On a StackedNet (a batch and
    feedback matrices per seed, with a leading seed axis) each loss is a vector of K, each
    seed's own."""
    bp_reference = None
    if method == "bp":  # the credits need the full graph; the update below is still local
        states = model.states(x)
        normed = model.normed(states[-1])
        bp_reference = bp_credits(states, model.head(normed), y)
    h0 = model.embed(x)
    outs, h = [], h0
    for branch in model.branches:
        out = branch(h.detach())
        outs.append(out)
        h = h.detach() + out
    last = h.detach().requires_grad_(True)
    normed = model.normed(last)
    logits = model.head(normed)
    credits = (
        bp_reference
        if bp_reference is not None
        else method_credits(
            method,
            model=model,
            states=[last],
            normed=normed,
            logits=logits,
            labels=y,
            matrices=matrices,
            config=config,
        )
    )
    ce = cross_entropy_of(model, logits, y)
    credit_loss, penalty_of = per_seed(model, local_credit_loss), per_seed(model, scale_penalty)
    local = sum(
        (
            credit_loss(o, spread(a, o, config.vit_credit_tokens))
            for o, a in zip(outs, credits[1:], strict=True)
        ),
        torch.zeros(()),
    )
    if config.embed_credit != "none":
        a0 = credits[0] if config.embed_credit == "own" else credits[1]
        local = local + credit_loss(h0, spread(a0, h0, config.vit_credit_tokens))
    penalty = (
        sum((penalty_of(o) for o in outs), torch.zeros(()))
        if config.penalty > 0
        else torch.zeros(())
    )
    total = ce + local + config.penalty * penalty
    return StepLosses(
        total=total,
        ce=ce.detach(),
        local=local.detach(),
        penalty=(config.penalty * penalty).detach(),
        logits=logits.detach(),
    )


# ---------------------------------------------------------------------------------------------
# the protocol snapshot on the fixed evaluation batch


@dataclass
class Snapshot:
    """The protocol diagnostics of one epoch (medians over the evaluation batch)."""

    h_norms: list[float]  # ||h_l||, l = 0..L
    ref_grad_norms: list[float]  # ||g_l|| = ||dCE/dh_l||, l = 0..L
    rho: float
    cosines: list[float]  # Gamma per pair, nan when D2 fails
    deep_cos: float
    aggregate_cos: float
    d1_fired: bool
    d2_fired: bool

    @property
    def ref_grad_norm(self) -> float:
        return self.ref_grad_norms[-1]

    def metrics(self) -> dict[str, float]:
        out = {
            "residual_growth_max": self.rho,
            "ref_grad_norm": self.ref_grad_norm,
            "deep_cos": self.deep_cos,
            "aggregate_cos": self.aggregate_cos,
        }
        out.update({f"h_norm_layer{i}": v for i, v in enumerate(self.h_norms)})
        out.update({f"ref_grad_norm_layer{i}": v for i, v in enumerate(self.ref_grad_norms)})
        out.update({f"cos_layer{i}": v for i, v in enumerate(self.cosines)})
        return out


def protocol_snapshot(
    model: ResidualNet,
    x: torch.Tensor,
    y: torch.Tensor,
    method: str,
    matrices: FeedbackMatrices | None,
    config: FeedbackConfig,
) -> Snapshot:
    """Norms, rho, the BP reference gradients (CE reduced by config.ce_reduction) and the
    per-layer cosines between the method's credit and BP's, on one batch."""
    states, grads, credits = audit_tensors(model, x, y, method, matrices, config)
    return snapshot_of(states, grads, credits, model.vector, config)


def audit_tensors(
    model: Network,
    x: torch.Tensor,
    y: torch.Tensor,
    method: str,
    matrices: FeedbackMatrices | None,
    config: FeedbackConfig,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The states h_0..h_L of one batch, the BP reference gradients g_l = dCE/dh_l (CE reduced
    by config.ce_reduction, over each seed's batch on a StackedNet) and the method's credits."""
    states = model.states(x)
    normed = model.normed(states[-1])
    logits = model.head(normed)
    loss = cross_entropy_of(model, logits, y, config.ce_reduction)
    grads = torch.autograd.grad(loss, states, grad_outputs=torch.ones_like(loss), retain_graph=True)
    credits = method_credits(
        method,
        model=model,
        states=states,
        normed=normed,
        logits=logits,
        labels=y,
        matrices=matrices,
        config=config,
    )
    return states, list(grads), credits


def snapshot_of(
    states: list[torch.Tensor],
    grads: list[torch.Tensor],
    credits: list[torch.Tensor],
    vec: Callable[[torch.Tensor], torch.Tensor],
    config: FeedbackConfig,
) -> Snapshot:
    """One network's Snapshot from its audit tensors; `vec` is ResidualNet.vector."""
    h_norms = [protocol.median_norm(vec(h.detach())) for h in states]
    g_norms = [protocol.median_norm(vec(g)) for g in grads]
    rho = protocol.scale_growth(h_norms)
    d1 = protocol.scale_check_fires(rho, config.scale_growth_threshold)
    d2 = protocol.reference_check_fires(g_norms[-1], config.ref_grad_floor)
    refs = [vec(g) for g in grads]
    credit_vectors = [vec(a) if a.dim() == 3 else a for a in credits]
    if config.cosine_pairing == "output":
        cosines = protocol.layer_cosines(credit_vectors, refs)
    else:  # block l's credit (for h_{l+1}) against g at its input h_l
        cosines = protocol.layer_cosines(credit_vectors[1:], refs[:-1])
    if d2:  # the reference is below the cosine's floor: the cosines measure noise
        cosines = [math.nan] * len(cosines)
    deep, aggregate = protocol.deep_and_aggregate(cosines)
    return Snapshot(h_norms, g_norms, rho, cosines, deep, aggregate, d1, d2)


@torch.no_grad()
def test_accuracy(model: ResidualNet, task: Task, should_stop: Callable[[], bool]) -> float | None:
    """Accuracy on the whole test set; None when the run must stop part-way (a large test set
    takes seconds, so every batch checks)."""
    correct = 0
    for x, y in task.test_batches(TEST_BATCH):
        if should_stop():
            return None
        correct += int((model(x).argmax(1) == y).sum())
    return correct / task.n_test


# ---------------------------------------------------------------------------------------------
# the trainer


def _metric_names() -> tuple[str, ...]:
    per_layer = ("h_norm_layer", "ref_grad_norm_layer", "cos_layer")
    return (
        "test_accuracy",
        "test_accuracy_noise_floor",
        "train_accuracy",
        "loss",
        "local_loss",
        "penalty_loss",
        "residual_growth_max",
        "ref_grad_norm",
        "deep_cos",
        "aggregate_cos",
        *(f"{p}{i}" for p in per_layer for i in range(MAX_DEPTH + 1)),
    )


@dataclass
class TrainedNetwork:
    """What `train_network` leaves: the trained model, its feedback matrices and the output."""

    model: ResidualNet
    matrices: FeedbackMatrices | None
    output: TrainOutput


@dataclass
class FeedbackOutcome:
    """The trained model and its feedback matrices, with the run's result."""

    model: ResidualNet
    matrices: FeedbackMatrices | None
    result: RunResult


class FeedbackTrainer(TrainerBase):
    name: ClassVar[str] = "feedback"
    description: ClassVar[str] = (
        "BP, feedback alignment and direct feedback alignment on residual networks (ResMLP, "
        "ViT-Mini, StudentNet) in one local-loss form, with the frozen-block baseline and the "
        "three-check audit protocol: scale stability (D1), reference validity (D2) and depth "
        "utility (D3, via GET /experiments/{id}/protocol), plus per-layer cosines every epoch."
    )
    paper: ClassVar[str] = (
        "Hao, Wan, Zhai, What Accuracy and Gradient Cosine Miss: Evaluating Feedback Alignment "
        "via Scale Stability, Reference Validity, and Depth Utility, arXiv:2606.21126 (2026)"
    )
    Config: ClassVar[type[FeedbackConfig]] = FeedbackConfig
    metrics: ClassVar[tuple[str, ...]] = _metric_names()
    diagnostics: ClassVar[tuple[str, ...]] = ("protocol", "feedback_matrices")
    primary_metric: ClassVar[str] = "test_accuracy"
    # The epoch's training CE: an overflowing residual stream reaches it as NaN through the
    # terminal norm, while a large but finite one is D1's finding, not a divergence.
    divergence_metric: ClassVar[str] = "loss"
    # D1 and D2 are judged per epoch on the run's own model; D3 needs the frozen-block run.
    stop_checks: ClassVar[tuple[str, ...]] = ("D1", "D2")
    reports: ClassVar[tuple[CrossRunReport[Any], ...]] = (PROTOCOL_REPORT,)
    metric_bounds: ClassVar[dict[str, tuple[float, float]]] = {
        "test_accuracy": (0.0, 1.0),
        "train_accuracy": (0.0, 1.0),
    }
    # Seed-batched tasks: train_seeds stacks the seeds' networks (a StackedNet). Eight seeds
    # of a StudentNet- or ResMLP-sized network (d = 128..256) pay one step's Python and
    # dispatch overhead instead of eight while their stacked tensors stay small (measured:
    # 1.6x the seeds per second of eight solo runs of examples/feedback_studentnet_cpu.yaml on
    # one CPU thread). A GPU, which one such network leaves mostly idle, gains more from more
    # seeds (docs/architecture.md: 8-33x per model-step), hence the maximum of 64. Memory grows
    # with K (the service checks K x the estimate).
    batched: ClassVar[bool] = True
    seeds_per_task_default: ClassVar[int] = 8
    max_seeds_per_task: ClassVar[int] = 64

    def reads_dataset(self, config: FeedbackConfig) -> bool:
        """StudentNet draws its inputs from a teacher (load_task): no dataset is read."""
        return config.arch != "studentnet"

    def test_set_sizes(self, diagnostics: dict[str, Any]) -> dict[str, int]:
        """test_accuracy averages the task's test set (`n_test` of the run: the image split,
        or the StudentNet teacher's `student_test_size` inputs)."""
        n_test = diagnostics.get("n_test")
        return {"test_accuracy": n_test} if isinstance(n_test, int) and n_test >= 1 else {}

    def train(self, config: FeedbackConfig, run: RunContext) -> TrainOutput:
        return train_network(config, run).output

    def train_seeds(self, config: FeedbackConfig, runs: list[RunContext]) -> list[TrainOutput]:
        """The seeds as one stacked computation (trainers/feedback/batched.py): each seed draws
        as its solo run; its result may drift from it as rounding grows (trainers/runtime.py)."""
        from trainers.feedback.batched import train_networks  # it builds on this module

        return train_networks(config, runs)

    def estimate(self, config: FeedbackConfig) -> ResourceEstimate:
        return feedback_estimate(config)


class _KeepsTrainedNetwork(FeedbackTrainer):
    """A FeedbackTrainer for one `fit` call: it keeps the network it trained."""

    trained: TrainedNetwork

    def train(self, config: FeedbackConfig, run: RunContext) -> TrainOutput:
        self.trained = train_network(config, run)
        return self.trained.output


def fit(config: FeedbackConfig, seed: int, reporter: Reporter) -> FeedbackOutcome:
    """One run as the worker runs it (FeedbackTrainer.run), also handing back the trained
    model and its feedback matrices (for tests and analyses of the trained network)."""
    trainer = _KeepsTrainedNetwork()
    result = trainer.run(config, seed, reporter)
    return FeedbackOutcome(trainer.trained.model, trainer.trained.matrices, result)


def freeze_untrained(model: ResidualNet, config: FeedbackConfig) -> None:
    """What the run does not train: the branch weights of the frozen-block baseline, and the
    embedding with embed_credit none (left at its random init)."""
    if config.frozen_blocks:
        for p in model.branch_weights():
            p.requires_grad_(False)
    if config.embed_credit == "none":
        for p in model.embed.parameters():
            p.requires_grad_(False)


# Devices whose fused Adam kernel the seed-batched path uses (torch has one for both).
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def build_optimizer(
    model: Network, config: FeedbackConfig, *, fused_adam: bool = False
) -> torch.optim.Optimizer:
    """The run's optimiser over `model`'s trainable parameters. `fused_adam`: Adam as one fused
    kernel over every parameter (the seed-batched path, on a CPU or a CUDA device), instead of
    torch's default for the device (a loop over the parameters on a CPU, foreach on a GPU):
    the same update, with the rounding of another order of operations."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "adam":
        fused = fused_adam and all(p.device.type in FUSED_ADAM_DEVICES for p in trainable)
        return torch.optim.Adam(
            trainable,
            lr=config.lr,
            weight_decay=config.weight_decay,
            fused=True if fused else None,  # None, not False: False also turns foreach off
        )
    return torch.optim.SGD(trainable, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)


def train_network(config: FeedbackConfig, run: RunContext) -> TrainedNetwork:
    """Build the task (failing before training if data is missing), the model and the
    feedback matrices, train, and audit every epoch (epoch 0 is the initialisation). Every
    optimisation step and every test batch checks the run's stop; an epoch cut short is
    neither audited nor logged, so the result is the last whole epoch's. A check the spec
    asked to stop on (D1, D2) that fires at an epoch's audit ends the run after that epoch is
    logged: its result is then that epoch's, with the verdict of that model."""
    task = load_task(config, run.sources, run.device)
    model = build_model(config, task.input_shape, task.num_classes, run.sources.init)
    model = model.to(run.device)
    method = "bp" if config.frozen_blocks else config.method
    drawn = draw_feedback(method, config.depth, config.width, task.num_classes, run.sources.init)
    matrices = drawn.to(run.device) if drawn is not None else None
    freeze_untrained(model, config)
    run.track(model)
    optimizer = build_optimizer(model, config)
    eval_x, eval_y = task.eval_batch(config.eval_batch_size)

    def audit() -> Snapshot:
        return protocol_snapshot(model, eval_x, eval_y, method, matrices, config)

    snapshots = [audit()]
    accuracy = test_accuracy(model, task, run.should_stop)
    if accuracy is not None:
        run.log(0, {**snapshots[0].metrics(), "test_accuracy": accuracy}, epoch=0)
        # a stop asked for here ends the run before its first step (should_stop() below)
        report_fired_checks(run, snapshots[0], config, step=0, epoch=0)
    last: dict[str, float] = {}
    step, started = 0, time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        sums = DeviceSums()
        model.train()
        for x, y in task.train_batches(config.batch_size):
            if run.should_stop():
                break
            losses = step_losses(model, x, y, method, matrices, config)
            optimizer.zero_grad(set_to_none=True)
            losses.total.backward()
            optimizer.step()
            step += 1
            sums.add(
                losses.ce,
                losses.local,
                losses.penalty,
                (losses.logits.argmax(1) == y).sum(),
                len(y),
            )
        if run.stopped:
            break
        model.eval()
        snapshot = audit()
        epoch_accuracy = test_accuracy(model, task, run.should_stop)
        if epoch_accuracy is None:
            break
        snapshots.append(snapshot)
        accuracy = epoch_accuracy
        last = sums.read().metrics(accuracy, snapshot)
        if run.log(step, last, epoch=epoch):
            break
        if report_fired_checks(run, snapshot, config, step=step, epoch=epoch):
            break
    output = run_output(
        config,
        method,
        task,
        matrices,
        snapshots=snapshots,
        last=last,
        accuracy=accuracy,
        steps=step,
        train_time_s=time.perf_counter() - started,
    )
    return TrainedNetwork(model=model, matrices=matrices, output=output)


@dataclass
class EpochSums:
    """One epoch's training losses and correct predictions, each loss weighted by its batch's
    size, over the steps so far."""

    loss: float = 0.0
    local_loss: float = 0.0
    penalty_loss: float = 0.0
    correct: float = 0.0
    seen: int = 0

    def add(self, ce: float, local: float, penalty: float, correct: float, n: int) -> None:
        self.seen += n
        self.loss += ce * n
        self.local_loss += local * n
        self.penalty_loss += penalty * n
        self.correct += correct

    def metrics(self, accuracy: float, snapshot: Snapshot) -> dict[str, float]:
        """What an epoch logs: its mean losses, accuracies and the audit's metrics."""
        return {
            "loss": self.loss / self.seen,
            "local_loss": self.local_loss / self.seen,
            "penalty_loss": self.penalty_loss / self.seen,
            "train_accuracy": self.correct / self.seen,
            "test_accuracy": accuracy,
            **snapshot.metrics(),
        }


class DeviceSums:
    """An epoch's EpochSums kept on the device: a step adds its values with no host read (a
    sync a step on a GPU), `read` takes them back once, at the epoch's end. The same float64
    products and sums in the same order as EpochSums.add of each step's values."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.seen = 0

    def add(
        self,
        ce: torch.Tensor,
        local: torch.Tensor,
        penalty: torch.Tensor,
        correct: torch.Tensor,
        n: int,
    ) -> None:
        values = torch.stack([ce.detach(), local.detach(), penalty.detach(), correct]).double()
        weights = device_constant((float(n), float(n), float(n), 1.0), torch.float64, values.device)
        step = values * weights
        self.total = step if self.total is None else self.total + step
        self.seen += n

    def read(self) -> EpochSums:
        if self.total is None:
            return EpochSums()
        loss, local, penalty, correct = self.total.tolist()
        return EpochSums(loss, local, penalty, correct, self.seen)


def run_output(
    config: FeedbackConfig,
    method: str,
    task: Task,
    matrices: FeedbackMatrices | None,
    *,
    snapshots: list[Snapshot],
    last: dict[str, float],
    accuracy: float | None,
    steps: int,
    train_time_s: float,
) -> TrainOutput:
    """A run's result from its audits (epoch 0 first), its last logged epoch's metrics and its
    last whole test accuracy."""
    final = snapshots[-1]
    metrics = {**last, **final.metrics()}
    if accuracy is not None:
        metrics["test_accuracy"] = accuracy
        metrics["test_accuracy_noise_floor"] = binomial_noise_floor(accuracy, task.n_test)
    diagnostics: dict[str, Any] = {
        "protocol": protocol_summary(snapshots, config, method),
        "feedback_matrices": (
            encode_feedback(matrices, include_data=config.store_feedback_matrices)
            if matrices is not None
            else None
        ),
        "epochs_run": len(snapshots) - 1,
        "optimizer_steps": steps,
        "n_train": task.n_train,
        "n_test": task.n_test,
        "train_time_s": train_time_s,
    }
    return TrainOutput(
        metrics=metrics, diagnostics=diagnostics, warnings=protocol_warnings(final, config)
    )


def report_fired_checks(
    run: RunContext, snapshot: Snapshot, config: FeedbackConfig, *, step: int, epoch: int
) -> bool:
    """Tell the run which of D1 and D2 fired at this epoch's audit; True when it must stop
    (the spec asked to stop on one of them)."""
    fired = {}
    if snapshot.d1_fired:
        fired["D1"] = (
            f"D1 scale stability fired at epoch {epoch}: residual_growth_max "
            f"{snapshot.rho:.4g} > {config.scale_growth_threshold:g}"
        )
    if snapshot.d2_fired:
        fired["D2"] = (
            f"D2 reference validity fired at epoch {epoch}: ref_grad_norm "
            f"{snapshot.ref_grad_norm:.4g} < {config.ref_grad_floor:g}"
        )
    return bool(fired) and run.checks_fired(fired, step=step, epoch=epoch)


def protocol_summary(
    snapshots: list[Snapshot], config: FeedbackConfig, method: str
) -> dict[str, Any]:
    """D1 and D2 on the final model (the authors' FAProtocol audits the final checkpoint),
    the first epoch each fired, the run's D1/D2 verdict and the per-layer cosines."""
    final = snapshots[-1]
    fired = [name for name, f in (("D1", final.d1_fired), ("D2", final.d2_fired)) if f]
    epochs = list(enumerate(snapshots))
    return {
        "checks": {
            "D1": {
                "name": "scale_stability",
                "metric": "residual_growth_max",
                "value": final.rho,
                "threshold": config.scale_growth_threshold,
                "fired": final.d1_fired,
                "first_epoch": protocol.first_firing([(e, s.d1_fired) for e, s in epochs]),
            },
            "D2": {
                "name": "reference_validity",
                "metric": "ref_grad_norm",
                "value": final.ref_grad_norm,
                "threshold": config.ref_grad_floor,
                "fired": final.d2_fired,
                "first_epoch": protocol.first_firing([(e, s.d2_fired) for e, s in epochs]),
            },
        },
        # D3 needs the frozen-block run of the same condition and seed: the service adds it
        "verdict": protocol.verdict(fired),
        "verdict_checks": ["D1", "D2"],
        "method": method,
        "frozen_blocks": config.frozen_blocks,
        "depth_utility_margin_pp": config.depth_utility_margin_pp,
        "cosine_pairing": config.cosine_pairing,
        "per_layer_cosine": final.cosines,
        "deep_cos": final.deep_cos,
        "aggregate_cos": final.aggregate_cos,
        "h_norms": final.h_norms,
        "ref_grad_norms": final.ref_grad_norms,
        "eval_batch_size": config.eval_batch_size,
        "ce_reduction": config.ce_reduction,
    }


def protocol_warnings(final: Snapshot, config: FeedbackConfig) -> list[RunWarning]:
    warnings = []
    if final.d1_fired:
        warnings.append(
            RunWarning(
                diagnostic="residual_growth_max",
                value=final.rho,
                threshold=config.scale_growth_threshold,
                message="D1 scale stability fails: one block amplifies the residual stream more "
                "than the threshold (residual-stream explosion, the precursor of reference "
                "collapse)",
            )
        )
    if final.d2_fired:
        warnings.append(
            RunWarning(
                diagnostic="ref_grad_norm",
                value=final.ref_grad_norm,
                threshold=config.ref_grad_floor,
                message="D2 reference validity fails: the BP reference gradient at h_L is below "
                "the cosine's numerical floor, so gradient cosines measure noise (reported "
                "as null)",
            )
        )
    return warnings
