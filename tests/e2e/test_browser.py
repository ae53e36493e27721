"""The dashboard (/ui) and the offline API docs (/docs, /redoc) in a real headless Chromium.

Debian's `chromium` (installed by scripts/test.sh) driven by Playwright, against a live service
with the token on and a completed collapse experiment. The browser may reach only the service:
every other request is aborted and recorded, so a page that needs a CDN fails here. Any console
error or uncaught exception fails the test. Screenshots go to tests-output/browser/; with
SEEDGRID_UPDATE_README_SCREENSHOT=1 the experiment page is also saved as the README's picture.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from playwright.sync_api import Browser, Page, sync_playwright
from scipy import stats as scipy_stats

from service.api.server import BackgroundServer
from service.settings import Settings
from tests.conftest import ROOT, Service
from tests.e2e.toy_trainer import ToyTrainer
from tests.service.test_figures import svg_texts
from trainers import REGISTRY

SCREENSHOTS = ROOT / "tests-output" / "browser"
README_SCREENSHOT = ROOT / "docs" / "images" / "dashboard-experiment.png"
TOKEN = "browser-test-token-5f0c2a"
SEEDS = 4
SPEC = {
    "name": "browser-collapse",
    "trainer": "collapse",
    # 800 steps: every stop_gradient=false run collapses and carries the same run warning
    "config": {"n_samples": 200, "steps": 800, "r": 0.1},
    "grid": {"stop_gradient": [False, True]},
    "seeds": SEEDS,
    "metric": "min_l2",
}
# 16 conditions with long keys, one step each of little work: the labels' worst case.
GRID_16 = {
    "name": "grid-16-conditions",
    "trainer": "collapse",
    "config": {"n_samples": 40, "steps": 20},
    "grid": {"loss": ["mse", "cosine"], "r": [0.05, 0.1, 0.2, 0.3], "stop_gradient": [False, True]},
    "seeds": 2,
    "metric": "min_l2",
}
# The bundled example (examples/collapse_stopgrad.yaml, 8 conditions) made tiny: its grid's labels.
BUNDLED = {
    **yaml.safe_load((ROOT / "examples" / "collapse_stopgrad.yaml").read_text()),
    "config": {"n_samples": 40, "steps": 20},
    "seeds": 2,
}
NUMBER = r"[-+]?\d*\.?\d+(?:e[-+]?\d+)?"
# (page scripts as functions: the page's Content-Security-Policy refuses eval of an expression)
# Pairs of the distribution chart's x-axis labels (every text under a condition) whose boxes meet.
LABEL_OVERLAPS = """() => {
  const boxes = [...document.querySelectorAll(
    '[data-role=distribution] [data-role=condition-distribution] text,'
    + '[data-role=distribution] [data-role=factor-names] text')]
    .map((t) => [t.textContent, t.getBoundingClientRect()]);
  const hits = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const [a, b] = [boxes[i][1], boxes[j][1]];
    if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
      hits.push([boxes[i][0], boxes[j][0]]);
  }
  return { labels: boxes.length, hits };
}"""
# The sections wider than their box or than the window.
OVERFLOWING_SECTIONS = """() => [...document.querySelectorAll('main section')]
  .filter((s) => s.scrollWidth > s.clientWidth + 1
    || s.getBoundingClientRect().right > document.documentElement.clientWidth)
  .map((s) => s.dataset.role)"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        # Fails, not skips: CI must not pass without having looked at the pages.
        pytest.fail(
            "chromium is not installed: scripts/test.sh installs it "
            "(apt-get install -y --no-install-recommends chromium)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable)
        yield launched
        launched.close()


class Watched:
    """A page whose console errors, uncaught exceptions and requests off the service are kept."""

    def __init__(self, browser: Browser, origin: str, color_scheme: str = "light") -> None:
        self.context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            color_scheme=color_scheme,  # type: ignore[arg-type]
        )
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.requests: list[str] = []  # the service's URLs the page asked for, in order

        def only_the_service(route, request) -> None:  # type: ignore[no-untyped-def]
            if request.url.startswith(origin + "/"):
                self.requests.append(request.url)
                route.continue_()
            else:
                self.blocked.append(request.url)
                route.abort()

        self.context.route("**/*", only_the_service)
        self.page: Page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def shot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=path, full_page=True)
        return path


def assert_labels_apart(page: Page, conditions: int) -> None:
    """No two x-axis labels of the distribution chart overlap (each condition has some)."""
    found = page.evaluate(LABEL_OVERLAPS)
    assert found["labels"] >= 2 * conditions and found["hits"] == [], found


def assert_no_section_overflows(page: Page) -> None:
    assert page.evaluate(OVERFLOWING_SECTIONS) == []
    assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")


def assert_tab_reaches_every_seed_point(page: Page) -> None:
    """Tab from the top of the page focuses every seed point, each visibly (a thick stroke),
    and names its condition, seed and value for a screen reader."""
    expected = {
        page.locator("[data-role=seed-point]").nth(i).get_attribute("data-run-id")
        for i in range(page.locator("[data-role=seed-point]").count())
    }
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    reached: set[str] = set()
    for _ in range(len(expected) + 80):
        page.keyboard.press("Tab")
        focused = page.evaluate(
            """() => { const e = document.activeElement;
              return e && e.dataset.role === 'seed-point' ? [e.dataset.runId,
                getComputedStyle(e).strokeWidth, e.getAttribute('aria-label'),
                document.querySelector('[data-role=point-readout]').textContent] : null; }"""
        )
        if focused:
            run_id, stroke, label, readout = focused
            reached.add(run_id)
            assert stroke == "3px" and re.search(r"seed \d+: ", label) and label == readout
            if reached == expected:
                break
    assert reached == expected


