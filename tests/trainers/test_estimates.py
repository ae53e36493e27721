"""Resource estimates (`Trainer.estimate`): logged points against real runs, parameter counts
against the real models, memory against the measured peak of CPU runs, the bundled examples
under the service's default limits, and the oversized specs the service must refuse."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from trainers import REGISTRY, MemoryReporter, ResourceEstimate, get_trainer
from trainers.cff import build_head, build_layers, cff_parameters
from trainers.data import load_images
from trainers.estimates import dataset_bytes, dataset_shape
from trainers.feedback import FeedbackConfig, build_model
from trainers.feedback.estimate import feedback_parameters, trainable_parameters
from trainers.feedback.trainer import freeze_untrained
from trainers.ssl import SSLConfig, SSLModel, ssl_parameters

GIB = 2**30
# The service's defaults (SEEDGRID_MAX_RUN_MEMORY_GB, SEEDGRID_MAX_POINTS_PER_RUN).
MAX_RUN_MEMORY = 64 * GIB
MAX_POINTS = 1_000_000
# An estimate is at least the measured peak and at most this many times it.
MAX_OVERESTIMATE = 4.0
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """Tiny models run fastest on one thread (two contend with other processes on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def estimate(trainer: str, **config: Any) -> ResourceEstimate:
    t = get_trainer(trainer)
    return t.estimate(t.Config(**config))


# ---------------------------------------------------------------------------------------------
# logged points: the estimate counts what a run logs

CFF_TINY = dict(
    dataset="digits",
    image_size=8,
    width=16,
    depth=2,
    heads=2,
    patch=4,
    epochs=2,
    head_epochs=2,
    batch_size=256,
    device="cpu",
)
SSL_TINY = dict(
    dataset="digits",
    image_size=8,
    backbone="resnet_small",
    proj_dim=16,
    pred_hidden=8,
    epochs=3,
    warmup_epochs=1,
    batch_size=512,
    knn_k=20,
    eval_every=2,
    device="cpu",
)
STUDENT = dict(
    arch="studentnet",
    width=16,
    depth=3,
    epochs=2,
    student_input_dim=12,
    student_train_size=256,
    student_test_size=64,
    eval_batch_size=64,
    batch_size=128,
    device="cpu",
)
DIGITS_MLP = dict(
    arch="resmlp", dataset="digits", width=16, depth=2, epochs=2, batch_size=512, device="cpu"
)
DIGITS_VIT = dict(
    arch="vit_mini",
    dataset="digits",
    image_size=8,
    patch=4,
    width=16,
    depth=2,
    heads=2,
    epochs=2,
    batch_size=512,
    device="cpu",
)

EXACT_POINTS = [
    ("collapse", dict(n_samples=40, n_classes=4, steps=25, log_every=4)),
    (
        "collapse",
        dict(n_samples=40, n_classes=4, steps=24, log_every=4, stop_gradient=True, loss="cosine"),
    ),
    ("collapse", dict(n_samples=40, n_classes=4, steps=30)),  # default log_every
    ("cff", CFF_TINY),
    ("cff", {**CFF_TINY, "depth": 3, "select_by_validation": False, "head_epochs": 1}),
    ("ssl", {**SSL_TINY, "method": "simclr", "held_out_classes": 2}),
    ("ssl", {**SSL_TINY, "method": "simsiam"}),
    ("ssl", {**SSL_TINY, "method": "byol", "epochs": 2, "eval_every": 1}),
    ("ssl_sim", dict(simulation="convergence", n_pairs=20, max_steps=50)),
    ("ssl_sim", dict(simulation="convergence", n_pairs=20, initial_norm=8.0, max_steps=30)),
    ("ssl_sim", dict(simulation="latent_class", n_samples=100, epochs=3, batch_size=50)),
    ("feedback", {**DIGITS_MLP, "method": "bp"}),
    ("feedback", {**DIGITS_MLP, "method": "fa", "cosine_pairing": "input", "depth": 3}),
    ("feedback", {**DIGITS_VIT, "method": "dfa"}),
    ("feedback", {**STUDENT, "method": "fa", "frozen_blocks": True}),
]


@pytest.mark.parametrize(
    ("trainer", "config"), EXACT_POINTS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(EXACT_POINTS)]
)
def test_logged_points_equal_what_a_run_logs(trainer: str, config: dict[str, Any]) -> None:
    t = get_trainer(trainer)
    reporter = MemoryReporter()
    result = t.run(t.Config(**config), 0, reporter)
    assert result.finished
    assert t.estimate(t.Config(**config)).logged_points == len(reporter.points)


