"""The errors of seedgrid's service logic, each mapped to one HTTP answer in service/api/app.py:
a spec or a request the models alone could not refuse (422), what is not there (404), what
conflicts with an experiment's state (409), a full queue (429)."""

from __future__ import annotations

from typing import Any

# An error response lists this many problems, then counts the rest: a spec with 90,000 unknown
# config keys got a 25.7 MB 422 after 6.9 s of CPU.
MAX_ERRORS_SHOWN = 20


class SpecError(Exception):
    """Invalid input the request model alone could not see; rendered as a 422 like pydantic's.
    `unlisted`: how many more problems there are than `errors` lists (counted, not built)."""

    def __init__(self, errors: list[dict[str, Any]], unlisted: int = 0) -> None:
        super().__init__(
            "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
            + (f"; and {unlisted} more" if unlisted else "")
        )
        self.errors = errors
        self.unlisted = unlisted

    @classmethod
    def query(cls, field: str, message: str) -> SpecError:
        """A 422 naming one query parameter."""
        return cls([{"loc": ["query", field], "msg": message, "type": "value_error"}])


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


class QueueFull(Exception):
    """Accepting the spec would pass the cap on queued runs: a 429 with Retry-After."""

    RETRY_AFTER_S = 30

    def __init__(self, queued: int, adding: int, cap: int) -> None:
        super().__init__(
            f"the queue holds {queued:,} runs and this spec adds {adding:,}, over the cap of "
            f"{cap:,} queued runs (SEEDGRID_MAX_QUEUED_RUNS); retry when runs have ended"
        )


def body_error(loc: list[Any], msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": kind}
