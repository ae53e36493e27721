"""The primary variance test: a randomisation test of deviations from each cell's median,
stratified by cell, with seeds paired where two conditions share them; its interval by
inverting the test.

One comparison is a list of strata. A stratum is the pair of cells that hold the two compared
levels at one combination of the other factors (a comparison within a cell has one stratum; a
pooled one has one per combination). Each value becomes its squared deviation from its cell's
median, d = (x - median(cell))^2 (the median as in Brown-Forsythe: a failed seed moves it
little, so it cannot make every other residual of its cell look large, as it does to residuals
from the mean; measured, centring on the mean made the test reject 2-10 times too often on
failed-seed mixtures and lognormal metrics). The statistic is

    T = log(mean of a's d) - log(mean of b's d),

the log ratio of the two levels' mean squared deviations, which estimates var_a / var_b when
the levels differ in scale. Its null distribution comes from re-assignments that keep every
stratum's counts, so cell means never mix into the comparison:

- unpaired: the deviations of a stratum's two cells are shuffled between them (a permutation
  test within strata). An odd cell's median deviates from itself by exactly 0 whatever the
  spread; that structural zero is left out of the shuffle (Hines and Hines, 2000);
- paired (both cells of every stratum hold the same seeds, which draw the same random
  streams): each seed's two deviations are swapped or not (sign flips of the per-seed
  difference, the randomisation form of the Pitman-Morgan test). Values that move together are
  never separated, so the test keeps the power common random numbers buy. With fewer than
  MIN_DISTINCT_ASSIGNMENTS sign flips (5 or fewer seeds) the unpaired test is used instead: it
  is conservative for positively correlated seeds, where 32 flips cannot reach 0.05 at all.

Both are exact when the deviations are exchangeable. With at most N_RESAMPLES + 1 distinct
re-assignments they are enumerated, else N_RESAMPLES random ones are drawn from
RESAMPLING_SEED (the same stored results give the same p-value). The two-sided p is
min(1, 2 min(P(T* >= T), P(T* <= T))), the observed assignment counted once on each side
(scipy.stats.permutation_test's rule).

The interval inverts the test under a scale model: H(s): var_a / var_b = s holds when a's
squared deviations divided by s are exchangeable with b's. For one re-assignment j, let U be
the sum of a's own deviations it leaves on a's side and V the sum of b's it moves there (A and
B: each side's total). Under H(s) its statistic is log(U / s + V) - log((A - U) / s + B - V) (plus
constants), and T*_j(s) >= T(s) holds exactly when s >= s_j, the positive root of a quadratic
in 1 / s. So P(T* >= T) under H(s) is the share of s_j at or below s: the p-value at any null
and the interval's ends are order statistics of the s_j, and a whole family costs one matrix
product per comparison.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

N_RESAMPLES = 9999
RESAMPLING_SEED = 0
# Fewer distinct re-assignments than this and the two-sided p cannot fall below 2/40 = 0.05.
MIN_DISTINCT_ASSIGNMENTS = 40
# s_j within this relative distance of the hypothesised scale ratio count as ties (rounding).
TIE_TOLERANCE = 1e-9

PAIRED_TEST = "paired sign-flip test of squared deviations from the cell median"
UNPAIRED_TEST = "stratified permutation test of squared deviations from the cell median"


@dataclass(frozen=True)
class Stratum:
    """The two cells of one combination of the other factors: values with their seeds."""

    a: np.ndarray
    b: np.ndarray
    a_seeds: tuple[int, ...] | None = None
    b_seeds: tuple[int, ...] | None = None


@dataclass
class Prepared:
    """One comparison made ready for the test: its layout and the deviations of each side."""

    paired: bool
    # unpaired: (n_a, n_b) per stratum, in the order of d_a and d_b; paired: (pairs,)
    layout: tuple[int, ...]
    d_a: np.ndarray
    d_b: np.ndarray
    pairs: int  # seeds paired (0 when unpaired)
    correlation: float | None  # Pearson correlation of the paired values, within cells
    note: str | None  # why a comparison whose runs have seeds is unpaired

    @property
    def name(self) -> str:
        return PAIRED_TEST if self.paired else UNPAIRED_TEST


def median_deviations(x: np.ndarray) -> np.ndarray:
    return (x - np.median(x)) ** 2


def drop_structural_zero(d: np.ndarray) -> np.ndarray:
    return np.delete(d, int(np.argmin(d))) if len(d) % 2 == 1 else d


# Each stratum's two cells in seed order when the comparison is paired, else None; and why not.
Pairing = tuple[list[tuple[np.ndarray, np.ndarray]] | None, str | None]


def usable_strata(strata: Sequence[Stratum]) -> list[Stratum]:
    """The strata with 2 or more values on each side: a cell of one value has no spread."""
    return [s for s in strata if len(s.a) >= 2 and len(s.b) >= 2]


def pairing(strata: Sequence[Stratum]) -> Pairing:
    """Each stratum's two cells in seed order, when every stratum's cells hold the same seeds
    once each and there are enough of them to sign-flip; else None and why (None when the runs
    carry no seeds)."""
    if not strata or any(s.a_seeds is None or s.b_seeds is None for s in strata):
        return None, None
    ordered = []
    for s in strata:
        assert s.a_seeds is not None and s.b_seeds is not None
        if len(set(s.a_seeds)) != len(s.a_seeds) or set(s.a_seeds) != set(s.b_seeds):
            only = len(set(s.a_seeds) ^ set(s.b_seeds))
            return None, (f"unpaired: {only} seed(s) ran in only one of the two conditions "
                          "(added seeds or failed runs), so the seeds do not pair up")
        ordered.append((s.a[np.argsort(s.a_seeds, kind="stable")],
                        s.b[np.argsort(s.b_seeds, kind="stable")]))
    pairs = sum(len(a) for a, _ in ordered)
    if 2**pairs < MIN_DISTINCT_ASSIGNMENTS:
        return None, (f"unpaired: {pairs} shared seeds give only {2**pairs} sign flips, too "
                      "few to reach 0.05; the unpaired test is used (conservative when the "
                      "seeds are correlated)")
    return ordered, None


def prepare(strata: Sequence[Stratum], paired: Pairing | None = None) -> Prepared | None:
    """The comparison's deviations; None when no stratum has 2 values on each side or a side
    has no spread at all (no scale ratio then). `paired`: pairing() of its usable strata, when
    the caller has it already."""
    usable = usable_strata(strata)
    if not usable:
        return None
    ordered, note = pairing(usable) if paired is None else paired
    if ordered is not None:
        d_a = np.concatenate([median_deviations(a) for a, _ in ordered])
        d_b = np.concatenate([median_deviations(b) for _, b in ordered])
        layout: tuple[int, ...] = (len(d_a),)
        centred_a = np.concatenate([a - a.mean() for a, _ in ordered])
        centred_b = np.concatenate([b - b.mean() for _, b in ordered])
        with np.errstate(all="ignore"):
            correlation: float | None = float(np.corrcoef(centred_a, centred_b)[0, 1])
        if correlation is not None and not math.isfinite(correlation):
            correlation = None
    else:
        parts_a = [drop_structural_zero(median_deviations(s.a)) for s in usable]
        parts_b = [drop_structural_zero(median_deviations(s.b)) for s in usable]
        d_a, d_b = np.concatenate(parts_a), np.concatenate(parts_b)
        layout = tuple(n for pa, pb in zip(parts_a, parts_b, strict=True)
                       for n in (len(pa), len(pb)))
        correlation = None
    if not (d_a.sum() > 0 and d_b.sum() > 0):
        return None
    return Prepared(paired=ordered is not None, layout=layout, d_a=d_a, d_b=d_b,
                    pairs=len(d_a) if ordered is not None else 0, correlation=correlation,
                    note=note)


def distinct_assignments(paired: bool, layout: tuple[int, ...]) -> int:
    if paired:
        return 2 ** layout[0]
    return math.prod(math.comb(layout[i] + layout[i + 1], layout[i])
                     for i in range(0, len(layout), 2))


# Re-assignment matrices kept in memory, least recently used dropped past this many bytes: one
# experiment's comparisons share a few layouts, and a poll reuses them.
MAX_CACHED_BYTES = 256 * 2**20
_cache: OrderedDict[tuple[bool, tuple[int, ...], int], tuple[np.ndarray, bool]] = OrderedDict()
_cache_lock = threading.Lock()


def assignments(paired: bool, layout: tuple[int, ...],
                resamples: int = N_RESAMPLES) -> tuple[np.ndarray, bool]:
    """The re-assignments other than the observed one, as a 0/1 float64 matrix, one row each:
    paired, 1 where a seed's two deviations are swapped; unpaired, over the strata laid end to
    end as [a..., b...], 1 where a deviation lands on a's side. And whether they are all of
    them (enumerated) rather than `resamples` random ones."""
    key = (paired, layout, resamples)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    made = _make_assignments(paired, layout, resamples)
    with _cache_lock:
        _cache[key] = made
        while len(_cache) > 1 and sum(m.nbytes for m, _ in _cache.values()) > MAX_CACHED_BYTES:
            _cache.popitem(last=False)
    return made


def _make_assignments(paired: bool, layout: tuple[int, ...],
                      resamples: int) -> tuple[np.ndarray, bool]:
    total = distinct_assignments(paired, layout)
    exact = total <= resamples + 1
    rng = np.random.default_rng(RESAMPLING_SEED)
    if paired:
        pairs = layout[0]
        if exact:
            codes = np.arange(1, total, dtype=np.int64)
            return ((codes[:, None] >> np.arange(pairs)) & 1).astype(np.float64), True
        return rng.integers(0, 2, size=(resamples, pairs)).astype(np.float64), False
    sizes = [(layout[i], layout[i + 1]) for i in range(0, len(layout), 2)]
    if exact:
        per_stratum = []
        for n_a, n_b in sizes:
            rows = np.zeros((math.comb(n_a + n_b, n_a), n_a + n_b))
            for i, chosen in enumerate(itertools.combinations(range(n_a + n_b), n_a)):
                rows[i, list(chosen)] = 1
            per_stratum.append(rows)
        index = np.array(list(itertools.product(*(range(len(r)) for r in per_stratum))))
        matrix = np.concatenate([rows[index[:, k]] for k, rows in enumerate(per_stratum)],
                                axis=1)
        observed = np.concatenate([np.r_[np.ones(n_a), np.zeros(n_b)] for n_a, n_b in sizes])
        return matrix[~np.all(matrix == observed, axis=1)], True
    blocks = []
    for n_a, n_b in sizes:  # each row: n_a of the n_a + n_b positions, uniformly at random
        keys = rng.random((resamples, n_a + n_b))
        kth = np.partition(keys, n_a - 1, axis=1)[:, n_a - 1:n_a]
        blocks.append((keys <= kth).astype(np.float64))
    return np.concatenate(blocks, axis=1), False


def _columns(prep: Prepared) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The two vectors whose products with the matrix give U and V (paired: a's deviations
    swapped away, and b's swapped in; unpaired: a's own and b's, at their positions in the
    layout), scaled to mean 1, and each side's total."""
    scale = (prep.d_a.sum() + prep.d_b.sum()) / (len(prep.d_a) + len(prep.d_b))
    d_a, d_b = prep.d_a / scale, prep.d_b / scale
    if prep.paired:
        return d_a, d_b, float(d_a.sum()), float(d_b.sum())
    own = np.zeros(len(d_a) + len(d_b))
    other = np.zeros(len(own))
    start = pos_a = pos_b = 0
    for i in range(0, len(prep.layout), 2):
        n_a, n_b = prep.layout[i], prep.layout[i + 1]
        own[start:start + n_a] = d_a[pos_a:pos_a + n_a]
        other[start + n_a:start + n_a + n_b] = d_b[pos_b:pos_b + n_b]
        start, pos_a, pos_b = start + n_a + n_b, pos_a + n_a, pos_b + n_b
    return own, other, float(d_a.sum()), float(d_b.sum())


