"""Trainer config fields carry their meaning into the JSON schema GET /trainers serves (and the
OpenAPI clients and the CLI show), with their defaults unchanged."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainers import REGISTRY


def schema_fields(trainer: str) -> dict[str, dict]:
    return REGISTRY[trainer].Config.model_json_schema()["properties"]


def undescribed_fields(schema: dict[str, Any]) -> list[str]:
    """The fields of a config's JSON schema, its nested models' ($defs) included, whose
    description is missing or blank."""
    models = {"": schema, **{f"{name}.": model for name, model in schema.get("$defs", {}).items()}}
    return [
        f"{prefix}{field}"
        for prefix, model in models.items()
        for field, property_schema in model.get("properties", {}).items()
        if not property_schema.get("description", "").strip()
    ]


def test_every_config_field_says_what_it_means() -> None:
    missing = {
        name: undescribed_fields(trainer.Config.model_json_schema())
        for name, trainer in REGISTRY.items()
    }
    assert {name: fields for name, fields in missing.items() if fields} == {}


def test_a_nested_model_field_without_a_description_is_found() -> None:
    class Inner(BaseModel):
        described: int = Field(1, description="says what it is")
        bare: int = 2

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="a nested model")
        plain: float = 0.5

    assert undescribed_fields(Outer.model_json_schema()) == ["plain", "Inner.bare"]


def test_descriptions_keep_the_meaning_and_the_defaults_stay() -> None:
    collapse = schema_fields("collapse")
    assert "round(r * n_samples)" in collapse["r"]["description"]
    assert collapse["r"]["default"] == 0.1
    assert "4000 without stop-gradient, 20000 with it" in collapse["steps"]["description"]
    cff = schema_fields("cff")
    assert cff["margin_mode"]["default"] == "clamp"
    assert "min(s + m, 1)" in cff["margin_mode"]["description"]
    assert cff["image_size"]["default"] == 32 and "paper's 32" in cff["image_size"]["description"]
    feedback = schema_fields("feedback")
    assert "D2 fails" in feedback["ref_grad_floor"]["description"]
    assert feedback["device"]["default"] == "auto"
    # a field the dataset config shares keeps the shared meaning where a trainer redeclares it
    assert (
        schema_fields("ssl")["val_fraction"]["description"]
        == schema_fields("cff")["val_fraction"]["description"]
    )
