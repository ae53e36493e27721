"""`seedgrid stats --format markdown|latex` (issue 39): tables that paste into a paper. The
LaTeX is checked as a tabular (every row as many cells as the column spec, braces balanced,
math closed, no bare special character), the Markdown as a pipe table; numbers at 3
significant digits with tiny ones in scientific notation (not 0.000000), missing ones as a
dash (not nan), an unbounded interval end as infinity, and a confound noted."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import service.cli as cli
from service.cli import paper_tables
from tests.service.test_cli import DETAIL, mock_service, stats_payload

SPECIAL = re.compile(r"(?<!\\)[_&%#^~]")


def payload() -> dict:
    stats = stats_payload()
    stats["conditions"][0]["mean"] = 1.0758e-8
    stats["conditions"][1]["std"] = None
    first = stats["comparisons"][0]
    first["primary_ci95"] = [3.2, None]
    first["var_ratio"] = 1372.4
    first["confounds"] = [{"field": "log_every", "a": "20", "b": "100"}]
    return stats


def tabulars(text: str) -> list[tuple[str, list[str]]]:
    """(column spec, rows) of every tabular: each row the text before its \\\\."""
    found = []
    for spec, body in re.findall(
        r"\\begin\{tabular\}\{([lcr]+)\}(.*?)\\end\{tabular\}", text, re.S
    ):
        rows = [r.strip() for r in body.split("\\\\")]
        found.append(
            (
                spec,
                [
                    r.replace("\\hline", "").strip()
                    for r in rows
                    if r.replace("\\hline", "").strip()
                ],
            )
        )
    return found


def test_latex_is_a_tabular_with_escaped_text_and_math_numbers() -> None:
    text = paper_tables.latex(payload())
    assert text.count("{") == text.count("}") and "nan" not in text and "0.000000" not in text
    tables = tabulars(text)
    assert [len(spec) for spec, _ in tables] == [5, 8]
    for spec, rows in tables:
        for row in rows:
            cells = re.split(r"(?<!\\)&", row)
            assert len(cells) == len(spec), row
            for cell in cells:  # the separators split, each cell's text escaped
                outside_math = "".join(cell.split("$")[::2])
                assert cell.count("$") % 2 == 0 and not SPECIAL.search(outside_math), cell
    conditions, comparisons = tables[0][1], tables[1][1]
    assert conditions[0].startswith("condition & n & mean & 95\\% CI & std")
    assert "$1.08 \\times 10^{-8}$" in conditions[1]
    assert "---" in conditions[2]  # the missing std
    assert "[3.2, $\\infty$]" in comparisons[1] and " 1370 " in comparisons[1]
    assert comparisons[1].startswith("lr: 0.1 vs 0.2 (confounded)")
    assert "log\\_every 20 $\\rightarrow$ 100" in text  # the caption names the confound


def test_markdown_is_a_pipe_table_per_table() -> None:
    text = paper_tables.markdown(payload())
    blocks = [b for b in text.split("\n\n") if b.startswith("| ")]
    assert len(blocks) == 2
    for block in blocks:
        lines = block.splitlines()
        widths = {len(re.split(r"(?<!\\)\|", line)) for line in lines}
        assert len(widths) == 1, lines
        assert re.fullmatch(r"\|(---\|)+", lines[1])
    assert "1.08×10^-8" in text and "[3.2, ∞]" in text and "—" in text
    assert "Confounded: lr: 0.1 vs 0.2 also changes log_every 20 → 100." in text


@pytest.mark.parametrize("kind", ["markdown", "latex"])
def test_stats_format_prints_the_tables(
    kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stats = payload()
    mock_service(monkeypatch, {"/experiments/1": DETAIL, "/experiments/1/stats": stats})
    result = CliRunner().invoke(cli.app, ["stats", "1", "--format", kind])
    assert result.exit_code == 0, result.output
    want = paper_tables.markdown(stats) if kind == "markdown" else paper_tables.latex(stats)
    assert want in result.output
    refused = CliRunner().invoke(cli.app, ["stats", "1", "--format", "html"])
    assert refused.exit_code != 0 and "expected markdown or latex" in refused.output
