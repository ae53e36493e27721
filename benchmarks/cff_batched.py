"""Seeds per second of K `cff` seeds as one batched task against the same K seeds one after
another (each seed draws the same either way; its result differs by float32 rounding).

Both sides run in this process after a warm-up (dataset cache, allocator), with the same thread
count; each repeat times the K sequential runs and the batched task (each goes first in turn, so
that an order effect cancels in the median), by the wall clock and by this process's CPU time
(the figure to judge on a shared machine). The ratio is the median over repeats of the
per-repeat ratio.

    PYTHONPATH=. python benchmarks/cff_batched.py                 # digits 16x16, small ViT, CPU
    PYTHONPATH=. python benchmarks/cff_batched.py --smoke         # tiny ViT, K = 2, seconds (CI)
    PYTHONPATH=. python benchmarks/cff_batched.py --fake-cifar --image-size 32 --width 128 \\
        --depth 5 --batch-size 512 --epochs 1 --seeds 8 --device cuda --precision tf32

--fake-cifar writes full-size random CIFAR-10 files (tests/fake_datasets.py) into a temporary
data root, so the times are real and the accuracies meaningless.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from trainers import NullReporter
from trainers.cff import CFFConfig, CFFTrainer

# --smoke's defaults: a run of a few seconds on a CPU, through the same code path
SMOKE = {
    "image_size": 8,
    "width": 8,
    "depth": 1,
    "heads": 2,
    "batch_size": 32,
    "train_size": 64,
    "epochs": 1,
    "seeds": 2,
    "repeats": 2,
}


def timed(work: Callable[[], None], seeds: int) -> tuple[float, float]:
    """(seeds/s by wall clock, seeds/s by this process's CPU time) of `work()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return seeds / (time.perf_counter() - wall), seeds / (time.process_time() - cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--fake-cifar", action="store_true")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--head-epochs", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, K = 2, 2 repeats (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    dataset = args.dataset
    if args.fake_cifar:
        from tests.fake_datasets import write_cifar

        root = Path(tempfile.mkdtemp(prefix="seedgrid-fake-cifar-"))
        write_cifar(root, classes=10, per_batch=10000)
        os.environ["SEEDGRID_DATA_ROOT"] = str(root)
        dataset = "cifar10"
    config = CFFConfig(
        dataset=dataset,
        image_size=args.image_size,
        width=args.width,
        depth=args.depth,
        heads=args.heads,
        batch_size=args.batch_size,
        train_size=args.train_size,
        epochs=args.epochs,
        head_epochs=args.head_epochs,
        device=args.device,
        precision=args.precision,
    )
    trainer = CFFTrainer()
    seeds = list(range(args.seeds))
    print(
        f"cff: {config.dataset} {config.image_size}px, E={config.width} L={config.depth} "
        f"H={config.heads}, batch {config.batch_size}, {config.epochs} + {config.head_epochs} "
        f"epochs, {config.precision}, device {config.device}, {args.threads} thread(s), "
        f"K = {len(seeds)}"
    )

    def sequential() -> None:
        for seed in seeds:
            trainer.run(config, seed, NullReporter(), threads=args.threads)

    def batched() -> None:
        trainer.run_seeds(config, seeds, [NullReporter() for _ in seeds], threads=args.threads)

    arms = {"sequential": sequential, "batched": batched}
    warm = config.model_copy(update={"epochs": 1, "head_epochs": 1})
    trainer.run(warm, 0, NullReporter(), threads=args.threads)
    trainer.run_seeds(warm, seeds[:2], [NullReporter(), NullReporter()], threads=args.threads)
    rows = []
    for repeat in range(args.repeats):
        order = ("sequential", "batched") if repeat % 2 == 0 else ("batched", "sequential")
        sides = {side: timed(arms[side], len(seeds)) for side in order}
        one_by_one, together = sides["sequential"], sides["batched"]
        rows.append((*one_by_one, *together))
        print(
            f"  repeat {repeat} ({order[0]} first): wall {one_by_one[0]:.3f} -> "
            f"{together[0]:.3f} seeds/s ({together[0] / one_by_one[0]:.2f}x); cpu "
            f"{one_by_one[1]:.3f} -> {together[1]:.3f} seeds/s ({together[1] / one_by_one[1]:.2f}x)"
        )
    for clock, a, b in (("wall clock", 0, 2), ("CPU time", 1, 3)):
        print(
            f"{clock:>10}: sequential median {statistics.median(r[a] for r in rows):.3f} "
            f"seeds/s, batched median {statistics.median(r[b] for r in rows):.3f} seeds/s, "
            f"median ratio {statistics.median(r[b] / r[a] for r in rows):.2f}x"
        )


if __name__ == "__main__":
    main()
