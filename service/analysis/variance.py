"""One variance comparison of two levels, on within-cell residuals (docs/api.md "Variance
comparisons"); the omnibus test of a factor's levels is service.analysis.omnibus.

A comparison's samples are strata (service.analysis.resampling.Stratum): for a comparison within a
cell
of the other factors, the two cells; pooled over them, the two cells at each combination of the
other factors. Every spread is measured inside cells, so a difference between the cells' means
(an interaction, or another factor's main effect) never counts as seed variance:

- var_a, var_b: sum_k (n_k - 1) s_k^2 / sum_k (n_k - 1) over each level's cells, with
  dof = sum_k (n_k - 1); var_ratio = var_a / var_b;
- primary_p and primary_ci95: service.analysis.resampling's randomisation test (paired by seed where
  the two levels ran the same seeds in every cell) and its inverted interval;
- f_test_p and var_ratio_ci95_f: the F-test and its exact interval on those degrees of freedom
  (normal theory: secondary);
- brown_forsythe_p: the one-way ANOVA of the absolute deviations from each cell's median
  between the two levels (scipy.stats.levene(center="median") for one cell a side);
- mean_diff: paired, the mean of each seed's difference (averaged over the cells; seeds that
  ran in one level only are left out) with the paired t-test and its interval; unpaired, the
  difference of all runs' means with service.analysis.mean_test's studentised permutation test
  and its inverted interval (mean_test names it); welch_p is Welch's t from Student's t either
  way (secondary: it over-rejects with unequal seeds on skewed metrics);
- marginal_var_*: the variance of all runs of a level (pooled comparisons only), descriptive.

A comparison's result depends only on its strata, so results are cached by a digest of them
(RESULT_CACHE_SIZE): a poll after one more run completes recomputes only the comparisons whose
cells it joined. Anything undefined (fewer than 2 seeds, zero variance) is null, never an error.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy import special

from service.analysis import resampling
from service.analysis.mean_test import MEAN_TEST, mean_test
from service.analysis.power import f_ratio_interval
from service.analysis.primary_power import primary_detectable_ratio, primary_seeds_needed
from service.analysis.resampling import Prepared, Stratum
from service.lru import LruCache, deep_size

# Seed minimums behind the warnings. Brown-Forsythe: with 2 seeds both absolute deviations from
# the median are equal, with 3 one is always 0; 5 is the smallest n at which neither dominates.
MIN_SEEDS_BROWN_FORSYTHE = 5
# Student's t with 1 degree of freedom puts the bound 12.7 standard errors from the mean.
MIN_SEEDS_MEAN_INTERVAL = 3
# A ratio interval whose high end is more than 10^3 times its low end says little.
MAX_RATIO_INTERVAL_DECADES = 3.0
# The marginal ratio is worth a warning when it is this many times the within-cell one (or
# less than its inverse): the cells' means differ enough to inflate it.
MARGINAL_INFLATION_WARNING = 2.0
# Pooled cells whose variances span more decades than this: the largest cells decide.
MAX_CELL_SPREAD_DECADES = 3.0
# Two levels whose means differ this many times over: their raw variances mostly say so.
MEAN_FOLD_WARNING = 10.0
# Comparison results kept in memory, keyed by their data: at most this many, and at most
# MAX_RESULT_BYTES of them (a result is 2-6 KB: its fields, warnings and intervals), so that a
# service that shows many experiments holds a bounded amount, not a count of entries whose
# size grows with their warnings.
RESULT_CACHE_SIZE = 100_000
MAX_RESULT_BYTES = 64 * 2**20

_results: LruCache[dict[str, Any]] = LruCache(
    max_items=RESULT_CACHE_SIZE, max_bytes=MAX_RESULT_BYTES, size=deep_size
)


class ResultStore(Protocol):
    """Where analyse() finds results past this process's memory, and keeps the ones it
    computes (service.analysis.stats_store.StoredResults: the database)."""

    def load(self, keys: Sequence[bytes]) -> dict[bytes, dict[str, Any]]:
        """The stored results of those of `keys` it has."""

    def keep(self, results: dict[bytes, dict[str, Any]]) -> None:
        """Every result analyse() answered with (from memory, the store or computed): the
        store keeps those it lacks."""


@dataclass(frozen=True)
class Scope:
    """The data of one comparison: its strata (cells of a and b at each combination of the
    other factors) and whether it is pooled over other factors."""

    strata: tuple[Stratum, ...]
    pooled: bool

    def side(self, which: str) -> np.ndarray:
        parts = [getattr(s, which) for s in self.strata]
        return np.concatenate(parts) if parts else np.empty(0)

    def digest(self, target_ratio: float, mean_test: bool) -> bytes:
        h = hashlib.blake2b(digest_size=20)
        h.update(repr((self.pooled, target_ratio, mean_test, len(self.strata))).encode())
        for s in self.strata:
            for values, seeds in ((s.a, s.a_seeds), (s.b, s.b_seeds)):
                h.update(np.asarray(values, dtype=np.float64).tobytes())
                h.update(repr(seeds).encode())
                h.update(b"|")
        return h.digest()


def finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _interval(values: Sequence[float | None]) -> list[float | None]:
    return [finite(v) for v in values]


def analyse(
    scopes: Sequence[Scope],
    *,
    target_ratio: float = 2.0,
    mean_test: bool = True,
    store: ResultStore | None = None,
) -> list[dict[str, Any]]:
    """The fields of api_schemas.Comparison (but factor, levels and Holm) for each scope; the
    primary tests of all scopes not cached run as one batch. mean_test=False leaves out the
    unpaired permutation mean test (mean_p, mean_diff_ci95 and mean_test stay unset), most of
    an unpaired comparison's cost: a simulation of the variance tests has no use for it.
    `store`: results this process does not hold are looked up there before they are
    computed, and those computed are kept there."""
    keys = [scope.digest(target_ratio, mean_test) for scope in scopes]
    out: list[dict[str, Any] | None] = []
    for key in keys:
        cached = _results.get(key)
        out.append(None if cached is None else dict(cached))
    todo = [i for i, r in enumerate(out) if r is None]
    if store is not None and todo:
        found = store.load([keys[i] for i in todo])
        for i in todo:
            if keys[i] in found:
                out[i] = dict(found[keys[i]])
                _results.put(keys[i], found[keys[i]])
        todo = [i for i in todo if out[i] is None]
    usable = {i: resampling.usable_strata(scopes[i].strata) for i in todo}
    pairings = {i: resampling.pairing(usable[i]) for i in todo}
    preps = {i: resampling.prepare(usable[i], pairings[i]) for i in todo}
    ready = {i: prep for i, prep in preps.items() if prep is not None}
    tested = list(ready)
    results = dict(
        zip(tested, resampling.randomisation_tests([ready[i] for i in tested]), strict=True)
    )
    for i in todo:
        out[i] = _fields(
            scopes[i], usable[i], pairings[i], preps[i], results.get(i), target_ratio, mean_test
        )
    for i in todo:
        _results.put(keys[i], dict(out[i]))  # type: ignore[arg-type]
    if store is not None:
        store.keep({key: result for key, result in zip(keys, out, strict=True) if result})
    return [r for r in out if r is not None]


def _fields(
    scope: Scope,
    usable: Sequence[Stratum],
    paired: resampling.Pairing,
    prep: Prepared | None,
    result: resampling.TestResult | None,
    target_ratio: float,
    mean_test: bool,
) -> dict[str, Any]:
    a_all, b_all = scope.side("a"), scope.side("b")
    out: dict[str, Any] = {
        "n_a": len(a_all),
        "n_b": len(b_all),
        "var_a": None,
        "var_b": None,
        "dof_a": None,
        "dof_b": None,
        "var_ratio": None,
        "f_test_p": None,
        "brown_forsythe_p": None,
        "mean_diff": None,
        "welch_p": None,
        "target_ratio": target_ratio,
    }
    if len(a_all) and len(b_all):
        out["mean_diff"] = finite(a_all.mean() - b_all.mean())
    if scope.pooled:
        if len(a_all) >= 2 and len(b_all) >= 2:
            marginal_a, marginal_b = float(a_all.var(ddof=1)), float(b_all.var(ddof=1))
            out.update(
                marginal_var_a=marginal_a,
                marginal_var_b=marginal_b,
                marginal_var_ratio=finite(marginal_a / marginal_b) if marginal_b > 0 else None,
            )
    _welch(out, a_all, b_all)
    if usable:
        dof_a = sum(len(s.a) - 1 for s in usable)
        dof_b = sum(len(s.b) - 1 for s in usable)
        var_a = float(sum((len(s.a) - 1) * resampling.cell_variance(s.a) for s in usable) / dof_a)
        var_b = float(sum((len(s.b) - 1) * resampling.cell_variance(s.b) for s in usable) / dof_b)
        out.update(var_a=var_a, var_b=var_b, dof_a=dof_a, dof_b=dof_b)
        out["brown_forsythe_p"] = _brown_forsythe(usable)
        if var_a > 0 and var_b > 0:
            ratio = var_a / var_b
            out["var_ratio"] = ratio
            tail = float(special.fdtr(dof_a, dof_b, ratio))
            out["f_test_p"] = min(1.0, 2.0 * min(tail, 1.0 - tail))
            out["var_ratio_ci95_f"] = _interval(f_ratio_interval(ratio, dof_a + 1, dof_b + 1))
    ordered, note = paired
    if prep is not None and result is not None:
        out.update(
            primary_test=prep.name,
            primary_p=result.p,
            primary_ci95=_interval(result.interval),
            primary_resamples=result.resamples,
            primary_exact=result.exact,
        )
    if ordered is not None:
        out.update(
            pairing="paired",
            paired_seeds=sum(len(a) for a, _ in ordered),
            pairing_note=note,
            seed_correlation=prep.correlation if prep is not None else None,
        )
        seed_sets = {resampling.shared_seeds(s) for s in usable}
        _paired_t(out, ordered, same_seeds=len(seed_sets) == 1)
    else:
        out.update(pairing="unpaired", pairing_note=note)
        if mean_test:
            _permutation_mean_test(out, scope)
    out.pop("welch_ci95", None)
    # Planning answers for uncorrelated seeds (correlation only adds power to a paired test),
    # so that an experiment's comparisons share a few cached simulations.
    paired = out["pairing"] == "paired"
    out["detectable_ratio"] = finite(
        primary_detectable_ratio((out["dof_a"] or 0) + 1, (out["dof_b"] or 0) + 1, paired=paired)
    )
    out["seeds_for_target_ratio"] = primary_seeds_needed(target_ratio, paired=paired)
    out["warnings"] = comparison_warnings(out, scope, len(usable))
    out.pop("mean_resamples", None)
    return out


def _welch(out: dict[str, Any], a: np.ndarray, b: np.ndarray) -> None:
    """Welch's two-sided t-test and its 95% interval, as scipy.stats.ttest_ind(equal_var=False)
    computes them (written out: scipy's wrapper costs milliseconds a call, and /stats makes
    one per comparison)."""
    if len(a) < 2 or len(b) < 2:
        return
    var_a, var_b = float(a.var(ddof=1)), float(b.var(ddof=1))
    if var_a == 0 and var_b == 0:
        out["welch_p_null_reason"] = (
            "both levels have zero variance: Welch's t is 0/0 "
            "(the means are equal or differ exactly, with no noise "
            "to test against)"
        )
        return
    se_a, se_b = var_a / len(a), var_b / len(b)
    se = math.sqrt(se_a + se_b)
    dof = (se_a + se_b) ** 2 / (se_a**2 / (len(a) - 1) + se_b**2 / (len(b) - 1))
    diff = float(a.mean() - b.mean())
    out["welch_p"] = finite(2 * special.stdtr(dof, -abs(diff) / se))
    half = float(special.stdtrit(dof, 0.975)) * se
    out["welch_ci95"] = [diff - half, diff + half]


def _permutation_mean_test(out: dict[str, Any], scope: Scope) -> None:
    """The unpaired mean test (service.analysis.mean_test): Welch's t with its null from
    re-assignments of the runs within each stratum, and its inverted interval."""
    out["mean_test"] = MEAN_TEST
    result = mean_test([(s.a, s.b) for s in scope.strata])
    if result is None:
        if out.get("welch_p_null_reason"):
            out["mean_p_null_reason"] = out["welch_p_null_reason"]
        return
    out["mean_p"] = finite(result.p)
    out["mean_diff_ci95"] = _interval(result.interval)
    out["mean_resamples"] = result.resamples  # for comparison_warnings, then dropped


def _paired_t(
    out: dict[str, Any], ordered: Sequence[tuple[np.ndarray, np.ndarray]], same_seeds: bool
) -> None:
    """The paired t-test of the mean difference: on each seed's difference averaged over the
    cells when every cell ran the same seeds (seeds, not cells, are the independent units
    then), else on each (cell, seed) difference."""
    if same_seeds:
        differences = np.mean([a - b for a, b in ordered], axis=0)
        out["mean_test"] = "paired t"
    else:
        differences = np.concatenate([a - b for a, b in ordered])
        out["mean_test"] = "paired t over (cell, seed) pairs"
    n = len(differences)
    mean = float(differences.mean())
    # the estimate its interval is centred on: the same seeds (runs without a partner left out)
    out["mean_diff"] = finite(mean)
    if n < 2:
        return
    sd = float(differences.std(ddof=1))
    if sd == 0:
        out["mean_p_null_reason"] = (
            "every seed's difference is the same: the paired t is "
            "undefined (no noise to test against)"
        )
        out["mean_diff_ci95"] = [mean, mean]
        return
    se = sd / math.sqrt(n)
    out["mean_p"] = finite(2 * special.stdtr(n - 1, -abs(mean) / se))
    half = float(special.stdtrit(n - 1, 0.975)) * se
    out["mean_diff_ci95"] = [mean - half, mean + half]


def _brown_forsythe(strata: Sequence[Stratum]) -> float | None:
    """One-way ANOVA of |x - median(cell)| between the two levels, F(1, N - 2) (for one cell a
    side, scipy.stats.levene(center="median"))."""
    dev_a = np.concatenate([resampling.cell_absolute_deviations(s.a) for s in strata])
    dev_b = np.concatenate([resampling.cell_absolute_deviations(s.b) for s in strata])
    return one_way_anova([dev_a, dev_b])


def one_way_anova(groups: Sequence[np.ndarray]) -> float | None:
    """The p of scipy.stats.f_oneway(*groups), written out; None when nothing varies."""
    n = np.array([len(g) for g in groups], dtype=float)
    means = np.array([g.mean() for g in groups])
    grand = float((n * means).sum() / n.sum())
    between = float((n * (means - grand) ** 2).sum())
    within = float(sum(((g - m) ** 2).sum() for g, m in zip(groups, means, strict=True)))
    dof_between, dof_within = len(groups) - 1, n.sum() - len(groups)
    if within <= 0 or dof_within <= 0:
        return None
    return finite(
        special.fdtrc(dof_between, dof_within, (between / dof_between) / (within / dof_within))
    )


def comparison_warnings(result: dict[str, Any], scope: Scope, usable: int) -> list[str]:
    """Each number of `result` computed from fewer seeds than it needs, and each reading the
    numbers invite that they do not support."""
    n_a, n_b = result["n_a"], result["n_b"]
    seeds = f"{n_a} and {n_b} seeds"
    out = []
    if usable == 0:
        out.append(
            f"{seeds}: a within-cell variance needs 2 seeds in a cell on each side, so "
            "no variance test"
        )
        return out
    if usable < len(scope.strata):
        out.append(
            f"{len(scope.strata) - usable} of {len(scope.strata)} cells left out: fewer "
            "than 2 seeds on a side"
        )
    if result.get("primary_resamples") is not None:
        total = result["primary_resamples"]
        if result["primary_exact"] and total < resampling.MIN_DISTINCT_ASSIGNMENTS:
            out.append(
                f"primary_p from {seeds}: they allow only {total} distinct "
                f"re-assignments, so it cannot fall below {2 / total:.2g} and never "
                "reaches 0.05; primary_ci95 excludes nothing"
            )
    if result["brown_forsythe_p"] is not None and min(n_a, n_b) < MIN_SEEDS_BROWN_FORSYTHE:
        out.append(
            f"brown_forsythe_p from {seeds}: it needs {MIN_SEEDS_BROWN_FORSYTHE} per "
            "level (with 2 the deviations from the median are equal; with 3 one is "
            "always 0), and has little power below that"
        )
    f_p, primary_p = result.get("f_test_p"), result.get("primary_p")
    if f_p is not None and primary_p is not None and (f_p < 0.05) != (primary_p < 0.05):
        out.append(
            f"f_test_p {f_p:.2g} and primary_p {primary_p:.2g} disagree at 0.05: the "
            "F-test assumes normal seeds and rejects 6-10 times too often on lognormal "
            "or failed-seed metrics (docs/api.md); primary_p keeps its level there"
        )
    for name in ("primary_ci95", "var_ratio_ci95_f"):
        interval = result.get(name)
        if not interval or interval[0] is None:
            continue
        low, high = interval
        decades = math.inf if low <= 0 or high is None else math.log10(high / low)
        if decades > MAX_RATIO_INTERVAL_DECADES:
            span = (
                "from 0"
                if low <= 0
                else ("to infinity" if high is None else f"{decades:.1f} orders of magnitude")
            )
            out.append(
                f"{name} spans {span} with {seeds}: it says little about the ratio "
                f"(more than {MAX_RATIO_INTERVAL_DECADES:g} orders of magnitude)"
            )
    marginal, within = result.get("marginal_var_ratio"), result.get("var_ratio")
    if marginal and within:
        inflation = marginal / within
        if max(inflation, 1 / inflation) >= MARGINAL_INFLATION_WARNING:
            out.append(
                f"marginal_var_ratio {marginal:.3g} is {inflation:.3g} times the "
                f"within-cell var_ratio {within:.3g}: the cells' means differ (another "
                "factor's effect or an interaction), which the marginal ratio counts as "
                "seed variance; var_ratio and the tests are within cells"
            )
    spreads = [
        resampling.cell_variance(c)
        for s in resampling.usable_strata(scope.strata)
        for c in (s.a, s.b)
    ]
    positive = [v for v in spreads if v > 0]
    if len(scope.strata) > 1 and len(positive) > 1:
        decades = math.log10(max(positive) / min(positive))
        if decades > MAX_CELL_SPREAD_DECADES:
            out.append(
                f"the pooled cells' variances span {decades:.0f} orders of magnitude: "
                "the cells with the largest decide var_ratio and the primary test; read "
                "the comparisons within cells, or ?scale=log for relative spreads"
            )
    a_all, b_all = scope.side("a"), scope.side("b")
    if len(a_all) and len(b_all) and min(a_all.min(), b_all.min()) > 0:
        fold = a_all.mean() / b_all.mean()
        if max(fold, 1 / fold) >= MEAN_FOLD_WARNING:
            out.append(
                f"the levels' means differ {max(fold, 1 / fold):.3g}-fold: raw "
                "variances then mostly restate the means; ?scale=log compares relative "
                "spreads (coefficients of variation)"
            )
    mean_resamples = result.get("mean_resamples")
    if mean_resamples is not None and mean_resamples < resampling.MIN_DISTINCT_ASSIGNMENTS:
        out.append(
            f"mean_p from {seeds}: they allow only {mean_resamples} distinct re-assignments, "
            f"so it cannot fall below {2 / mean_resamples:.2g} and never reaches 0.05; "
            "mean_diff_ci95 excludes nothing"
        )
    elif result.get("mean_diff_ci95") and min(n_a, n_b) < MIN_SEEDS_MEAN_INTERVAL:
        out.append(
            f"mean_diff_ci95 from {seeds}: about 1 degree of freedom below "
            f"{MIN_SEEDS_MEAN_INTERVAL} seeds per level, so very wide"
        )
    return out