def test_ssl_points_bound_a_run_whose_classes_lack_training_images() -> None:
    """Four training images cover at most four of the ten classes: their per-class norms are
    all the run logs, the estimate counts ten (an upper bound, within 2x here)."""
    config = {**SSL_TINY, "train_size": 4, "epochs": 2, "eval_every": 1}
    reporter = MemoryReporter()
    get_trainer("ssl").run(SSLConfig(**config), 0, reporter)
    logged = len(reporter.points)
    bound = estimate("ssl", **config).logged_points
    assert logged < bound <= 2 * logged


def test_a_convergence_run_logs_two_points_whatever_its_steps() -> None:
    """steps_to_converge and final_mean_cos once, at the end: max_steps does not count."""
    assert estimate("ssl_sim", max_steps=10_000_000).logged_points == 2


# ---------------------------------------------------------------------------------------------
# parameter counts: the formulas against the trainers' own models


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(width=48, depth=3, heads=4, patch=2, mlp_ratio=3, image_size=16),
        dict(
            dataset="synthetic",
            synthetic_classes=7,
            width=24,
            heads=3,
            patch=8,
            image_size=16,
            depth=1,
            mlp_ratio=1,
        ),
        dict(rgb=False, image_size=12, patch=3, width=20, heads=5),
    ],
)
def test_cff_parameter_count_is_the_models(overrides: dict[str, Any]) -> None:
    config = get_trainer("cff").Config(**{**CFF_TINY, **overrides})
    shape = dataset_shape(config)
    g = torch.Generator().manual_seed(0)
    layers = build_layers(config, shape.channels, shape.side, g)
    head = build_head(config.width, shape.num_classes, g)
    assert cff_parameters(config, shape.channels, shape.side, shape.num_classes) == numel(
        layers
    ) + numel(head)


@pytest.mark.parametrize(
    "overrides",
    [
        {**DIGITS_MLP},
        {**DIGITS_MLP, "width": 40, "depth": 5, "image_size": 16, "rgb": False},
        {**DIGITS_MLP, "frozen_blocks": True, "embed_credit": "none"},
        {**STUDENT, "teacher_classes": 7, "student_input_dim": 5},
        {**STUDENT, "frozen_blocks": True},
        {**DIGITS_VIT},
        {
            **DIGITS_VIT,
            "width": 24,
            "heads": 3,
            "patch": 2,
            "mlp_ratio": 3,
            "depth": 3,
            "frozen_blocks": True,
        },
        {**DIGITS_VIT, "image_size": 16, "embed_credit": "none"},
    ],
)
def test_feedback_parameter_counts_are_the_models(overrides: dict[str, Any]) -> None:
    """All parameters, and those the run trains (frozen_blocks freezes the branch weights,
    embed_credit none the embedding, as `fit` does)."""
    from trainers.feedback.estimate import task_shape

    config = FeedbackConfig(**overrides)
    task = task_shape(config)
    model = build_model(
        config, task.input_shape, task.num_classes, torch.Generator().manual_seed(0)
    )
    freeze_untrained(model, config)
    assert feedback_parameters(config, task.input_shape, task.num_classes) == numel(model)
    assert trainable_parameters(config, task.input_shape, task.num_classes) == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )


