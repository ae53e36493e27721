"""Seed-batched `feedback` training (TrainerBase.train_seeds): the K seeds of one task as one
stacked computation, each seed's result its solo run's (trainer.train_network).

Each seed builds its own task, network and feedback matrices from its own random sources, in
its solo run's order, and draws its own batches (order, fresh StudentNet inputs) from its own
data generator. The K networks then train as one StackedNet (models.py): every step runs
step_losses on the K batches at once, and every audit and test pass runs the one evaluation
batch and test set (they do not depend on the seed) through the K networks at once. Credits,
losses and protocol diagnostics are each seed's own: the credits of BP, FA and DFA are taken
per seed (each seed's feedback matrices, its own gradients), every loss is reduced over its
seed's batch, and medians, cosines and the D1/D2 checks are computed per seed. The optimiser is
torch.optim's Adam or SGD on the stacked parameters: both are elementwise and every seed in the
stack takes the same steps at the same time, so each seed's update is its solo update (Adam as
torch's fused kernel on a CPU or CUDA device: one pass over each stacked parameter instead of
six, 9% of a StudentNet task's time on this CPU; the same update in another rounding).

A seed that stops leaves the stack: cancelled or stopped by its reporter at a step or during a
test pass, diverged (its logged training loss turned non-finite) or stopped by a check
(stop_on_checks). Its result is what its solo run returns at that point (the last whole
epoch's), its tracked parameters its values then; the other seeds go on. A cancel stops every
seed. Seeds whose epochs have different batches (the training split's size differs from seed
to seed, as it can with imbalance_ratio and a validation split) train as separate stacks, one
after the other.

Every configuration is batched; none falls back to training the seeds one after another: the
networks keep no running statistics (LayerNorm has none), and ViT-Mini's attention core runs
with the seed axis folded into the batch axis rather than under torch.func.vmap, whose backward
of scaled_dot_product_attention fails on CUDA ("LSE is not correctly aligned", measured on an
H200).

Equivalence: the trainer computes in float32. Each seed's forward pass is its solo run's, bit
for bit on this CPU (the epoch-0 audit and test accuracy are equal), but the parameter
gradients of a stacked LayerNorm and some per-seed loss reductions sum in another order, and
training carries that rounding on. Measured on the cases of tests/trainers/
test_batched_feedback.py (StudentNet, ResMLP and ViT-Mini; BP, FA and DFA; 1-4 epochs; one
thread): the largest relative difference of any logged point, final metric or diagnostic is
3.8e-5 (most are below 1e-6), BP's local loss (a sum of ~1e-7 that nearly cancels) differs by at
most 1.5e-8, and epochs, steps, accuracies, checks, verdicts and warnings are equal. In float64
the stacked step and audit equal the solo ones to 1e-10.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.data import stacked_images
from trainers.data.augment import device_constant
from trainers.feedback.config import FeedbackConfig
from trainers.feedback.credit import FeedbackMatrices, draw_feedback
from trainers.feedback.estimate import TEST_BATCH
from trainers.feedback.models import ResidualNet, StackedNet, build_model
from trainers.feedback.trainer import (
    Batch,
    EpochSums,
    ImageTask,
    Snapshot,
    Task,
    audit_tensors,
    build_optimizer,
    freeze_untrained,
    load_task,
    report_fired_checks,
    run_output,
    snapshot_of,
    step_losses,
)
from trainers.runtime import RunContext, TrainOutput


@dataclass(eq=False)  # a seed is itself: compared by identity
class Seed:
    """One seed of a batched task: its run, task and feedback matrices, and its progress
    (audits, last logged epoch, last whole test accuracy, the current epoch's batches)."""

    run: RunContext
    task: Task
    matrices: FeedbackMatrices | None = None
    snapshots: list[Snapshot] = field(default_factory=list)
    last: dict[str, float] = field(default_factory=dict)
    accuracy: float | None = None
    sums: EpochSums = field(default_factory=EpochSums)
    batches: Iterator[Batch | torch.Tensor] = field(default_factory=lambda: iter(()))
    output: TrainOutput | None = None

    def build_network(self, config: FeedbackConfig, method: str) -> ResidualNet:
        """The seed's network and feedback matrices, drawn from its init generator as its solo
        run draws them."""
        model = build_model(
            config, self.task.input_shape, self.task.num_classes, self.run.sources.init
        ).to(self.run.device)
        drawn = draw_feedback(
            method, config.depth, config.width, self.task.num_classes, self.run.sources.init
        )
        self.matrices = drawn.to(self.run.device) if drawn is not None else None
        freeze_untrained(model, config)
        return model


def train_networks(config: FeedbackConfig, runs: Sequence[RunContext]) -> list[TrainOutput]:
    """The runs' seeds trained together; one output per run, in order. Each seed's task is
    loaded first (a missing dataset fails before any training), then each group of seeds with
    the same training-set size trains as one stack."""
    method = "bp" if config.frozen_blocks else config.method
    seeds = [Seed(run=run, task=load_task(config, run.sources, run.device)) for run in runs]
    groups: dict[int, list[Seed]] = {}
    for seed in seeds:
        groups.setdefault(seed.task.n_train, []).append(seed)
    for group in groups.values():
        train_group(config, method, group)
    outputs = []
    for seed in seeds:
        assert seed.output is not None  # every seed ends in its group's loop
        outputs.append(seed.output)
    return outputs


class SeedStack:
    """The seeds still training, in the order of the stack's seed axis, with their stacked
    network, feedback matrices and optimiser."""

    def __init__(self, config: FeedbackConfig, method: str, seeds: list[Seed]) -> None:
        self.config = config
        self.method = method
        self.seeds = seeds
        self.net = StackedNet.stack(
            [seed.build_network(config, method) for seed in seeds],
            sample_dims=len(seeds[0].task.input_shape),
        )
        self.matrices = stack_feedback([seed.matrices for seed in seeds])
        self.optimizer = build_optimizer(self.net, config, fused_adam=True)
        self.steps = 0
        self.started = time.perf_counter()
        # the current epoch's sums of every seed in the stack (K x 4, float64) and its images
        self.sums: torch.Tensor | None = None
        self.seen = 0

    def end(self, ended: Sequence[Seed]) -> None:
        """These seeds stop here: each keeps its result and its network's current values,
        and leaves the stack."""
        if not ended:
            return
        for k, seed in enumerate(self.seeds):
            if seed in ended:
                seed.run.track(*self.net.network_tensors(k))
                seed.output = run_output(
                    self.config,
                    self.method,
                    seed.task,
                    seed.matrices,
                    snapshots=seed.snapshots,
                    last=seed.last,
                    accuracy=seed.accuracy,
                    steps=self.steps,
                    train_time_s=time.perf_counter() - self.started,
                )
        keep = [k for k, seed in enumerate(self.seeds) if seed not in ended]
        self.seeds = [self.seeds[k] for k in keep]
        if not keep:
            return
        index = torch.tensor(keep, device=next(iter(self.net.params.values())).device)
        net = self.net.select(keep)
        self.optimizer = select_optimizer(self.optimizer, self.net, net, index, self.config)
        self.net = net
        if self.sums is not None:
            self.sums = self.sums.index_select(0, index)
        if self.matrices is not None:
            self.matrices = select_feedback(self.matrices, index)

    def audit(self, x: torch.Tensor, y: torch.Tensor) -> list[Snapshot]:
        """Each seed's protocol snapshot on the evaluation batch (x, y), shared by the seeds."""
        states, grads, credits = audit_tensors(
            self.net, x, y.expand(len(self.seeds), -1), self.method, self.matrices, self.config
        )
        return [
            snapshot_of(
                [h[k] for h in states],
                [g[k] for g in grads],
                [a[k] for a in credits],
                self.net.template.vector,
                self.config,
            )
            for k in range(len(self.seeds))
        ]

    @torch.no_grad()
    def test_accuracies(self, task: Task) -> list[float | None]:
        """Each seed's accuracy on the whole test set (shared by the seeds); None for a seed
        that must stop part-way (every test batch checks every seed, as a solo run does)."""
        correct = torch.zeros(len(self.seeds), dtype=torch.long)
        cut = [False] * len(self.seeds)
        for x, y in task.test_batches(TEST_BATCH):
            cut = [c or seed.run.should_stop() for c, seed in zip(cut, self.seeds, strict=True)]
            if all(cut):
                break
            correct += (self.net(x).argmax(-1) == y).sum(1).cpu()
        return [
            None if c else int(n) / task.n_test for c, n in zip(cut, correct.tolist(), strict=True)
        ]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One optimisation step of every seed, each on its own batch (K x n x ...)."""
        losses = step_losses(self.net, x, y, self.method, self.matrices, self.config)
        self.optimizer.zero_grad(set_to_none=True)
        losses.total.sum().backward()
        self.optimizer.step()
        self.steps += 1
        k, n = len(self.seeds), y.shape[1]
        values = torch.stack(
            [
                torch.broadcast_to(t.detach(), (k,))
                for t in (
                    losses.ce,
                    losses.local,
                    losses.penalty,
                    (losses.logits.argmax(-1) == y).sum(1),  # to float by the stack
                )
            ],
            dim=1,
        ).double()
        # EpochSums.add's float64 products and sums, kept on the device until the epoch ends
        weights = device_constant((float(n), float(n), float(n), 1.0), torch.float64, y.device)
        weighted = values * weights
        self.sums = weighted if self.sums is None else self.sums + weighted
        self.seen += n

    def start_epoch(self) -> None:
        self.sums, self.seen = None, 0

    def read_sums(self) -> None:
        """Each seed's epoch sums, read back from the device once an epoch (a read a step was
        a host-device sync a step on a GPU)."""
        rows = [[0.0] * 4] * len(self.seeds) if self.sums is None else self.sums.tolist()
        for seed, (loss, local, penalty, correct) in zip(self.seeds, rows, strict=True):
            seed.sums = EpochSums(loss, local, penalty, correct, self.seen)


def train_group(config: FeedbackConfig, method: str, seeds: list[Seed]) -> None:
    """Seeds whose epochs have the same batch sizes, trained as one stack: the loop of
    trainer.train_network for each seed, the seeds that stop leaving the stack."""
    stack = SeedStack(config, method, seeds)
    task = seeds[0].task  # the evaluation batch and the test set: the same for every seed
    images = all(isinstance(seed.task, ImageTask) for seed in seeds)
    eval_x, eval_y = task.eval_batch(config.eval_batch_size)
    for seed, snapshot, accuracy in zip(
        stack.seeds, stack.audit(eval_x, eval_y), stack.test_accuracies(task), strict=True
    ):
        seed.snapshots.append(snapshot)
        if accuracy is not None:
            seed.accuracy = accuracy
            seed.run.log(0, {**snapshot.metrics(), "test_accuracy": accuracy}, epoch=0)
            report_fired_checks(seed.run, snapshot, config, step=0, epoch=0)
    stack.started = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        stack.start_epoch()
        for seed in stack.seeds:
            seed.batches = epoch_batches(seed.task, config.batch_size, images)
        while stack.seeds:
            drawn = [(seed, next(seed.batches, None)) for seed in stack.seeds]
            if drawn[0][1] is None:  # the same batch sizes: every seed's epoch ends here
                break
            stack.end([seed for seed, _ in drawn if seed.run.should_stop()])
            if stack.seeds:
                stack.step(
                    *stacked_batches(
                        [(s, b) for s, b in drawn if b is not None and s in stack.seeds], images
                    )
                )
        if not stack.seeds:
            return
        stack.read_sums()
        snapshots = stack.audit(eval_x, eval_y)
        accuracies = stack.test_accuracies(task)
        ended = []
        for seed, snapshot, accuracy in zip(stack.seeds, snapshots, accuracies, strict=True):
            if accuracy is None:  # cut short: the epoch is neither audited nor logged
                ended.append(seed)
                continue
            seed.snapshots.append(snapshot)
            seed.accuracy = accuracy
            seed.last = seed.sums.metrics(accuracy, snapshot)
            if seed.run.log(stack.steps, seed.last, epoch=epoch) or report_fired_checks(
                seed.run, snapshot, config, step=stack.steps, epoch=epoch
            ):
                ended.append(seed)
        stack.end(ended)
    stack.end(list(stack.seeds))


def epoch_batches(task: Task, batch_size: int, images: bool) -> Iterator[Batch | torch.Tensor]:
    """A seed's epoch: its batches' positions when the task's seeds gather their images at
    once (`images`), else its batches."""
    if images:
        assert isinstance(task, ImageTask)
        return iter(task.train_positions(batch_size))
    return iter(task.train_batches(batch_size))


def stacked_batches(
    drawn: list[tuple[Seed, Batch | torch.Tensor]], images: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every seed's batch as one (K x n x ...): image seeds' gathered, augmented from each
    seed's own generator and normalised at once (trainers.data.stacked_images: each seed's
    slice is its `train_batches` batch, bit for bit)."""
    if images:
        tasks = [seed.task for seed, _ in drawn]
        assert all(isinstance(t, ImageTask) for t in tasks)
        image_tasks = [t for t in tasks if isinstance(t, ImageTask)]
        generators = [t.augment_generator for t in image_tasks]
        return stacked_images(
            [t.splits for t in image_tasks],
            "train",
            [positions for _, positions in drawn if isinstance(positions, torch.Tensor)],
            None if generators[0] is None else [g for g in generators if g is not None],
            device=image_tasks[0].device,
        )
    batches = [batch for _, batch in drawn if isinstance(batch, tuple)]
    return torch.stack([x for x, _ in batches]), torch.stack([y for _, y in batches])


