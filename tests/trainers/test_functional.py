"""A plain function as a trainer (trainers.functional): its config from a dict of defaults or a
pydantic model, its metrics from what it returns and logs, the runtime's divergence, cancel,
provenance and seed batching unchanged, the global generators seeded per run, and its module
loaded from a path outside the package, with a clear error when it cannot be."""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pydantic
import pytest
import torch

from api_schemas import RunStatus
from trainers import (
    LOADED_MODULES,
    REGISTRY,
    MemoryReporter,
    load_trainer_modules,
    register,
    trainer,
)
from trainers.functional import FunctionTrainer
from trainers.runtime import RunContext, TrainOutput
from workers.messages import Result
from workers.task import execute_seeds

USER_MODULE = '''\
import torch

from trainers import trainer


def dot(a, b):
    return a @ b


@trainer(metrics=("loss", "norm"), defaults={"steps": 20, "lr": 0.1, "width": 3})
def quadratic(config, run):
    """Gradient descent on ||w||^2."""
    w = torch.randn(config.width, generator=run.sources.init, dtype=torch.float64)
    if config.width > 8:
        dot(w, torch.ones(config.width + 1, dtype=torch.float64))
    loss = float(w @ w)
    for step in range(config.steps):
        w = w - config.lr * 2 * w
        loss = float(w @ w)
        if run.log(step, {"loss": loss}):
            break
    return {"loss": loss, "norm": float(w.norm())}
'''


@pytest.fixture
def user_file(tmp_path: Path) -> Iterator[Path]:
    """The user's trainer in a file outside the package, loaded from its path as the service
    loads SEEDGRID_TRAINER_MODULES; unregistered afterwards."""
    path = tmp_path / "user_quadratic.py"
    path.write_text(USER_MODULE)
    before, loaded = dict(REGISTRY), list(LOADED_MODULES)
    yield path
    REGISTRY.clear()
    REGISTRY.update(before)
    LOADED_MODULES[:] = loaded
    sys.modules.pop("user_quadratic", None)


def test_a_function_from_a_file_is_a_trainer_with_a_config_from_its_defaults(
    user_file: Path,
) -> None:
    (module,) = load_trainer_modules(str(user_file))
    assert (module.name, module.path) == ("user_quadratic", user_file.resolve())
    quadratic = REGISTRY["quadratic"]
    assert isinstance(quadratic, FunctionTrainer)
    assert (quadratic.metrics, quadratic.primary_metric) == (("loss", "norm"), "loss")
    assert quadratic.divergence_metric == "loss"
    assert quadratic.description == "Gradient descent on ||w||^2."
    schema = quadratic.Config.model_json_schema()
    assert {k: (v["type"], v["default"]) for k, v in schema["properties"].items()} == {
        "steps": ("integer", 20),
        "lr": ("number", 0.1),
        "width": ("integer", 3),
    }
    # as strict as every trainer's config: unknown fields and coercions are refused
    for bad in ({"stepz": 3}, {"steps": "3"}, {"steps": 2.5}):
        with pytest.raises(pydantic.ValidationError):
            quadratic.Config.model_validate(bad)
    assert quadratic.Config.model_validate({"lr": 1}).lr == 1  # an int for a float field

    reporter = MemoryReporter()
    result = quadratic.run(quadratic.Config(steps=5), seed=3, reporter=reporter)
    w = torch.randn(3, generator=_init_generator(3), dtype=torch.float64) * 0.8**5
    assert result.metrics["loss"] == pytest.approx(float(w @ w), rel=1e-12)
    assert result.metrics["norm"] == pytest.approx(float(w.norm()), rel=1e-12)
    assert [s for s, _ in reporter.curve("loss")] == [0, 1, 2, 3, 4]
    digest = hashlib.sha256()
    digest.update(b"user_quadratic.py\0" + user_file.read_bytes() + b"\0")
    assert result.provenance["trainer_source_sha256"] == digest.hexdigest()
    assert result.provenance["config"] == {"steps": 5, "lr": 0.1, "width": 3}