@pytest.mark.parametrize(
    ("method", "backbone", "channels"),
    [
        ("simclr", "resnet18", 3),
        ("simsiam", "resnet18", 3),
        ("byol", "resnet_small", 3),
        ("simclr", "resnet_small", 1),
        ("simsiam", "resnet_small", 3),
    ],
)
def test_ssl_parameter_count_is_the_models(method: str, backbone: str, channels: int) -> None:
    config = SSLConfig(method=method, backbone=backbone, proj_dim=96, pred_hidden=40)
    model = SSLModel(config, channels, torch.Generator().manual_seed(0))
    assert ssl_parameters(config, channels) == numel(model)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(dataset="digits"),
        dict(dataset="digits", image_size=16, rgb=False),
        dict(
            dataset="synthetic",
            synthetic_classes=3,
            synthetic_train_per_class=5,
            synthetic_test_per_class=2,
            image_size=8,
        ),
    ],
)
def test_dataset_term_is_the_decoded_dataset(overrides: dict[str, Any]) -> None:
    """uint8 images of both splits at the model's resolution and int64 labels."""
    config = get_trainer("cff").Config(**{**CFF_TINY, **overrides})
    data = load_images(
        config.dataset,
        image_size=config.image_size,
        rgb=config.rgb,
        synthetic=(
            config.synthetic_classes,
            config.synthetic_train_per_class,
            config.synthetic_test_per_class,
            config.synthetic_difficulty,
            config.synthetic_seed,
        ),
    )
    decoded = sum(
        t.numel() * t.element_size() for t in (data.train_x, data.train_y, data.test_x, data.test_y)
    )
    assert dataset_bytes(dataset_shape(config)) == decoded


# ---------------------------------------------------------------------------------------------
# memory: the estimate bounds the measured peak of a CPU run (tests/peak_memory.py), tightly

# A warm-up only has to take the trainer's code paths once (its dataset is decoded again for
# the measured run): 64 images a split do, in 1.2 s less than all of digits for cff and ssl
# together, and the measured peaks stay within 0.2% of those after full warm-ups.
TINY_WARMUP_DATA = {"train_size": 64, "test_size": 64}
MEMORY_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    # (trainer, warm-up config, measured config): one mid-size run per trainer, two for feedback
    # (StudentNet's data and labelling; ViT-Mini's two forward graphs under BP)
    (
        "collapse",
        dict(n_samples=40, steps=2),
        dict(n_samples=6_000, n_classes=50, dim=40, steps=2, log_every=1),
    ),
    (
        "cff",
        {**CFF_TINY, "epochs": 1, "head_epochs": 1, **TINY_WARMUP_DATA},
        {
            **CFF_TINY,
            "image_size": 16,
            "patch": 2,
            "width": 64,
            "heads": 4,
            "epochs": 1,
            "head_epochs": 1,
            "batch_size": 512,
            "train_size": 512,
            "test_size": 128,
            "val_fraction": 0.05,
        },
    ),
    (
        "ssl",
        {**SSL_TINY, "epochs": 1, **TINY_WARMUP_DATA},
        {
            **SSL_TINY,
            "image_size": 32,
            "method": "simsiam",
            "proj_dim": 64,
            "pred_hidden": 32,
            "epochs": 1,
            "batch_size": 128,
            "train_size": 128,
            "test_size": 128,
        },
    ),
    ("ssl_sim", dict(n_pairs=10, max_steps=3), dict(n_pairs=100_000, dim=32, max_steps=2)),
    (
        "feedback",
        {**STUDENT, "epochs": 1},
        {
            **STUDENT,
            "width": 64,
            "depth": 2,
            "epochs": 1,
            "student_train_size": 150_000,
            "teacher_width": 256,
            "batch_size": 50_000,
            "method": "dfa",
        },
    ),
    (
        "feedback",
        {**DIGITS_VIT, "epochs": 1},
        {
            **DIGITS_VIT,
            "image_size": 16,
            "patch": 2,
            "width": 32,
            "heads": 4,
            "epochs": 1,
            "batch_size": 256,
            "eval_batch_size": 256,
            "method": "bp",
            "train_size": 256,
            "test_size": 256,
        },
    ),
]


