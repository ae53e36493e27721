"""Models of per-seed results imported from elsewhere (POST /experiments/import): a JSON list of
runs or a CSV run table (one row per run; W&B's and MLflow's run-table exports recognised), and
what the stored experiment keeps of them.

An imported experiment is an ended experiment of trainer `imported` whose runs are `completed`
with the imported metrics: the statistics read it as any other. No trainer can run its seeds,
so it grows only by another import (POST /experiments/{id}/import).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Kept equal to api_schemas' bounds (importing them here would be a cycle).
_MAX_KEY_LENGTH = 100
_MAX_LEVEL_LENGTH = 200
_MAX_SEED = 2**31 - 1
_STORABLE_TEXT = r"^[^\x00]*$"

# The trainer name of imported results; no trainer of the registry may take it.
IMPORTED_TRAINER = "imported"

ImportSource = Literal["json", "csv", "wandb", "mlflow"]
MetricName = Annotated[str, Field(min_length=1, max_length=_MAX_KEY_LENGTH, pattern=_STORABLE_TEXT)]
FactorLevel = (
    bool
    | int
    | float
    | Annotated[str, Field(max_length=_MAX_LEVEL_LENGTH, pattern=_STORABLE_TEXT)]
    | None
)


def _keys_as_property_names(schema: dict[str, Any]) -> None:
    """A dict whose keys have a pattern, written as additionalProperties with propertyNames
    (api_schemas.key_pattern_as_property_names: generators ignore patternProperties)."""
    ((pattern, values),) = schema.pop("patternProperties").items()
    schema["additionalProperties"] = values
    schema["propertyNames"] = {**schema.get("propertyNames", {}), "pattern": pattern}


class ImportedResults(BaseModel):
    """What an imported experiment's spec records in place of a trainer: its metrics (what
    /stats may compare; the spec's `metric` is the primary one) and where they came from."""

    model_config = ConfigDict(extra="forbid", strict=True)

    metrics: list[MetricName] = Field(..., min_length=1)
    source: ImportSource


class ImportedRun(BaseModel):
    """One run of the JSON form: its condition (factor -> level), seed and final metrics (a
    null metric: not recorded for this run)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    condition: dict[MetricName, FactorLevel] = Field(
        default_factory=dict, json_schema_extra=_keys_as_property_names
    )
    seed: int = Field(..., ge=0, le=_MAX_SEED)
    metrics: dict[MetricName, float | None] = Field(
        ..., min_length=1, json_schema_extra=_keys_as_property_names
    )


class ExperimentImport(BaseModel):
    """Per-seed results to store as an experiment: `runs` (JSON) or `csv` (the text of a run
    table), exactly one of them."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "name": "lr-study",
                    "csv": "optimizer,seed,test_accuracy\nsgd,0,0.91\nsgd,1,0.90\n"
                    "adam,0,0.93\nadam,1,0.92\n",
                }
            ]
        },
    )

    # The new experiment's name; left out when importing into an existing experiment.
    name: str | None = Field(None, min_length=1, max_length=200, pattern=_STORABLE_TEXT)
    runs: list[ImportedRun] | None = Field(
        None, description="the runs, one per (condition, seed); or give `csv`"
    )
    csv: str | None = Field(
        None,
        pattern=_STORABLE_TEXT,
        description="a CSV run table with a header row: one row per run, a seed column, factor "
        "columns and metric columns; W&B (config.*, summary.*) and MLflow (params.*, metrics.*) "
        "run-table exports are recognised by their column prefixes",
    )
    seed_column: MetricName | None = Field(
        None,
        description="CSV: the seed column (default: the first of seed, config.seed, "
        "params.seed in the header)",
    )
    metrics: list[MetricName] | None = Field(
        None,
        max_length=1000,
        description="a plain CSV's metric columns (default: the columns after the seed column; "
        "the columns before it are factors)",
    )
    metric: MetricName | None = Field(
        None, description="the primary metric (default: the first metric column)"
    )

    @model_validator(mode="after")
    def _one_form(self) -> ExperimentImport:
        if (self.runs is None) == (self.csv is None):
            raise ValueError("give the results as exactly one of runs (JSON) or csv (its text)")
        return self
