"""What seedgrid's CFF diagnostics cost: stage-1 images/s of the trainer against a bare loop.

Both train the same model (same layers, init, data, augmentation and loss function) for the same
epochs in this process, and both do the same set-up (splits, model) and the same final test
evaluation; the bare loop has no diagnostics (no clamp activation rate, no per-layer gradient
norms, no loss bookkeeping, no reporter). The trainer runs with select_by_validation off and
head_epochs 0, so both sides do stage-1 training only, and both are warmed up first. Each repeat
runs the two back to back (each goes first in turn, so that an order effect cancels in the
median; a repeat whose two sides trained on different numbers of images stops the script) and
times each with the wall clock and with this process's CPU time; the reported ratio is the
median over repeats of the per-repeat ratio. CPU time is the figure to judge on a shared
machine (other processes' load does not enter it). Target: the trainer keeps at least 90% of
the bare loop's throughput (diagnostics cost at most 10%).

    python benchmarks/cff_overhead.py                 # digits at 16x16, a small ViT, CPU
    python benchmarks/cff_overhead.py --width 128 --depth 5 --image-size 32 --device cuda
    python benchmarks/cff_overhead.py --smoke         # a tiny ViT, 2 repeats, seconds (CI)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from trainers import MemoryReporter
from trainers.cff import CFFConfig, CFFTrainer, build_head, build_layers, evaluate, patchify
from trainers.data import prepare_splits
from trainers.losses.supcon_margin import supcon_margin_loss
from trainers.random_sources import random_sources
from trainers.runtime import pick_device

# --smoke's defaults: a run of a few seconds on a CPU, through the same code path
SMOKE = {
    "image_size": 8,
    "width": 8,
    "depth": 1,
    "heads": 2,
    "batch_size": 32,
    "train_size": 128,
    "epochs": 1,
    "repeats": 2,
}


def bare_loop(config: CFFConfig, seed: int) -> int:
    """A plain PyTorch loop over the same model, data and loss; returns images trained on."""
    device = pick_device(config.device)
    sources = random_sources(seed)
    splits = prepare_splits(config, sources)
    channels, side, _ = splits.data.image_shape
    layers = build_layers(config, channels, side, sources.init).to(device)
    head = build_head(config.width, splits.num_classes, sources.init).to(device)
    optimizers = [
        torch.optim.AdamW(layer.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        for layer in layers
    ]
    margins = config.margins()
    images = 0
    for _ in range(config.epochs):
        for positions in splits.train_batches(config.batch_size, sources.data):
            x1, y = splits.images(
                "train", positions, augment_generator=sources.augment, device=device
            )
            x2, _ = splits.images(
                "train", positions, augment_generator=sources.augment, device=device
            )
            h = patchify(torch.cat([x1, x2]), config.patch)
            n = len(y)
            for layer, optimizer, margin in zip(layers, optimizers, margins, strict=True):
                h = layer(h.detach())
                f = h.mean(dim=1)
                loss = supcon_margin_loss(
                    f[:n],
                    f[n:],
                    y,
                    margin,
                    temperature=config.temperature,
                    margin_mode=config.margin_mode,
                    stability=config.stability,
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            images += n
    evaluate(layers, head, splits, config.patch, device, should_stop=lambda: False)
    return images


def trainer_loop(config: CFFConfig, seed: int) -> int:
    return CFFTrainer().run(config, seed, MemoryReporter()).diagnostics["stage1_images"]


def timed(
    loop: Callable[[CFFConfig, int], int], config: CFFConfig, seed: int
) -> tuple[int, float, float]:
    """(images trained on, images/s by wall clock, images/s by this process's CPU time)."""
    wall, cpu = time.perf_counter(), time.process_time()
    images = loop(config, seed)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return images, images / (time.perf_counter() - wall), images / (time.process_time() - cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--train-size", type=int, default=None, help="(default: the whole split)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 2 repeats (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    config = CFFConfig(
        dataset=args.dataset,
        image_size=args.image_size,
        width=args.width,
        depth=args.depth,
        heads=args.heads,
        batch_size=args.batch_size,
        train_size=args.train_size,
        epochs=args.epochs,
        head_epochs=0,
        select_by_validation=False,
        device=args.device,
    )
    # as the trainer's runs set it (TrainerBase.run), so that both loops use the same kernels
    torch.use_deterministic_algorithms(pick_device(config.device).type == "cpu")
    print(
        f"CFF stage 1: {config.dataset} {config.image_size}px, E={config.width} "
        f"L={config.depth} H={config.heads}, batch {config.batch_size}, {config.epochs} "
        f"epochs, device {config.device}, torch threads {torch.get_num_threads()}"
    )
    loops = {"bare": bare_loop, "seedgrid": trainer_loop}
    for loop in loops.values():  # warm-up: dataset cache, allocator, first calls
        loop(config.model_copy(update={"epochs": 1}), 0)
    rows = []
    for repeat in range(args.repeats):
        order = ("bare", "seedgrid") if repeat % 2 == 0 else ("seedgrid", "bare")
        sides = {side: timed(loops[side], config, repeat) for side in order}
        (bare_images, *bare), (seedgrid_images, *seedgrid) = sides["bare"], sides["seedgrid"]
        if bare_images != seedgrid_images:
            raise SystemExit(
                f"unequal work: the bare loop trained on {bare_images} images, the trainer on "
                f"{seedgrid_images}"
            )
        rows.append((*bare, *seedgrid))
        print(
            f"  repeat {repeat} ({order[0]} first): wall bare {bare[0]:8.1f} seedgrid "
            f"{seedgrid[0]:8.1f} img/s (ratio {seedgrid[0] / bare[0]:.3f});  cpu bare "
            f"{bare[1]:8.1f} seedgrid {seedgrid[1]:8.1f} img/s (ratio {seedgrid[1] / bare[1]:.3f})"
        )
    for clock, b, s in (("wall clock", 0, 2), ("CPU time", 1, 3)):
        ratio = statistics.median(r[s] / r[b] for r in rows)
        print(
            f"{clock:>10}: bare loop median {statistics.median(r[b] for r in rows):.1f} "
            f"images/s, seedgrid trainer median {statistics.median(r[s] for r in rows):.1f} "
            f"images/s, median ratio seedgrid/bare {ratio:.3f} (diagnostics overhead "
            f"{100 * (1 - ratio):.1f}%; target <= 10%: {'met' if ratio >= 0.9 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