def _init_generator(seed: int) -> torch.Generator:
    from trainers.random_sources import random_sources

    return random_sources(seed).init


def test_divergence_cancel_and_seed_batching_come_from_the_runtime(user_file: Path) -> None:
    load_trainer_modules(str(user_file))
    quadratic = REGISTRY["quadratic"]
    diverged = quadratic.run(
        quadratic.Config(steps=2000, lr=5.0), seed=0, reporter=MemoryReporter()
    )
    assert diverged.diverged and diverged.diverged_at_step is not None
    assert math.isfinite(diverged.metrics["loss"])

    class Cancelled(MemoryReporter):
        def should_stop(self) -> bool:
            return len(self.points) >= 3

    cancelled = quadratic.run(quadratic.Config(steps=1000), seed=0, reporter=Cancelled())
    assert not cancelled.finished

    config = quadratic.Config(steps=7)
    batched = quadratic.run_seeds(config, [4, 5, 6], [MemoryReporter() for _ in range(3)])
    for seed, outcome in zip([4, 5, 6], batched, strict=True):
        solo = quadratic.run(config, seed=seed, reporter=MemoryReporter())
        assert not isinstance(outcome, Exception)
        assert outcome.metrics == solo.metrics


def test_a_failure_inside_a_helper_is_stored_with_the_helpers_file_and_line(
    user_file: Path,
) -> None:
    load_trainer_modules(str(user_file))
    messages = list(execute_seeds("quadratic", {"width": 9}, [0], batch_interval_s=0.01))
    (result,) = [m for m in messages if isinstance(m, Result)]
    assert result.status == RunStatus.failed
    assert result.error is not None and result.error.startswith("RuntimeError: ")
    line = USER_MODULE.splitlines().index("    return a @ b") + 1
    assert result.traceback is not None
    assert f'  File "{user_file.resolve()}", line {line}, in dot\n' in result.traceback


def test_global_generators_are_seeded_per_run_and_given_back() -> None:
    @trainer(metrics=("loss",))
    def global_noise(config: object, run: RunContext) -> dict[str, float]:
        return {"loss": float(torch.randn(1)) + float(np.random.rand()) + sys.float_info.epsilon}

    torch.manual_seed(123)
    np.random.seed(123)
    state = torch.get_rng_state()
    first = global_noise.run(global_noise.Config(), seed=1, reporter=MemoryReporter())
    assert torch.equal(torch.get_rng_state(), state)  # the worker's generators are put back
    torch.manual_seed(999)  # whatever ran before in the process
    np.random.seed(999)
    again = global_noise.run(global_noise.Config(), seed=1, reporter=MemoryReporter())
    other = global_noise.run(global_noise.Config(), seed=2, reporter=MemoryReporter())
    assert first.metrics == again.metrics
    assert first.metrics != other.metrics


def test_a_pydantic_config_and_what_a_function_may_return() -> None:
    class Config(pydantic.BaseModel):
        hidden: int = pydantic.Field(8, description="units")

    @trainer(config=Config, metrics=("accuracy",), metric_bounds={"accuracy": (0.0, 1.0)})
    def model_config(config: Config, run: RunContext) -> TrainOutput:
        return TrainOutput(metrics={"accuracy": config.hidden / 10}, diagnostics={"h": 1})

    assert model_config.Config.model_json_schema()["properties"]["hidden"]["description"] == "units"
    with pytest.raises(pydantic.ValidationError):
        model_config.Config.model_validate({"hidden": 4, "other": 1})
    result = model_config.run(model_config.Config(hidden=5), seed=0, reporter=MemoryReporter())
    assert result.metrics == {"accuracy": 0.5} and result.diagnostics == {"h": 1}
    assert model_config.divergence_metric is None  # no metric named loss

    @trainer(metrics=("loss",))
    def returns_text(config: object, run: RunContext) -> dict[str, str]:
        return {"loss": "low"}

    with pytest.raises(TypeError, match="returned metric 'loss' = 'low', which is not a number"):
        returns_text.run(returns_text.Config(), seed=0, reporter=MemoryReporter())