def crossing_scales(preps: Sequence[Prepared], matrix: np.ndarray) -> np.ndarray:
    """s_j per row of `matrix` (rows) for each comparison of one layout (columns), unsorted
    (module docstring): T*_j(s) >= T(s) exactly when s >= s_j (0: always; inf: never)."""
    columns = [_columns(p) for p in preps]
    products = matrix @ np.stack([c for first, second, _, _ in columns
                                  for c in (first, second)], axis=1)
    total_a = np.array([c[2] for c in columns])
    total_b = np.array([c[3] for c in columns])
    paired = np.array([p.paired for p in preps])
    first, v = products[:, 0::2], products[:, 1::2]
    u = np.where(paired, total_a - first, first)
    return _roots(u, v, total_a, total_b)


def _roots(u: np.ndarray, v: np.ndarray, total_a: np.ndarray,
           total_b: np.ndarray) -> np.ndarray:
    # With x = 1 / s: T* >= T  <=>  c2 x^2 + c1 x - c0 <= 0, where c2 = A (A - U) >= 0 and
    # c0 = B V >= 0, that is x <= x_j, the positive root, so s >= s_j = 1 / x_j: written
    # without cancellation, s_j = (c1 + sq) / (2 c0) for c1 > 0, else 2 c2 / (sq - c1).
    c2 = total_a * np.maximum(total_a - u, 0.0)
    c0 = np.maximum(v, 0.0) * total_b
    c1 = total_a * (total_b - v) - u * total_b
    sq = np.sqrt(c1 * c1 + 4 * c2 * c0)
    with np.errstate(all="ignore"):
        s = np.where(c1 > 0, (c1 + sq) / (2 * c0), 2 * c2 / (sq - c1))
    return np.where(np.isnan(s), np.inf, s)


