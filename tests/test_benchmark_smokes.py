"""Each benchmark's --smoke mode runs end to end and prints real figures, so that none of them
rots: cff_batched, cff_overhead, dispatch_pass and stats in this process, load.py (which starts
a service and its Ray) as a subprocess."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
NUMBER = r"[\d,]+(?:\.\d+)?"


def load_script(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def figures(pattern: str, text: str) -> list[tuple[str, ...]]:
    """Every match of `pattern` in `text`, its groups as strings."""
    found = re.findall(pattern, text)
    return [m if isinstance(m, tuple) else (m,) for m in found]


def positive(value: str) -> bool:
    return float(value.replace(",", "")) > 0


@pytest.fixture
def torch_settings() -> Iterator[None]:
    """The trainers' runs set torch's thread count and determinism for the whole process."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def test_cff_batched_smoke_times_sequential_and_batched_seeds_in_turn(
    torch_settings: None, capsys: pytest.CaptureFixture[str]
) -> None:
    load_script("cff_batched").main(["--smoke"])
    out = capsys.readouterr().out
    assert "K = 2" in out
    repeats = figures(
        rf"repeat (\d) \((\w+) first\): wall ({NUMBER}) -> ({NUMBER}) seeds/s \(({NUMBER})x\); "
        rf"cpu ({NUMBER}) -> ({NUMBER}) seeds/s",
        out,
    )
    assert [(r[0], r[1]) for r in repeats] == [("0", "sequential"), ("1", "batched")], out
    assert all(positive(v) for r in repeats for v in r[2:]), out
    medians = figures(rf"(wall clock|CPU time): sequential median .* ratio ({NUMBER})x", out)
    assert [m[0] for m in medians] == ["wall clock", "CPU time"], out
    assert all(positive(m[1]) for m in medians)


