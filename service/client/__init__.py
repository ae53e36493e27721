"""A Python client of the seedgrid API: submit, wait, and read runs, statistics and curves as
pandas DataFrames.

    from service.client import Client

    with Client() as sg:                      # SEEDGRID_URL and SEEDGRID_API_TOKEN, or arguments
        created = sg.submit("examples/collapse_stopgrad.yaml")
        sg.wait(created.id)                   # a progress bar until every run has ended
        conditions, comparisons = sg.stats(created.id)
        curves = sg.curves(created.id, name="min_l2")

It speaks HTTP only and imports nothing of the service but the contract (api_schemas), so it
works against any deployment. Answers are the api_schemas models; a refusal raises ApiError with
the status code and the API's detail. A 503 (the database locked or unreachable, every
heavy-read slot taken) or a 429 (the queue full) did nothing, so the request is sent again
after the answer's Retry-After, up to `retries` times and `max_retry_wait_s` seconds of waiting
in all, before it is raised. pandas is imported only when a DataFrame is built.

It is also the `seedgrid` command's way to the service (service/cli): `request` (the JSON
answer as served), `pages` (every item of a paged list) and `export` (a file streamed to disk)
are the one HTTP layer, with one URL rule, one token header and one retry policy.

Modules: http.py (the address, the errors, the wait a 429 or 503 asks for), core.py (Client),
imports.py (an import's body from a results file).
"""

from service.client.core import POINT_COLUMNS, Client, StatsFrames, has_ended
from service.client.http import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_RETRY_AFTER_S,
    MAX_RETRIES,
    MAX_RETRY_WAIT_S,
    RETRIED_STATUSES,
    WILDCARD_HOSTS,
    ApiError,
    RetryHook,
    Unreachable,
    default_address,
    default_url,
    error_detail,
    http_url,
    retry_after_s,
)
from service.client.imports import ResultsFileError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_RETRY_AFTER_S",
    "MAX_RETRIES",
    "MAX_RETRY_WAIT_S",
    "POINT_COLUMNS",
    "RETRIED_STATUSES",
    "WILDCARD_HOSTS",
    "ApiError",
    "Client",
    "ResultsFileError",
    "RetryHook",
    "StatsFrames",
    "Unreachable",
    "default_address",
    "default_url",
    "error_detail",
    "has_ended",
    "http_url",
    "retry_after_s",
]
