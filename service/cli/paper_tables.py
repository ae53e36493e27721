"""`seedgrid stats ID --format markdown|latex`: the per-condition table and the variance
comparisons as tables to paste into a paper, with sensible precision (3 significant digits;
scientific notation below 1e-3 or from 1e5, as $1.08 \\times 10^{-8}$ in LaTeX, never
0.000000), a missing number as an em dash (never nan), unbounded interval ends as infinity,
and LaTeX's special characters escaped. The comparisons carry the raw interval beside the
Holm-adjusted p, saying so in the caption line, and mark a confounded comparison."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from api_schemas.levels import condition_text, pair_text

MISSING = "—"
LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "→": r"$\rightarrow$",
    "−": "$-$",
    "—": "---",
}

CONDITION_HEADER = ("condition", "n", "mean", "95% CI", "std")
COMPARISON_HEADER = (
    "comparison",
    "within",
    "n a/b",
    "var ratio",
    "95% CI (raw)",
    "p (raw)",
    "p (Holm)",
    "mean a − b [95% CI]",
)


def number(value: Any, *, latex: bool) -> str:
    """3 significant digits; scientific below 1e-3 or from 1e5; MISSING for None or nan."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING if not latex else "---"
    if isinstance(value, float) and math.isinf(value):
        return (
            ("$\\infty$" if value > 0 else "$-\\infty$") if latex else ("∞" if value > 0 else "−∞")
        )
    x = float(value)
    if x == 0 or 1e-3 <= abs(x) < 1e5:
        # 3 significant digits, never in e-notation: 1370, not 1.37e+03
        text = f"{float(f'{x:.3g}'):.0f}" if abs(x) >= 100 else f"{x:.3g}"
        return text if not latex or not text.startswith("-") else f"${text}$"
    mantissa, exponent = f"{x:.2e}".split("e")
    power = int(exponent)
    if latex:
        return f"${mantissa} \\times 10^{{{power}}}$"
    return f"{mantissa}×10^{power}"


def interval(bounds: Sequence[Any] | None, *, latex: bool, unbounded_high: bool = False) -> str:
    if bounds is None:
        return "---" if latex else MISSING
    low, high = bounds
    if high is None and unbounded_high:
        high = math.inf
    return f"[{number(low, latex=latex)}, {number(high, latex=latex)}]"


def escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def condition_rows(stats: dict[str, Any], *, latex: bool) -> list[list[str]]:
    return [
        [
            c["condition_key"] or "(all)",
            str(c["n"]),
            number(c["mean"], latex=latex),
            interval(c.get("ci95"), latex=latex),
            number(c["std"], latex=latex),
        ]
        for c in stats["conditions"]
    ]


def _within(c: dict[str, Any]) -> str:
    within = c.get("within")
    if within is None:
        return "pooled"
    return condition_text(within)


def comparison_rows(stats: dict[str, Any], *, latex: bool) -> list[list[str]]:
    rows = []
    for c in stats["comparisons"]:
        pair = pair_text(c) + (" (confounded)" if c.get("confounds") else "")
        mean = (
            f"{number(c.get('mean_diff'), latex=latex)} "
            f"{interval(c.get('mean_diff_ci95'), latex=latex)}"
        )
        rows.append(
            [
                pair,
                _within(c),
                f"{c['n_a']}/{c['n_b']}",
                number(c.get("var_ratio"), latex=latex),
                interval(c.get("primary_ci95"), latex=latex, unbounded_high=True),
                number(c.get("primary_p"), latex=latex),
                number(c.get("primary_p_holm_factor"), latex=latex),
                mean,
            ]
        )
    return rows


def notes(stats: dict[str, Any]) -> list[str]:
    scale = "log scale: variances of the logarithm" if stats.get("scale") == "log" else "raw scale"
    lines = [
        f"Metric {stats['metric']} ({scale}). var ratio: var_a / var_b within cells; 95% CI "
        "(raw) and p (raw): the primary randomisation test of each comparison alone; p (Holm): "
        "adjusted over the factor's comparisons.",
    ]
    confounded = {
        pair_text(c): ", ".join(f"{d['field']} {d['a']} → {d['b']}" for d in c["confounds"])
        for c in stats["comparisons"]
        if c.get("confounds")
    }
    lines += [f"Confounded: {pair} also changes {fields}." for pair, fields in confounded.items()]
    return lines


def markdown(stats: dict[str, Any]) -> str:
    def table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
        cell = lambda text: text.replace("|", "\\|")  # noqa: E731
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        return out

    lines = [f"**Per-condition {stats['metric']}**", ""]
    lines += table(CONDITION_HEADER, condition_rows(stats, latex=False))
    lines += ["", f"**Variance comparisons of {stats['metric']}**", ""]
    lines += table(COMPARISON_HEADER, comparison_rows(stats, latex=False))
    lines += ["", *notes(stats)]
    return "\n".join(lines) + "\n"


def latex(stats: dict[str, Any]) -> str:
    def table(header: Sequence[str], rows: list[list[str]], caption: str) -> list[str]:
        spec = "l" + "r" * (len(header) - 1)
        out = [
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{{escape(caption)}}}",
            f"\\begin{{tabular}}{{{spec}}}",
            "\\hline",
            " & ".join(escape(h) for h in header) + " \\\\",
            "\\hline",
        ]
        for row in rows:
            out.append(" & ".join(_latex_cell(value) for value in row) + " \\\\")
        out += ["\\hline", "\\end{tabular}", "\\end{table}"]
        return out

    lines = ["% seedgrid stats --format latex", ""]
    lines += table(
        CONDITION_HEADER, condition_rows(stats, latex=True), f"Per-condition {stats['metric']}"
    )
    lines.append("")
    lines += table(
        COMPARISON_HEADER,
        comparison_rows(stats, latex=True),
        " ".join(notes(stats)),
    )
    return "\n".join(lines) + "\n"


def _latex_cell(value: str) -> str:
    """A cell whose numbers are already LaTeX math ($...$): the text around them escaped."""
    parts = value.split("$")
    # even parts are text, odd ones math (numbers made by `number`)
    return "$".join(escape(part) if i % 2 == 0 else part for i, part in enumerate(parts))