@dataclass
class TestResult:
    """A two-sided test of var_a / var_b = null and the interval of var_a / var_b."""

    p: float
    interval: tuple[float, float]
    resamples: int  # re-assignments counted, the observed one included
    exact: bool  # all of them enumerated


def from_crossings(s: np.ndarray, exact: bool, null: float = 1.0,
                   confidence: float = 0.95) -> list[TestResult]:
    """The test of var_a / var_b = `null` and the interval at `confidence` of each column of
    `s`, the crossing scales of the re-assignments other than the observed one (rows)."""
    m = s.shape[0]
    total = m + 1
    greater = 1 + (s <= null * (1 + TIE_TOLERANCE)).sum(axis=0)
    less = 1 + (s >= null * (1 - TIE_TOLERANCE)).sum(axis=0)
    p = np.minimum(1.0, 2.0 * np.minimum(greater, less) / total)
    # H(s) stands while 1 + #{s_j <= s} and 1 + #{s_j >= s} both exceed tail * total, that is
    # while #{s_j <= s} >= k and #{s_j >= s} >= k: s from the k-th smallest s_j to the k-th
    # largest.
    tail = (1 - confidence) / 2
    k = math.floor(tail * total - 1) + 1
    if k <= 0 or k > m:  # too few re-assignments to exclude any ratio at this confidence
        low = np.zeros(s.shape[1])
        high = np.full(s.shape[1], math.inf)
    else:
        low = np.partition(s, k - 1, axis=0)[k - 1]
        high = np.partition(s, m - k, axis=0)[m - k]
    return [TestResult(p=float(p[i]), interval=(float(low[i]), float(high[i])),
                       resamples=total, exact=exact) for i in range(s.shape[1])]


def randomisation_tests(preps: Sequence[Prepared], null: float = 1.0,
                        confidence: float = 0.95,
                        resamples: int = N_RESAMPLES) -> list[TestResult]:
    """The primary test of var_a / var_b = `null` and its interval at `confidence`, for many
    comparisons: one matrix product per layout they share."""
    groups: dict[tuple[bool, tuple[int, ...]], list[int]] = {}
    for i, prep in enumerate(preps):
        groups.setdefault((prep.paired, prep.layout), []).append(i)
    out: list[TestResult | None] = [None] * len(preps)
    for (paired, layout), members in groups.items():
        matrix, exact = assignments(paired, layout, resamples)
        crossings = crossing_scales([preps[i] for i in members], matrix)
        for i, result in zip(members, from_crossings(crossings, exact, null, confidence),
                             strict=True):
            out[i] = result
    return [r for r in out if r is not None]


def randomisation_test(prep: Prepared, null: float = 1.0, confidence: float = 0.95,
                       resamples: int = N_RESAMPLES) -> TestResult:
    """The primary test of one comparison (randomisation_tests)."""
    return randomisation_tests([prep], null, confidence, resamples)[0]