def test_bad_declarations_are_named_at_once() -> None:
    def two(config: object, run: object) -> dict[str, float]:
        return {}

    with pytest.raises(ValueError, match="primary_metric 'acc' is not in"):
        trainer(metrics=("loss",), primary_metric="acc")(two)
    with pytest.raises(TypeError, match=r"defaults\['model'\]: a object default"):
        trainer(defaults={"model": object()})(two)
    with pytest.raises(ValueError, match="descriptions name fields with no default: lr"):
        trainer(defaults={"steps": 1}, descriptions={"lr": "x"})(two)
    with pytest.raises(ValueError, match="'imported' is reserved for imported results"):
        register(trainer(name="imported")(two))
    with pytest.raises(ValueError, match="'sys/cpu_percent': names starting with 'sys/' are"):
        register(trainer(name="hogs_sys", metrics=("loss", "sys/cpu_percent"))(two))
    with pytest.raises(TypeError, match="must be a function of \\(config, run\\)"):
        trainer(lambda config: {})  # type: ignore[arg-type]


def test_a_module_that_cannot_be_loaded_is_one_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken_trainer.py"
    broken.write_text("import torch\n\nvalue = 1 / 0\n")
    with pytest.raises(ImportError) as info:
        load_trainer_modules(str(broken))
    message = str(info.value)
    assert message.startswith("SEEDGRID_TRAINER_MODULES: cannot import 'broken_trainer' from ")
    assert f"ZeroDivisionError: division by zero ({broken}:3)" in message
    assert "broken_trainer" not in sys.modules
    empty = tmp_path / "empty_trainer.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ImportError, match="defines no TRAINERS and no @trainer function"):
        load_trainer_modules(str(empty))
    with pytest.raises(ImportError, match="neither a .py file nor a package folder"):
        load_trainer_modules(str(tmp_path / "missing.py"))


def test_a_package_folder_is_loaded_by_its_name_and_hashed_whole(tmp_path: Path) -> None:
    """An operator's package (a folder with __init__.py): imported under the folder's name,
    its trainers' provenance hashing every .py file of it, a change to any of them shows."""
    package = tmp_path / "my_lab"
    package.mkdir()
    (package / "__init__.py").write_text("from my_lab.models import fit\n")
    (package / "helpers.py").write_text("SCALE = 2.0\n")
    (package / "models.py").write_text(
        "from my_lab.helpers import SCALE\n"
        "from trainers import trainer\n\n\n"
        "@trainer(name='lab_fit', metrics=('loss',))\n"
        "def fit(config, run):\n"
        "    return {'loss': SCALE}\n"
    )
    before, loaded = dict(REGISTRY), list(LOADED_MODULES)
    try:
        (module,) = load_trainer_modules(str(package))
        assert (module.name, module.path) == ("my_lab", package.resolve())
        fit = REGISTRY["lab_fit"]
        result = fit.run(fit.Config(), seed=0, reporter=MemoryReporter())
        assert result.metrics == {"loss": 2.0}
        digest = hashlib.sha256()
        for name in ("__init__.py", "helpers.py", "models.py"):
            file = package / name
            digest.update(f"my_lab/{name}".encode() + b"\0" + file.read_bytes() + b"\0")
        assert result.provenance["trainer_source_sha256"] == digest.hexdigest()
    finally:
        REGISTRY.clear()
        REGISTRY.update(before)
        LOADED_MODULES[:] = loaded
        for name in ("my_lab", "my_lab.models", "my_lab.helpers"):
            sys.modules.pop(name, None)
