"""Independent scipy computations of the statistics docs/api.md specifies, for the tests."""

from __future__ import annotations

import numpy as np
from scipy import stats

from service.stats import N_RESAMPLES, RESAMPLING_SEED


def reference_comparison(a: list[float], b: list[float]) -> dict[str, float]:
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    var_a, var_b = np.var(a_arr, ddof=1), np.var(b_arr, ddof=1)
    ratio = var_a / var_b
    f_cdf = stats.f.cdf(ratio, len(a) - 1, len(b) - 1)
    perm = stats.permutation_test(
        (a_arr, b_arr),
        lambda x, y: np.log(np.var(x, ddof=1) / np.var(y, ddof=1)),
        permutation_type="independent", n_resamples=N_RESAMPLES,
        random_state=RESAMPLING_SEED, vectorized=False,
    )
    boot = stats.bootstrap(
        (a_arr, b_arr), lambda x, y: np.var(x, ddof=1) / np.var(y, ddof=1), paired=False,
        vectorized=False, n_resamples=N_RESAMPLES, method="percentile",
        random_state=RESAMPLING_SEED,
    )
    return {
        "var_a": var_a, "var_b": var_b, "var_ratio": ratio,
        "f_test_p": min(1.0, 2 * min(f_cdf, 1 - f_cdf)),
        "brown_forsythe_p": stats.levene(a_arr, b_arr, center="median").pvalue,
        "permutation_p": perm.pvalue,
        "var_ratio_ci95": [boot.confidence_interval.low, boot.confidence_interval.high],
        "mean_diff": a_arr.mean() - b_arr.mean(),
        "welch_p": stats.ttest_ind(a_arr, b_arr, equal_var=False).pvalue,
    }


def reference_condition(values: list[float]) -> dict[str, float]:
    x = np.asarray(values)
    n = len(x)
    half = stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n)
    return {"n": n, "mean": x.mean(), "std": x.std(ddof=1), "var": x.var(ddof=1),
            "min": x.min(), "median": np.median(x), "max": x.max(),
            "ci95": [x.mean() - half, x.mean() + half]}


def _json(value: float) -> float | None:
    # the API serves an undefined value (nan, e.g. a bootstrap with zero-variance resamples) as null
    return None if not np.isfinite(value) else float(value)


def assert_matches(got: dict, expected: dict, rel: float = 1e-9) -> None:
    import pytest

    for key, value in expected.items():
        if isinstance(value, list):
            want = [_json(v) for v in value]
            if None in want:
                assert got[key] in (None, [None, None]), key
            else:
                assert got[key] == pytest.approx(want, rel=rel), key
        else:
            assert got[key] == pytest.approx(float(value), rel=rel), key
