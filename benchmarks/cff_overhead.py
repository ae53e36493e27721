"""What seedgrid's CFF diagnostics cost: stage-1 images/s of the trainer against a bare loop.

Both train the same model (same layers, init, data, augmentation and loss function) for the same
epochs in this process; the bare loop has no diagnostics (no clamp activation rate, no
per-layer gradient norms, no loss bookkeeping, no reporter). The trainer runs with
select_by_validation off and head_epochs 0 so both sides do stage-1 training only, and its
images/s is its own stage-1 wall time (it times its training batches, diagnostics included).
Repeats alternate the two to spread machine noise; the ratio is of medians. Target: the trainer
keeps at least 90% of the bare loop's throughput (diagnostics cost at most 10%).

    python benchmarks/cff_overhead.py                 # digits at 16x16, a small ViT, CPU
    python benchmarks/cff_overhead.py --width 128 --depth 5 --image-size 32 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainers import MemoryReporter
from trainers.cff import CFFConfig, build_layers, fit, patchify, supcon_margin_loss
from trainers.data import prepare_splits
from trainers.random_sources import random_sources
from trainers.runtime import deterministic_cpu, pick_device


def bare_loop(config: CFFConfig, seed: int) -> float:
    """Stage-1 images/s of a plain PyTorch loop over the same model, data and loss."""
    device = pick_device(config.device)
    sources = random_sources(seed)
    splits = prepare_splits(config, sources)
    channels, side, _ = splits.data.image_shape
    layers = build_layers(config, channels, side, sources.init).to(device)
    optimizers = [torch.optim.AdamW(layer.parameters(), lr=config.lr,
                                    weight_decay=config.weight_decay) for layer in layers]
    margins = config.margins()
    images = 0
    started = time.perf_counter()
    for _ in range(config.epochs):
        for positions in splits.train_batches(config.batch_size, sources.data):
            x1, y = splits.images("train", positions, augment_generator=sources.augment,
                                  device=device)
            x2, _ = splits.images("train", positions, augment_generator=sources.augment,
                                  device=device)
            h = patchify(torch.cat([x1, x2]), config.patch)
            n = len(y)
            for layer, optimizer, margin in zip(layers, optimizers, margins, strict=True):
                h = layer(h.detach())
                f = h.mean(dim=1)
                loss = supcon_margin_loss(f[:n], f[n:], y, margin,
                                          temperature=config.temperature,
                                          margin_mode=config.margin_mode,
                                          stability=config.stability)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            images += n
    if device.type == "cuda":
        torch.cuda.synchronize()
    return images / (time.perf_counter() - started)


def trainer_loop(config: CFFConfig, seed: int) -> float:
    result = fit(config, seed, MemoryReporter()).result
    return result.diagnostics["stage1_images_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    config = CFFConfig(
        dataset=args.dataset, image_size=args.image_size, width=args.width, depth=args.depth,
        heads=args.heads, batch_size=args.batch_size, epochs=args.epochs, head_epochs=0,
        select_by_validation=False, device=args.device,
    )
    if pick_device(config.device).type == "cpu":
        deterministic_cpu()
    print(f"CFF stage 1: {config.dataset} {config.image_size}px, E={config.width} "
          f"L={config.depth} H={config.heads}, batch {config.batch_size}, {config.epochs} "
          f"epochs, device {config.device}, torch threads {torch.get_num_threads()}")
    bare_loop(config.model_copy(update={"epochs": 1}), 0)  # warm-up: dataset cache, allocator
    bare, seedgrid = [], []
    for repeat in range(args.repeats):
        bare.append(bare_loop(config, repeat))
        seedgrid.append(trainer_loop(config, repeat))
        print(f"  repeat {repeat}: bare {bare[-1]:8.1f} img/s   seedgrid {seedgrid[-1]:8.1f} "
              f"img/s   ratio {seedgrid[-1] / bare[-1]:.3f}")
    b, s = statistics.median(bare), statistics.median(seedgrid)
    ratio = s / b
    print(f"bare PyTorch loop, median: {b:.1f} images/s")
    print(f"seedgrid trainer (CAR, per-layer grad norms and losses, reporter), median: "
          f"{s:.1f} images/s")
    print(f"throughput ratio seedgrid/bare: {ratio:.3f}  (diagnostics overhead "
          f"{100 * (1 - ratio):.1f}%; target <= 10%: {'met' if ratio >= 0.9 else 'NOT met'})")


if __name__ == "__main__":
    main()
