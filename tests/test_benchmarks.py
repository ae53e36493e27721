"""The benchmark scripts that must travel: gpu_throughput.py runs on a machine with the trainers'
libraries only (no Ray, FastAPI or database), reports every trainer and mode, and times steady
epochs; seed_batching.py compares a seed-batched task with solo runs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = ("ray", "fastapi", "sqlalchemy", "sqlmodel", "service", "workers")

# Installed through PYTHONPATH as sitecustomize, so that it runs in the script and in every
# worker process it spawns: an import of a blocked package fails, and says so on stderr even
# where the importer catches the ImportError.
IMPORT_BLOCKER = f"""
import sys

class BlockServiceImports:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            sys.stderr.write(f"BLOCKED IMPORT {{name}}\\n")
            raise ImportError(f"blocked for this test: {{name}}")
        return None

sys.meta_path.insert(0, BlockServiceImports())
"""


def load_script(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def throughput() -> ModuleType:
    return load_script("gpu_throughput")


def test_the_union_of_intervals_counts_overlaps_once(throughput: ModuleType) -> None:
    assert throughput.union_length([]) == 0.0
    assert throughput.union_length([(0.0, 2.0), (1.0, 3.0)]) == 3.0
    assert throughput.union_length([(5.0, 6.0), (0.0, 1.0), (0.5, 0.75)]) == 2.0
    assert throughput.union_length([(0.0, 1.0), (1.0, 2.0), (0.0, 4.0)]) == 4.0


def test_steady_units_share_time_between_concurrent_seeds_and_add_it_for_sequential_ones(
    throughput: ModuleType,
) -> None:
    # Two seeds logged together at epochs 1, 2, 3 (t = 10, 12, 14): 4 seed-epochs in 4 s.
    together = [[(10.0, 1.0), (12.0, 2.0), (14.0, 3.0)], [(10.1, 1.0), (12.1, 2.0), (14.1, 3.0)]]
    units, seconds = throughput.steady_units(together)
    assert units == 4.0 and seconds == pytest.approx(4.1)
    # The same seeds one after another, with set-up between them: 4 seed-epochs in 8 s; the
    # set-up gap (t = 14 .. 20) and a lone first point are not counted.
    in_turn = [
        [(10.0, 1.0), (12.0, 2.0), (14.0, 3.0)],
        [(20.0, 1.0), (22.0, 2.0), (24.0, 3.0)],
        [(30.0, 1.0)],
    ]
    assert throughput.steady_units(in_turn) == (4.0, 8.0)
    # Points that do not advance (a second log of the same epoch) add no interval.
    assert throughput.steady_units([[(0.0, 0.0), (1.0, 0.0), (3.0, 2.0)]]) == (2.0, 2.0)


def test_a_seed_stops_after_its_bound_past_the_first_point_or_at_the_deadline(
    throughput: ModuleType,
) -> None:
    cff_like = throughput.progress_of("epoch", 1)  # cff logs epoch e once it is trained
    reporter = throughput.BoundedReporter(cff_like, bound=2, deadline=float("inf"))
    assert not reporter.should_stop()
    reporter.log(7, {"loss": 1.0}, epoch=0)
    reporter.log(8, {"loss": 1.0})  # not an epoch's point: not counted
    reporter.log(14, {"loss": 1.0}, epoch=1)
    assert not reporter.should_stop()
    reporter.log(21, {"loss": 1.0}, epoch=2)
    assert reporter.should_stop()
    assert [units for _, units in reporter.points] == [1.0, 2.0, 3.0]
    steps = throughput.progress_of("step", 0)
    assert steps(40, None) == 40.0
    late = throughput.BoundedReporter(steps, bound=1e9, deadline=0.0)
    assert late.should_stop()  # the measurement's time is up


def test_the_example_config_takes_the_first_grid_level_and_the_device(
    throughput: ModuleType,
) -> None:
    (case,) = [c for c in throughput.CASES if c.name == "feedback_resmlp"]
    config, level = throughput.case_config(
        case, smoke=False, device="cpu", precision="bf16", data_root="bench-fake"
    )
    assert level == {"method": "bp", "frozen_blocks": False}
    assert (config.method, config.width, config.depth, config.batch_size) == ("bp", 256, 4, 128)
    assert config.device == "cpu" and config.data_root == "bench-fake"
    assert not hasattr(config, "precision")  # passed only where the Config has the field
    (collapse,) = [c for c in throughput.CASES if c.name == "collapse"]
    config, _ = throughput.case_config(
        collapse, smoke=False, device="cuda", precision=None, data_root="bench-fake"
    )
    assert not hasattr(config, "device") and not hasattr(config, "data_root")


def test_smoke_run_reports_every_trainer_and_mode_without_service_imports(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(IMPORT_BLOCKER)
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_throughput.py", "--smoke", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BLOCKED IMPORT" not in done.stderr, done.stderr[-3000:]
    report = json.loads(out.read_text())
    names = [case["name"] for case in report["trainers"]]
    assert names == ["cff", "feedback_resmlp", "ssl", "collapse", "ssl_sim", "feedback_studentnet"]
    for case in report["trainers"]:
        assert case["device"] == "cpu"
        measured = [(row["mode"], row["k"]) for row in case["results"]]
        assert measured == [
            ("single", 1),
            ("processes", 1),
            ("processes", 2),
            ("run_seeds", 1),
            ("run_seeds", 2),
        ], case["name"]
        for row in case["results"]:
            where = f"{case['name']} {row['mode']} K={row['k']}"
            assert row["error"] is None, where
            assert row["seeds_measured"] == row["k"], where
            for figure in (
                "seed_epochs_per_s",
                "s_per_seed_epoch",
                "seed_epochs_per_s_incl_setup",
                "wall_s",
                "vs_single",
            ):
                assert row[figure] > 0, (where, figure)
            assert row["s_per_seed_epoch"] == pytest.approx(1 / row["seed_epochs_per_s"])
            assert row["gpu_busy"] is None, where  # a CPU has no GPU clock
    table = done.stdout
    for name in names:
        assert f"\n{name}: examples/" in table
    assert table.count("n/a") == 6 * 5  # one GPU-busy cell a row


@pytest.fixture(scope="module")
def seed_batching() -> ModuleType:
    return load_script("seed_batching")


def test_seed_batching_prints_both_trainers_ratios_and_their_agreement(
    seed_batching: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    threads = torch.get_num_threads()
    try:
        seed_batching.main(["--k", "2", "--steps", "10", "--epochs", "1"])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert printed.count("median ratio task/solo") == 4  # two trainers x two clocks
    # Same seeds, same config: each seed's task result is its solo run's. collapse (float64)
    # bit for bit; feedback (float32, batched GEMMs) to rounding after one epoch.
    collapse, feedback = printed.split("feedback StudentNet", 1)
    assert "parameters_sha256 equal for 2 of 2 seeds" in collapse
    assert "largest relative difference of a final metric 0;" in collapse
    (difference,) = re.findall(r"largest relative difference of a final metric ([^;]+);", feedback)
    assert float(difference) < 1e-3, feedback
    assert "seed-batched task / solo runs, seeds per second (wall clock): collapse " in printed
    # the machine's load is printed before and after, so a low ratio on a busy machine says so
    assert re.search(r"^before: load average \(1 min\) \d+\.\d\d on \d+ cores", printed, re.M)
    assert re.search(r"^after: load average \(1 min\) \d+\.\d\d on \d+ cores", printed, re.M)


def test_seed_batching_warns_when_other_work_competes_for_the_cores(
    seed_batching: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seed_batching.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(seed_batching.os, "getloadavg", lambda: (0.9, 0.0, 0.0))
    assert seed_batching.machine_load(1) == "load average (1 min) 0.90 on 2 cores"
    monkeypatch.setattr(seed_batching.os, "getloadavg", lambda: (3.2, 0.0, 0.0))
    assert seed_batching.machine_load(1).endswith(
        "other work competes for the cores; the ratios below read low"
    )


def test_largest_relative_difference_of_final_metrics(seed_batching: ModuleType) -> None:
    from trainers import RunResult

    def result(**metrics: float) -> RunResult:
        return RunResult(metrics=metrics, diagnostics={}, warnings=[], provenance={})

    a = [result(loss=2.0, acc=0.5), result(loss=0.0)]
    assert seed_batching.largest_relative_difference(a, a) == 0.0
    b = [result(loss=2.0, acc=0.4), result(loss=0.0)]
    assert seed_batching.largest_relative_difference(a, b) == pytest.approx(0.1 / 0.5)
    c = [result(loss=2.0, acc=0.5), result(loss=float("nan"))]
    assert seed_batching.largest_relative_difference(a, c) == float("inf")


def test_read_paths_runs_in_its_smoke_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/read_paths.py end to end on a tiny experiment (it had stopped running: an
    import of a constant that was gone, and runs without the completed count the stored page
    is served by, so every "warm" GET computed again)."""
    load_script("read_paths").main(["--smoke"])
    out = capsys.readouterr().out
    assert "/stats of a 18-run experiment" in out
    assert "/metrics of a 10,000-point curve" in out
    assert "/protocol: 100 runs" in out


