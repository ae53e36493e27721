"""Paper-ready figures of an experiment's statistics, each as SVG and PNG (matplotlib, drawn
off-screen), for `seedgrid figure ID` and the dashboard's download buttons
(GET /experiments/{id}/figure):

- `forest`: the variance ratio of each comparison (the pooled ones first, at most
  MAX_FOREST_ROWS) with its primary 95% interval on a log axis, a line at 1, and the
  Holm-adjusted p beside each row; an interval unbounded above runs to the axis' edge with an
  arrow; a confounded comparison's label ends in "(confounded)";
- `distribution`: every completed seed's value per condition, on the experiment's analysis
  scale (log axis when the spec says log), each condition's mean as a bar;
- `curves`: the metric's curve per condition over training, the mean across seeds as a line
  and mean +- one standard deviation as a band, at most MAX_CURVE_RUNS_PER_CONDITION seeds of
  each (on the log scale the mean and deviation are of log10 values: a geometric mean and a
  band of factors), when the runs logged the metric as points.

The data are GET /experiments/{id}/stats's, so the figures show what the tables show. Each
figure is a matplotlib Figure of its own (no pyplot state), so the service's threads can draw
at once."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api_schemas.levels import condition_text, pair_text
from api_schemas.pages import CURVE_RUNS

MAX_FOREST_ROWS = 40
MAX_CURVE_RUNS_PER_CONDITION = 20
FORMATS = ("svg", "png")
MEDIA_TYPES = {"svg": "image/svg+xml", "png": "image/png"}
DPI = 200


def _figure(width: float, height: float) -> tuple[Any, Any]:
    """A new Figure of that size in inches (drawn by the Agg canvas: no display) and its axes."""
    import matplotlib
    from matplotlib.figure import Figure

    # text stays text in the SVG (editable, searchable, the paper's font), not glyph outlines
    # (set for the process, once: rc_context around each save would race between threads)
    matplotlib.rcParams["svg.fonttype"] = "none"
    # the SVG's element ids from a fixed salt, not a random one: the same statistics give the
    # same bytes (a figure can be cached, compared, diffed)
    matplotlib.rcParams["svg.hashsalt"] = "seedgrid"
    fig = Figure(figsize=(width, height))
    return fig, fig.subplots()


def forest_rows(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """The comparisons the forest plot shows: the pooled ones first, then the rest, at most
    MAX_FOREST_ROWS, each with a ratio."""
    comparisons = [c for c in stats["comparisons"] if c.get("var_ratio") is not None]
    ordered = [c for c in comparisons if c.get("within") is None] + [
        c for c in comparisons if c.get("within") is not None
    ]
    return ordered[:MAX_FOREST_ROWS]


def comparison_label(c: dict[str, Any]) -> str:
    within = "pooled" if c.get("within") is None else condition_text(c["within"])
    return f"{pair_text(c)} ({within})" + (" (confounded)" if c.get("confounds") else "")


def _p_text(p: float | None) -> str:
    if p is None:
        return "Holm p —"
    return f"Holm p {p:.2g}" if p >= 1e-3 else f"Holm p {p:.1e}"


def forest(stats: dict[str, Any]) -> Any:
    """The forest plot of `stats`' variance ratios (a Figure)."""
    rows = forest_rows(stats)
    height = 1.2 + 0.35 * max(len(rows), 1)
    fig, ax = _figure(7.5, height)
    ends = [v for c in rows for v in (c.get("primary_ci95") or []) if v not in (None, 0)]
    ratios = [c["var_ratio"] for c in rows if c["var_ratio"] and c["var_ratio"] > 0]
    positive = [v for v in ends + ratios if v and v > 0 and math.isfinite(v)] or [1.0]
    low_edge = min(positive + [1.0]) / 2
    high_edge = max(positive + [1.0]) * 2
    for i, c in enumerate(rows):
        y = len(rows) - 1 - i
        interval = c.get("primary_ci95")
        if interval is not None:
            low, high = interval
            low = low if low and low > 0 else low_edge
            unbounded = high is None
            high = high_edge if unbounded else high
            ax.plot([low, high], [y, y], color="black", linewidth=1.2)
            if unbounded:
                ax.annotate(
                    "",
                    xy=(high_edge, y),
                    xytext=(high_edge / 1.6, y),
                    arrowprops={"arrowstyle": "->", "color": "black"},
                )
        if c["var_ratio"] and c["var_ratio"] > 0:
            ax.plot([c["var_ratio"]], [y], marker="s", color="black", markersize=5)
        ax.text(
            1.02,
            y,
            _p_text(c.get("primary_p_holm_factor")),
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize=8,
        )
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlim(low_edge, high_edge)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([comparison_label(c) for c in reversed(rows)], fontsize=8)
    scale = "log " if stats.get("scale") == "log" else ""
    ax.set_xlabel(f"variance ratio a / b of {scale}{stats['metric']} (primary 95% interval)")
    ax.set_title(f"Variance ratios, {stats['metric']}", fontsize=10)
    fig.tight_layout()
    return fig


