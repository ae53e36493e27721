"""The client commands that organise experiments: `tag` and `note` (what a researcher writes on
an experiment to find it again) and `params` (every condition's config side by side with its
summary). `list`'s filters are in service.cli.commands; docs/organising.md shows them all."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

import service.cli.remote as remote
import service.cli.render as render
from service.cli.common import CsvOpt, JsonOpt, UrlOpt, fail, output_mode
from service.cli.render import fmt, print_csv, print_json, print_table


def tag(
    experiment_id: int,
    tags: Annotated[
        list[str] | None, typer.Argument(help="tags to add", show_default=False)
    ] = None,
    remove: Annotated[
        list[str] | None,
        typer.Option("--remove", help="a tag to remove (repeat for more)", show_default=False),
    ] = None,
    url: UrlOpt = None,
) -> None:
    """Add tags to an experiment (or remove them with --remove); prints its tags after."""
    with remote.connect(url, 60) as client:
        if tags or remove:
            add, drop = tags or [], remove or []
            detail = remote.call(client, lambda: client.tag(experiment_id, add, drop))
        else:
            detail = remote.call(client, lambda: client.experiment(experiment_id))
    shown = ", ".join(detail.tags) if detail.tags else "no tags"
    render.console.print(f"experiment {detail.id} {detail.name}: {shown}", markup=False)


def note(
    experiment_id: int,
    text: Annotated[str, typer.Argument(help='the note ("" removes it)')],
    url: UrlOpt = None,
) -> None:
    """Set an experiment's free-text note, replacing the one it had."""
    with remote.connect(url, 60) as client:
        detail = remote.call(client, lambda: client.label(experiment_id, note=text))
    done = "note set" if detail.note else "note removed"
    render.console.print(f"experiment {detail.id} {detail.name}: {done}", markup=False)


def params(
    experiment_id: int,
    show_all: Annotated[
        bool, typer.Option("--all", help="every config field, not only those that vary")
    ] = False,
    metric: Annotated[
        str | None, typer.Option(help="the summary's metric [default: the spec's]")
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """Each condition's config fields that vary, with its n, mean and std (--all: every field)."""
    mode = output_mode(as_json, as_csv)
    with remote.connect(url, 60) as client:
        table = remote.call(client, lambda: client.params_table(experiment_id, metric))
    if mode == "json":
        print_json(table.model_dump(mode="json"))
        return
    fields = table.fields if show_all else table.varying
    columns = ["condition", "n", f"mean {table.metric}", "std", *fields]
    rows = [
        [
            c.condition_key or "(no grid)",
            str(c.n),
            fmt(c.mean) if mode == "table" else _full(c.mean),
            fmt(c.std) if mode == "table" else _full(c.std),
            *(_value(c.config.get(field)) for field in fields),
        ]
        for c in table.conditions
    ]
    if mode == "csv":
        print_csv(columns, rows)
        return
    if not table.conditions:
        raise fail(f"experiment {experiment_id} has no conditions")
    if show_all:
        # a row per field, a column per condition: dozens of fields stay readable at 80 columns
        varying = set(table.varying)
        names = [f"{name} *" if name in varying else name for name in columns]
        numbers = [f"#{i + 1}" for i in range(len(rows))]
        by_field = zip(*rows, strict=True)
        flipped = [[name, *cells] for name, cells in zip(names, by_field, strict=True)]
        print_table(None, ["field", *numbers], flipped, {"field", *numbers})
        render.console.print("*: differs between the conditions", markup=False)
        return
    print_table(None, columns, rows, {"condition", *fields})
    if not table.varying:
        render.console.print(
            "no config field differs between the conditions; --all shows every field",
            markup=False,
        )


def _value(value: Any) -> str:
    """A config value as typed in a spec: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _full(value: float | None) -> str:
    """A number at full precision for --csv; empty for none."""
    return "" if value is None else repr(value)