def test_cff_overhead_smoke_times_the_bare_loop_and_the_trainer_in_turn(
    torch_settings: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both loops train on the same images (the script stops otherwise) and go first in turn."""
    load_script("cff_overhead").main(["--smoke"])
    out = capsys.readouterr().out
    repeats = figures(
        rf"repeat (\d) \((\w+) first\): wall bare +({NUMBER}) seedgrid +({NUMBER}) img/s "
        rf"\(ratio ({NUMBER})\);  cpu bare +({NUMBER}) seedgrid +({NUMBER})",
        out,
    )
    assert [(r[0], r[1]) for r in repeats] == [("0", "bare"), ("1", "seedgrid")], out
    assert all(positive(v) for r in repeats for v in r[2:]), out
    medians = figures(rf"(wall clock|CPU time): bare loop median .* seedgrid/bare ({NUMBER})", out)
    assert [m[0] for m in medians] == ["wall clock", "CPU time"], out
    assert out.count("target <= 10%: ") == 2


def test_cff_overhead_stops_when_its_two_loops_train_on_different_images(
    torch_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    overhead = load_script("cff_overhead")
    trainer_loop = overhead.trainer_loop
    monkeypatch.setattr(
        overhead, "trainer_loop", lambda config, seed: trainer_loop(config, seed) + 1
    )
    with pytest.raises(SystemExit, match="unequal work: the bare loop trained on 128 images"):
        overhead.main(["--smoke"])


def test_dispatch_pass_smoke_measures_every_size_in_alternating_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    load_script("dispatch_pass").main(["--smoke"])
    out = capsys.readouterr().out
    rounds = figures(
        rf"round (\d): +({NUMBER}) queued runs: median +({NUMBER}) ms per pass of 8 runs "
        r"\(4 passes\)",
        out,
    )
    assert [(r[0], r[1]) for r in rounds] == [("0", "64"), ("0", "256"), ("1", "256"), ("1", "64")]
    assert all(positive(r[2]) for r in rounds)
    summary = figures(
        rf"({NUMBER}) queued runs: +({NUMBER}) ms per pass .* ratio to 64: ({NUMBER})", out
    )
    assert [s[0] for s in summary] == ["64", "256"], out
    assert summary[0][2] == "1.00" and positive(summary[1][2])


def test_stats_smoke_times_cold_warm_and_a_restart_over_http_against_the_earlier_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The statistics benchmark asks a `seedgrid serve` of its own (a subprocess) over HTTP:
    cold, warm, one more run, and after a restart the stored page and one more run, each
    printed with the ratio to cold and against its goal."""
    load_script("stats").main(["--smoke"])
    out = capsys.readouterr().out
    (compared,) = figures(r"60 runs, 20 conditions, (\d+) comparisons \((\d+) on the first", out)
    assert int(compared[0]) == int(compared[1]) == 86, out
    assert "seedgrid serve in its own process, HTTP from this one" in out
    assert f"earlier path (scipy per comparison, {compared[0]} comparisons" in out
    ((cold, warm, poll),) = figures(
        rf"cold ({NUMBER}) ms; warm ({NUMBER}) ms \(median of 2, max {NUMBER}\); "
        rf"after one more run ({NUMBER}) ms",
        out,
    )
    ((stored, restart),) = figures(
        rf"after a restart: stored page ({NUMBER}) ms; one more run ({NUMBER}) ms", out
    )
    assert all(positive(v) for v in (cold, warm, poll, stored, restart))
    assert re.search(
        rf"cold/earlier {NUMBER}; warm/cold {NUMBER}; one-more-run/cold {NUMBER}; "
        rf"after-restart one-more-run/cold {NUMBER}",
        out,
    ), out
    verdicts = figures(
        r"(?m)^(cold|warm|one more run|one more run after a restart): goal <= .*: "
        r"(met|NOT met)$",
        out,
    )
    assert [v[0] for v in verdicts] == [
        "cold",
        "warm",
        "one more run",
        "one more run after a restart",
    ], out


def test_ingest_smoke_stores_the_same_points_in_both_arms_in_alternating_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both arms store all 5,000 points (the script stops otherwise), each first in turn, and
    the ratio is printed against the goal."""
    result = load_script("ingest").main(["--smoke"])
    out = capsys.readouterr().out
    repeats = figures(
        rf"repeat (\d) \((raw sqlite3|seedgrid) first\): (\w+(?: sqlite3)?) ({NUMBER}) points/s; "
        rf"(\w+(?: sqlite3)?) ({NUMBER}) points/s",
        out,
    )
    assert [(r[0], r[1]) for r in repeats] == [("0", "raw sqlite3"), ("1", "seedgrid")], out
    assert all(positive(r[3]) and positive(r[5]) for r in repeats), out
    assert "5,000 points in 8 passes" in out, out
    ((ratio, verdict),) = figures(
        rf"ratio seedgrid / raw sqlite3: ({NUMBER})x \(goal >= 0\.8x: (met|NOT met)\)", out
    )
    assert float(ratio) == pytest.approx(result["ratio"], abs=0.006)
    assert (verdict == "met") == (result["ratio"] >= 0.8)


def test_ingest_stops_when_an_arm_stores_other_points(monkeypatch: pytest.MonkeyPatch) -> None:
    ingest = load_script("ingest")
    raw_arm = ingest.raw_arm
    # the raw arm leaves the last pass out
    monkeypatch.setattr(ingest, "raw_arm", lambda path, passes: raw_arm(path, passes[:-1]))
    with pytest.raises(SystemExit, match="unequal work: raw sqlite3 stored 4,480 of 5,000"):
        ingest.main(["--smoke"])


def smoke_of_its_own_ray(script: str, timeout_s: float) -> str:
    """A benchmark's --smoke run as a subprocess that starts a seedgrid serve; its output."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # RAY_ADDRESS=local: never a cluster that something else on this machine started
    assert "Started a local Ray instance" in done.stderr, done.stderr[-3000:]
    return done.stdout


def test_load_smoke_answers_every_endpoint_without_errors_from_its_own_ray() -> None:
    out = smoke_of_its_own_ray("load.py", 150)
    (warm_up_s,) = figures(rf"warm-up: one experiment submitted and ended in ({NUMBER}) s", out)
    assert positive(warm_up_s[0]), out
    ((submitted, ended),) = figures(
        r"2 clients, [\d.]+ s, experiments submitted (\d+), seen ending (\d+)", out
    )
    assert int(submitted) >= 1 and int(ended) >= 1, out
    rows = {
        endpoint: int(requests)
        for endpoint, requests in re.findall(r"\n(GET /[^\n]*?|POST /[^\n]*?|all) +(\d+) +0 ", out)
    }
    assert set(rows) == {
        "GET /experiments",
        "GET /experiments/{id}",
        "GET /experiments/{id}/runs",
        "GET /experiments/{id}/stats",
        "GET /runs/{id}/metrics",
        "POST /experiments",
        "all",
    }, out
    assert all(requests > 0 for requests in rows.values())
    assert re.search(rf"requests/s {NUMBER}; errors 0\n", out), out


def test_watch_smoke_times_unwatched_and_both_watchers_in_turn() -> None:
    out = smoke_of_its_own_ray("watch.py", 300)
    arms = dict(
        re.findall(rf"round 1 +(unwatched|batched|per-run): +{NUMBER} s, (\d+) requests", out)
    )
    assert list(arms) == ["unwatched", "batched", "per-run"], out
    # the unwatched arm's only client polls the end; each watcher refreshed at least once
    assert int(arms["unwatched"]) == 0 and int(arms["batched"]) > 0 and int(arms["per-run"]) > 0
    for arm in ("batched", "per-run"):
        ((ratio,),) = figures(rf"watched \({arm} curves\) / unwatched: ({NUMBER});", out)
        assert positive(ratio), out
