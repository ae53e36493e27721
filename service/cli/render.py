"""What the `seedgrid` commands print: the console, tables that stay readable at 80 columns
(text columns fold at spaces, a condition key at its commas; grid factors abbreviated, with a
legend, when the words do not fit), JSON and CSV, and the views of /stats.

Every print goes through `console` (stdout) or `err` (stderr), looked up here when printing,
so that a test may swap in a recording console."""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from api_schemas import environment
from api_schemas.levels import condition_text, pair_text
from api_schemas.stats_fields import COMPARISON_FIELDS, CONDITION_FIELDS

# A pipe gets 160 columns unless COLUMNS says otherwise (rich reads COLUMNS itself).
console = Console(width=None if sys.stdout.isatty() or environment.terminal_columns_set() else 160)
err = Console(stderr=True)


def counts_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v)


def spaced(condition_key: str) -> str:
    """A condition key with a space after each comma, where a narrow table may fold it: each
    `factor=level` stays whole."""
    return condition_key.replace(",", ", ")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def print_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(
        [json.dumps(v) if isinstance(v, list | dict) else v for v in row] for row in rows
    )


# Longest unbroken word a text column is kept wide enough for; longer ones fold.
MAX_WORD_WIDTH = 40
# Columns apart in a table (its padding either side and the separator).
TABLE_GAP = 3


def print_table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    text_columns: set[str],
    factors: Sequence[str] = (),
    width: int | None = None,
    *,
    keep_whole: Collection[str] = (),
) -> None:
    """A table that stays readable in a narrow terminal: text columns wrap at spaces (a
    condition key at its commas), the others never wrap and are as wide as their widest cell,
    so that no number is cut. When the words of the text columns are too wide for that with
    the numbers' headers and the cells of `keep_whole` (text columns that wrap only when the
    others cannot make room) whole, the grid factors' names are abbreviated in them
    (stop_gradient -> sg), with a legend."""
    width = width or console.width
    legend: dict[str, str] = {}
    if _min_width(columns, rows, text_columns, keep_whole) > width and factors:
        legend = abbreviations(factors)
        rows = [
            [
                _abbreviate(cell, legend) if col in text_columns else cell
                for col, cell in zip(columns, row, strict=True)
            ]
            for row in rows
        ]
    widths = _column_widths(columns, rows, text_columns, width, keep_whole)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name, column_width in zip(columns, widths, strict=True):
        table.add_column(
            name,
            overflow="fold",
            width=column_width,
            justify="left" if name in text_columns else "right",
        )
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table, width=width)
    if legend:
        console.print(
            "factors: " + ", ".join(f"{short} = {full}" for full, short in legend.items()),
            markup=False,
            soft_wrap=True,
        )


def stats_factors(stats: dict[str, Any]) -> list[str]:
    """The grid factors a stats page names (its conditions' and comparisons')."""
    names = [f for c in stats["conditions"] for f in c["condition"]]
    names += [f for c in stats["comparisons"] for f in [c["factor"], *(c["within"] or {})]]
    return list(dict.fromkeys(names))


def key_factors(keys: Iterator[str] | Sequence[str]) -> list[str]:
    """The factor names in condition keys (`factor=level,factor=level`)."""
    return list(
        dict.fromkeys(
            part.split("=", 1)[0] for key in keys for part in key.split(",") if "=" in part
        )
    )


def _word_width(header: str, rows: Sequence[Sequence[str]], i: int) -> int:
    words = [w for row in rows for w in row[i].split()] + header.split()
    return min(max((len(w) for w in words), default=1), MAX_WORD_WIDTH)


def _min_widths(
    columns: Sequence[str], rows: Sequence[Sequence[str]], text_columns: set[str]
) -> list[int]:
    """Each column's narrowest width with every word of a text column and every number of
    the others whole (a header may wrap at its spaces)."""
    return [
        _word_width(name, rows, i)
        if name in text_columns
        else max([len(row[i]) for row in rows] + [len(max(name.split(), key=len))])
        for i, name in enumerate(columns)
    ]


def _min_width(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    text_columns: set[str],
    keep_whole: Collection[str] = (),
) -> int:
    """The narrowest the table can be with every word, every number and its header, and every
    cell of `keep_whole` whole."""
    narrowest = _min_widths(columns, rows, text_columns - set(keep_whole))
    widths = [
        narrowest[i] if name in text_columns else max([len(row[i]) for row in rows] + [len(name)])
        for i, name in enumerate(columns)
    ]
    return sum(widths) + TABLE_GAP * (len(columns) - 1)


