"""The client commands that read an experiment's results and the service's trainers (stats,
compare, protocol, trainers), and `plan`, which needs no service: how many seeds a variance
comparison needs."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

import service.cli.remote as remote
import service.cli.render as render
from api_schemas.pages import COMPARE_PAGE, COMPARISONS_PAGE
from api_schemas.stats_fields import field_meaning, known_fields
from service.cli.common import CsvOpt, JsonOpt, UrlOpt, fail, output_mode
from service.cli.follow import report
from service.cli.render import (
    fmt,
    key_factors,
    print_csv,
    print_json,
    print_table,
    ratio_interval,
    spaced,
)


def compare(
    a: Annotated[int, typer.Argument(help="the first experiment's id")],
    b: Annotated[int, typer.Argument(help="the second experiment's id")],
    url: UrlOpt = None,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
    scale: Annotated[
        str | None,
        typer.Option(
            help="raw or log: the scale the variances and means are tested on (default: the "
            "specs' analysis.scale when both name the same one, else raw)"
        ),
    ] = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """Two experiments of one trainer side by side, condition by condition (matched by the
    values their run configs give the gridded fields, whatever grid keys gave them; the
    base-config fields that differ listed first): the means with their test, the variance
    ratio with the primary test (raw p-values: not adjusted for the conditions compared)."""
    params: dict[str, Any] = {"a": a, "b": b, "limit": COMPARE_PAGE}
    if metric:
        params["metric"] = metric
    if scale:
        params["scale"] = scale
    columns = (
        "condition",
        "n a/b",
        "mean a",
        "mean b",
        "mean test",
        "mean p",
        "var a/b",
        "primary ci95",
        "primary p",
    )
    rows: list[list[str]] = []
    pages: list[dict[str, Any]] = []
    offset: int | None = 0
    with remote.connect(url, 120) as client:
        while offset is not None:
            body = remote.ask(client, "GET", "/compare", params={**params, "offset": offset})
            pages.append(body)
            for side in body["conditions"]:
                t = side["comparison"]
                rows.append(
                    [
                        spaced(_matched(side)),
                        f"{t['n_a']}/{t['n_b']}",
                        fmt(side["a"]["mean"]),
                        fmt(side["b"]["mean"]),
                        t.get("mean_test") or "-",
                        fmt(t.get("mean_p"), 3),
                        fmt(t["var_ratio"], 3),
                        ratio_interval(t.get("primary_ci95")),
                        fmt(t.get("primary_p"), 3),
                    ]
                )
            offset = body["next_offset"]
    mode = output_mode(as_json, as_csv)
    if mode == "json":
        print_json(pages[0] if len(pages) == 1 else pages)
        return
    if mode == "csv":
        print_csv(columns, rows)
        return
    on = body.get("scale", "raw")
    render.console.print(
        f"{body['trainer']}, metric {body['metric']} ({on} scale: "
        f"{'its logarithm' if on == 'log' else 'the metric itself'} tested; means shown raw): "
        f"{body['total_conditions']} shared conditions (matched by what they run)",
        markup=False,
        soft_wrap=True,
    )
    if body.get("scale_note"):
        render.console.print(body["scale_note"], markup=False, soft_wrap=True)
    for difference in body.get("config_differences", []):
        render.console.print(
            f"config {difference['field']}: {difference['a']} in {a}, {difference['b']} in {b}",
            markup=False,
            soft_wrap=True,
        )
    print_table(
        f"experiment {a} vs {b}: raw p-values, not adjusted for the conditions compared",
        columns,
        rows,
        {"condition", "mean test", "primary ci95"},
        key_factors(side["condition_key"] for page in pages for side in page["conditions"]),
        keep_whole={"mean test", "primary ci95"},
    )
    if rows:
        render.console.print(
            "primary p and ci95: the randomisation test of var a/b and the "
            "ratios it does not reject (where the seeds pair up, signs flipped "
            "within each seed and the mean test a paired t; else runs permuted "
            "and Welch's t)",
            markup=False,
        )
    for side, keys in (("a", body["only_in_a"]), ("b", body["only_in_b"])):
        if keys:
            render.console.print(f"only in {side}: {', '.join(keys)}", markup=False)


def _matched(side: dict[str, Any]) -> str:
    """A shared condition's key in a, and b's where b's grid names it otherwise."""
    key_a, key_b = side["condition_key"], side.get("condition_key_b", side["condition_key"])
    if key_b != key_a:
        return f"{key_a or '(all)'} = b: {key_b or '(all)'}"
    return str(key_a)


