"""The CLI's one-line announcements: how many runs a submission queued, and where `seedgrid
serve` answers (issue 39: "8 conditions x seeds = 40 runs" lacked its seeds, and serve never
said where its dashboard was)."""

from __future__ import annotations

from service.cli.server import conditions_times_seeds, serving_banner


def test_the_run_count_names_the_seeds_per_condition() -> None:
    assert conditions_times_seeds(8, 40) == "8 conditions x 5 seeds = 40 runs"
    assert conditions_times_seeds(1, 1) == "1 condition x 1 seed = 1 run"
    # conditions with different seed counts (added seeds on some): the total alone
    assert conditions_times_seeds(3, 10) == "3 conditions, 10 runs"


def test_serve_names_its_api_and_dashboard() -> None:
    assert serving_banner("127.0.0.1", 8000) == (
        "seedgrid API at http://127.0.0.1:8000 (docs http://127.0.0.1:8000/docs); "
        "the dashboard at http://127.0.0.1:8000/ui"
    )
    assert "http://127.0.0.1:9000/ui" in serving_banner("0.0.0.0", 9000)
    assert "http://[::1]:8000/ui" in serving_banner("::1", 8000)