def _column_widths(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    text_columns: set[str],
    width: int,
    keep_whole: Collection[str] = (),
) -> list[int | None]:
    """Fixed widths that fit `width`: each column's natural width when all fit, else its
    narrowest whole-word width (the cells of `keep_whole` whole, when that fits) with the room
    left given to the number columns first. None each (rich decides, folding inside words)
    when even the narrowest do not fit."""
    natural = [max([len(row[i]) for row in rows] + [len(name)]) for i, name in enumerate(columns)]
    room = width - TABLE_GAP * (len(columns) - 1)
    if sum(natural) <= room:
        return list(natural)
    widths = _min_widths(columns, rows, text_columns - set(keep_whole))
    if sum(widths) > room:
        widths = _min_widths(columns, rows, text_columns)
    spare = room - sum(widths)
    if spare < 0:
        return [None] * len(columns)
    # numbers' headers whole first (a header that wraps, "var / ratio", reads badly), then the
    # text columns get the room left
    order = sorted(range(len(columns)), key=lambda i: columns[i] in text_columns)
    for i in order:
        grow = min(spare, natural[i] - widths[i])
        widths[i] += grow
        spare -= grow
    return list(widths)


def abbreviations(factors: Sequence[str]) -> dict[str, str]:
    """Short names for factor names of several `_`-separated words: their initials
    (stop_gradient -> sg), made longer until no two factors share one."""
    short: dict[str, str] = {}
    for factor in factors:
        parts = [p for p in factor.split("_") if p]
        if len(parts) < 2:  # one word (lr, steps) stays as it is
            continue
        for extra in range(max(len(p) for p in parts)):
            candidate = "".join(p[: 1 + extra] for p in parts)
            if candidate not in short.values():
                break
        if len(candidate) < len(factor):
            short[factor] = candidate
    return short


def _abbreviate(cell: str, legend: dict[str, str]) -> str:
    for full, short in legend.items():
        cell = re.sub(rf"(?<![\w.]){re.escape(full)}(?=[=:])", short, cell)
    return cell


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v, digits) for v in value) + "]"
    return str(value)


# The compact view's width: its tables fit a 100-column terminal.
COMPACT_WIDTH = 100


def _within(comparison: dict[str, Any]) -> str:
    within = comparison["within"]
    return condition_text(within) if within else "pooled"


def _flag(item: dict[str, Any]) -> str:
    return f"!{len(item['warnings'])}" if item.get("warnings") else ""


CONDITION_COLUMNS = ("condition", "n", "mean", "ci95", "std", "noise share", "!")
COMPARISON_COLUMNS = ("pair", "within", "n", "pairing", "var ratio", "primary ci95", "Holm p", "!")
# The significance marks of a Holm-adjusted p-value, as the dashboard shows them.
SIGNIFICANCE_MARKS = ((0.01, "**"), (0.05, "*"))
# Ratio intervals whose high end is null when it is unbounded (infinity).
RATIO_INTERVALS = {"primary_ci95", "var_ratio_ci95_f"}
# p-values as computed, before any adjustment for multiple comparisons.
RAW_P_VALUES = {"primary_p", "f_test_p", "brown_forsythe_p", "welch_p", "mean_p"}


def _mark(p: float | None) -> str:
    return next((mark for level, mark in SIGNIFICANCE_MARKS if p is not None and p < level), "")


def ratio_interval(interval: list[float | None] | None, digits: int = 2) -> str:
    """A variance ratio's interval, its null high end shown as inf (no ratio above is
    rejected)."""
    if interval is None:
        return "-"
    low, high = interval
    return f"[{fmt(low, digits)}, {'inf' if high is None else fmt(high, digits)}]"


def condition_rows(stats: dict[str, Any]) -> list[list[str]]:
    return [
        [
            spaced(c["condition_key"]) or "(all)",
            str(c["n"]),
            fmt(c["mean"]),
            fmt(c["ci95"]),
            fmt(c["std"], 3),
            fmt(c.get("noise_floor_share"), 2),
            _flag(c),
        ]
        for c in stats["conditions"]
    ]


