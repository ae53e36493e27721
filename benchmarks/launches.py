"""What each training step would launch on a GPU, counted on the CPU: device-side ops, host-device
syncs and host-to-device copies per seed per training step, solo and in seed-batched tasks.

This is seedgrid's GPU-efficiency gauge until a GPU is lent (on an H200, measured in 2026-11, the
cff step was launch-bound). A K-seed task is only about K times cheaper per seed when the ops
of a step fall about K-fold and its syncs do not stay per seed; this script counts both.

How it counts. Every trainer runs its paper-scale example model (the example's config and the
first level of each grid axis, as benchmarks/gpu_throughput.py takes it) on the CPU, with small
data: --batch-size examples a batch (the number of ops a step launches does not depend on the
batch size, unless a step loops over its examples in Python). A `TorchDispatchMode` sees every
aten op dispatched; a training step's share is the difference between a one-epoch run of 4
batches and one of 2 (set-up, data loading, the epoch's evaluation and the final results cancel
out), divided by the seed-steps it adds: 2 training steps (batches) per seed, times K (collapse,
which trains by full-batch gradient descent: 4 steps against 2). A trainer with an optimiser per
layer (cff) steps each of them in one training step.

    ops     non-view aten ops other than allocations (`empty*`): on a GPU, each is about one
            kernel launch (an optimiser's foreach kernels count once per op, as on a GPU:
            optimisers are made to take their foreach path here, their GPU default);
    syncs   points where a GPU run's host would wait for the device: a tensor read into Python
            (`item`, `float`, `bool`, `tolist`, `numpy`), data-dependent shapes (`nonzero`,
            `masked_select`, `unique`), `linalg` error checks; not an optimiser reading its
            step count, which a GPU run keeps on the host. An upper bound: on the CPU every
            tensor is a host tensor, and a read of one that a GPU run keeps on the host too
            (batch indices, numbers drawn from a CPU generator) counts here but not there;
    copies  tensors the host builds from Python data (`torch.tensor(...)`, `lift_fresh`), and
            host tensors an op on the device reads (random numbers drawn from the seeds' CPU
            generators, and what the host computes from them alone, which launches nothing
            and is not counted in ops): on a GPU, each a host-to-device copy.

The modes: `solo` (Trainer.run of one seed), `K=1` and `K=8` (Trainer.run_seeds of K seeds: a
batched computation for a batched trainer, one seed after another otherwise). Deterministic
algorithms stay on, as the runtime sets them on a CPU (they change which kernel runs, hardly how
many). What the counts cannot see: kernel fusion inside one aten op,
cuDNN's algorithm choice, the cost of a kernel, copies `.to(device)` makes on a GPU of a tensor
that already lives there on the CPU.

    python benchmarks/launches.py                    # every trainer, K = 1 8
    python benchmarks/launches.py --trainers cff --k 1 4 8 --json launches.json
    python benchmarks/launches.py --smoke            # tiny models, K = 1 2 (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

import gpu_throughput as gt  # noqa: E402
import torch  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.weak import WeakTensorKeyDictionary  # noqa: E402

from api_schemas import environment  # noqa: E402
from trainers import stacked_ops  # noqa: E402
from trainers.base import NullReporter  # noqa: E402

# Ops that allocate or only read metadata: no kernel on a GPU.
NO_KERNEL = frozenset(
    {
        "empty",
        "empty_strided",
        "empty_like",
        "new_empty",
        "new_empty_strided",
        "lift_fresh",
        "_local_scalar_dense",
        "_local_scalar_dense (host)",
        "set_",
        "resize_",
        "detach",
        "alias",
        "_unsafe_view",  # a view the autograd graph does not track: no data moves
        "_record_function_enter_new",  # profiler markers
        "_record_function_exit",
    }
)
# What an op run on host tensors is recorded as: the host computes it, no kernel is launched.
HOST = " (host)"
# A host tensor an op on the device reads: copied there (once per tensor).
TO_DEVICE = "host-to-device"
# Ops whose result decides a shape, or a Python value: the host waits for the device.
SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "_linalg_check_errors",
        "is_nonzero",
        "equal",
    }
)
COPY_OPS = frozenset({"lift_fresh", TO_DEVICE})

CASES = {case.name: case for case in gt.CASES}
CASES_ADDED = {
    "feedback_vit": gt.Case(
        "feedback_vit",
        "feedback",
        "examples/feedback_vit_mini_cifar10.yaml",
        "epoch",
        0,
        {"width": 16, "depth": 1, "heads": 2, "batch_size": 32},
    )
}
ALL_CASES = {**CASES, **CASES_ADDED}
DEFAULT_CASES = ("cff", "feedback_resmlp", "feedback_vit", "ssl", "collapse", "ssl_sim")
# The two epoch lengths whose difference is what a training step costs.
FEW_BATCHES, MANY_BATCHES = 2, 4


class Counting(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active (this thread only: the trainers run
    in the caller's thread when called directly).

    Host tensors: what a GPU run computes on the host. Random numbers come from the seeds' CPU
    generators, so an op given a generator runs on the host, and so does an op whose every
    tensor input is a host tensor (arithmetic on the draws, their stacking, a slice of a
    shuffle): such ops are recorded as `name (host)` and launch nothing, and a new tensor they
    make is a host tensor (an in-place draw, a layer's initialisation, is not tracked). An op
    on the device that reads a host tensor has it copied there first: one host-to-device copy
    per tensor (views of one tensor: one copy). A host tensor moved with `.to(device)` (a
    no-op on a CPU) is counted as copied there and is a device tensor from then on. Index
    arrays the host made outside an op the mode sees (a split's positions, from numpy) are host
    tensors too: an integer or boolean tensor that no device op made and no `.to(device)`
    moved."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()  # every op by name
        self.views: set[str] = set()  # the names of those that only make a view
        self.host: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.copied: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.device: WeakTensorKeyDictionary = WeakTensorKeyDictionary()  # known on the device
        self._to = torch.Tensor.to

    def __enter__(self) -> Counting:
        counting, to = self, self._to

        def moved(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            out = to(tensor, *args, **kwargs)
            devices = [
                a for a in (*args, kwargs.get("device")) if isinstance(a, torch.device | str)
            ]
            if devices:
                if tensor in counting.host:
                    counting.copy(tensor)
                    del counting.host[tensor]  # on the device from here on
                    counting.host.pop(out, None)
                counting.device[tensor] = counting.device[out] = True
            return out

        torch.Tensor.to = moved  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        torch.Tensor.to = self._to  # type: ignore[method-assign]
        super().__exit__(*exc)

    def copy(self, tensor: torch.Tensor) -> None:
        """A host tensor the device reads: one copy, once (views of one tensor: one copy)."""
        base = tensor if tensor._base is None else tensor._base
        if base not in self.copied:
            self.copied[base] = True
            self.ops[TO_DEVICE] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name == "_local_scalar_dense" and _in_optimiser():
            # an optimiser reading its step count: on a GPU that count stays on the host
            # (torch.optim's default, not capturable), so the read waits for nothing
            name = "_local_scalar_dense (host)"
        leaves = pytree.tree_leaves((args, kwargs))
        inputs = [t for t in leaves if isinstance(t, torch.Tensor)]
        drawn = any(isinstance(leaf, torch.Generator) for leaf in leaves)
        on_host = drawn or (bool(inputs) and all(self.on_host(t) for t in inputs))
        if on_host:
            name += HOST
        else:
            for tensor in inputs:
                if tensor in self.host:
                    self.copy(tensor)
        self.ops[name] += 1
        if func.is_view:
            self.views.add(name)
        out = func(*args, **kwargs)
        # a draw into an existing tensor (a layer's initialisation) leaves it where it lives:
        # a GPU run draws on the host and moves the layer to the device, which a CPU cannot show
        made = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if on_host and not func._schema.is_mutable:
            for tensor in made:
                self.host[tensor] = True
        elif not on_host:
            for tensor in made:
                self.device[tensor] = True
        return out

    def on_host(self, tensor: torch.Tensor) -> bool:
        """A host tensor: made on the host (a draw, or an op of host tensors alone), or an
        index array no device op made and no `.to(device)` moved."""
        if tensor in self.host:
            return True
        return not tensor.is_floating_point() and tensor not in self.device


def _in_optimiser() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if "/torch/optim/" in frame.f_code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


@dataclass
class Counts:
    ops: float
    syncs: float
    copies: float


def tally(ops: Counter[str], reads: int, views: Collection[str] = ()) -> Counts:
    kernels = sum(
        n
        for name, n in ops.items()
        if name not in NO_KERNEL
        and name not in views
        and name not in COPY_OPS
        and not name.endswith(HOST)
    )
    syncs = sum(ops[name] for name in SYNC_OPS) + reads
    return Counts(kernels, syncs, sum(ops[name] for name in COPY_OPS))


@contextmanager
def gpu_like() -> Iterator[dict[str, int]]:
    """Optimisers on their foreach path (their GPU default), the stacked layer norms fused as
    on a GPU, and host reads of tensors that dispatch no op on a CPU (`tolist`, `numpy`)
    counted."""
    reads = {"n": 0}
    # every optimiser module binds the chooser under its own name (`from .optimizer import`):
    # each binding is replaced, not only optimizer's
    choosers = {
        module: module._default_to_fused_or_foreach
        for name, module in list(sys.modules.items())
        if (name == "torch.optim" or name.startswith("torch.optim."))
        and hasattr(module, "_default_to_fused_or_foreach")
    }
    tolist, numpy = torch.Tensor.tolist, torch.Tensor.numpy

    def foreach(*args: Any, **kwargs: Any) -> tuple[bool, bool]:
        return False, True

    def counted(method: Any) -> Any:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            reads["n"] += 1
            return method(self, *args, **kwargs)

        return read

    for module in choosers:
        module._default_to_fused_or_foreach = foreach
    fused_norm = dict(stacked_ops.FUSED_NORM)
    stacked_ops.FUSED_NORM["cpu"] = True  # the stacked layer norms as on a GPU
    torch.Tensor.tolist = counted(tolist)  # type: ignore[method-assign]
    torch.Tensor.numpy = counted(numpy)  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        for module, chooser in choosers.items():
            module._default_to_fused_or_foreach = chooser
        stacked_ops.FUSED_NORM.clear()
        stacked_ops.FUSED_NORM.update(fused_norm)
        torch.Tensor.tolist, torch.Tensor.numpy = tolist, numpy  # type: ignore[method-assign]


def sized(config: Any, batches: int, batch_size: int) -> Any:
    """The config trained for one epoch of `batches` batches of `batch_size` examples (collapse,
    full-batch gradient descent: `batches` steps), its test sets one batch."""
    fields = type(config).model_fields
    if "steps" in fields:  # collapse
        changes: dict[str, Any] = {"steps": batches, "log_every": batches}
        return type(config).model_validate({**config.model_dump(), **changes})
    changes = {"epochs": 1}
    if "batch_size" in fields:
        changes["batch_size"] = batch_size
    for name in ("train_size", "student_train_size", "n_samples"):
        if name in fields:
            changes[name] = batches * batch_size
    for name in ("test_size", "student_test_size", "eval_batch_size"):
        if name in fields:
            changes[name] = batch_size
    if "head_epochs" in fields:
        changes["head_epochs"] = 0
    if "warmup_epochs" in fields:
        changes["warmup_epochs"] = 0
    if "eval_every" in fields:
        changes["eval_every"] = 100_000  # the kNN monitor (its most): not a training step's
    return type(config).model_validate({**config.model_dump(), **changes})


def measure(trainer: Any, config: Any, k: int | None) -> Counts:
    """Counts of one run (k None: Trainer.run of seed 0) or task (run_seeds of k seeds)."""
    with gpu_like() as reads, Counting() as counting:
        if k is None:
            trainer.run(config, seed=0, reporter=NullReporter(), threads=1)
        else:
            outcomes = trainer.run_seeds(
                config, list(range(k)), [NullReporter() for _ in range(k)], threads=1
            )
            failed = [o for o in outcomes if isinstance(o, Exception)]
            if failed:
                raise failed[0]
    return tally(counting.ops, reads["n"], counting.views)


def step_counts(trainer: Any, config: Any, batch_size: int, k: int | None) -> Counts:
    """What FEW_BATCHES more training steps add to a run or task (an epoch of MANY_BATCHES
    batches minus one of FEW_BATCHES): set-up, data loading, the epoch's evaluation and the
    final results cancel out."""
    few = measure(trainer, sized(config, FEW_BATCHES, batch_size), k)
    many = measure(trainer, sized(config, MANY_BATCHES, batch_size), k)
    return Counts(many.ops - few.ops, many.syncs - few.syncs, many.copies - few.copies)


@dataclass
class Row:
    case: str
    trainer: str
    batched: bool
    mode: str
    ops: float
    syncs: float
    copies: float


def run_case(name: str, ks: Sequence[int], *, smoke: bool, batch_size: int) -> list[Row]:
    case = ALL_CASES[name]
    trainer = gt.trainer_named(case.trainer)
    config, _ = gt.case_config(
        case, smoke=smoke, device="cpu", precision=None, data_root=_data_root(config_of(case))
    )
    steps = MANY_BATCHES - FEW_BATCHES  # training steps a seed gains
    # a run first, so that what a process makes once (data caches, device constants) is made
    # before the counted runs, not in the first of them
    measure(trainer, sized(config, FEW_BATCHES, batch_size), None)
    rows = []
    for mode, k in [("solo", None), *((f"K={k}", k) for k in ks)]:
        epoch = step_counts(trainer, config, batch_size, k)
        seed_steps = steps * (k or 1)
        rows.append(
            Row(
                name,
                case.trainer,
                trainer.batched,
                mode,
                epoch.ops / seed_steps,
                epoch.syncs / seed_steps,
                epoch.copies / seed_steps,
            )
        )
    return rows


def config_of(case: gt.Case) -> Any:
    config, _ = gt.case_config(case, smoke=True, device="cpu", precision=None, data_root=None)
    return config


FAKE: dict[str, str] = {}


def _data_root(config: Any) -> str | None:
    dataset = gt.needs_files(config)
    if dataset is None:
        return None
    if dataset not in FAKE:
        folder = tempfile.mkdtemp(prefix="seedgrid-launches-")
        gt.write_fake(Path(folder), dataset, smoke=True)
        FAKE[dataset] = folder
        roots = environment.text(environment.DATA_ROOTS)
        entry = f"launches-{dataset}={folder}"
        environment.set_text(environment.DATA_ROOTS, ",".join(filter(None, [roots, entry])))
    return f"launches-{dataset}"


def table(rows: Sequence[Row]) -> str:
    lines = [
        "per seed per training step, counted on the CPU (see the docstring): device ops, "
        "host-device syncs, host-to-device copies",
        f"{'trainer':<20} {'mode':<6} {'ops':>9} {'syncs':>7} {'copies':>7}  vs solo",
    ]
    solo = {r.case: r for r in rows if r.mode == "solo"}
    for r in rows:
        base = solo[r.case].ops
        ratio = f"{base / r.ops:6.2f}x fewer ops" if r.mode != "solo" and r.ops > 0 else ""
        lines.append(
            f"{r.case:<20} {r.mode:<6} {r.ops:9.1f} {r.syncs:7.2f} {r.copies:7.2f}  {ratio}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", nargs="+", default=list(DEFAULT_CASES), choices=ALL_CASES)
    parser.add_argument("--k", nargs="+", type=int, default=None, help="(default 1 8; --smoke 1 2)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="tiny models, K = 1 2 (CI)")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    ks = args.k or ([1, 2] if args.smoke else [1, 8])
    rows: list[Row] = []
    for name in args.trainers:
        rows += run_case(name, ks, smoke=args.smoke, batch_size=args.batch_size)
        print(f"counted {name}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
