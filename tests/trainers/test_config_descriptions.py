"""Trainer config fields carry their meaning into the JSON schema GET /trainers serves (and the
OpenAPI clients and the CLI show), with their defaults unchanged."""

from __future__ import annotations

from trainers import REGISTRY


def schema_fields(trainer: str) -> dict[str, dict]:
    return REGISTRY[trainer].Config.model_json_schema()["properties"]


def test_most_config_fields_say_what_they_mean() -> None:
    fields = {(name, field): schema for name in ("collapse", "cff", "ssl", "ssl_sim", "feedback")
              for field, schema in schema_fields(name).items()}
    described = {key for key, schema in fields.items() if schema.get("description", "").strip()}
    # every field that had a comment beside it; the few left are plain (epochs, batch_size, lr)
    assert len(described) >= 0.8 * len(fields), sorted(set(fields) - described)


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
    assert schema_fields("ssl")["val_fraction"]["description"] == \
        schema_fields("cff")["val_fraction"]["description"]
