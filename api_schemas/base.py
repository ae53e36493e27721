"""The base of every model the REST API returns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ResponseModel(BaseModel):
    """A model the API returns. In its response schema every field is required, since the
    JSON always carries it (a field with a default is written with its default): a generated
    client then types it as what it is, not as "the value or Unset". The request bodies
    (ExperimentSpec and the models inside it, AddSeeds) stay plain models: one schema each,
    their defaults optional."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)
