"""Every integer of a trainer's config has an upper bound: the numbers reach torch and numpy as
seeds, sizes and counts, where an integer out of their range fails every run of a spec that
was accepted (feedback's `synthetic_seed` of 2^64: "Overflow when unpacking long long"). Out of
range is a 422 naming the field, as config or as a grid level; the bound itself runs."""

from __future__ import annotations

import annotated_types
import pytest

from api_schemas import MAX_SEED, ExperimentSpec
from service.experiments import SpecError, validate_spec
from service.settings import Settings
from trainers import REGISTRY, get_trainer
from trainers.data.sources import synthetic_images
from trainers.feedback.models import Teacher

SETTINGS = Settings(database_url="sqlite://", _env_file=None)


def integer_fields() -> list[tuple[str, str, object]]:
    """(trainer, field, its FieldInfo) of every field that takes an integer."""
    return [
        (name, field, info)
        for name, trainer in sorted(REGISTRY.items())
        for field, info in trainer.Config.model_fields.items()
        if "int" in str(info.annotation) and "bool" not in str(info.annotation)
    ]


def test_every_integer_of_every_trainer_config_is_bounded_above() -> None:
    assert len(integer_fields()) > 40  # the scan sees the trainers' fields
    unbounded = [
        f"{trainer}.{field}"
        for trainer, field, info in integer_fields()
        if not any(isinstance(m, annotated_types.Le | annotated_types.Lt) for m in info.metadata)
    ]
    assert unbounded == []


@pytest.mark.parametrize(
    ("trainer", "field"),
    [
        ("feedback", "synthetic_seed"),
        ("feedback", "teacher_seed"),
        ("cff", "train_size"),
        ("collapse", "log_every"),
    ],
)
def test_an_out_of_range_integer_is_a_422_naming_the_field(trainer: str, field: str) -> None:
    for where, body in (
        ("config", {"config": {field: 2**64}}),
        ("grid", {"grid": {field: [16, 2**64]}}),
    ):
        spec = ExperimentSpec.model_validate(
            {"name": "big", "trainer": trainer, "seeds": 2, **body}
        )
        with pytest.raises(SpecError) as refused:
            validate_spec(spec, settings=SETTINGS)
        (error,) = refused.value.errors
        assert error["loc"][:3] == ["body", where, field], error
        assert "less than or equal to" in error["msg"], error


def test_the_largest_seeds_accepted_are_seeds_torch_takes() -> None:
    train_x, *_ = synthetic_images(2, 2, 1, 0.5, MAX_SEED)
    assert len(train_x) == 4
    config = get_trainer("feedback").Config(
        arch="studentnet", teacher_seed=MAX_SEED, student_input_dim=4, teacher_width=4
    )
    assert Teacher(config).generator.initial_seed() == MAX_SEED