def test_experiment_detail_compares_kept_and_legacy_curve_names_in_its_smoke_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """benchmarks/experiment_detail.py end to end at 40 and 400 runs over HTTP: both arms name
    the same curves (it exits otherwise), and it prints each arm's ratio and the goal."""
    medians = load_script("experiment_detail").main(["--smoke"])
    out = capsys.readouterr().out
    assert set(medians) == {(n, arm) for n in (40, 400) for arm in ("kept", "legacy")}
    assert "curve_metrics ['grad_norm', 'loss', 'min_l2']" in out
    assert "kept: 400 runs / 40 runs = " in out and "(goal for kept <= 1.5:" in out
    assert "kept / legacy at 400 runs: " in out


@pytest.fixture(scope="module")
def launches() -> ModuleType:
    return load_script("launches")


def test_the_launch_counter_counts_kernels_syncs_and_host_copies(launches: ModuleType) -> None:
    """On a known computation: an allocation and a view launch nothing; a fill, a multiply,
    an add and a sum launch one kernel each; .item() and .tolist() make the host wait; a
    tensor built from Python data is a host-to-device copy."""
    with launches.gpu_like() as reads, launches.Counting() as counting:
        a = torch.ones(3)  # empty + fill_
        b = (a * 2 + 1).sum()
        a.view(3, 1)
        b.item()
        a.tolist()
        torch.tensor([1.0, 2.0])
    counts = launches.tally(counting.ops, reads["n"], counting.views)
    assert (counts.ops, counts.syncs, counts.copies) == (4, 2, 1), counting.ops
    # random numbers from a (CPU) generator, and arithmetic on them alone, stay on the host:
    # no kernel; the device op that reads them copies them once
    generator = torch.Generator().manual_seed(0)
    x = torch.ones(4)
    with launches.gpu_like() as reads, launches.Counting() as counting:
        draws = torch.rand(4, generator=generator)
        scaled = 2 * draws + 1
        y = x * scaled  # one kernel, one copy
        y = y + scaled  # one kernel, already on the device
        rows = torch.stack([draws, draws]).unbind(0)  # host work
        y = y * rows[0] + rows[1]  # two kernels, one copy (of the stack the rows view)
        moved = torch.rand(4, generator=generator).to("cpu", non_blocking=True)  # one copy
        y = y * (moved < 0.5)  # two kernels on the device, no further copy
    drawn = launches.tally(counting.ops, reads["n"], counting.views)
    assert (drawn.ops, drawn.syncs, drawn.copies) == (6, 0, 3), counting.ops
    assert counting.ops["rand" + launches.HOST] == 2
    # an optimiser's read of its step count is no sync: a GPU run keeps that count on the host
    weight = torch.zeros(3, requires_grad=True)
    weight.grad = torch.ones(3)
    adam = torch.optim.Adam([weight], lr=0.1)
    with launches.gpu_like() as reads, launches.Counting() as counting:
        adam.step()
    stepped = launches.tally(counting.ops, reads["n"], counting.views)
    assert stepped.syncs == 0 and stepped.ops > 0, counting.ops
    assert counting.ops["_local_scalar_dense (host)"] >= 1  # it did read it