@pytest.fixture(scope="module")
def measured_peaks() -> list[int]:
    """The peak of every MEMORY_CASES run, measured in one fresh process."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    cases = [{"trainer": t, "warmup": w, "config": c} for t, w, c in MEMORY_CASES]
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "peak_memory.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    return [json.loads(line)["peak_bytes"] for line in done.stdout.splitlines()]


@pytest.mark.parametrize(
    "index", range(len(MEMORY_CASES)), ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(MEMORY_CASES)]
)
def test_memory_estimate_bounds_the_measured_peak(index: int, measured_peaks: list[int]) -> None:
    trainer, _, config = MEMORY_CASES[index]
    peak = measured_peaks[index]
    assert peak > 100 * 2**20, "a case too small to measure its tensors against overheads"
    estimated = estimate(trainer, **config).memory_bytes
    assert peak <= estimated <= MAX_OVERESTIMATE * peak, (
        f"estimate {estimated / 2**20:.0f} MiB, measured {peak / 2**20:.0f} MiB"
    )


# ---------------------------------------------------------------------------------------------
# the bundled examples pass the service's default limits


def expanded_conditions(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The example's trainer and its base config merged with every combination of grid
    levels."""
    spec = yaml.safe_load(path.read_text())
    grid = spec.get("grid") or {}
    return [
        (spec["trainer"], {**spec.get("config", {}), **dict(zip(grid, levels, strict=True))})
        for levels in itertools.product(*grid.values())
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_condition_is_within_the_default_limits(path: Path) -> None:
    for trainer, config in expanded_conditions(path):
        e = estimate(trainer, **config)
        assert e.memory_bytes < MAX_RUN_MEMORY, (config, e)
        assert e.logged_points < MAX_POINTS, (config, e)


# ---------------------------------------------------------------------------------------------
# specs the service must refuse, with the fields to blame


def test_collapse_with_a_million_samples_and_ten_thousand_classes_is_over_the_limit() -> None:
    e = estimate("collapse", n_samples=1_000_000, n_classes=10_000)
    assert e.memory_bytes > MAX_RUN_MEMORY
    assert {"n_samples", "n_classes"} <= set(e.memory_fields)


def test_collapse_logging_every_one_of_1e8_steps_is_over_the_points_limit() -> None:
    e = estimate("collapse", steps=100_000_000, log_every=1)
    assert e.logged_points > MAX_POINTS
    assert {"steps", "log_every"} <= set(e.points_fields)
    assert e.memory_bytes < MAX_RUN_MEMORY  # the default sizes themselves are small


@pytest.mark.parametrize("arch", ["studentnet", "resmlp"])
def test_feedback_at_large_field_values_is_over_the_limit(arch: str) -> None:
    e = estimate(
        "feedback",
        arch=arch,
        dataset="cifar10",
        width=4096,
        depth=16,
        batch_size=65_536,
        eval_batch_size=65_536,
        student_train_size=10_000_000,
    )
    assert e.memory_bytes > MAX_RUN_MEMORY
    assert {"batch_size", "width"} <= set(e.memory_fields)


def test_cff_at_512_pixels_on_cifar10_is_over_the_limit() -> None:
    e = estimate("cff", dataset="cifar10", image_size=512)
    assert e.memory_bytes > MAX_RUN_MEMORY
    assert "image_size" in e.memory_fields


def test_every_trainer_estimates_its_defaults_cheaply() -> None:
    """The service estimates every condition of a grid (up to 10,000) per request: a thousand
    estimates take under a second of this thread's CPU time (not wall time, which a machine busy
    with other work stretches while the thread waits for a core)."""
    import time

    for trainer in REGISTRY.values():
        config = trainer.Config()
        started = time.thread_time()
        for _ in range(1_000):
            trainer.estimate(config)
        assert time.thread_time() - started < 1.0, trainer.name