def stats(
    experiment_id: int,
    url: UrlOpt = None,
    metric: Annotated[str | None, typer.Option(help="metric to compare")] = None,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help="every field of every condition and comparison, warnings included, "
            "instead of the compact tables",
        ),
    ] = False,
    scale: Annotated[
        str | None,
        typer.Option(
            help="raw: variances of the metric; log: of its logarithm (relative spreads, for a "
            "positive metric) [default: the spec's analysis.scale]",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    as_csv: Annotated[
        bool,
        typer.Option(
            "--csv",
            help="both tables as one CSV at full precision, intervals as two columns (its "
            "`table` column says which table a row is from)",
        ),
    ] = False,
    table_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="markdown or latex: both tables ready for a paper (3 significant digits, "
            "the raw interval beside the Holm p, confounds noted)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Per-condition table and variance comparisons of an experiment: the primary test of
    each comparison, its p Holm-adjusted per factor (compact; --all for every field)."""
    mode = output_mode(as_json, as_csv)
    if table_format is not None:
        if table_format not in ("markdown", "latex"):
            raise fail(f"--format: expected markdown or latex, got {table_format!r}")
        if mode != "table":
            raise fail("--format: give it alone, without --json or --csv")
        mode = table_format
    if scale not in (None, "raw", "log"):
        raise fail(f"--scale: expected raw or log, got {scale!r}")
    with remote.connect(url, 120) as client:
        report(client, experiment_id, metric, show_all, mode, scale)


def figure(
    experiment_id: int,
    url: UrlOpt = None,
    metric: Annotated[str | None, typer.Option(help="metric to draw")] = None,
    scale: Annotated[
        str | None,
        typer.Option(help="raw or log [default: the spec's analysis.scale]", show_default=False),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="folder for the files [default: ./seedgrid-figures-ID]"),
    ] = None,
) -> None:
    """Paper-ready figures of an experiment's statistics, each as SVG and PNG: a forest plot
    of the variance ratios with their primary 95% intervals (log axis, Holm p beside each; the
    pooled comparisons first), every seed's value per condition on the analysis scale, and
    the metric's curve per condition (mean +- sd across seeds) where the runs logged it."""
    import service.analysis.figures as figures

    if scale not in (None, "raw", "log"):
        raise fail(f"--scale: expected raw or log, got {scale!r}")
    params: dict[str, Any] = {"limit": COMPARISONS_PAGE}
    params.update({k: v for k, v in (("metric", metric), ("scale", scale)) if v})
    with remote.connect(url, 120) as client:
        stats = remote.ask(client, "GET", f"/experiments/{experiment_id}/stats", params=params)
        detail = remote.ask(client, "GET", f"/experiments/{experiment_id}")
        curve = None
        if stats["metric"] in (detail.get("curve_metrics") or []):

            def fetch(name: str, run_ids: list[int]) -> dict[int, figures.Points]:
                answer = remote.ask(
                    client,
                    "GET",
                    f"/experiments/{experiment_id}/curves",
                    params={"name": name, "run": run_ids},
                )
                return {int(k): v for k, v in answer["curves"].items()}

            curve = (stats["metric"], figures.fetch_curves(stats, stats["metric"], fetch))
    folder = out if out is not None else Path(f"seedgrid-figures-{experiment_id}")
    for path in figures.write_figures(stats, folder, curve):
        render.console.print(str(path), markup=False, soft_wrap=True)
    if curve is None:
        render.console.print(
            f"no curves figure: the runs logged no points of {stats['metric']}",
            markup=False,
            soft_wrap=True,
        )


def protocol(
    experiment_id: int,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """The protocol verdicts of an experiment whose trainer declares them (feedback): per
    condition, then per run."""
    mode = output_mode(as_json, as_csv)
    with remote.connect(url, 120) as client:
        body = remote.ask(client, "GET", f"/experiments/{experiment_id}/reports/protocol")
    if mode == "json":
        print_json(body)
        return
    run_columns = ("run", "condition", "seed", "status", "verdict", "depth utility pp")
    run_rows = [
        [
            str(r["run_id"]),
            spaced(r["condition_key"]),
            str(r["seed"]),
            r["status"],
            r["verdict"],
            fmt(r.get("depth_utility_pp"), 3),
        ]
        for r in body["runs"]
    ]
    if mode == "csv":
        print_csv(run_columns, run_rows)
        return
    render.console.print(
        f"experiment {experiment_id}: {body['n_completed']} completed and "
        f"{body.get('n_stopped', 0)} stopped runs audited of {body['n_runs']}"
        + (f"; depth utility: {body['d3_reason']}" if body.get("d3_reason") else ""),
        markup=False,
        soft_wrap=True,
    )
    columns = ("condition", "n", "verdicts", "fired", "depth utility pp")
    rows = [
        [
            spaced(c["condition_key"]) or "(all)",
            str(c["n"]),
            spaced(_pairs(c["verdicts"])),
            spaced(_pairs(c["fired"])),
            f"{fmt(c['depth_utility_pp_mean'], 3)} ± {fmt(c['depth_utility_pp_std'], 3)}",
        ]
        for c in body["conditions"]
    ]
    factors = key_factors(r["condition_key"] for r in body["runs"])
    print_table("per condition", columns, rows, {"condition", "verdicts", "fired"}, factors)
    print_table("per run", run_columns, run_rows, {"condition", "verdict"}, factors)


def _pairs(counts: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in counts.items()) or "-"


def trainers(
    name: Annotated[str | None, typer.Argument(help="a trainer: its config fields")] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
) -> None:
    """The trainers the service runs; with NAME, its config fields, defaults and meanings."""
    mode = output_mode(as_json, as_csv)
    with remote.connect(url, 60) as client:
        listed = remote.ask(client, "GET", "/trainers")
    if name is None:
        if mode == "json":
            print_json(listed)
            return
        columns = ("name", "primary metric", "reports", "description")
        rows = [
            [t["name"], t["primary_metric"], ", ".join(t["reports"]) or "-", t["description"]]
            for t in listed
        ]
        if mode == "csv":
            print_csv(columns, rows)
        else:
            print_table(None, columns, rows, set(columns))
        return
    found = {t["name"]: t for t in listed}
    trainer = found.get(name)
    if trainer is None:
        close = difflib.get_close_matches(name, found, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise fail(f"unknown trainer {name!r}{hint}; available: {', '.join(found)}")
    if mode == "json":
        print_json(trainer)
        return
    schema = trainer["config_schema"]
    columns = ("field", "type", "default", "meaning")
    rows = [
        [field, _schema_type(prop, schema), _default(prop), prop.get("description", "")]
        for field, prop in schema.get("properties", {}).items()
    ]
    if mode == "csv":
        print_csv(columns, rows)
        return
    render.console.print(
        f"{trainer['name']}: {trainer['description']}", markup=False, soft_wrap=True
    )
    if trainer["paper"]:
        render.console.print(f"paper: {trainer['paper']}", markup=False, soft_wrap=True)
    render.console.print(f"metrics: {', '.join(trainer['metrics'])}", markup=False, soft_wrap=True)
    render.console.print(
        f"diagnostics (per run, not compared): {', '.join(trainer['diagnostics'])}",
        markup=False,
        soft_wrap=True,
    )
    print_table("config fields", columns, rows, {"field", "type", "default", "meaning"})


def _schema_type(prop: dict[str, Any], schema: dict[str, Any]) -> str:
    """A config field's type from its JSON schema, in a few words."""
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "$ref" in prop:
        target = schema.get("$defs", {}).get(prop["$ref"].rsplit("/", 1)[-1], {})
        return _schema_type(target, schema) if target else prop["$ref"].rsplit("/", 1)[-1]
    for union in ("anyOf", "oneOf"):
        if union in prop:
            return " | ".join(_schema_type(p, schema) for p in prop[union])
    kind = prop.get("type", "any")
    if kind == "array" and "items" in prop:
        return f"list of {_schema_type(prop['items'], schema)}"
    return str(kind)


def _default(prop: dict[str, Any]) -> str:
    return json.dumps(prop["default"]) if "default" in prop else "(required)"


def plan(
    ratio: Annotated[
        float | None,
        typer.Option(help="variance ratio var_a / var_b to detect: prints the seeds per level"),
    ] = None,
    seeds: Annotated[
        int | None, typer.Option(help="seeds per level: prints the smallest ratio they detect")
    ] = None,
    alpha: Annotated[float, typer.Option(help="level of the two-sided primary test")] = 0.05,
    power: Annotated[float, typer.Option(help="probability of detecting it")] = 0.8,
    paired: Annotated[
        bool,
        typer.Option(
            "--paired/--unpaired",
            help="the levels run the same seeds (seedgrid's default) or independent ones",
        ),
    ] = True,
    correlation: Annotated[
        float,
        typer.Option(
            help="how much the two levels' results correlate seed by seed, in [0, 0.99] "
            "(paired only)"
        ),
    ] = 0.0,
) -> None:
    """How many seeds a variance comparison needs (no service needed; GET /planning/seeds
    answers the same)."""
    from service.analysis.planning import seed_plan

    if (ratio is None) == (seeds is None):
        raise fail(
            "give exactly one of --ratio (to get the seeds per level) and --seeds (to "
            "get the detectable ratio)"
        )
    if ratio is not None and ratio <= 0:
        raise fail(f"--ratio must be above 0, got {ratio}")
    if seeds is not None and seeds < 2:
        raise fail(f"--seeds must be at least 2 (a variance needs two values), got {seeds}")
    if not (0 < alpha < power < 1):
        raise fail(
            f"--alpha and --power must satisfy 0 < alpha < power < 1, got {alpha} and {power}"
        )
    if not 0 <= correlation <= 0.99:
        raise fail(f"--correlation must be in [0, 0.99], got {correlation}")
    if correlation > 0 and not paired:
        raise fail("--correlation is for paired seeds: drop it or use --paired")
    answer = seed_plan(
        ratio=ratio, seeds=seeds, alpha=alpha, power=power, paired=paired, correlation=correlation
    )
    if ratio is not None:
        result = (
            f"{answer.seeds_per_level} seeds per level" if answer.seeds_per_level else answer.note
        )
        render.console.print(
            f"to detect a variance ratio of {ratio:g} (or 1/{ratio:g}) with power "
            f"{power:g} at alpha {alpha:g}: {result}",
            markup=False,
            soft_wrap=True,
        )
    else:
        result = f"{answer.ratio:.3g} (or 1/{answer.ratio:.3g})" if answer.ratio else answer.note
        render.console.print(
            f"{seeds} seeds per level detect, with power {power:g} at alpha "
            f"{alpha:g}, a variance ratio of {result}",
            markup=False,
            soft_wrap=True,
        )
    if answer.f_test_seeds_per_level is not None or answer.f_test_ratio is not None:
        promised = (
            f"{answer.f_test_seeds_per_level} seeds per level"
            if ratio is not None
            else f"a ratio of {answer.f_test_ratio:.3g}"
        )
        render.console.print(
            f"(the F-test, if the seeds were normal, would promise {promised})",
            markup=False,
            soft_wrap=True,
        )
    render.console.print(f"({answer.method})", markup=False, soft_wrap=True)


def explain(
    field: Annotated[
        str | None,
        typer.Argument(help="a field of /stats (a condition's or a comparison's) [default: all]"),
    ] = None,
) -> None:
    """What a statistics field means, in one line (no service needed); every field without
    FIELD."""
    if field is None:
        for name in known_fields():
            render.console.print(f"{name}: {field_meaning(name)}", markup=False, soft_wrap=True)
        return
    meaning = field_meaning(field)
    if meaning is None:
        close = difflib.get_close_matches(field, known_fields(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise fail(f"unknown statistics field {field!r}{hint}; `seedgrid explain` lists them all")
    render.console.print(f"{field}: {meaning}", markup=False, soft_wrap=True)
