"""Every bundled example spec is accepted by the service's own validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from api_schemas import ExperimentSpec
from service.experiments import validate_spec
from service.settings import Settings
from service.specs import config_condition

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"collapse_stopgrad", "cff_cifar10_paper", "cff_digits_cpu"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_spec_validates(path: Path) -> None:
    spec = ExperimentSpec.model_validate(yaml.safe_load(path.read_text()))
    # the service's defaults: run, memory and logged-point limits, no download, no named roots
    trainer, conditions = validate_spec(spec, settings=Settings(data_roots="", _env_file=None))
    assert len(conditions) * len(spec.seed_list()) >= 6
    for condition in conditions:  # every condition builds a valid trainer config
        trainer.Config.model_validate({**spec.config, **config_condition(condition)})
