"""Pagination shared by the list endpoints: `limit` (up to a maximum page size) and `offset`
in the query, and a `Link: <...>; rel="next"` header while a page came back full."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response

from service.api.deps import MAX_DB_INT

Offset = Annotated[int, Query(ge=0, le=MAX_DB_INT, description="items to skip")]


def link_next(
    request: Request, response: Response, *, offset: int, limit: int, returned: int
) -> None:
    """Point at the next page when this one is full (there may be more)."""
    if returned >= limit:
        url = request.url.include_query_params(offset=offset + returned, limit=limit)
        response.headers["Link"] = f'<{url}>; rel="next"'
