"""Paper-ready figures of an experiment's statistics, each as SVG and PNG (matplotlib, drawn
off-screen), for `seedgrid figure ID` and the dashboard's download buttons
(GET /experiments/{id}/figure):

- `forest`: the variance ratio of each comparison (the pooled ones first, at most
  MAX_FOREST_ROWS) with its primary 95% interval on a log axis, a line at 1, and the
  Holm-adjusted p beside each row; an interval unbounded above runs to the axis' edge with an
  arrow; a confounded comparison's label ends in "(confounded)";
- `distribution`: every completed seed's value per condition, on the experiment's analysis
  scale (log axis when the spec says log), each condition's mean as a bar.

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

MAX_FOREST_ROWS = 40
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


FIGURES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "forest": forest,
    "distribution": distribution,
}


def render(name: str, stats: dict[str, Any], kind: str) -> bytes:
    """Figure `name` of `stats` as the bytes of an SVG or PNG file."""
    fig = FIGURES[name](stats)
    out = io.BytesIO()
    # no date in an SVG, so the same statistics give the same bytes
    fig.savefig(out, dpi=DPI, format=kind, metadata={"Date": None} if kind == "svg" else None)
    return out.getvalue()


def filename(experiment_id: int, name: str, kind: str) -> str:
    return f"seedgrid-{experiment_id}-{name}.{kind}"


def write_figures(stats: dict[str, Any], out: Path) -> list[Path]:
    """Every figure of `stats` under `out` (made if missing), as SVG and PNG; the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FIGURES:
        for kind in FORMATS:
            path = out / f"{name}.{kind}"
            path.write_bytes(render(name, stats, kind))
            written.append(path)
    return written
