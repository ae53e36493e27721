"""`seedgrid figure ID` (issue 39): the forest plot of variance ratios and the per-condition
distribution, each written as SVG (which parses, and names what it draws) and PNG (an image
of the size asked)."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
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
    # the same statistics give the same bytes (no date, no random element id)
    for name in ("forest", "distribution"):
        for kind in figures.FORMATS:
            path = tmp_path / "figs" / f"{name}.{kind}"
            assert figures.render(name, stats, kind) == path.read_bytes(), path.name


def test_a_scale_other_than_raw_or_log_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_service(monkeypatch, {})
    result = CliRunner().invoke(cli.app, ["figure", "1", "--scale", "sqrt"])
    assert result.exit_code != 0 and "expected raw or log" in result.output


def test_the_curves_figure_draws_a_mean_and_band_per_condition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = stats_payload()
    for i, c in enumerate(stats["conditions"]):  # /stats names each value's run and seed
        c["runs"] = [
            {"run_id": 100 * i + seed, "seed": seed, "value": value}
            for seed, value in enumerate(c["values"])
        ]
    runs = [r for c in stats["conditions"] for r in c["runs"]]
    # each run's loss falls from its seed's value: [step, value], one value not finite (null)
    curves = {
        str(r["run_id"]): [[0, 2.0 + r["seed"]], [10, 1.0 + r["seed"] / 2], [20, None]]
        for r in runs
    }
    answers = {
        "/experiments/1": {**DETAIL, "curve_metrics": ["loss"]},
        "/experiments/1/stats": stats,
        "/experiments/1/curves": {"name": "loss", "curves": curves},
    }
    sent = mock_service(monkeypatch, answers)
    result = CliRunner().invoke(cli.app, ["figure", "1", "--out", str(tmp_path / "figs")])
    assert result.exit_code == 0, result.output
    asked = [req for req in sent if req.url.path.endswith("/curves")]
    # every run of the stats, CURVE_RUNS to a request, each once
    assert sorted(int(v) for req in asked for v in req.url.params.get_list("run")) == sorted(
        r["run_id"] for r in runs
    )
    assert all(len(req.url.params.get_list("run")) <= 20 for req in asked)
    shown = svg_texts(tmp_path / "figs" / "curves.svg")
    for c in stats["conditions"]:
        assert f"{c['condition_key']} (n={c['n']})" in shown
    assert png_size(tmp_path / "figs" / "curves.png") == (7.5 * figures.DPI, 4.5 * figures.DPI)


def test_the_band_is_the_mean_and_sd_across_seeds_at_each_step() -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(size=(5, 3))
    # seed 4 has no point at step 2 (cut short); a NaN and a value <= 0 count only raw / never
    runs = [[(step, float(values[s, step])) for step in range(3)] for s in range(4)]
    runs.append([(0, float(values[4, 0])), (1, float(values[4, 1]))])
    steps, mean, low, high = figures.band(runs, log=False)
    assert steps == [0, 1, 2]
    for step, column in ((0, values[:, 0]), (1, values[:, 1]), (2, values[:4, 2])):
        m, sd = column.mean(), column.std(ddof=1)
        assert (mean[step], low[step], high[step]) == pytest.approx((m, m - sd, m + sd))
    # on the log scale: of log10 values (a geometric mean), a value <= 0 left out
    runs[0] = [(0, -1.0), *runs[0][1:]]
    steps, mean, low, high = figures.band(runs, log=True)
    logs = np.log10(values[1:, 0])
    m, sd = logs.mean(), logs.std(ddof=1)
    assert (mean[0], low[0], high[0]) == pytest.approx((10**m, 10 ** (m - sd), 10 ** (m + sd)))
    assert figures.band([[(0, 3.0)]], log=False) == ([0], [3.0], [3.0], [3.0])
