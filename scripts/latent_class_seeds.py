"""Paper 001's latent-class simulation over many seeds: the frequency effect per seed and
across seeds (the table in docs/design-notes.md, `ssl` section).

Runs the `ssl_sim` trainer itself (simulation latent_class, one thread per process) for each
seed and reads its per-class mean-norm curves at the given epochs (epoch 0 is the untrained
network). Per epoch it prints the seed-mean norm of each class with its standard error, the
mean rank correlation between class frequency and norm with a one-sample t-test, how many
seeds have the most frequent class above the rarest and all classes in frequency order, and
each class's growth over its untrained norm relative to the rarest class's.

    python scripts/latent_class_seeds.py                      # seeds 0-47, notebook settings
    python scripts/latent_class_seeds.py --seeds 24 --spread 0.1 --epochs 100
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from scipy import stats


def curves(seed: int, spread: float, epochs: int, lr: float) -> np.ndarray:
    """The per-class mean norms of one seed, shape (epochs + 1, classes)."""
    import torch

    from trainers import MemoryReporter, get_trainer

    torch.set_num_threads(1)
    trainer = get_trainer("ssl_sim")
    config = trainer.Config(simulation="latent_class", class_spread=spread, epochs=epochs, lr=lr)
    reporter = MemoryReporter()
    trainer.run(config, seed, reporter)
    k = len(config.class_weights)
    return np.array([[v for _, v in reporter.curve(f"norm_class{c}")] for c in range(k)]).T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=48)
    parser.add_argument("--spread", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument(
        "--report",
        type=int,
        nargs="+",
        default=[0, 50, 100],
        help="epochs to report (0 = untrained)",
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    seeds = list(range(args.seeds))
    with ProcessPoolExecutor(args.workers) as pool:
        runs = np.stack(
            list(
                pool.map(
                    curves,
                    seeds,
                    [args.spread] * len(seeds),
                    [args.epochs] * len(seeds),
                    [args.lr] * len(seeds),
                )
            )
        )
    n, _, k = runs.shape
    frequency = np.arange(k)  # class c has weight 2^c: ranks are the class indices
    print(f"latent-class simulation: {n} seeds, spread {args.spread}, lr {args.lr}")
    for epoch in args.report:
        if epoch > args.epochs:
            continue
        norms = runs[:, epoch]
        sem = norms.std(axis=0, ddof=1) / np.sqrt(n)
        print(
            f"epoch {epoch}: mean norm per class "
            + ", ".join(f"{m:.2f} ± {s:.2f}" for m, s in zip(norms.mean(0), sem, strict=True))
        )
        most_over_rarest = int((norms[:, -1] > norms[:, 0]).sum())
        ordered = int(np.all(np.diff(norms, axis=1) > 0, axis=1).sum())
        print(
            f"  most frequent > rarest in {most_over_rarest}/{n} seeds; "
            f"full frequency order in {ordered}/{n}"
        )
        if epoch == 0:
            continue
        rho = np.array([stats.spearmanr(frequency, row).statistic for row in norms])
        test = stats.ttest_1samp(rho, 0.0)
        rho_sem = rho.std(ddof=1) / np.sqrt(n)
        print(
            f"  Spearman(frequency, norm) mean {rho.mean():.3f} ± {rho_sem:.3f}"
            f" (t-test against 0: p = {test.pvalue:.1e})"
        )
        growth = norms / runs[:, 0]
        versus_rarest = 100 * (growth - growth[:, :1])
        print(
            "  growth over the untrained norm minus the rarest class's, points: "
            + ", ".join(
                f"{m:+.1f} ± {s:.1f}"
                for m, s in zip(
                    versus_rarest.mean(0), versus_rarest.std(0, ddof=1) / np.sqrt(n), strict=True
                )
            )
        )
        middle = 100 * (growth[:, 2] - growth[:, 1])
        print(
            f"  frequency 4 vs 2 (the middle classes): {middle.mean():+.1f} ± "
            f"{middle.std(ddof=1) / np.sqrt(n):.1f} points"
        )


if __name__ == "__main__":
    main()