def _luminance(page: Page, selector: str) -> float:
    """The relative luminance (0 black, 1 white) of the background of `selector`."""
    color = page.locator(selector).first.evaluate("(e) => getComputedStyle(e).backgroundColor")
    red, green, blue = (int(x) / 255 for x in re.findall(r"\d+", color)[:3])
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(NUMBER, text)]


def _as_shown(x: float) -> float:
    """x rounded as the page's fmt() shows it: 3 significant digits in exponent form below
    1e-3 or from 1e5, else 4."""
    return float(f"{x:.2e}") if x != 0 and not 1e-3 <= abs(x) < 1e5 else float(f"{x:.4g}")


def assert_headline_in_first_screen(service: Service, page: Page, experiment_id: int) -> None:
    """Issue 39: the experiment page's first 1280x800 screen states the answer: per factor its
    pooled comparison with the smallest Holm p, the variance ratio with its interval and Holm p
    and the mean difference, as /stats serves them; the distribution chart on the spec's scale."""
    stats = service.client.get(f"/experiments/{experiment_id}/stats", params={"limit": 2000}).json()
    spec = service.client.get(f"/experiments/{experiment_id}").json()["spec"]
    pooled: dict[str, tuple[float, dict[str, object]]] = {}
    for c in stats["comparisons"]:
        p = c["primary_p_holm_factor"]
        p = 2.0 if p is None else p
        if c["within"] is None and (c["factor"] not in pooled or p < pooled[c["factor"]][0]):
            pooled[c["factor"]] = (p, c)
    lines = page.locator("[data-role=headline-comparison]")
    lines.first.wait_for(timeout=15_000)
    assert lines.count() == len(pooled) >= 1
    for i in range(lines.count()):
        line = lines.nth(i)
        c = pooled[line.get_attribute("data-factor") or ""][1]
        for role in ("headline-ratio", "headline-interval", "headline-p", "headline-mean"):
            box = line.locator(f"[data-role={role}]").bounding_box()
            assert box is not None and box["y"] + box["height"] <= 800, (role, box)
        ratio = _numbers(line.locator("[data-role=headline-ratio]").inner_text())
        assert ratio == pytest.approx([c["var_ratio"]], rel=1e-3)
        low, high = c["primary_ci95"]
        assert _numbers(line.locator("[data-role=headline-interval]").inner_text()) == (
            pytest.approx(
                [_as_shown(v) for v in ([low] if high is None else [low, high])], rel=1e-9
            )
        )
        holm = c["primary_p_holm_factor"]
        if holm is not None:
            shown_p = _numbers(line.locator("[data-role=headline-p]").inner_text())[0]
            assert shown_p == pytest.approx(holm, rel=1e-3, abs=1e-4)
        mean = _numbers(line.locator("[data-role=headline-mean]").inner_text())
        assert mean[0] == pytest.approx(c["mean_diff"], rel=1e-3, abs=1e-12)
    log = (spec.get("analysis") or {}).get("scale", "raw") == "log"
    assert page.locator("[data-role=log-scale]").is_checked() == log
    # ... and as a forest plot in that screen too: a row per factor, its ratio's square inside
    # its interval's line (an end at 0 or infinity runs to the axis' edge)
    forest = page.locator("[data-role=forest]")
    box = forest.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 800, box
    rows = forest.locator("[data-role=forest-row]")
    assert sorted(rows.nth(i).get_attribute("data-key") or "" for i in range(rows.count())) == (
        sorted(pooled)
    )
    for i in range(rows.count()):
        c = pooled[rows.nth(i).get_attribute("data-key") or ""][1]
        mark = rows.nth(i).locator("[data-role=forest-ratio]").bounding_box()
        line = rows.nth(i).locator("[data-role=forest-interval]").bounding_box()
        assert mark is not None and line is not None
        centre = mark["x"] + mark["width"] / 2
        assert line["x"] - 0.5 <= centre <= line["x"] + line["width"] + 0.5, (c, mark, line)