@pytest.mark.parametrize("make", ["Adam", "AdamW", "SGD"])
def test_optimisers_take_their_foreach_path_whose_ops_do_not_grow_with_the_tensors(
    launches: ModuleType, make: str
) -> None:
    """A GPU steps every parameter tensor of a group in one foreach kernel per op: the counted
    step launches as many ops for 6 tensors as for 1 (each optimiser module binds the chooser
    of its path under its own name; all are switched, and switched back after)."""

    def ops(tensors: int) -> tuple[int, Counter[str]]:
        params = [torch.zeros(3, requires_grad=True) for _ in range(tensors)]
        for param in params:
            param.grad = torch.ones(3)
        kwargs = {"momentum": 0.9} if make == "SGD" else {}
        step = getattr(torch.optim, make)(params, lr=0.1, **kwargs)
        step.step()  # the first step makes the state
        with launches.gpu_like() as reads, launches.Counting() as counting:
            step.step()
        return launches.tally(counting.ops, reads["n"], counting.views).ops, counting.ops

    one, seen = ops(1)
    six, _ = ops(6)
    assert any(name.startswith("_foreach_") for name in seen), seen
    assert one == six > 0
    from torch.optim import adam

    assert adam._default_to_fused_or_foreach.__module__ == "torch.optim.optimizer"


