"""The `cff` seeds of one task as one computation (TrainerBase.train_seeds).

Each seed is set up as its solo run sets it up (splits from its `data` source, layers and head
from its `init` source) and keeps its own modules; the layers of one depth and the heads are
stacked across seeds (trainers.cff.stacked) and run under vmap. Every random draw comes from the
seed's own generators in its solo order: its shuffles, its two augmented training views, its
validation views. Losses, clamp activation rates, gradient norms, validation losses, checkpoints
and logged points are per seed; the test evaluation runs per seed on its own modules.

A seed whose run stops (cancelled, diverged, or a part of an epoch cut short) is dropped from the
stacks at the point its solo run would break out of its loop: its modules get its values there
(the best checkpoint where its solo run would load one) and it logs nothing more; the others go
on. A seed's values differ from its solo run's by float32 rounding (the batched products sum in
another order), which long training can amplify (trainers/runtime.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from trainers.cff.config import CFFConfig
from trainers.cff.model import patchify
from trainers.cff.stacked import SeedStack
from trainers.cff.trainer import (
    Stage1Record,
    early_window_steps,
    evaluate,
    run_output,
    set_up_run,
)
from trainers.data import ImageSplits, Split, stacked_images
from trainers.losses.supcon_margin import (
    clamp_activation_rate,
    pair_similarities,
    supcon_margin_loss,
    supcon_margin_loss_from_similarities,
)
from trainers.precision import PrecisionScope, precision_scope
from trainers.runtime import RunContext, TrainOutput

if TYPE_CHECKING:
    from trainers.cff.trainer import CFFTrainer


@dataclass(eq=False)
class _Seed:
    """One seed of the task: its run, splits and own modules, and what its stages kept."""

    run: RunContext
    splits: ImageSplits
    layers: nn.ModuleList
    head: nn.Sequential
    dataset_cached: bool
    record: Stage1Record
    head_stats: dict[str, float] = field(default_factory=dict)
    # the head epoch with the best validation cross-entropy: (loss, head state, its stats)
    best_head: tuple[float, dict[str, torch.Tensor] | None, dict[str, float]] = (math.inf, None, {})


def train_seeds(
    trainer: CFFTrainer, config: CFFConfig, runs: list[RunContext]
) -> list[TrainOutput]:
    """Stage 1, stage 2 and the test evaluation of every seed, batched across seeds.

    An imbalanced config (imbalance_ratio > 1) gives each seed a training split of its own size,
    hence batches that do not line up: its seeds run one after another on the solo path."""
    if config.imbalance_ratio > 1.0:
        return [trainer.train(config, run) for run in runs]
    seeds = []
    for run in runs:
        splits, layers, head, dataset_cached = set_up_run(config, run)
        seeds.append(
            _Seed(
                run,
                splits,
                layers,
                head,
                dataset_cached,
                Stage1Record(early_window_steps(config, len(splits.train))),
            )
        )
    device = runs[0].device
    with precision_scope(config.precision, device) as precision:
        _BatchedStage1(config, seeds, precision).train()
        trained = [seed for seed in seeds if not seed.run.stopped]
        if trained and config.head_epochs > 0:
            _BatchedHeads(config, trained, precision).train()
        evaluations = [
            evaluate(
                s.layers,
                s.head,
                s.splits,
                config.patch,
                device,
                s.run.should_stop,
                precision=precision,
            )
            for s in seeds
        ]
    return [
        run_output(config, s.splits, s.record, s.head_stats, evaluation, s.dataset_cached)
        for s, evaluation in zip(seeds, evaluations, strict=True)
    ]


class _Cohort:
    """The seeds still training, in the order of their slices in `stacks`."""

    def __init__(
        self,
        seeds: Sequence[_Seed],
        stacks: Sequence[SeedStack],
        finish: Callable[[_Seed, int], None],
    ) -> None:
        self.seeds = list(seeds)
        self.stacks = list(stacks)
        self._finish = finish

    def drop(self, stopped: Sequence[_Seed]) -> torch.Tensor | None:
        """Finish each stopped seed from its slices, then keep the others in every stack.
        Returns the kept positions (to index the caller's per-seed tensors), None when no seed
        was stopped."""
        if not stopped:
            return None
        for seed in stopped:
            self._finish(seed, self.seeds.index(seed))
        kept = [i for i, seed in enumerate(self.seeds) if seed not in stopped]
        self.seeds = [self.seeds[i] for i in kept]
        if kept:
            for stack in self.stacks:
                stack.keep(kept)
        device = next(iter(self.stacks[0].params.values())).device
        return torch.tensor(kept, dtype=torch.long, device=device)

    def check_stops(self) -> torch.Tensor | None:
        """Ask every seed's run whether it must stop (once each, as its solo loop asks) and
        drop those that must."""
        return self.drop([seed for seed in self.seeds if seed.run.should_stop()])

    def finish_all(self) -> None:
        self.drop(list(self.seeds))


def _stacked_views(
    seeds: Sequence[_Seed],
    split: Split,
    positions: Sequence[torch.Tensor],
    generators: Sequence[torch.Generator],
    patch: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each seed's two augmented views (its solo `two_views`, from the same draws), stacked:
    K x 2n x T x P patches and K x n labels; gathered, augmented and patchified for every seed
    at once."""
    x, y = stacked_images(
        [seed.splits for seed in seeds],
        split,
        positions,
        generators,
        views=2,
        device=seeds[0].run.device,
    )
    return patchify(x.flatten(0, 1), patch).unflatten(0, x.shape[:2]), y


def _next_batches(
    iterators: dict[int, Iterator[torch.Tensor]], seeds: Sequence[_Seed]
) -> list[torch.Tensor] | None:
    """The next training batch of every seed, None at the end of the epoch. Every seed's split
    has the same size, so their epochs end together."""
    try:
        return [next(iterators[seed.run.index]) for seed in seeds]
    except StopIteration:
        return None


class _BatchedStage1:
    """Stage 1 of every seed: the layer-local contrastive steps on stacked layers."""

    def __init__(
        self, config: CFFConfig, seeds: Sequence[_Seed], precision: PrecisionScope
    ) -> None:
        self.config = config
        self.precision = precision
        self.margins = config.margins()
        stacks = [
            SeedStack(
                [seed.layers[index] for seed in seeds],
                lr=config.lr,
                weight_decay=config.weight_decay,
            )
            for index in range(config.depth)
        ]
        self.cohort = _Cohort(seeds, stacks, self._finish)
        # (the seeds in the stack, their layer-0 CARs) for each step of the early window
        self.early_cars: list[tuple[list[_Seed], torch.Tensor]] = []

    def _finish(self, seed: _Seed, position: int) -> None:
        """The seed's layers as its solo run ends stage 1: its values here, then its best
        checkpoint where it has one."""
        for index, stack in enumerate(self.cohort.stacks):
            seed.layers[index].load_state_dict(stack.state(position))
        for members, cars in self.early_cars:
            if seed in members:
                seed.record.early_car_values.append(cars[members.index(seed)])
        if seed.record.best_state is not None:
            seed.layers.load_state_dict(seed.record.best_state)

    def _layers_state(self, position: int) -> dict[str, torch.Tensor]:
        """A copy of one seed's layers as its nn.ModuleList's state_dict."""
        return {
            f"{index}.{name}": value
            for index, stack in enumerate(self.cohort.stacks)
            for name, value in stack.state(position).items()
        }

    def train(self) -> None:
        """The epochs until the last or until every seed has stopped; each seed ends with its
        best checkpoint under select_by_validation, as its solo run."""
        cohort = self.cohort
        for epoch in range(self.config.epochs):
            if not cohort.seeds:
                break
            started_with = list(cohort.seeds)
            started = time.perf_counter()
            means, positives = self._epoch()
            elapsed = time.perf_counter() - started
            for seed in started_with:
                seed.record.train_time_s += elapsed
            # a seed stopped during the epoch was dropped: a part of an epoch is not logged
            points = {
                seed: seed.record.epoch_point({k: v[i] for k, v in means.items()}, positives[i])
                for i, seed in enumerate(cohort.seeds)
            }
            if self.config.select_by_validation:
                val = self._validate()
                for position, seed in enumerate(cohort.seeds):
                    seed.record.validated(
                        epoch, points[seed], val[seed], partial(self._layers_state, position)
                    )
            stopped = []
            for seed in cohort.seeds:
                seed.record.last = points[seed]
                if seed.run.log(seed.record.step, points[seed], epoch=epoch):
                    stopped.append(seed)
            cohort.drop(stopped)
        cohort.finish_all()

    def _epoch(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One pass over every seed's training split (K x depth means of the loss, CAR and
        gradient norm, and the K mean positives per anchor) for the seeds that went through
        it; a seed that stops on the way is dropped."""
        config, cohort = self.config, self.cohort
        device = cohort.seeds[0].run.device
        sums = {
            name: torch.zeros(len(cohort.seeds), config.depth, device=device)
            for name in ("loss", "car", "grad_norm")
        }
        positives = torch.zeros(len(cohort.seeds), device=device)
        batches = 0
        iterators = {
            seed.run.index: seed.splits.train_batches(config.batch_size, seed.run.sources.data)
            for seed in cohort.seeds
        }
        while cohort.seeds and (chunks := _next_batches(iterators, cohort.seeds)) is not None:
            seeds = cohort.seeds
            h, y = _stacked_views(
                seeds, "train", chunks, [s.run.sources.augment for s in seeds], config.patch
            )
            n = y.shape[1]
            for index, (stack, margin) in enumerate(zip(cohort.stacks, self.margins, strict=True)):
                with self.precision.autocast():
                    h = stack(h.detach())
                with self.precision.float32():
                    features = h.float().mean(dim=2)
                    s, pos = vmap(pair_similarities)(features[:, :n], features[:, n:], y)
                    loss = vmap(
                        partial(
                            supcon_margin_loss_from_similarities,
                            margin=margin,
                            temperature=config.temperature,
                            margin_mode=config.margin_mode,
                            stability=config.stability,
                        )
                    )(s, pos)
                stack.zero_grad()
                loss.sum().backward()  # the seeds share no parameter: each gets its own gradient
                car = vmap(partial(clamp_activation_rate, margin=margin))(s, pos)
                sums["loss"][:, index] += loss.detach()
                sums["car"][:, index] += car
                sums["grad_norm"][:, index] += stack.grad_norms()
                if index == 0:
                    positives += pos.sum(dim=(1, 2)) / pos.shape[1]
                    if seeds[0].record.step < seeds[0].record.early_steps:
                        self.early_cars.append((list(seeds), car))
                stack.step()
            for seed in seeds:
                seed.record.step += 1
                seed.record.images_seen += n
            batches += 1
            kept = cohort.check_stops()
            if kept is not None:
                sums = {name: v[kept] for name, v in sums.items()}
                positives = positives[kept]
        return (
            {name: v / max(batches, 1) for name, v in sums.items()},
            positives / max(batches, 1),
        )

    @torch.no_grad()
    def _validate(self) -> dict[_Seed, list[float]]:
        """Each seed's per-layer loss on its augmented validation split, for the seeds that
        went through it; a seed that stops on the way is dropped."""
        config, cohort = self.config, self.cohort
        if not cohort.seeds:  # every seed stopped in the epoch (a cancel ends them all)
            return {}
        device = cohort.seeds[0].run.device
        # float64 sums, as the solo run's
        totals = torch.zeros(len(cohort.seeds), config.depth, dtype=torch.float64, device=device)
        count = 0
        n_val = len(cohort.seeds[0].splits.val)
        for start in range(0, n_val, config.batch_size):
            kept = cohort.check_stops()
            if kept is not None:
                totals = totals[kept]
            if not cohort.seeds:
                return {}
            positions = torch.arange(start, min(start + config.batch_size, n_val))
            if len(positions) < 2:  # a contrastive batch needs two images
                continue
            seeds = cohort.seeds
            h, y = _stacked_views(
                seeds,
                "val",
                [positions] * len(seeds),
                [s.run.sources.evaluate for s in seeds],
                config.patch,
            )
            n = y.shape[1]
            for index, (stack, margin) in enumerate(zip(cohort.stacks, self.margins, strict=True)):
                with self.precision.autocast():
                    h = stack(h)
                with self.precision.float32():
                    f = h.float().mean(dim=2)
                    loss = vmap(
                        partial(
                            supcon_margin_loss,
                            margin=margin,
                            temperature=config.temperature,
                            margin_mode=config.margin_mode,
                            stability=config.stability,
                        )
                    )(f[:, :n], f[:, n:], y)
                totals[:, index] += n * loss.double()
            count += n
        return dict(zip(cohort.seeds, (totals / max(count, 1)).tolist(), strict=True))


class _BatchedHeads:
    """Stage 2 of the seeds that went through stage 1: each seed's head, stacked, trained on
    its frozen layers' features, with its own validation and checkpoint."""

    def __init__(
        self, config: CFFConfig, seeds: Sequence[_Seed], precision: PrecisionScope
    ) -> None:
        self.config = config
        self.precision = precision
        self.encoder = [
            SeedStack([seed.layers[index] for seed in seeds]) for index in range(config.depth)
        ]
        self.heads = SeedStack(
            [seed.head for seed in seeds], lr=config.head_lr, weight_decay=config.weight_decay
        )
        self.cohort = _Cohort(seeds, [*self.encoder, self.heads], self._finish)
        # each seed's statistics of its last epoch, as its solo run holds them
        self.stats: dict[_Seed, dict[str, float]] = {seed: {} for seed in seeds}

    def _finish(self, seed: _Seed, position: int) -> None:
        """The seed's head and statistics as its solo run returns them: its best head where it
        has one, else its head here and its last epoch's statistics."""
        seed.head.load_state_dict(self.heads.state(position))
        _, best_state, best_stats = seed.best_head
        if best_state is not None:
            seed.head.load_state_dict(best_state)
            seed.head_stats = best_stats
        else:
            seed.head_stats = self.stats[seed]

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """The last layer's token mean of each seed's layers on its images (K x n x C x H x W)."""
        h = patchify(x.flatten(0, 1), self.config.patch).unflatten(0, x.shape[:2])
        for stack in self.encoder:
            h = stack(h)
        return h.mean(dim=2)

    def _images(
        self,
        seeds: Sequence[_Seed],
        split: Split,
        positions: Sequence[torch.Tensor],
        generators: Sequence[torch.Generator],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each seed's images and labels at `positions` of its split, augmented from its
        generator, stacked: K x n x C x H x W and K x n."""
        splits = [seed.splits for seed in seeds]
        return stacked_images(splits, split, positions, generators, device=seeds[0].run.device)

    def train(self) -> None:
        config, cohort = self.config, self.cohort
        step = cohort.seeds[0].record.step  # every seed here went through all of stage 1
        for epoch in range(config.head_epochs):
            cohort.check_stops()
            if not cohort.seeds:
                break
            device = cohort.seeds[0].run.device
            total = torch.zeros(len(cohort.seeds), dtype=torch.float64, device=device)
            count = 0
            iterators = {
                seed.run.index: seed.splits.train_batches(config.batch_size, seed.run.sources.data)
                for seed in cohort.seeds
            }
            while cohort.seeds and (chunks := _next_batches(iterators, cohort.seeds)) is not None:
                seeds = cohort.seeds
                x, y = self._images(seeds, "train", chunks, [s.run.sources.augment for s in seeds])
                with torch.no_grad(), self.precision.autocast():
                    features = self._encode(x)
                with self.precision.autocast():
                    logits = self.heads(features)
                loss = vmap(F.cross_entropy)(logits.float(), y)
                self.heads.zero_grad()
                loss.sum().backward()
                self.heads.step()
                total += loss.detach().double() * y.shape[1]
                count += y.shape[1]
                step += 1
                kept = cohort.check_stops()
                if kept is not None:
                    total = total[kept]
            if not cohort.seeds:
                break
            for seed, value in zip(cohort.seeds, total.tolist(), strict=True):
                self.stats[seed] = {"head_loss": value / max(count, 1)}
            if config.select_by_validation:
                validation = self._validate()
                for position, seed in enumerate(cohort.seeds):
                    val_loss, val_accuracy = validation[seed]
                    stats = self.stats[seed]
                    stats.update(head_val_loss=val_loss, head_val_accuracy=val_accuracy)
                    if val_loss < seed.best_head[0]:
                        seed.best_head = (val_loss, self.heads.state(position), dict(stats))
            cohort.drop(
                [
                    seed
                    for seed in cohort.seeds
                    if seed.run.log(step, self.stats[seed], epoch=config.epochs + epoch)
                ]
            )
        cohort.finish_all()

    @torch.no_grad()
    def _validate(self) -> dict[_Seed, tuple[float, float]]:
        """Each seed's cross-entropy and accuracy on its augmented validation split, for the
        seeds that went through it; a seed that stops on the way is dropped."""
        config, cohort = self.config, self.cohort
        device = cohort.seeds[0].run.device
        total = torch.zeros(len(cohort.seeds), dtype=torch.float64, device=device)
        correct = torch.zeros(len(cohort.seeds), dtype=torch.int64, device=device)
        count = 0
        n_val = len(cohort.seeds[0].splits.val)
        for start in range(0, n_val, config.batch_size):
            kept = cohort.check_stops()
            if kept is not None:
                total, correct = total[kept], correct[kept]
            if not cohort.seeds:
                return {}
            seeds = cohort.seeds
            positions = torch.arange(start, min(start + config.batch_size, n_val))
            x, y = self._images(
                seeds, "val", [positions] * len(seeds), [s.run.sources.evaluate for s in seeds]
            )
            with self.precision.autocast():
                logits = self.heads(self._encode(x)).float()
            total += vmap(partial(F.cross_entropy, reduction="sum"))(logits, y).double()
            correct += (logits.argmax(2) == y).sum(1)
            count += y.shape[1]
        return {
            seed: (t / max(count, 1), c / max(count, 1))
            for seed, t, c in zip(cohort.seeds, total.tolist(), correct.tolist(), strict=True)
        }
