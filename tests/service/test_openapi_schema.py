"""The OpenAPI schema types what the API returns: a client generated from it (or a validator)
knows a run's final metrics are numbers or null, a grid's levels are JSON scalars and the
diagnostics are nested JSON, rather than "any object"."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from api_schemas import ExperimentSpec, JsonValue
from service.api.app import create_app
from service.settings import Settings

OPENAPI = create_app(Settings(database_url="sqlite://"), dispatch=False).openapi()
SCHEMAS = OPENAPI["components"]["schemas"]
SCALARS = [
    {"type": "string"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "null"},
]
# Fields left as any JSON object, and why.
UNTYPED = {
    # the trainer's own config model validates it; GET /trainers serves that model's schema
    ("ExperimentSpec", "config"),
    # FastAPI's own model of a 422's detail
    ("ValidationError", "ctx"),
}


def untyped(schema: Any) -> bool:
    """An object schema that says nothing of its values, or a schema that says nothing."""
    if not isinstance(schema, dict):
        return False
    if schema == {}:
        return True
    if schema.get("type") == "object" and "properties" not in schema:
        return schema.get("additionalProperties", True) in (True, {})
    return any(untyped(sub) for sub in [schema.get("items"), *schema.get("anyOf", [])])


def test_every_field_the_api_returns_is_typed() -> None:
    found = {
        (name, field)
        for name, model in SCHEMAS.items()
        for field, schema in model.get("properties", {}).items()
        if untyped(schema)
    }
    assert found == UNTYPED


def test_run_metrics_are_numbers_or_null() -> None:
    for model in ("RunOut", "RunDetail"):
        metrics = SCHEMAS[model]["properties"]["metrics"]
        assert metrics["additionalProperties"] == {"anyOf": [{"type": "number"}, {"type": "null"}]}


def test_diagnostics_are_json_objects_at_any_depth() -> None:
    json_object = SCHEMAS["JsonObject"]
    value = json_object["additionalProperties"]
    # an object nests itself; arrays nest typed two deep, then any JSON
    assert value["anyOf"][0] == {"$ref": "#/components/schemas/JsonObject"}
    assert value["anyOf"][2:] == SCALARS
    inner = value["anyOf"][1]["items"]["anyOf"][1]["items"]["anyOf"]
    assert {} in inner and {"$ref": "#/components/schemas/JsonObject"} in inner
    for model, field in [
        ("RunOut", "diagnostics"),
        ("RunDetail", "diagnostics"),
        ("RunDetail", "provenance"),
        ("RunDetail", "config"),
        ("TrainerInfo", "config_schema"),
    ]:
        assert SCHEMAS[model]["properties"][field]["additionalProperties"] == value, field

    nested = {
        "protocol": {
            "checks": {"D1": {"value": 1.5, "fired": False, "first_epoch": None}},
            "verdict_checks": ["D1"],
        },
        "shapes": [[256, 256], [10, 256]],
        "deeper": [[[{"a": [[[1]]]}]]],
        "n_test": 3,
        "ratio": 3.0,
        "converged": True,
        "name": "x",
    }
    # validated as it is: no int becomes a float, no bool an int, nothing dropped
    assert TypeAdapter(dict[str, JsonValue]).dump_python(nested) == nested
    served = TypeAdapter(dict[str, JsonValue]).validate_python(nested)
    assert served == nested and type(served["n_test"]) is int and served["converged"] is True
    with pytest.raises(ValidationError):
        TypeAdapter(dict[str, JsonValue]).validate_python({"when": object()})


def test_grid_levels_are_json_scalars_under_keys_with_a_pattern() -> None:
    grid = SCHEMAS["ExperimentSpec"]["properties"]["grid"]
    assert "patternProperties" not in grid
    assert grid["propertyNames"] == {"maxLength": 100, "pattern": "^[^\\x00]*$"}
    levels = grid["additionalProperties"]
    assert levels["type"] == "array" and levels["maxItems"] == 1000
    assert [{"type": s["type"]} for s in levels["items"]["anyOf"]] == [
        {"type": "boolean"},
        {"type": "integer"},
        {"type": "number"},
        {"type": "string"},
        {"type": "null"},
    ]
    # the schema only moved: a key with NUL is still refused, a level keeps its JSON type
    with pytest.raises(ValidationError, match="grid"):
        ExperimentSpec(name="a", trainer="collapse", grid={"r\x00": [0.1]})
    spec = ExperimentSpec(name="a", trainer="collapse", grid={"stop_gradient": [False, 1, 1.0]})
    assert [type(v) for v in spec.grid["stop_gradient"]] == [bool, int, float]
