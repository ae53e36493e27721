"""The one place that turns a run's seed into random generators (docs/architecture.md).

Each source of seed-to-seed variance gets its own named generator so that a user can hold one
fixed and vary another: `init` (parameters, fixed random matrices), `data` (splits, subsampling,
shuffling, label noise) and `augment` (augmentation and other per-step noise). `evaluate` feeds
evaluation only (say the augmented views of a kNN bank), so that how often a run evaluates never
changes what it trains. Trainers never touch global random state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from api_schemas import MAX_SEED, RANDOM_SOURCES

SOURCES = RANDOM_SOURCES


def derive_seed(seed: int, source: str) -> int:
    """A 63-bit seed for one source: independent streams from one run seed, stable across runs."""
    if source not in SOURCES:
        raise ValueError(f"unknown random source {source!r}; expected one of {SOURCES}")
    digest = hashlib.blake2b(f"seedgrid:{source}:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class RandomSources:
    seed: int
    init: torch.Generator
    data: torch.Generator
    augment: torch.Generator
    evaluate: torch.Generator
    init_np: np.random.Generator
    data_np: np.random.Generator
    augment_np: np.random.Generator
    # The seed each source was made from: the run's seed unless an override pinned it.
    source_seeds: dict[str, int]


def random_sources(
    seed: int, overrides: dict[str, int] | None = None, device: str | torch.device = "cpu"
) -> RandomSources:
    """Generators for the four sources; `overrides` pins a source to another seed."""
    overrides = checked_overrides(overrides)
    source_seeds = {s: overrides.get(s, seed) for s in SOURCES}
    seeds = {s: derive_seed(source_seeds[s], s) for s in SOURCES}
    gens = {}
    for source, s in seeds.items():
        g = torch.Generator(device=device)
        g.manual_seed(s)
        gens[source] = g
    return RandomSources(
        seed=seed,
        init=gens["init"],
        data=gens["data"],
        augment=gens["augment"],
        evaluate=gens["evaluate"],
        init_np=np.random.default_rng(seeds["init"]),
        data_np=np.random.default_rng(seeds["data"]),
        augment_np=np.random.default_rng(seeds["augment"]),
        source_seeds=source_seeds,
    )


def checked_overrides(overrides: dict[str, int] | None) -> dict[str, int]:
    """`overrides` as a plain dict once every name is a source and every seed an int in
    [0, MAX_SEED]: they come from a spec through the service, and are refused here rather than
    turned into generators when anything else reaches a worker."""
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise ValueError(
            f"source seeds must be a dict of source -> seed, not {type(overrides).__name__}"
        )
    unknown = set(overrides) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown random sources {sorted(map(str, unknown))}; expected {SOURCES}")
    for source, seed in overrides.items():
        if type(seed) is not int or not 0 <= seed <= MAX_SEED:
            raise ValueError(
                f"the seed of random source {source!r} must be an int in "
                f"[0, {MAX_SEED}], not {seed!r}"
            )
    return dict(overrides)
