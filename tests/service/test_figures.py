"""`seedgrid figure ID` (issue 39): the forest plot of variance ratios and the per-condition
distribution, each written as SVG (which parses, and names what it draws) and PNG (an image
of the size asked)."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from typer.testing import CliRunner

import service.cli as cli
from service.analysis import figures
from tests.service.test_cli import DETAIL, mock_service, stats_payload


def svg_texts(path: Path) -> list[str]:
    """The texts of an SVG's <text> elements (it must parse as XML)."""
    root = ElementTree.parse(path).getroot()
    return ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_figure_writes_the_forest_and_distribution_as_svg_and_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = stats_payload()
    stats["comparisons"][0]["primary_ci95"] = [3.2, None]  # unbounded above: an arrow
    stats["comparisons"][0]["confounds"] = [{"field": "log_every", "a": "20", "b": "100"}]
    sent = mock_service(monkeypatch, {"/experiments/1": DETAIL, "/experiments/1/stats": stats})
    result = CliRunner().invoke(cli.app, ["figure", "1", "--out", str(tmp_path / "figs")])
    assert result.exit_code == 0, result.output
    assert sent[0].url.params["limit"] == "2000"
    names = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert names == ["distribution.png", "distribution.svg", "forest.png", "forest.svg"]
    forest_svg = svg_texts(tmp_path / "figs" / "forest.svg")
    # one row per comparison with a ratio, the pooled ones first
    rows = figures.forest_rows(stats)
    assert len(rows) == len(stats["comparisons"]) and rows[0]["within"] is None
    assert figures.comparison_label(rows[0]).endswith("(pooled) (confounded)")
    assert figures.comparison_label(rows[0]) in forest_svg
    assert sum(text.startswith("Holm p") for text in forest_svg) == len(rows)
    width, height = png_size(tmp_path / "figs" / "forest.png")
    assert width == 7.5 * figures.DPI and height > 0
    assert png_size(tmp_path / "figs" / "distribution.png")[1] == 4 * figures.DPI
    shown = svg_texts(tmp_path / "figs" / "distribution.svg")
    assert {c["condition_key"] for c in stats["conditions"]} <= set(shown)


def test_a_scale_other_than_raw_or_log_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_service(monkeypatch, {})
    result = CliRunner().invoke(cli.app, ["figure", "1", "--scale", "sqrt"])
    assert result.exit_code != 0 and "expected raw or log" in result.output