def test_launches_smoke_counts_per_seed_step_and_batching_lowers_them(
    launches: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = launches.main(["--smoke", "--trainers", "collapse", "feedback_studentnet"])
    by = {(r.case, r.mode): r for r in rows}
    assert set(by) == {
        (c, m) for c in ("collapse", "feedback_studentnet") for m in ("solo", "K=1", "K=2")
    }
    for case in ("collapse", "feedback_studentnet"):
        assert by[case, "solo"].ops > 0
        # both batch their seeds: two seeds in one computation launch fewer ops per seed
        assert by[case, "K=2"].ops < by[case, "K=1"].ops
    assert "per seed per training step" in capsys.readouterr().out


def test_batched_tasks_launch_less_per_seed_and_sync_at_most_every_other_seed_step(
    launches: ModuleType,
) -> None:
    """The gauge's targets that hold (issue 25): a task of one seed costs what a solo run
    costs (K = 1 ops at most 1.05 x solo), and at K = 8 a batched trainer syncs at most 0.5
    times per seed-step (feedback and ssl_sim read their step's losses once per step for all
    K seeds) and launches fewer ops per seed than at K = 1."""
    cases = ("collapse", "feedback_studentnet", "ssl_sim")
    rows = launches.main(["--smoke", "--k", "1", "8", "--trainers", *cases])
    by = {(r.case, r.mode): r for r in rows}
    for case in cases:
        solo, one, eight = by[case, "solo"], by[case, "K=1"], by[case, "K=8"]
        assert one.ops <= 1.05 * solo.ops, (case, one, solo)
        assert eight.syncs <= 0.5, (case, eight)
        assert eight.ops < one.ops / 2, (case, eight, one)


def test_the_paper_scale_batched_steps_launch_a_seventh_per_seed_at_k_8(
    launches: ModuleType,
) -> None:
    """Issue 25's targets at the paper-scale example models (the gauge's own configs): at K = 8
    a seed-step of cff and of both feedback models launches at most a seventh of a solo
    step's ops, with at most 0.5 syncs; a task of one seed costs what a solo run costs; ssl
    (not batched; its smoke model) syncs at most once a step."""
    cases = ("cff", "feedback_resmlp", "feedback_vit")
    # batches of 4, not the script's 16: the same counts (measured; a step launches what it
    # launches whatever its batch size, test below) in under half the time
    rows = launches.main(["--k", "1", "8", "--batch-size", "4", "--trainers", *cases])
    by = {(r.case, r.mode): r for r in rows}
    for case in cases:
        solo, one, eight = by[case, "solo"], by[case, "K=1"], by[case, "K=8"]
        assert eight.ops <= solo.ops / 7, (case, eight.ops, solo.ops)
        assert eight.syncs <= 0.5, (case, eight)
        assert one.ops <= 1.05 * solo.ops, (case, one, solo)
    (ssl,) = [r for r in launches.main(["--smoke", "--trainers", "ssl"]) if r.mode == "solo"]
    assert ssl.syncs <= 1, ssl


def test_a_steps_op_count_does_not_depend_on_the_batch_size(launches: ModuleType) -> None:
    """What lets the gauge train on small batches: no trainer step here loops over examples."""
    case = launches.ALL_CASES["feedback_studentnet"]
    trainer = launches.gt.trainer_named(case.trainer)
    config = launches.config_of(case)
    per_step = [launches.step_counts(trainer, config, size, None).ops for size in (8, 16)]
    assert per_step[0] == per_step[1] > 0


def test_dispatch_compares_equal_work_with_alternating_arms_in_its_smoke_mode() -> None:
    """benchmarks/dispatch.py at 4 seeds a task in both arms (seedgrid's spec, sent over HTTP to
    a serve of its own that joins the script's Ray, and the bare Ray tasks), each arm first in
    turn, compute alone timed in a Ray worker: it runs to the end on its own local Ray and
    prints positive figures and their ratio against the goal."""
    done = subprocess.run(
        [sys.executable, "benchmarks/dispatch.py", "--smoke", "--seeds-per-task", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "repeat 0 (bare first)" in out and "repeat 1 (seedgrid first)" in out, out
    assert "runs per repeat: 16, repeats: 2, seeds per task: 4" in out, out
    figures = {
        name: float(value)
        for name, value in re.findall(
            r"^(compute alone|bare Ray tasks|seedgrid).*?([\d.]+) ms/run", out, re.M
        )
    }
    assert set(figures) == {"compute alone", "bare Ray tasks", "seedgrid"}, out
    assert all(v > 0 for v in figures.values()), figures
    # seedgrid out of this process (its own serve, over HTTP), the goal as a ratio
    assert "serve in its own process, polled over HTTP" in out, out
    assert "Connecting to existing Ray cluster" in done.stderr, done.stderr[-3000:]
    (ratio,) = re.findall(
        r"ratio seedgrid / bare Ray: ([\d.]+)x "
        r"\(goal <= 1\.5x at 4 seeds a task: (?:met|NOT met)\)",
        out,
    )
    assert float(ratio) == pytest.approx(figures["seedgrid"] / figures["bare Ray tasks"], rel=0.01)


def test_ray_task_times_seedgrids_task_against_a_bare_ray_task_and_the_report_reads_it(
    tmp_path: Path,
) -> None:
    """benchmarks/ray_task.py --smoke on its own local Ray: seedgrid's worker task and a bare
    Ray task of the same two seeds, each first in turn after an untimed warm-up, their medians'
    ratio against the goal; device_report.py then prints it beside the steps that did not run."""
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/ray_task.py",
            "--smoke",
            "--json",
            str(tmp_path / "ray_task.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "ray_task.json").read_text())
    assert report["completed"] == report["k"] == 2, report
    assert len(report["bare_s"]) == len(report["seedgrid_s"]) == 2
    assert all(t > 0 for t in report["bare_s"] + report["seedgrid_s"])
    medians = [sorted(report[arm]) for arm in ("seedgrid_s", "bare_s")]
    assert report["vs_bare"] == pytest.approx(sum(medians[0]) / sum(medians[1]))
    assert "warm-up: one bare task of 2 seeds" in done.stderr
    order = re.findall(r"repeat (\d): (bare|seedgrid) task", done.stderr)
    assert order == [("0", "bare"), ("0", "seedgrid"), ("1", "seedgrid"), ("1", "bare")]
    assert re.search(r"seedgrid/bare [\d.]+x, goal <= 1\.5x: (met|NOT met)", done.stdout)

    shown = subprocess.run(
        [sys.executable, "benchmarks/device_report.py", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "throughput: no result" in shown.stdout and "launches: no result" in shown.stdout
    assert re.search(
        r"ray task: cff K = 2 through a local Ray [\d.]+ on cpu: 2/2 completed on cpu; "
        r"seedgrid's task against a bare Ray task of the same seeds \(medians of 2\): "
        r"[\d.]+x, goal <= 1\.5x: (met|NOT met)",
        shown.stdout,
    ), shown.stdout