def comparison_rows(stats: dict[str, Any], marks: bool = True) -> list[list[str]]:
    """One row per comparison: its primary test's interval and Holm p (per factor), with `*`
    below 0.05 and `**` below 0.01 when `marks`."""
    rows = []
    for c in stats["comparisons"]:
        holm = c.get("primary_p_holm_factor")
        mark = _mark(holm) if marks else ""
        shown = fmt(holm, 3) + (f" {mark}" if mark else "")
        rows.append(
            [
                pair_text(c),
                spaced(_within(c)),
                f"{c['n_a']}/{c['n_b']}",
                c.get("pairing") or "-",
                fmt(c["var_ratio"], 3),
                ratio_interval(c.get("primary_ci95")),
                shown,
                ("c " if c.get("confounds") else "") + _flag(c),
            ]
        )
    return rows


def split_silent(stats: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The stats with only the comparisons that can say something, and those that cannot (the
    primary interval [0, inf]: no ratio rejected), when there are at least two of the latter
    (one is shown as it is)."""
    silent = [
        c
        for c in stats["comparisons"]
        if (c.get("primary_ci95") or [None, 0])[1:] == [None]
        and (c.get("primary_ci95") or [1])[0] == 0
    ]
    if len(silent) < 2:
        return stats, []
    kept = [c for c in stats["comparisons"] if not any(c is s for s in silent)]
    return {**stats, "comparisons": kept}, silent


def confound_lines(stats: dict[str, Any]) -> list[str]:
    """One line per level pair whose comparisons are confounded: the other fields its two
    levels change, with both values (the first cell's, where pooled cells differ)."""
    lines: dict[str, str] = {}
    for c in stats["comparisons"]:
        if not c.get("confounds"):
            continue
        pair = pair_text(c)
        changes = ", ".join(f"{d['field']} {d['a']} -> {d['b']}" for d in c["confounds"])
        lines.setdefault(pair, f"{pair} also changes {changes}")
    return list(lines.values())


def print_seed_warnings(warnings: list[str]) -> None:
    """What a submitted experiment's seeds per condition cannot let the test say."""
    for warning in warnings:
        console.print(f"warning: {warning}", style="yellow", markup=False, soft_wrap=True)


def print_interim(stats: dict[str, Any], width: int | None = None) -> None:
    """An adaptive experiment still adding seeds: say that its p-values are interim looks."""
    if stats.get("interim"):
        note = stats.get("interim_note") or (
            "interim: this adaptive experiment is still adding seeds; every p-value and interval "
            "here is an interim look, not adjusted for the looks its rule takes"
        )
        console.print(note, style="yellow", markup=False, width=width)


def print_stats(stats: dict[str, Any], full: bool = False) -> None:
    """The compact view (a few columns per condition and per comparison, `!n`: n warnings),
    or with `full` every field of every condition, comparison, family and omnibus test."""
    if full:
        print_all_stats(stats)
        return
    width = min(console.width, COMPACT_WIDTH)
    print_interim(stats, width)
    bounds = stats.get("metric_bounds")
    title = f"per-condition {stats['metric']}" + (f" (bounded {fmt(bounds)})" if bounds else "")
    factors = stats_factors(stats)
    print_table(title, CONDITION_COLUMNS, condition_rows(stats), {"condition"}, factors, width)
    scale = " (log scale)" if stats.get("scale") == "log" else ""
    title = (
        f"variance comparisons of {stats['metric']}{scale}: var_a / var_b within cells, "
        "primary test; Holm p adjusted per factor"
    )
    # Rows that cannot say anything (the test rejects no ratio: [0, inf]) are one line under
    # the table, not dozens of identical rows.
    shown_stats, silent = split_silent(stats)
    # The interval wraps at its space only when abbreviations leave too little room.
    print_table(
        title,
        COMPARISON_COLUMNS,
        comparison_rows(shown_stats),
        {"pair", "within", "primary ci95"},
        factors,
        width,
        keep_whole={"primary ci95"},
    )
    if stats["comparisons"]:
        console.print(
            "primary test: randomisation test of squared deviations from the cell "
            "medians (paired: signs flipped within each seed; unpaired: permuted "
            "within cells); ci95: the ratios it does not reject, raw (each comparison "
            "alone), so it can exclude 1 beside a Holm p above 0.05; Holm p: its p "
            "Holm-adjusted over the factor's comparisons (* < 0.05, ** < 0.01). "
            "F-test, Brown-Forsythe, the mean test and raw p-values: --all",
            markup=False,
            width=width,
        )
    if silent:
        console.print(
            f"{len(silent)} more comparison{'s' * (len(silent) != 1)} cannot say anything "
            "(the test rejects no ratio: interval [0, inf], too few seeds or re-assignments): "
            + ", ".join(sorted({f"{c['factor']} within {_within(c)}" for c in silent})[:6])
            + (", ..." if len({(c["factor"], _within(c)) for c in silent}) > 6 else "")
            + "; `--all` lists them",
            markup=False,
            width=width,
        )
    confounded = confound_lines(stats)
    if confounded:
        console.print(
            "c: confounded: the two levels also differ in other config fields (resolved as "
            "the runs train, defaults included), so the comparison measures those too:",
            style="yellow",
            markup=False,
            width=width,
        )
        for line in confounded:
            console.print(f"  {line}", markup=False, width=width)
    if stats.get("source_decomposition"):
        print_source_decomposition(stats)
    warned = sum(1 for c in stats["comparisons"] + stats["conditions"] if c.get("warnings"))
    if warned:
        console.print(
            f"!n: n warnings on {warned} rows (numbers from fewer seeds than they "
            "need);\n`seedgrid stats ID --all` lists them with every field",
            markup=False,
        )
    _print_page(stats)


# The CSV of `stats --csv`: one row per condition, then one per comparison (the `table` column
# says which, the other table's columns empty), numbers at full precision, intervals as two
# columns, a null as an empty cell and an unbounded interval end as inf.
CONDITION_CSV = ("condition", "n", "mean", "ci_low", "ci_high", "std", "noise_floor_share")
COMPARISON_CSV = (
    "factor",
    "a",
    "b",
    "within",
    "n_a",
    "n_b",
    "pairing",
    "var_ratio",
    "primary_ci_low",
    "primary_ci_high",
    "primary_p",
    "primary_p_holm_factor",
)
# Columns of the CSV that hold a number in every row they are filled in.
CSV_NUMBERS = frozenset(
    {"n", "mean", "ci_low", "ci_high", "std", "noise_floor_share", "n_a", "n_b", "var_ratio"}
    | {"primary_ci_low", "primary_ci_high", "primary_p", "primary_p_holm_factor", "warnings"}
)


def _number(value: Any) -> str:
    """A number as CSV text at full precision (repr), a null as an empty cell."""
    return "" if value is None else repr(value)


def _ends(interval: list[float | None] | None, unbounded: str = "") -> list[str]:
    """An interval's two ends; a null high end is `unbounded` (a ratio interval: inf)."""
    if interval is None:
        return ["", ""]
    low, high = interval
    return [_number(low), unbounded if high is None else _number(high)]


def print_stats_csv(stats: dict[str, Any]) -> None:
    """Both compact tables as one CSV (CONDITION_CSV, COMPARISON_CSV), at full precision."""
    columns = ["table", *CONDITION_CSV, *COMPARISON_CSV, "warnings"]
    blank_c, blank_p = [""] * len(CONDITION_CSV), [""] * len(COMPARISON_CSV)
    rows: list[list[Any]] = [
        [
            "condition",
            c["condition_key"],
            c["n"],
            _number(c["mean"]),
            *_ends(c["ci95"]),
            _number(c["std"]),
            _number(c.get("noise_floor_share")),
            *blank_p,
            len(c.get("warnings", [])),
        ]
        for c in stats["conditions"]
    ]
    rows += [
        [
            "comparison",
            *blank_c,
            c["factor"],
            c["a"],
            c["b"],
            _within(c),
            c["n_a"],
            c["n_b"],
            c.get("pairing") or "",
            _number(c["var_ratio"]),
            *_ends(c.get("primary_ci95"), "inf"),
            _number(c.get("primary_p")),
            _number(c.get("primary_p_holm_factor")),
            len(c.get("warnings", [])),
        ]
        for c in stats["comparisons"]
    ]
    print_csv(columns, rows)


def print_all_stats(stats: dict[str, Any]) -> None:
    """Every field, one per line, grouped per condition, comparison, family and omnibus test;
    each p-value says whether it is raw or Holm-adjusted."""

    def block(title: str, item: dict[str, Any]) -> None:
        console.print(title, markup=False, style="bold")
        for key, value in item.items():
            if key == "warnings":
                for warning in value:
                    console.print(f"  warning: {warning}", markup=False, soft_wrap=True)
            else:
                console.print(f"  {key}: {_field(key, value)}", markup=False, soft_wrap=True)

    print_interim(stats)
    console.print(
        f"metric {stats['metric']}, scale {stats.get('scale', 'raw')}, bounds "
        f"{fmt(stats.get('metric_bounds'))}, {stats['n_completed']} completed runs",
        markup=False,
    )
    for c in stats["conditions"]:
        block(
            f"condition {c['condition_key'] or '(all)'}",
            {k: v for k, v in c.items() if k not in {"condition", "condition_key"}},
        )
    for c in stats["comparisons"]:
        block(
            f"comparison {pair_text(c)} ({_within(c)})",
            {k: v for k, v in c.items() if k not in {"factor", "a", "b", "within"}},
        )
    for family in stats.get("multiplicity", []):
        name = f"factor {family['factor']}" if family["factor"] is not None else "all"
        block(f"Holm family: {name}", {k: v for k, v in family.items() if k != "factor"})
    for omnibus in stats.get("omnibus", []):
        block(f"omnibus {omnibus['factor']}", {k: v for k, v in omnibus.items() if k != "factor"})
    _print_page(stats)
    print_legend(stats)


def print_legend(stats: dict[str, Any]) -> None:
    """What each field of the conditions and comparisons above means, one line each."""
    for title, items, meanings in (
        ("per condition", stats["conditions"], CONDITION_FIELDS),
        ("per comparison", stats["comparisons"], COMPARISON_FIELDS),
    ):
        shown = dict.fromkeys(key for item in items for key in item)
        if shown:
            console.print(f"legend, {title}:", markup=False, style="bold")
            for key in shown:
                console.print(
                    f"  {key}: {meanings.get(key, '(no meaning recorded)')}",
                    markup=False,
                    soft_wrap=True,
                )


def _field(key: str, value: Any) -> str:
    """One field of --all: unbounded ratio intervals end at inf, and a p-value is labelled
    raw or with the family Holm adjusted it over."""
    if key in RATIO_INTERVALS:
        return ratio_interval(value, 6)
    shown = fmt(value, 6)
    if value is None:
        return shown
    if key in RAW_P_VALUES:
        return f"{shown} (raw)"
    if key.endswith("_holm_factor"):
        return f"{shown} (Holm, over the factor's comparisons)"
    if key.endswith("_holm_all"):
        return f"{shown} (Holm, over every comparison)"
    return shown


def _print_page(stats: dict[str, Any]) -> None:
    if stats.get("next_offset") is not None:
        console.print(
            f"showing comparisons {stats['offset'] + 1}-{stats['next_offset']} of "
            f"{stats['total_comparisons']}"
        )


def print_source_decomposition(stats: dict[str, Any]) -> None:
    """One row per condition of the other factors: each level's variance and its interval."""
    decompositions = stats["source_decomposition"]
    table = Table(title=f"variance of {stats['metric']} by random source (var [95% interval])")
    table.add_column("within")
    for source in decompositions[0]["sources"]:
        table.add_column(source["source"], justify="right")
    table.add_column("sum / all", justify="right")
    for d in decompositions:
        table.add_row(
            ", ".join(f"{k}={v}" for k, v in d["within"].items()) or "(all)",
            *(f"{fmt(s['var'], 3)} {fmt(s['var_ci95'], 2)}" for s in d["sources"]),
            fmt(d["sum_over_all"], 3),
        )
    console.print(table)


def queue_line(detail: dict[str, Any]) -> str | None:
    """Why an experiment's queued runs wait for a dispatcher that has loaded its trainer (GET
    /experiments/{id}'s waiting_for), or where a queued experiment waits (queue_position), or
    None."""
    if detail.get("waiting_for"):
        return str(detail["waiting_for"])
    position = detail.get("queue_position")
    if position is None:
        return None
    if position == 1:
        return "queue position 1: the next experiment to start"
    return f"queue position {position}: {position - 1} queued experiments start before it"


def print_message(detail: dict[str, Any]) -> None:
    """Why the experiment stopped before all its runs had run (its first runs all failed)."""
    if detail.get("message"):
        console.print(detail["message"], style="red", markup=False, soft_wrap=True)