def stack_feedback(drawn: list[FeedbackMatrices | None]) -> FeedbackMatrices | None:
    """The seeds' feedback matrices stacked along a leading seed axis (None for BP)."""
    each = [m for m in drawn if m is not None]
    if not each:
        return None
    layers = [torch.stack(bs) for bs in zip(*(m.layers for m in each), strict=True)]
    tops = [m.top for m in each if m.top is not None]
    return FeedbackMatrices(each[0].method, layers, torch.stack(tops) if tops else None)


def select_feedback(matrices: FeedbackMatrices, index: torch.Tensor) -> FeedbackMatrices:
    return FeedbackMatrices(
        matrices.method,
        [b.index_select(0, index) for b in matrices.layers],
        None if matrices.top is None else matrices.top.index_select(0, index),
    )


def select_optimizer(
    optimizer: torch.optim.Optimizer,
    old: StackedNet,
    new: StackedNet,
    index: torch.Tensor,
    config: FeedbackConfig,
) -> torch.optim.Optimizer:
    """An optimiser of `new` (the networks of `old` at `index`) that carries on from
    `optimizer`'s state: each per-element state tensor (Adam's moments, SGD's momentum) at
    the same seeds, the shared step count as it is."""
    moved = build_optimizer(new, config, fused_adam=True)
    for name, param in old.params.items():
        state = optimizer.state.get(param)
        if state:
            kept = new.params[name]
            moved.state[kept] = {
                key: _select_state(value, index, kept) for key, value in state.items()
            }
    return moved


def _select_state(value: Any, index: torch.Tensor, param: torch.Tensor) -> Any:
    """One optimiser state entry for the seeds at `index`: a per-element tensor (shaped like
    the stacked parameter) at those seeds, in the parameter's memory layout; a scalar as is."""
    if not torch.is_tensor(value):
        return value
    if value.dim() == 0:
        return value.clone()
    return torch.empty_like(param, requires_grad=False).copy_(value.index_select(0, index))