def test_dashboard_and_offline_docs_in_chromium(
    browser: Browser, start_service: Callable[..., Service]
) -> None:
    service = start_service(api_token=TOKEN)
    service.client.headers["Authorization"] = f"Bearer {TOKEN}"
    origin = service.server.url.rstrip("/")
    watched = Watched(browser, origin)
    page = watched.page

    # The token is asked for before any data request (none is sent without it).
    page.goto(f"{origin}/ui")
    page.wait_for_selector("[data-role=token-needed]")
    page.fill("#token", TOKEN)
    page.click("#login button[type=submit]")
    page.wait_for_selector("text=no experiments")
    assert page.evaluate("sessionStorage.getItem('seedgrid.token')") == TOKEN
    assert TOKEN not in page.url

    # Live: the experiment submitted now appears in the open list, and its page follows the runs
    # to the end without a reload.
    experiment_id = service.submit(SPEC)["id"]
    row = page.locator(f"[data-role=experiment-row][data-experiment-id='{experiment_id}']")
    row.wait_for(timeout=15_000)
    row.locator("a").click()
    # (predicates as functions: an expression is re-evaluated with eval, which the page's
    # Content-Security-Policy refuses)
    page.wait_for_function(
        "() => document.querySelector('.facts [data-status]')?.dataset.status === 'completed'"
        f" && document.querySelectorAll('[data-role=seed-point]').length === {2 * SEEDS}",
        timeout=120_000,
    )
    assert service.wait(experiment_id)["status"] == "completed"
    runs = service.runs(experiment_id)
    stats = service.client.get(f"/experiments/{experiment_id}/stats").json()
    # (submitted now, it runs while the pages below are checked, not beside the first)
    wide_id = service.submit(GRID_16)["id"]
    bundled_id = service.submit(BUNDLED)["id"]

    # The list: status and progress; filters by name on the page, by status through ?status=.
    page.goto(f"{origin}/ui#/")
    row.wait_for()
    assert SPEC["name"] in row.inner_text() and "completed" in row.inner_text()
    assert f"{len(runs)}/{len(runs)}" in row.inner_text()
    page.fill("[data-role=name-filter]", "no-such-name")
    assert page.locator("[data-role=experiment-row]").count() == 0
    page.fill("[data-role=name-filter]", "browser")
    assert page.locator("[data-role=experiment-row]").count() == 1
    page.select_option("[data-role=status-filter]", "running")
    page.wait_for_selector("text=no experiments")
    page.select_option("[data-role=status-filter]", "completed")
    row.wait_for()
    watched.shot("experiments")

    # The experiment page: one distribution per condition, a point per completed seed.
    row.locator("a").click()
    page.wait_for_selector("[data-role=distribution]")
    page.wait_for_selector("[data-role=band]")
    distributions = page.locator("[data-role=condition-distribution]")
    assert distributions.count() == len(stats["conditions"]) == 2
    for condition in stats["conditions"]:
        key = condition["condition_key"]
        points = page.locator(f"[data-role=seed-point][data-condition='{key}']")
        assert points.count() == condition["n"] == SEEDS
        shown_runs = sorted(
            int(points.nth(i).get_attribute("data-run-id") or -1) for i in range(points.count())
        )
        assert shown_runs == sorted(r["id"] for r in runs if r["condition_key"] == key)
    assert page.locator("[data-role=box]").count() == 2
    assert_labels_apart(page, 2)
    # Only what the runs logged is offered: final values to compare, curves with points.
    offered = set(page.locator("[data-role=metric-select] option").all_inner_texts())
    assert SPEC["metric"] in offered and offered <= set(runs[0]["metrics"])
    curve_options = page.locator("[data-role=curve-metric-select] option").all_inner_texts()
    logged = {p["name"] for p in service.client.get(f"/runs/{runs[0]['id']}/metrics").json()}
    assert curve_options == sorted(logged)
    # The legend hides a condition on every chart, and shows it again.
    hidden = stats["conditions"][0]["condition_key"]
    page.locator(f"[data-role=legend-item][data-condition='{hidden}']").first.click()
    page.wait_for_function(
        "() => document.querySelectorAll('[data-role=condition-distribution]').length === 1"
    )
    assert page.locator(f"[data-role=mean-curve][data-condition='{hidden}']").count() == 0
    assert page.locator(f"[data-role=seed-point][data-condition='{hidden}']").count() == 0
    page.locator("[data-role=show-all]").first.click()
    page.wait_for_function(
        "() => document.querySelectorAll('[data-role=condition-distribution]').length === 2"
    )
    assert_tab_reaches_every_seed_point(page)

    # Curves: a mean ± std band and a 95% CI per condition; single seeds on demand.
    bands = page.locator("[data-role=band]")
    assert bands.count() == 2 and page.locator("[data-role=ci-band]").count() == 2
    for i in range(2):
        assert len(re.findall("L", bands.nth(i).get_attribute("d") or "")) > 4
    assert page.locator("[data-role=seed-curve]").count() == 0
    page.check("[data-role=show-seeds]")
    page.wait_for_function(
        f"() => document.querySelectorAll('[data-role=seed-curve]').length === {len(runs)}"
    )
    # The curves came a batch of runs to a request (GET /experiments/{id}/curves), never one
    # request per run (/runs/{id}/metrics): watching a running experiment cost ~200 requests a
    # refresh (issue 38).
    assert [u for u in watched.requests if "/curves?" in u]
    assert not [u for u in watched.requests if re.search(r"/runs/\d+/metrics", u)]

    # The comparison row: the within-cell variance ratio (one factor: the sample variances'
    # ratio) against numpy, the primary test's interval, raw p and Holm p as /stats serves them,
    # and the F interval (a tooltip now: secondary) against scipy.
    by_level = {
        level: np.array(
            [r["metrics"]["min_l2"] for r in runs if r["condition"]["stop_gradient"] is level],
            dtype=np.float64,
        )
        for level in (False, True)
    }
    comparison = stats["comparisons"][0]
    a, b = by_level[comparison["a"]], by_level[comparison["b"]]
    ratio = a.var(ddof=1) / b.var(ddof=1)
    assert comparison["var_ratio"] == pytest.approx(ratio, rel=1e-9)
    df_a, df_b = len(a) - 1, len(b) - 1
    f_interval = (
        ratio / scipy_stats.f.ppf(0.975, df_a, df_b),
        ratio / scipy_stats.f.ppf(0.025, df_a, df_b),
    )
    comparison_row = page.locator("[data-role=comparison-row]").first
    assert "pooled" in comparison_row.inner_text()
    # SPEC leaves lr to the trainer, whose default follows stop_gradient (0.5 without, 0.2 with
    # it): the comparison is confounded by it, and the row says so (issue 39)
    assert [(d["field"], d["a"], d["b"]) for d in comparison["confounds"]] == [("lr", "0.5", "0.2")]
    assert comparison_row.locator("[data-role=confound]").inner_text() == (
        "confounded: also changes lr 0.5 → 0.2"
    )
    shown_ratio = _numbers(comparison_row.locator("[data-role=var-ratio]").inner_text())
    assert shown_ratio == pytest.approx([ratio], rel=1e-3)
    interval_cell = comparison_row.locator("[data-role=var-ratio-ci]")
    low, high = comparison["primary_ci95"]
    shown_interval = interval_cell.inner_text()
    assert _numbers(shown_interval) == pytest.approx(
        [_as_shown(v) for v in ([low] if high is None else [low, high])], rel=1e-9
    )
    assert shown_interval.endswith("∞]") == (high is None)
    f_tooltip = (interval_cell.get_attribute("title") or "").split("F interval")[1]
    assert _numbers(f_tooltip) == pytest.approx([_as_shown(v) for v in f_interval], rel=1e-9)
    assert comparison_row.locator("[data-role=pairing]").inner_text() == comparison["pairing"]
    assert _numbers(comparison_row.locator("[data-role=primary-p]").inner_text())[0] == (
        pytest.approx(comparison["primary_p"], rel=1e-3, abs=1e-4)
    )
    holm = comparison["primary_p_holm_factor"]
    holm_cell = comparison_row.locator("[data-role=holm-p]").inner_text()
    assert _numbers(holm_cell)[0] == pytest.approx(holm, rel=1e-3, abs=1e-4)
    assert holm_cell.count("*") == (2 if holm < 0.01 else 1 if holm < 0.05 else 0)
    headers = page.locator("[data-role=comparisons] th").all_inner_texts()
    assert {"95% CI (primary, raw)", "primary p (raw)", "Holm p (factor)"} <= set(headers)
    # the raw interval beside the adjusted p, explained in one line (issue 39)
    note = page.locator("[data-role=interval-note]").first.inner_text()
    assert "raw (each comparison alone)" in note and "Holm p is adjusted" in note
    assert page.locator("[data-role=interim-note]").count() == 0  # not an adaptive experiment
    # The runs table sorts by a clicked header (seed, then reversed).
    page.locator("[data-role=runs] [data-role=sort-header]", has_text="seed").click()
    seeds = [
        int(t) for t in page.locator("[data-role=runs] tbody td:nth-child(3)").all_inner_texts()
    ]
    assert seeds == sorted(seeds) and len(seeds) == len(runs)
    page.locator("[data-role=runs] [data-role=sort-header]", has_text="seed").click()
    seeds = [
        int(t) for t in page.locator("[data-role=runs] tbody td:nth-child(3)").all_inner_texts()
    ]
    assert seeds == sorted(seeds, reverse=True)
    assert_no_section_overflows(page)
    watched.shot("experiment")
    if os.environ.get("SEEDGRID_UPDATE_README_SCREENSHOT") == "1":
        # The top of the page: distributions, comparisons and curves.
        README_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(
            path=README_SCREENSHOT,
            full_page=True,
            clip={"x": 0, "y": 0, "width": 1280, "height": 1750},
        )

    # The run page of one seed: its curves, diagnostics and provenance.
    first = page.locator("[data-role=seed-point]").first
    run_id = int(first.get_attribute("data-run-id") or -1)
    first.click()
    page.wait_for_selector("[data-role=run-curve]")
    assert page.url.endswith(f"#/runs/{run_id}")
    curve = page.locator("figure[data-metric=min_l2] [data-role=mean-curve]")
    assert len(re.findall("L", curve.get_attribute("d") or "")) > 4
    assert "min_l2_peak" in page.locator("[data-role=diagnostics]").inner_text()
    # the trainer's curves first, led by those it reports a final value of; sys/ ones last
    order = [
        page.locator("[data-role=run-curves-section] figure").nth(i).get_attribute("data-metric")
        for i in range(page.locator("[data-role=run-curves-section] figure").count())
    ]
    finals = next(r for r in runs if r["id"] == run_id)["metrics"]
    system = [i for i, name in enumerate(order) if (name or "").startswith("sys/")]
    assert system and system == list(range(len(order) - len(system), len(order))), order
    assert order[0] in finals, order
    assert page.locator("[data-role=provenance]").count() == 1
    assert "Final metrics" in page.locator("[data-role=run-metrics-section] h2").inner_text()
    page.check("[data-role=run-log-scale]")  # min_l2 falls by decades: a log axis shows it
    page.wait_for_function(
        "() => document.querySelector('[data-role=run-log-scale]')?.checked"
        " && document.querySelectorAll('[data-role=run-curve]').length > 0"
    )
    assert_no_section_overflows(page)
    watched.shot("run")

    # 16 conditions: labels still apart, every point in reach of Tab.
    assert service.wait(wide_id)["status"] == "completed"
    page.goto(f"{origin}/ui#/experiments/{wide_id}")
    page.wait_for_function(
        "() => document.querySelectorAll('[data-role=seed-point]').length === 32"
    )
    assert page.locator("[data-role=condition-distribution]").count() == 16
    assert_labels_apart(page, 16)
    assert_no_section_overflows(page)
    fills = {
        page.locator("[data-role=legend-item] .swatch")
        .nth(i)
        .evaluate("(e) => getComputedStyle(e).backgroundColor")
        for i in range(16)
    }
    assert len(fills) == 16  # a colour per condition
    assert_tab_reaches_every_seed_point(page)
    assert_headline_in_first_screen(service, page, wide_id)
    watched.shot("experiment-16-conditions")
    assert service.wait(bundled_id)["status"] == "completed"
    page.goto(f"{origin}/ui#/experiments/{bundled_id}")
    page.wait_for_function(
        "() => document.querySelectorAll('[data-role=seed-point]').length === 16"
    )
    assert_labels_apart(page, 8)
    assert_no_section_overflows(page)
    assert_headline_in_first_screen(service, page, bundled_id)
    # a level written as condition keys write it, on the page as in the CLI and the figures
    assert page.locator(
        "[data-role=headline-comparison][data-factor=stop_gradient] strong"
    ).inner_text() == ("stop_gradient: false vs true")
    # Config against result (two factors): a line per completed run through stop_gradient, r
    # and min_l2; Enter on a line opens its run.
    parallel = page.locator("[data-role=parallel]")
    assert parallel.locator("[data-role=parallel-axis]").all_text_contents() == [
        *BUNDLED["grid"],
        BUNDLED["metric"],
    ]
    lines = parallel.locator("[data-role=parallel-line]")
    assert lines.count() == 16
    bundled_runs = {r["id"]: r for r in service.runs(bundled_id)}
    assert {int(lines.nth(i).get_attribute("data-run-id") or -1) for i in range(16)} == set(
        bundled_runs
    )
    watched.shot("experiment-bundled")
    # The figure buttons download what `seedgrid figure` draws, of the page's metric and scale.
    with page.expect_download() as download_info:
        page.click("[data-role=figure-download][data-figure=forest][data-format=svg]")
    forest_svg = download_info.value
    assert forest_svg.suggested_filename == f"seedgrid-{bundled_id}-forest.svg"
    texts = svg_texts(Path(forest_svg.path()))
    assert any(t.startswith("Holm p") for t in texts)
    assert any("variance ratio a / b of log min_l2" in t for t in texts)
    with page.expect_download() as download_info:
        page.click("[data-role=figure-download][data-figure=distribution][data-format=png]")
    assert Path(download_info.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the min_l2 curves: a line and a band per condition, each condition in the legend
    with page.expect_download() as download_info:
        page.click("[data-role=figure-download][data-figure=curves][data-format=svg]")
    texts = svg_texts(Path(download_info.value.path()))
    for key in {r["condition_key"] for r in bundled_runs.values()}:
        assert f"{key} (n=2)" in texts, (key, texts)
    # the endpoint: the figure's own media type, or application/octet-stream when that alone
    # is accepted (a generated client's bytes); the same bytes either way
    figure_url = f"/experiments/{bundled_id}/figure"
    as_image = service.client.get(figure_url, params={"format": "png"})
    as_bytes = service.client.get(
        figure_url, params={"format": "png"}, headers={"Accept": "application/octet-stream"}
    )
    assert as_image.headers["content-type"] == "image/png"
    assert as_bytes.headers["content-type"] == "application/octet-stream"
    assert as_image.content == as_bytes.content
    # 2 seeds a condition: the page says that no comparison within a cell can reach 0.05 (as
    # the 201 body did), on its first screen
    shown = page.locator("[data-role=seed-warnings]")
    assert "2 seeds per condition: a comparison within one cell cannot reach" in shown.inner_text()
    box = shown.bounding_box()
    assert box is not None and box["y"] < 800
    assert "8 conditions × 2 seeds = 16 runs" in page.locator("main").inner_text()

    # Add-seeds gives every new run the same warning again: listed once, with its count.
    added = service.client.post(f"/experiments/{experiment_id}/seeds", json={"seeds": 1})
    assert added.status_code == 201, added.text
    assert service.wait(experiment_id)["status"] == "completed"
    runs = service.runs(experiment_id)
    page.goto(f"{origin}/ui#/experiments/{experiment_id}")
    page.wait_for_function(
        f"() => document.querySelectorAll('[data-role=seed-point]').length === {len(runs)}"
    )
    titles = page.locator("[data-role=warning-title]").all_inner_texts()
    assert titles and len(titles) == len(set(titles))
    warned = [w["message"] for r in runs for w in r["warnings"]]
    assert len(warned) == SEEDS + 1  # each stop_gradient=false run's collapse, added seed too
    for message in set(warned):
        kind = page.locator("[data-role=warning-kind]", has_text=message)
        assert kind.count() == 1
        assert kind.locator("[data-role=warning-count]").inner_text() == (
            f"× {warned.count(message)}"
        )
        kind.locator("summary").click()  # the runs it concerns, on expand
        assert kind.locator("li").count() == warned.count(message)

    # Dark where the system prefers it; the toggle's choice is remembered.
    dark = Watched(browser, origin, color_scheme="dark")
    dark.page.goto(f"{origin}/ui")
    dark.page.fill("#token", TOKEN)
    dark.page.click("#login button[type=submit]")
    dark.page.goto(f"{origin}/ui#/experiments/{experiment_id}")
    dark.page.wait_for_selector("[data-role=distribution]")
    assert _luminance(dark.page, "body") < 0.2 and _luminance(dark.page, "section") < 0.2
    dark.shot("experiment-dark")
    dark.page.click("#theme-toggle")
    assert _luminance(dark.page, "body") > 0.9
    dark.page.reload()
    dark.page.wait_for_selector("[data-role=distribution]")
    assert _luminance(dark.page, "body") > 0.9
    assert dark.blocked == [] and dark.errors == []
    dark.context.close()

    # Tags and the params table (docs/organising.md): beside the 16-condition experiment, the
    # bundled example and an imported one (no runs to wait for), the tagged one is the only row
    # left when the list is filtered by its tag, and its page shows its tag, its note and a
    # Parameters section led by the grid's field.
    seeds_csv = (ROOT / "examples" / "seeds.csv").read_text()
    imported = service.client.post("/experiments/import", json={"name": "other", "csv": seeds_csv})
    assert imported.status_code == 201, imported.text
    # imported results hold no points: no curves figure, said as a 422 naming `name`
    no_curves = service.client.get(
        f"/experiments/{imported.json()['id']}/figure", params={"name": "curves"}
    )
    assert no_curves.status_code == 422, no_curves.text
    assert "no points" in no_curves.text and '"name"' in no_curves.text
    labels = {"tags": ["browser-tag"], "note": "tagged by the browser test"}
    assert service.client.patch(f"/experiments/{experiment_id}", json=labels).status_code == 200
    page.goto(f"{origin}/ui#/")
    page.fill("[data-role=name-filter]", "")
    page.select_option("[data-role=status-filter]", "")
    rows_are = "n => document.querySelectorAll('[data-role=experiment-row]').length === n"
    page.wait_for_function(rows_are, arg=4)
    # The list sorts by a clicked header too: by id, then the other way round.
    id_header = page.locator("[data-role=experiments] [data-role=sort-header]", has_text="id")
    listed_ids = "[data-role=experiments] tbody td:nth-child(1)"
    id_header.click()
    ids = [int(t) for t in page.locator(listed_ids).all_inner_texts()]
    assert ids == sorted(ids) and len(ids) == 4
    id_header.click()
    assert [int(t) for t in page.locator(listed_ids).all_inner_texts()] == sorted(ids)[::-1]
    # Two experiments side by side (issue 39): tick two, the button opens their comparison
    # page, with a row and a forest row per condition both ran, and what else differs.
    compared = service.client.get("/compare", params={"a": experiment_id, "b": bundled_id}).json()
    assert compared["total_conditions"] == 2  # stop_gradient false / true at r = 0.1
    for ticked in (experiment_id, bundled_id):
        page.check(f"[data-role=compare-pick][data-experiment-id='{ticked}']")
    page.click("[data-role=compare-picked]")
    page.wait_for_selector("[data-role=compare-row]")
    assert page.url.endswith(f"#/compare/{experiment_id}/{bundled_id}")
    compare_rows = page.locator("[data-role=compare-row]")
    assert compare_rows.count() == 2
    for i, c in enumerate(compared["conditions"]):
        shown = compare_rows.nth(i)
        assert shown.get_attribute("data-condition") == c["condition_key"]
        assert _numbers(shown.locator("[data-role=compare-ratio]").inner_text()) == (
            pytest.approx([c["comparison"]["var_ratio"]], rel=1e-3)
        )
        # each stands alone: the raw p, in the table and beside its forest row
        assert _numbers(shown.locator("[data-role=compare-p]").inner_text()) == (
            pytest.approx([c["comparison"]["primary_p"]], rel=1e-3, abs=1e-4)
        )
        forest_p = page.locator("[data-role=compare-forest] [data-role=forest-p]").nth(i)
        assert forest_p.text_content() == (
            f"p {shown.locator('[data-role=compare-p]').inner_text()} (raw)"
        )
    assert page.locator("[data-role=compare-forest] [data-role=forest-row]").count() == 2
    differs = page.locator("[data-role=compare-confounds]").inner_text()
    assert "n_samples 200 → 40" in differs and "steps 800 → 20" in differs
    # SPEC names no scale, the bundled example log: raw, and the page says why
    assert compared["scale"] == "raw" and compared["scale_note"]
    assert compared["scale_note"] in page.locator("[data-role=compare-summary]").inner_text()
    page.select_option("[data-role=compare-scale]", "log")  # the page asks /compare?scale=log
    page.wait_for_function(
        "() => document.querySelector('[data-role=compare-summary]')?.textContent"
        ".includes('on the log scale')"
    )
    logged = service.client.get(
        "/compare", params={"a": experiment_id, "b": bundled_id, "scale": "log"}
    ).json()
    assert _numbers(
        page.locator("[data-role=compare-row] [data-role=compare-ratio]").first.inner_text()
    ) == pytest.approx([logged["conditions"][0]["comparison"]["var_ratio"]], rel=1e-3)
    assert_no_section_overflows(page)
    watched.shot("compare")
    page.goto(f"{origin}/ui#/")
    page.wait_for_function(rows_are, arg=4)
    page.select_option("[data-role=tag-filter]", "browser-tag")
    page.wait_for_function(rows_are, arg=1)
    assert row.locator("[data-role=tag]").all_inner_texts() == ["browser-tag"]
    row.locator("a").click()
    page.wait_for_selector("[data-role=params-section]")
    labels_line = page.locator("[data-role=labels]")
    assert labels_line.locator("[data-role=tag]").all_inner_texts() == ["browser-tag"]
    assert labels_line.locator("[data-role=note]").inner_text() == labels["note"]
    params = page.locator("[data-role=params]")
    # (lr too: the trainer's default for it depends on stop_gradient)
    assert params.locator("[data-role=varying-field]").all_inner_texts() == ["stop_gradient", "lr"]
    assert params.locator("[data-role=params-row]").count() == 2
    assert params.locator("th").all_inner_texts()[4] == "stop_gradient"
    page.check("[data-role=params-all]")
    assert {"n_samples", "steps", "r"} <= set(params.locator("th").all_inner_texts())
    watched.shot("params")

    # /docs and /redoc with nothing but the service reachable: every operation is listed.
    schema = service.client.get("/openapi.json").json()
    operations = sum(len(methods) for methods in schema["paths"].values())
    page.goto(f"{origin}/docs")
    page.wait_for_selector(".opblock")
    assert page.locator(".opblock").count() == operations
    assert (
        page.locator(".opblock-summary-path", has_text="/experiments/{experiment_id}/stats").count()
        == 1
    )
    watched.shot("docs")
    page.goto(f"{origin}/redoc")
    page.wait_for_selector("[data-section-id^='operation/']")
    assert page.locator("[data-section-id^='operation/']").count() == operations
    watched.shot("redoc")

    assert watched.blocked == []
    assert watched.errors == []
    watched.context.close()


def test_pages_are_open_without_the_token_and_load_nothing_from_outside(
    start_service: Callable[..., Service],
) -> None:
    """Checked over plain HTTP, so that a broken page shows up even where chromium is missing."""
    service = start_service(api_token=TOKEN)
    anon = service.client
    pages = [
        "/ui",
        "/ui/app.js",
        "/ui/app.css",
        "/docs",
        "/redoc",
        "/docs-assets/swagger-ui-bundle.js",
        "/docs-assets/swagger-ui.css",
        "/docs-assets/redoc.standalone.js",
        "/docs-assets/favicon.png",
    ]
    for path in pages:
        assert anon.get(path).status_code == 200, path
    # The data stays behind the token, and so does any other file name under /ui.
    assert anon.get("/experiments").status_code == 401
    assert anon.get("/ui/secrets.js").status_code == 401
    authorised = {"Authorization": f"Bearer {TOKEN}"}
    assert anon.get("/ui/secrets.js", headers=authorised).status_code == 404
    assert anon.get("/ui/", follow_redirects=False).headers["location"] == "/ui"

    for path in ("/ui", "/docs", "/redoc"):
        html = anon.get(path).text
        assert re.findall(r"""(?:src|href)=["']?(?:https?:)?//""", html) == [], path
    assert b"cdn.redoc.ly" not in anon.get("/docs-assets/redoc.standalone.js").content
    # HTML and files, not operations: the schema (and the clients generated from it) omit them.
    paths = anon.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/ui", "/docs", "/redoc"))]


def test_without_a_token_the_dashboard_opens_and_shows_why_an_experiment_stopped(
    browser: Browser, start_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service with no token: the pages ask for none. An experiment whose first runs all
    failed is found with the `failed` filter, and its page says why it stopped."""
    toy = ToyTrainer()
    monkeypatch.setitem(REGISTRY, toy.name, toy)
    # one task in Ray at a time: the runs after the first three are still queued when the
    # stop comes (with every run in flight at once, all could fail before it)
    service = start_service(max_in_flight=1)
    experiment_id = service.submit(
        {"name": "browser-fails", "trainer": "toy", "config": {"fail_at_step": 0}, "seeds": 6}
    )["id"]
    detail = service.wait(experiment_id)
    assert detail["status"] == "failed" and detail["message"], detail
    origin = service.server.url.rstrip("/")
    watched = Watched(browser, origin)
    page = watched.page

    page.goto(f"{origin}/ui")
    row = page.locator(f"[data-role=experiment-row][data-experiment-id='{experiment_id}']")
    row.wait_for(timeout=15_000)
    assert page.locator("[data-role=token-needed]").count() == 0
    page.select_option("[data-role=status-filter]", "failed")  # lists through ?status=failed
    row.wait_for()
    assert "failed" in row.inner_text()
    row.locator("a").click()
    message = page.locator("[data-role=experiment-message]")
    message.wait_for(timeout=15_000)
    assert message.inner_text() == detail["message"]
    # The first screen says why, with the first run's error; no empty chart.
    first_error = page.locator("[data-role=first-error]")
    for shown in (message, first_error):
        box = shown.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 900
    failed_runs = [r for r in service.runs(experiment_id) if r["error"]]
    assert min(failed_runs, key=lambda r: r["id"])["error"] in first_error.inner_text()
    assert page.locator("[data-role=distribution]").count() == 0
    # The progress bar: a segment per outcome in its status's colour, no full blue bar.
    segments = page.locator("[data-role=progress-segment]")
    shown_counts = {
        segments.nth(i).get_attribute("data-status"): segments.nth(i).get_attribute("title")
        for i in range(segments.count())
    }
    counts = service.client.get(f"/experiments/{experiment_id}").json()["counts"]
    assert shown_counts == {s: f"{s}: {n}" for s, n in counts.items() if n}
    assert "failed" in shown_counts
    watched.shot("failed-experiment")
    # a failed run's page: the frame it failed at and its whole traceback
    failed = next(r for r in service.runs(experiment_id) if r["status"] == "failed")
    run = service.client.get(f"/runs/{failed['id']}").json()
    page.goto(f"{origin}/ui#/runs/{failed['id']}")
    shown = page.locator("[data-role=traceback]")
    shown.wait_for(timeout=15_000)
    assert shown.inner_text().strip() == run["traceback"].strip()
    assert run["failed_at"] and run["failed_at"] in page.locator("dl.facts").inner_text()
    # its error and traceback come first; its values are the last it logged, not final ones
    roles = page.locator("main section").evaluate_all("(s) => s.map((e) => e.dataset.role)")
    assert roles[0] == "error-section"
    assert run["error"] in page.locator("[data-role=run-error]").inner_text()
    values = page.locator("[data-role=run-metrics-section] h2").inner_text()
    assert values.startswith("Last logged") and "Final" not in page.locator("main").inner_text()
    # the attempt table leaves the traceback out of its cells
    headers = page.locator("[data-role=attempts] th").all_inner_texts()
    assert "outcome" in headers and "traceback" not in headers
    watched.shot("failed-run")
    assert watched.blocked == []
    assert watched.errors == []
    watched.context.close()


def test_an_imported_experiment_in_the_dashboard(browser: Browser, tmp_path: Path) -> None:
    """Imported results (POST /experiments/import of examples/seeds.csv) get the experiment
    page of a launched experiment: a point per seed, the conditions and the comparison, every
    imported metric to choose from; no curves, which an import does not have."""
    db_path = tmp_path / "seedgrid.db"
    server = BackgroundServer(Settings(database_url=f"sqlite:///{db_path}"), dispatch=False)
    service = Service(server.start(), db_path)
    try:
        text = (ROOT / "examples" / "seeds.csv").read_text()
        created = service.client.post("/experiments/import", json={"name": "seeds", "csv": text})
        assert created.status_code == 201, created.text
        experiment_id = created.json()["id"]
        stats = service.client.get(f"/experiments/{experiment_id}/stats").json()
        origin = service.server.url.rstrip("/")
        watched = Watched(browser, origin)
        page = watched.page
        page.goto(f"{origin}/ui#/experiments/{experiment_id}")
        page.wait_for_selector("[data-role=distribution]")
        for condition in stats["conditions"]:
            points = page.locator(
                f"[data-role=seed-point][data-condition='{condition['condition_key']}']"
            )
            assert points.count() == condition["n"] == 10
        assert "imported" in page.locator(".facts").inner_text()
        options = page.locator("[data-role=metric-select] option").all_inner_texts()
        assert options == ["test_accuracy", "test_loss"]
        row = page.locator("[data-role=comparison-row]").first
        shown = _numbers(row.locator("[data-role=var-ratio]").inner_text())
        assert shown == pytest.approx([stats["comparisons"][0]["var_ratio"]], rel=1e-3)
        assert page.locator("[data-role=no-curves]").count() == 1
        page.select_option("[data-role=metric-select]", "test_loss")
        page.wait_for_selector("text=Distribution of test_loss per condition")
        watched.shot("imported-experiment")

        # With no dispatcher, two submitted experiments wait: each page says where in the queue.
        waiting = [
            service.client.post("/experiments", json={**SPEC, "name": f"waiting-{i}"}).json()["id"]
            for i in range(2)
        ]
        for place, waiting_id in enumerate(waiting, start=1):
            detail = service.client.get(f"/experiments/{waiting_id}").json()
            assert detail["queue_position"] == place, detail
            page.goto(f"{origin}/ui#/experiments/{waiting_id}")
            page.wait_for_selector(f"h1:has-text('waiting-{place - 1} #{waiting_id}')")
            shown = page.locator("[data-role=queue-position]")
            assert shown.inner_text() == (
                "next to start" if place == 1 else f"{place - 1} queued experiments ahead of it"
            )
            # and why it waits: no dispatcher has loaded its trainer (none runs at all here)
            why = page.locator("[data-role=waiting-for]").inner_text()
            assert why == detail["waiting_for"] and "no dispatcher runs trainer 'collapse'" in why

        # A 200 x 10 experiment (a 20 x 10 grid, 10 seeds a condition: 2,000 runs and 3,035
        # comparisons) opens with its comparisons, paged 2,000 at a time: the page asked for
        # them whole and showed the 422 (issue 38).
        rng = np.random.default_rng(38)
        rows = ["a,b,seed,accuracy"] + [
            f"a{a:02d},b{b},{seed},{0.5 + 0.01 * a + 0.002 * b + 0.01 * rng.standard_normal():.6f}"
            for a in range(20)
            for b in range(10)
            for seed in range(10)
        ]
        wide = service.client.post(
            "/experiments/import", json={"name": "wide", "csv": "\n".join(rows) + "\n"}
        )
        assert wide.status_code == 201, wide.text
        assert (wide.json()["n_conditions"], wide.json()["n_runs"]) == (200, 2000)
        page.goto(f"{origin}/ui#/experiments/{wide.json()['id']}")
        page.wait_for_selector("[data-role=comparisons-pager]", timeout=120_000)
        shown = page.locator("[data-role=comparisons-shown]")
        assert shown.inner_text() == "comparisons 1–2000 of 3035"
        assert page.locator("[data-role=comparison-row]").count() == 2000
        assert page.locator("[data-role=headline-comparison]").count() == 2  # a, b
        assert page.locator("[data-role=comparisons-previous]").count() == 0
        page.click("[data-role=comparisons-next]")
        page.wait_for_selector("text=comparisons 2001–3035 of 3035", timeout=120_000)
        assert page.locator("[data-role=comparison-row]").count() == 1035
        assert page.locator("[data-role=comparisons-next]").count() == 0
        page.click("[data-role=comparisons-previous]")
        page.wait_for_selector("text=comparisons 1–2000 of 3035", timeout=120_000)
        assert watched.blocked == []
        assert watched.errors == []
        watched.context.close()
    finally:
        service.close()


def test_a_partial_experiment_opens_with_its_failures_and_a_cancelled_one_without_an_error(
    browser: Browser, start_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39: an experiment that ended partial (some runs failed, the rest completed) had no
    notice on its first screen, and one the user cancelled opened with a red "First error:
    cancelled while running". Now the first says how many runs failed and the first failure's
    error; the second shows no error."""
    toy = ToyTrainer()
    monkeypatch.setitem(REGISTRY, toy.name, toy)
    service = start_service()
    partial = service.submit(
        {
            "name": "browser-partial",
            "trainer": "toy",
            "config": {"steps": 5, "log_every": 1},
            "grid": {"fail_at_step": [2, 100]},  # step 100 is never reached: those complete
            "seeds": 2,
        }
    )["id"]
    detail = service.wait(partial)
    assert (detail["counts"]["failed"], detail["counts"]["completed"]) == (2, 2), detail
    assert detail["message"] is None, detail
    long = {
        "name": "browser-cancelled",
        "trainer": "toy",
        "config": {"steps": 10**9, "log_every": 10**6},
        "seeds": 2,
    }
    cancelled = service.submit(long)["id"]
    deadline = time.monotonic() + 60
    while service.client.get(f"/experiments/{cancelled}").json()["counts"]["running"] == 0:
        assert time.monotonic() < deadline, "no run of the long experiment started in 60 s"
        time.sleep(0.1)
    assert service.client.post(f"/experiments/{cancelled}/cancel").status_code == 202
    ended = service.wait(cancelled)
    assert ended["counts"]["cancelled"] == 2, ended
    assert any(r["error"] for r in service.runs(cancelled))  # a cancelled run's own note

    origin = service.server.url.rstrip("/")
    watched = Watched(browser, origin)
    page = watched.page
    page.goto(f"{origin}/ui#/experiments/{partial}")
    first_error = page.locator("[data-role=first-error]")
    first_error.wait_for(timeout=15_000)
    box = first_error.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 800
    failed = [r for r in service.runs(partial) if r["status"] == "failed"]
    text = first_error.inner_text()
    assert text.startswith("2 of 4 runs failed. First error: "), text
    assert min(failed, key=lambda r: r["id"])["error"] in text

    page.goto(f"{origin}/ui#/experiments/{cancelled}")
    page.locator("h1", has_text="browser-cancelled").wait_for(timeout=15_000)
    page.locator("[data-role=progress-segment]").first.wait_for(timeout=15_000)
    assert page.locator("[data-role=first-error]").count() == 0
    assert page.locator("[data-role=problem]").count() == 0
    assert "cancelled while running" not in page.locator("main").inner_text()
    assert watched.blocked == []
    assert watched.errors == []
    watched.context.close()