def distribution(stats: dict[str, Any]) -> Any:
    """Every seed's value per condition, on the analysis scale (a Figure)."""
    conditions = stats["conditions"]
    fig, ax = _figure(max(4.0, 0.8 * len(conditions) + 2), 4.0)
    log = stats.get("scale") == "log"
    for i, c in enumerate(conditions):
        values = [v for v in c.get("values", []) if v is not None and (not log or v > 0)]
        jitter = [i + 0.12 * ((k % 5) - 2) / 2 for k in range(len(values))]
        ax.scatter(jitter, values, s=12, color="tab:blue", alpha=0.8, zorder=2)
        if c.get("mean") is not None and (not log or c["mean"] > 0):
            ax.plot([i - 0.25, i + 0.25], [c["mean"], c["mean"]], color="black", zorder=3)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(conditions)))
    ax.set_xticklabels(
        [c["condition_key"] or "(all)" for c in conditions], rotation=30, ha="right", fontsize=8
    )
    ax.set_ylabel(f"{stats['metric']}" + (" (log axis)" if log else ""))
    ax.set_title(f"{stats['metric']} per condition: every seed, mean as a bar", fontsize=10)
    fig.tight_layout()
    return fig


# A run's points of one metric: [step, value] in step order, value None where not finite.
Points = list[tuple[int, float | None]]
# Fetches metric `name`'s points of these runs (at most CURVE_RUNS at once): run id -> points.
CurveFetcher = Callable[[str, list[int]], dict[int, Points]]


def curve_runs(stats: dict[str, Any]) -> dict[str, list[int]]:
    """The completed runs whose curves the curves figure draws: per condition, its first
    MAX_CURVE_RUNS_PER_CONDITION in /stats' order."""
    return {
        c["condition_key"]: [r["run_id"] for r in c.get("runs", [])][:MAX_CURVE_RUNS_PER_CONDITION]
        for c in stats["conditions"]
    }


def fetch_curves(stats: dict[str, Any], name: str, fetch: CurveFetcher) -> dict[str, list[Points]]:
    """Each condition's runs' curves of metric `name`, CURVE_RUNS runs to a fetch."""
    wanted = curve_runs(stats)
    every = [run_id for ids in wanted.values() for run_id in ids]
    fetched: dict[int, Points] = {}
    for start in range(0, len(every), CURVE_RUNS):
        fetched.update(fetch(name, every[start : start + CURVE_RUNS]))
    return {key: [fetched[i] for i in ids if fetched.get(i)] for key, ids in wanted.items()}


def band(
    curves: list[Points], log: bool
) -> tuple[list[int], list[float], list[float], list[float]]:
    """The steps some curve has a usable value at, and at each the mean, mean - sd and
    mean + sd over the curves that have one (sd 0 with one curve); with `log`, of log10 of the
    positive values, brought back (a geometric mean, a band of factors)."""
    at: dict[int, list[float]] = {}
    for points in curves:
        for step, value in points:
            if value is None or not math.isfinite(value) or (log and value <= 0):
                continue
            at.setdefault(step, []).append(math.log10(value) if log else value)
    steps, mean, low, high = [], [], [], []
    for step in sorted(at):
        values = at[step]
        m = sum(values) / len(values)
        sd = (
            math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
            if len(values) > 1
            else 0.0
        )
        back = (lambda u: 10.0**u) if log else (lambda u: u)
        steps.append(step)
        mean.append(back(m))
        low.append(back(m - sd))
        high.append(back(m + sd))
    return steps, mean, low, high


def curves(stats: dict[str, Any], name: str, by_condition: dict[str, list[Points]]) -> Any:
    """Metric `name` over training per condition: mean line, +- one sd band (a Figure)."""
    fig, ax = _figure(7.5, 4.5)
    log = stats.get("scale") == "log"
    for i, (key, runs) in enumerate(by_condition.items()):
        steps, mean, low, high = band(runs, log)
        if not steps:
            continue
        colour = f"C{i % 10}"  # matplotlib's colour cycle
        label = f"{key or '(all)'} (n={len(runs)})"
        ax.plot(steps, mean, color=colour, linewidth=1.4, label=label)
        ax.fill_between(steps, low, high, color=colour, alpha=0.18, linewidth=0)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(name + (" (log axis)" if log else ""))
    spread = "geometric mean, x/ one sd of log10" if log else "mean +- one sd"
    ax.set_title(f"{name} over training per condition: {spread} across seeds", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, frameon=False, loc="best")
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "forest": forest,
    "distribution": distribution,
}


def render(
    name: str,
    stats: dict[str, Any],
    kind: str,
    curve: tuple[str, dict[str, list[Points]]] | None = None,
) -> bytes:
    """Figure `name` of `stats` as the bytes of an SVG or PNG file; `curves` draws `curve`
    (the metric's name and each condition's runs' points)."""
    if name == "curves":
        if curve is None:
            raise ValueError("the curves figure needs the curves")
        fig = curves(stats, *curve)
    else:
        fig = FIGURES[name](stats)
    out = io.BytesIO()
    # no date in an SVG (nor a random id: _figure), so the same statistics give the same bytes
    fig.savefig(out, dpi=DPI, format=kind, metadata={"Date": None} if kind == "svg" else None)
    return out.getvalue()


def filename(experiment_id: int, name: str, kind: str) -> str:
    return f"seedgrid-{experiment_id}-{name}.{kind}"


def write_figures(
    stats: dict[str, Any],
    out: Path,
    curve: tuple[str, dict[str, list[Points]]] | None = None,
) -> list[Path]:
    """Every figure of `stats` under `out` (made if missing), as SVG and PNG, the curves too
    when `curve` is given; the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in [*FIGURES, *(["curves"] if curve is not None else [])]:
        for kind in FORMATS:
            path = out / f"{name}.{kind}"
            path.write_bytes(render(name, stats, kind, curve))
            written.append(path)
    return written
