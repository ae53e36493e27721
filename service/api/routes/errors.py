"""The error responses a route declares in the OpenAPI schema, each with its body's model, so
that a generated client parses a 404 or a 409 into a typed object instead of returning None.
(FastAPI declares the 422 itself, with pydantic's validation model, on every route that takes
input; the 401 is declared by service.api.security when a token is set.)"""

from __future__ import annotations

from typing import Any

from api_schemas import ErrorDetail

Responses = dict[int | str, dict[str, Any]]


def errors(described: dict[int, str]) -> Responses:
    """`errors({404: "No experiment with this id"})`: each status code with its description
    and the ErrorDetail body."""
    return {
        code: {"model": ErrorDetail, "description": description}
        for code, description in described.items()
    }


NO_EXPERIMENT = "No experiment with this id"
BODY_TOO_LARGE = "The request body is larger than SEEDGRID_MAX_REQUEST_BODY_BYTES"
QUEUE_FULL = "The queue is full (SEEDGRID_MAX_QUEUED_RUNS): retry after the Retry-After seconds"
HEAVY_READS = (
    "As many heavy reads (statistics or comparisons not stored yet, exports) as "
    "SEEDGRID_MAX_HEAVY_READS are running: retry after the Retry-After seconds"
)
