"""The client commands' one way to the service: a service.client.Client (its URL rule, token
header, pager and Retry-After policy), whose errors stop the command with one line: where the
service was looked for when it cannot be reached, the API's detail when it refuses (each
invalid field of a 422), and how long the retries of a 503 or 429 waited."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer

import service.cli.render as render
from api_schemas import ExperimentImported, environment
from service.cli.common import fail
from service.client import (
    MAX_RETRIES,
    ApiError,
    Client,
    ResultsFileError,
    Unreachable,
    default_address,
)

T = TypeVar("T")

# Where an address given to a command came from.
URL_OPTION = "--url or SEEDGRID_URL"


def default_url() -> tuple[str, str]:
    """The address `seedgrid serve` listens on by this environment's settings (the client's
    rule: http://SEEDGRID_HOST:SEEDGRID_PORT, a wildcard host reached on loopback), and where
    it came from; a bad SEEDGRID_PORT stops the command."""
    try:
        return default_address()
    except environment.BadVariable as exc:
        raise fail(str(exc)) from None


def connect(url: str | None, timeout_s: float) -> Client:
    """A client of the service at `url` (else default_url()) that says each retry on stderr."""
    source = URL_OPTION
    if url is None:
        url, source = default_url()
    return Client(url, timeout_s=timeout_s, url_source=source, on_retry=_say_retry)


def ask(client: Client, method: str, path: str, **kwargs: Any) -> Any:
    """The API's JSON answer; an error answer stops the command with one message, after the
    retries a 503 or 429 asks for."""
    with _stop_on_errors(client):
        return client.request(method, path, **kwargs)


def call(client: Client, action: Callable[[], T]) -> T:
    """What `action` (a call of a Client method) returns; an error answer stops the command
    with one message, as ask()'s does."""
    with _stop_on_errors(client):
        return action()


def pages(
    client: Client, path: str, limit: int, params: dict[str, Any] | None = None
) -> Iterator[Any]:
    """Every item of a paged list endpoint, a page of `limit` at a time."""
    with _stop_on_errors(client):
        yield from client.pages(path, limit, params)


def export(client: Client, experiment_id: int, target: Path, file_format: str, what: str) -> int:
    """The experiment's export written to `target` (Client.export); the bytes written."""
    try:
        return client.export(experiment_id, target, file_format, what)
    except Unreachable as exc:
        raise fail(
            f"cannot export from the seedgrid API at {client.base_url}: {exc.error}"
        ) from None
    except ApiError as exc:
        raise refused(exc, fields=False) from None
    except OSError as exc:
        raise fail(f"cannot write {target}: {exc.strerror}") from None


def import_results(client: Client, results: Path, **options: Any) -> ExperimentImported:
    """The import of a results file (Client.import_results); a file that cannot be read, or
    a refusal, stops the command with one message."""
    with _stop_on_errors(client):
        try:
            return client.import_results(results, **options)
        except ResultsFileError as exc:
            raise fail(str(exc)) from None


@contextmanager
def _stop_on_errors(client: Client) -> Iterator[None]:
    try:
        yield
    except Unreachable as exc:
        raise fail(
            f"cannot reach the seedgrid API at {client.base_url} (from "
            f"{client.url_source}; set --url or SEEDGRID_URL to reach another): "
            f"{exc.error}"
        ) from None
    except ApiError as exc:
        raise refused(exc) from None


# API requests an error answer may name, and the command that does the same.
CLI_EQUIVALENTS = (
    (re.compile(r"POST /experiments/(\d+)/cancel"), r"`seedgrid cancel \1`"),
    (re.compile(r"POST /experiments/(\d+)/seeds"), r"`seedgrid add-seeds \1 SEEDS`"),
    (re.compile(r"POST /experiments/(\d+)/import"), r"`seedgrid import FILE --into \1`"),
    (re.compile(r"POST /experiments/import"), "`seedgrid import FILE`"),
    (re.compile(r"DELETE /experiments/(\d+)"), r"`seedgrid delete \1`"),
    (re.compile(r"GET /experiments/(\d+)/stats"), r"`seedgrid stats \1`"),
    (re.compile(r"GET /runs/(\{id\}|\d+)"), "`seedgrid run-log RUN_ID`"),
)


def in_cli_terms(text: str) -> str:
    """An API message with each request it names replaced by the command that does it."""
    for pattern, command in CLI_EQUIVALENTS:
        text = pattern.sub(command, text)
    return text


def _answer(error: ApiError) -> str:
    if error.status_code == 401:
        return _unauthorized(error)
    detail = in_cli_terms(error.detail) if isinstance(error.detail, str) else error.detail
    return f"{error.method} {error.path}: {error.status_code} {detail}"


def _unauthorized(error: ApiError) -> str:
    """A 401 as what to set: the service asks for a token, or refused the one given."""
    if environment.text(environment.API_TOKEN):
        return (
            f"the service refused the token in {environment.API_TOKEN} ({error.detail}): set it "
            "to the token the service was started with"
        )
    return (
        f"the service asks for a token: set {environment.API_TOKEN} to the token it was "
        "started with"
    )


def refused(error: ApiError, fields: bool = True) -> typer.Exit:
    """The exit of a command the API refused: a 503 or 429 after its retries, with what they
    waited; with `fields`, a 422's invalid fields one a line."""
    if error.retry_after_s is not None:
        tried = (
            f" (after {error.retries} retries over {error.waited_s:.0f} s)" if error.retries else ""
        )
        return fail(f"{_answer(error)}{tried}; it asks to retry in {error.retry_after_s:g} s")
    if error.status_code == 422 and fields:
        detail = error.detail
        lines = (
            [f"  {'.'.join(map(str, e['loc']))}: {in_cli_terms(e['msg'])}" for e in detail]
            if isinstance(detail, list)
            else [f"  {in_cli_terms(str(detail))}"]
        )
        what = (
            "the spec was rejected"
            if (error.method, error.path) == ("POST", "/experiments")
            else f"{error.method} {error.path} was refused"
        )
        return fail(f"{what}:\n" + "\n".join(lines))
    return fail(_answer(error))


def _say_retry(error: ApiError, wait_s: float) -> None:
    render.err.print(
        f"{_answer(error)}; retrying in {wait_s:g} s ({error.retries + 1} of {MAX_RETRIES})",
        markup=False,
        soft_wrap=True,
    )
