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
  spread; that structural zero is left out of the shuffle (Hines and Hines, 2000), and so is one
  of a 4-seed cell's two middle deviations, equal by construction;
- paired (both cells of every stratum hold the same seeds, which draw the same random
  streams): each seed's two deviations are swapped or not (sign flips of the per-seed
  difference, the randomisation form of the Pitman-Morgan test). Values that move together are
  never separated, so the test keeps the power common random numbers buy. A paired cell of up
  to PAIRED_MIXED_MAX_SEEDS seeds is centred between its median and the midpoint of its
  shortest half (paired_centres), not on its median, which lost the level on skewed seeds.
  With fewer than MIN_DISTINCT_ASSIGNMENTS sign flips (5 or fewer seeds) the unpaired test is
  used instead: it is conservative for positively correlated seeds, where 32 flips cannot
  reach 0.05 at all.

Both are exact when the deviations are exchangeable. With at most MAX_ENUMERATED (2^16) distinct
re-assignments they are all enumerated (a borderline p then depends on no resampling seed: 16
shared seeds give 65,536 sign flips, where 9,999 random ones answered 0.0542 for an exact
0.0499), else N_RESAMPLES random ones are drawn from RESAMPLING_SEED (the same stored results
give the same p-value). The two-sided p is
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

import functools
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.lru import LruCache

N_RESAMPLES = 9999
RESAMPLING_SEED = 0
# Layouts with at most this many distinct re-assignments are enumerated, not drawn, when their
# matrix fits MAX_MATRIX_BYTES (a layout of 16 pairs: 65,536 rows of 16, 8 MB).
MAX_ENUMERATED = 2**16
# Fewer distinct re-assignments than this and the two-sided p cannot fall below 2/40 = 0.05.
MIN_DISTINCT_ASSIGNMENTS = 40
# Shared seeds are paired whenever there are enough of them to sign-flip (6 or more), whatever
# their correlation: choosing the test from the data's correlation made the adaptive rule stop
# falsely 7% of the time on failed-seed nulls, against 3.7% when pairing is decided by the seeds
# alone. The price: 6-9 uncorrelated pairs detect less than the unpaired shuffle would (7 pairs:
# a ratio of 85 against 43); /planning/seeds says so.
# Unpaired strata whose smaller cell holds MODE_ALIGNED_MIN_SEEDS to MODE_ALIGNED_MAX_SEEDS seeds
# take their deviations from one mode-aligned centre (mode_aligned_deviations). Each cell's own
# median lost the level there on collapse and skewed nulls (4,000 nulls each, at 0.05 / 0.01:
# bimodal 6 seeds 0.073 / 0.050, beta(50,1) 6 seeds 0.068, lognormal 12 seeds 0.048 / 0.018);
# from 16 seeds it holds (lognormal 16: 0.041 / 0.013). At 5 or fewer the own-median form is
# kept: its 70 splits at 5 seeds stay within 0.06 at 0.05 (lognormal 0.059, the worst) and
# cannot reach 0.01, while the mode-aligned centre's alignment noise would leave it almost no
# power (0.004 at 0.05 on normal seeds).
MODE_ALIGNED_MIN_SEEDS = 6
MODE_ALIGNED_MAX_SEEDS = 15
# Paired cells of up to PAIRED_MIXED_MAX_SEEDS seeds take their deviations from a centre between
# the cell's median and the midpoint of its shortest half, SHORTEST_HALF_WEIGHT of the way to the
# latter (paired_centres). Each cell's own median lost the level on skewed shared seeds
# (lognormal sigma 1, copula correlation 0.5, 4,000 nulls: 0.064-0.067 at 0.05 from 6 to 10
# pairs, 0.017-0.021 at 0.01), and the mode-aligned pooled centre of the unpaired test, valid
# there, kept almost no power (ratio 4, correlation 0.8, 6 pairs: 0.03 against 0.22). Weights
# measured on lognormal 8 / 10 pairs at 0.05 and 0.01: 0.5: 0.057 / 0.017, 0.050 / 0.018; 0.75:
# 0.053 / 0.014, 0.044 / 0.015; 1 (the midpoint alone): 0.050 / 0.013, 0.038 / 0.015, with less
# power. From 16 pairs the median holds (docs/statistics.md).
PAIRED_MIXED_MAX_SEEDS = 15
SHORTEST_HALF_WEIGHT = 0.75
# s_j within this relative distance of the hypothesised scale ratio count as ties (rounding).
TIE_TOLERANCE = 1e-9
# Cells whose deviations and strata whose seed split are kept (paired_deviations, _split).
CELL_MEMO_SIZE = 4096

PAIRED_TEST = "paired sign-flip test of squared deviations from the cell median"
PAIRED_MIXED_TEST = (
    "paired sign-flip test of squared deviations from a centre between the cell median and the "
    "midpoint of its shortest half"
)
UNPAIRED_TEST = "stratified permutation test of squared deviations from the cell median"
MODE_ALIGNED_TEST = "stratified permutation test of squared deviations from a mode-aligned centre"


def paired_test_name(smaller_cell: int) -> str:
    """The paired test's name for strata whose smaller cell holds `smaller_cell` seeds."""
    return PAIRED_MIXED_TEST if smaller_cell <= PAIRED_MIXED_MAX_SEEDS else PAIRED_TEST


def unpaired_test_name(smaller_cell: int) -> str:
    """The unpaired test's name for strata whose smaller cell holds `smaller_cell` seeds."""
    if MODE_ALIGNED_MIN_SEEDS <= smaller_cell <= MODE_ALIGNED_MAX_SEEDS:
        return MODE_ALIGNED_TEST
    return UNPAIRED_TEST


@dataclass(frozen=True)
class Stratum:
    """The two cells of one combination of the other factors: values with their seeds."""

    a: np.ndarray
    b: np.ndarray
    a_seeds: tuple[int, ...] | None = None
    b_seeds: tuple[int, ...] | None = None


@dataclass
class Prepared:
    """One comparison made ready for the test: the paired seeds' deviations (`pair_a`,
    `pair_b`, one entry per seed), then per stratum a block of the values that are not paired,
    laid out a's then b's (`own` holds a's deviations at their positions and 0 at b's, `other`
    the reverse). `layout` is (pairs, n_a, n_b, n_a, n_b, ...): the pairs, then each block's
    counts."""

    paired: bool  # some seeds are paired (and swapped as pairs)
    layout: tuple[int, ...]
    pair_a: np.ndarray
    pair_b: np.ndarray
    own: np.ndarray
    other: np.ndarray
    pairs: int  # seeds paired
    correlation: float | None  # Pearson correlation of the paired values, within cells
    note: str | None  # what of the seeds did not pair, and how it was handled
    mode_aligned: bool = False  # some stratum's deviations are from a mode-aligned centre
    mixed_centre: bool = False  # some paired stratum's deviations are from paired_centres

    @property
    def name(self) -> str:
        if self.paired:
            return PAIRED_MIXED_TEST if self.mixed_centre else PAIRED_TEST
        return MODE_ALIGNED_TEST if self.mode_aligned else UNPAIRED_TEST


def median_deviations(x: np.ndarray) -> np.ndarray:
    return (x - np.median(x)) ** 2


def paired_centres(x: np.ndarray) -> np.ndarray:
    """Each row's centre between its median and the midpoint of its shortest half (the shortest
    window of n // 2 + 1 sorted values; tied windows averaged, so the centre does not depend on
    the order of the values), SHORTEST_HALF_WEIGHT of the way to the midpoint. The paired
    test's cells of up to PAIRED_MIXED_MAX_SEEDS seeds take deviations from it.

    Why: the sign flips are exact when each seed's two deviations are exchangeable, and a centre
    estimated from each cell breaks that by the centre's own error, which moves all of one
    cell's deviations together; on skewed seeds the median's error does so most (its error
    falls on the long side, where the values are few and far). The shortest half sits in the
    dense part of a skewed or collapsed cell; alone it is noisy (a 6-pair test kept 0.17 of
    the median's 0.24 power at ratio 4), and the two errors partly cancel: between them, every
    null family measured holds its level (docs/statistics.md) at a few points of power.
    Location and scale equivariant in each cell, so the planner's one simulation per layout
    describes every ratio."""
    x = np.asarray(x, dtype=np.float64)
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[1]
    ordered = np.sort(rows, axis=1)
    h = n // 2 + 1
    widths = ordered[:, h - 1 :] - ordered[:, : n - h + 1]
    mids = (ordered[:, h - 1 :] + ordered[:, : n - h + 1]) / 2
    scale = np.maximum(np.abs(ordered[:, -1:]), np.abs(ordered[:, :1]))
    tied = widths <= widths.min(axis=1, keepdims=True) + TIE_TOLERANCE * np.maximum(scale, 1e-300)
    shortest = (mids * tied).sum(axis=1) / tied.sum(axis=1)
    w = SHORTEST_HALF_WEIGHT
    centres = w * shortest + (1 - w) * np.median(rows, axis=1)
    return centres.reshape(x.shape[:-1])


def paired_deviations(x: np.ndarray, smaller_cell: int) -> np.ndarray:
    """A paired cell's squared deviations: from paired_centres up to PAIRED_MIXED_MAX_SEEDS seeds
    in the stratum's smaller cell, else from the median (rows: each row one cell). One cell's
    (a 1-d x) are kept (read-only), by its values: a grid's cell takes part in many comparisons
    (a 10 x 10 grid's 100 cells in 990), and its deviations were a quarter of a cold /stats."""
    mixed = paired_test_name(smaller_cell) == PAIRED_MIXED_TEST
    if np.ndim(x) == 1:
        return _cell_deviations(np.asarray(x, dtype=np.float64).tobytes(), mixed)
    if mixed:
        return (x - paired_centres(x)[..., None]) ** 2
    return (x - np.median(x, axis=-1, keepdims=True)) ** 2


def cell_mean(x: np.ndarray) -> float:
    """A cell's mean, kept by its values as its deviations are."""
    return _cell_moments(np.asarray(x, dtype=np.float64).tobytes())[2]


def cell_variance(x: np.ndarray) -> float:
    """A cell's variance (ddof 1; at least 2 values), kept by its values as its deviations are."""
    return _cell_moments(np.asarray(x, dtype=np.float64).tobytes())[0]


def cell_absolute_deviations(x: np.ndarray) -> np.ndarray:
    """|x - median(x)| of a cell (read-only), kept by its values (Brown-Forsythe's)."""
    return _cell_moments(np.asarray(x, dtype=np.float64).tobytes())[1]


@functools.lru_cache(maxsize=CELL_MEMO_SIZE)
def _cell_moments(values: bytes) -> tuple[float, np.ndarray, float]:
    x = np.frombuffer(values, dtype=np.float64)
    variance = float(np.var(x, ddof=1)) if len(x) >= 2 else math.nan
    absolute = np.abs(x - np.median(x))
    absolute.flags.writeable = False
    return variance, absolute, float(x.mean()) if len(x) else math.nan


@functools.lru_cache(maxsize=CELL_MEMO_SIZE)
def _cell_deviations(values: bytes, mixed: bool) -> np.ndarray:
    x = np.frombuffer(values, dtype=np.float64)
    d = (x - paired_centres(x)) ** 2 if mixed else (x - np.median(x)) ** 2
    d.flags.writeable = False
    return d


def mode_aligned_deviations(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared deviations of a stratum's two cells from one centre, b's cell first shifted onto
    a's: the shift (among the differences a_i - b_j) that leaves the pooled values the smallest
    median absolute deviation, the centre their median. Under equal variances the shifted
    values are exchangeable once the shift is right, and a centre that is a symmetric function
    of them keeps their deviations exchangeable, so the shuffle is exact at the true shift. The
    shift is mode-seeking: when 3 of 6 seeds collapse, each cell's own median falls between
    the modes and makes every deviation of that cell large, which the shuffle reads as six
    independent large ones (p = 2/924 on a true null); the smallest pooled MAD lays mode on
    mode instead. Ties go to the shift nearest the difference of the medians."""
    d_a, d_b = mode_aligned_rows(a[None, :], b[None, :])
    return d_a[0], d_b[0]


def mode_aligned_rows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mode_aligned_deviations of each row of `a` with the same row of `b` (datasets of one
    layout at once: the planner's simulations)."""
    rows = len(a)
    shifts = (a[:, :, None] - b[:, None, :]).reshape(rows, -1)
    width = shifts.shape[1]
    pooled = np.concatenate(
        [
            np.broadcast_to(a[:, None, :], (rows, width, a.shape[1])),
            b[:, None, :] + shifts[..., None],
        ],
        axis=2,
    )
    centres = np.median(pooled, axis=2)
    spread = np.median(np.abs(pooled - centres[..., None]), axis=2)
    median_shift = np.median(a, axis=1) - np.median(b, axis=1)
    distance = np.abs(shifts - median_shift[:, None])
    # the smallest spread, ties to the smallest distance: lexsort per row
    order = np.lexsort((distance, spread), axis=1)
    best = order[:, 0]
    pick = np.arange(rows)
    centre, shift = centres[pick, best], shifts[pick, best]
    return (a - centre[:, None]) ** 2, (b + shift[:, None] - centre[:, None]) ** 2


def drop_structural_zero(d: np.ndarray) -> np.ndarray:
    """An odd cell's median deviates from itself by exactly 0, and a cell of 4 has its two
    middle deviations equal by construction: one of them is left out of the unpaired shuffle.
    (Kept, 4 + 4 seeds rejected equal variances 7% of the time at 0.05 on normal data and 16% on
    lognormal; left out, 20 splits remain and the test says it cannot reach 0.05.)"""
    return np.delete(d, int(np.argmin(d))) if len(d) % 2 == 1 or len(d) == 4 else d


# Each stratum's paired values (a's and b's, in seed order) when the comparison pairs seeds,
# else None; and what of its seeds did not pair.
Pairing = tuple[list[tuple[np.ndarray, np.ndarray]] | None, str | None]


def usable_strata(strata: Sequence[Stratum]) -> list[Stratum]:
    """The strata with 2 or more values on each side: a cell of one value has no spread."""
    return [s for s in strata if len(s.a) >= 2 and len(s.b) >= 2]


def _split(s: Stratum) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Indices into a and b of the seeds both ran once (in seed order), and of the rest (kept,
    read-only, by the two cells' seeds: each comparison asks it of each stratum three times,
    and a grid's strata share their seeds)."""
    assert s.a_seeds is not None and s.b_seeds is not None
    return _split_seeds(tuple(s.a_seeds), tuple(s.b_seeds))


@functools.lru_cache(maxsize=CELL_MEMO_SIZE)
def _split_seeds(
    a_seeds: tuple[int, ...], b_seeds: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    count_a, count_b = Counter(a_seeds), Counter(b_seeds)
    shared = sorted(seed for seed in count_a if count_a[seed] == 1 and count_b[seed] == 1)
    where_a = {seed: i for i, seed in enumerate(a_seeds)}
    where_b = {seed: i for i, seed in enumerate(b_seeds)}
    pa = np.array([where_a[seed] for seed in shared], dtype=np.int64)
    pb = np.array([where_b[seed] for seed in shared], dtype=np.int64)
    paired_a, paired_b = set(pa.tolist()), set(pb.tolist())
    ua = np.array([i for i in range(len(a_seeds)) if i not in paired_a], dtype=np.int64)
    ub = np.array([i for i in range(len(b_seeds)) if i not in paired_b], dtype=np.int64)
    for made in (pa, pb, ua, ub):
        made.flags.writeable = False
    return pa, pb, ua, ub


def shared_seeds(s: Stratum) -> tuple[int, ...]:
    """The seeds both cells of a stratum ran once each, in order."""
    assert s.a_seeds is not None and s.b_seeds is not None
    pa = _split(s)[0]
    return tuple(s.a_seeds[i] for i in pa)


def pairing(strata: Sequence[Stratum]) -> Pairing:
    """The paired values of each stratum (seeds both conditions ran), when there are enough
    of them to sign-flip; else None and why (None and None when the runs carry no seeds). Seeds
    that ran in only one of the two conditions (added seeds, failed runs) are not paired: the
    test shuffles them within their stratum, and the note says how many."""
    if not strata or any(s.a_seeds is None or s.b_seeds is None for s in strata):
        return None, None
    splits = [_split(s) for s in strata]
    pairs = sum(len(pa) for pa, _, _, _ in splits)
    unmatched = sum(len(ua) + len(ub) for _, _, ua, ub in splits)
    if 2**pairs < MIN_DISTINCT_ASSIGNMENTS:
        why = (
            f"{pairs} shared seeds give only {2**pairs} sign flips, too few to reach 0.05"
            if unmatched == 0
            else f"{pairs} seeds ran in both conditions, too few to pair ({2**pairs} sign flips)"
        )
        return None, (
            f"unpaired: {why}; the unpaired test is used (conservative when the "
            "seeds are correlated)"
        )
    matched = [(s.a[pa], s.b[pb]) for s, (pa, pb, _, _) in zip(strata, splits, strict=True)]
    note = (
        None
        if unmatched == 0
        else (
            f"{unmatched} value(s) of seeds that ran in only one of the two conditions (added "
            "seeds or failed runs) are not paired: they are shuffled within their cells' stratum"
        )
    )
    return matched, note


def seed_correlation(
    strata: Sequence[Stratum], matched: Sequence[tuple[np.ndarray, np.ndarray]]
) -> float | None:
    """Pearson correlation of the paired values, each centred on its full cell's mean."""
    centred_a = np.concatenate(
        [a - cell_mean(s.a) for s, (a, _) in zip(strata, matched, strict=True)]
    )
    centred_b = np.concatenate(
        [b - cell_mean(s.b) for s, (_, b) in zip(strata, matched, strict=True)]
    )
    if len(centred_a) < 2:
        return None
    # np.corrcoef written out (its wrapper cost more than the sums on a cell of seeds)
    ca, cb = centred_a - centred_a.mean(), centred_b - centred_b.mean()
    with np.errstate(all="ignore"):
        value = float(ca @ cb / math.sqrt(float(ca @ ca) * float(cb @ cb)))
    return value if math.isfinite(value) else None


def prepare(strata: Sequence[Stratum], paired: Pairing | None = None) -> Prepared | None:
    """The comparison's deviations; None when no stratum has 2 values on each side or a side
    has no spread at all (no scale ratio then). `paired`: pairing() of its usable strata, when
    the caller has it already."""
    usable = usable_strata(strata)
    if not usable:
        return None
    matched, note = pairing(usable) if paired is None else paired
    pair_a: list[np.ndarray] = []
    pair_b: list[np.ndarray] = []
    blocks: list[tuple[np.ndarray, np.ndarray]] = []
    mode_aligned = mixed_centre = False
    for s in usable:
        if matched is None:  # unpaired: every value shuffled within the stratum
            if unpaired_test_name(min(len(s.a), len(s.b))) == MODE_ALIGNED_TEST:
                blocks.append(mode_aligned_deviations(s.a, s.b))
                mode_aligned = True
            else:
                d_a, d_b = median_deviations(s.a), median_deviations(s.b)
                blocks.append((drop_structural_zero(d_a), drop_structural_zero(d_b)))
            continue
        smaller = min(len(s.a), len(s.b))
        d_a, d_b = paired_deviations(s.a, smaller), paired_deviations(s.b, smaller)
        mixed_centre |= paired_test_name(smaller) == PAIRED_MIXED_TEST
        pa, pb, ua, ub = _split(s)
        pair_a.append(d_a[pa])
        pair_b.append(d_b[pb])
        if len(ua) + len(ub):
            blocks.append((d_a[ua], d_b[ub]))
    da = np.concatenate(pair_a) if pair_a else np.empty(0)
    db = np.concatenate(pair_b) if pair_b else np.empty(0)
    own, other = [np.empty(0)], [np.empty(0)]
    for block_a, block_b in blocks:
        own.append(np.r_[block_a, np.zeros(len(block_b))])
        other.append(np.r_[np.zeros(len(block_a)), block_b])
    own_all, other_all = np.concatenate(own), np.concatenate(other)
    if not (da.sum() + own_all.sum() > 0 and db.sum() + other_all.sum() > 0):
        return None
    correlation = None if matched is None else seed_correlation(usable, matched)
    layout = (len(da), *(n for block_a, block_b in blocks for n in (len(block_a), len(block_b))))
    return Prepared(
        paired=matched is not None,
        layout=layout,
        pair_a=da,
        pair_b=db,
        own=own_all,
        other=other_all,
        pairs=len(da),
        correlation=correlation,
        note=note,
        mode_aligned=mode_aligned,
        mixed_centre=mixed_centre,
    )


def distinct_assignments(layout: tuple[int, ...]) -> int:
    return 2 ** layout[0] * math.prod(
        math.comb(layout[i] + layout[i + 1], layout[i]) for i in range(1, len(layout), 2)
    )


# Re-assignment matrices kept in memory, least recently used dropped past this many bytes: one
# experiment's comparisons share a few layouts, and a poll reuses them.
MAX_CACHED_BYTES = 256 * 2**20
_matrices: LruCache[tuple[np.ndarray, bool]] = LruCache(
    max_items=1024, max_bytes=MAX_CACHED_BYTES, size=lambda made: made[0].nbytes
)


def enumerated(layout: tuple[int, ...], resamples: int, enumerate_up_to: int) -> bool:
    """Whether a layout's re-assignments are all enumerated: no more of them than `resamples` + 1,
    or than `enumerate_up_to` while their matrix fits MAX_MATRIX_BYTES."""
    count = distinct_assignments(layout)
    if count <= resamples + 1:
        return True
    return count <= enumerate_up_to and count * sum(layout) * 8 <= MAX_MATRIX_BYTES


def assignments(
    layout: tuple[int, ...], resamples: int = N_RESAMPLES, enumerate_up_to: int = 0
) -> tuple[np.ndarray, bool]:
    """The re-assignments other than the observed one, as a 0/1 float64 matrix, one row each:
    a column per pair, 1 where its two values swap sides; then a column per position of each
    block (Prepared), 1 where that value lands on a's side. And whether they are all of them
    (enumerated: see enumerated()) rather than `resamples` random ones."""
    key = (layout, resamples, enumerate_up_to)
    made = _matrices.get(key)
    if made is None:
        made = _make_assignments(layout, resamples, enumerated(layout, resamples, enumerate_up_to))
        _matrices.put(key, made)
    return made


def _make_assignments(
    layout: tuple[int, ...], resamples: int, exact: bool
) -> tuple[np.ndarray, bool]:
    if not exact:
        return draw_assignments(layout, resamples, np.random.default_rng(RESAMPLING_SEED)), exact
    pairs = layout[0]
    sizes = [(layout[i], layout[i + 1]) for i in range(1, len(layout), 2)]
    parts = []
    if pairs:
        codes = np.arange(2**pairs, dtype=np.int64)
        parts.append(((codes[:, None] >> np.arange(pairs)) & 1).astype(np.float64))
    for n_a, n_b in sizes:
        rows = np.zeros((math.comb(n_a + n_b, n_a), n_a + n_b))
        for i, chosen in enumerate(itertools.combinations(range(n_a + n_b), n_a)):
            rows[i, list(chosen)] = 1
        parts.append(rows)
    index = np.array(list(itertools.product(*(range(len(p)) for p in parts))))
    choices = [p[index[:, k]] for k, p in enumerate(parts)]
    observed = np.concatenate(
        [np.zeros(pairs)] + [np.r_[np.ones(n_a), np.zeros(n_b)] for n_a, n_b in sizes]
    )
    keep = ~np.all(np.concatenate(choices, axis=1) == observed, axis=1)
    choices = [c[keep] for c in choices]
    flips = choices.pop(0) if pairs else np.zeros((int(keep.sum()), 0))
    return np.concatenate([flips, *choices], axis=1), exact


def draw_assignments(
    layout: tuple[int, ...], rows: int, rng: np.random.Generator, *, flip_bytes: bool = False
) -> np.ndarray:
    """`rows` random re-assignments of `layout` from `rng`, laid out as assignments() lays
    them out, none of them the observed one (_draw's `flip_bytes`: large layouts)."""
    pairs = layout[0]
    sizes = [(layout[i], layout[i + 1]) for i in range(1, len(layout), 2)]
    flips, choices = _draw(pairs, sizes, rows, rng, flip_bytes=flip_bytes)
    # A draw of the observed assignment ties with it at every ratio, which no crossing ratio
    # can say: like the enumeration, leave it out (draw again in its place).
    while (observed := _is_observed(flips, choices, sizes)).any():
        again, more = _draw(pairs, sizes, int(observed.sum()), rng, flip_bytes=flip_bytes)
        flips[observed] = again
        for choice, redrawn in zip(choices, more, strict=True):
            choice[observed] = redrawn
    return np.concatenate([flips, *choices], axis=1)


def drawn_crossing_scales(preps: Sequence[Prepared], resamples: int) -> tuple[np.ndarray, bool]:
    """crossing_scales of `resamples` random re-assignments of the comparisons' one (large)
    layout, drawn from RESAMPLING_SEED a block of rows at a time so that no more than
    BLOCK_BYTES of the matrix exist at once; and False (drawn, not enumerated: a layout this
    large has more distinct re-assignments than any count of resamples). The observed
    assignment is redrawn where drawn, as in _make_assignments."""
    layout = preps[0].layout
    rng = np.random.default_rng(RESAMPLING_SEED)
    rows_per_block = max(1, BLOCK_BYTES // (8 * sum(layout)))
    blocks = []
    for start in range(0, resamples, rows_per_block):
        rows = min(rows_per_block, resamples - start)
        matrix = draw_assignments(layout, rows, rng, flip_bytes=True)
        blocks.append(crossing_scales(preps, matrix))
    return np.concatenate(blocks, axis=0), False


def _draw(
    pairs: int,
    sizes: Sequence[tuple[int, int]],
    rows: int,
    rng: np.random.Generator,
    *,
    flip_bytes: bool = False,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """`rows` random re-assignments: sign flips of the pairs, and per block n_a of its
    n_a + n_b positions on a's side, uniformly at random. `flip_bytes`: each flip one bit of
    random bytes (a fraction of the time of an integer draw each: large layouts)."""
    if flip_bytes:
        bits = rng.integers(0, 256, size=(rows, (pairs + 7) // 8), dtype=np.uint8)
        flips = np.unpackbits(bits, axis=1, count=pairs).astype(np.float64)
    else:
        flips = rng.integers(0, 2, size=(rows, pairs)).astype(np.float64)
    choices = []
    for n_a, n_b in sizes:
        keys = rng.random((rows, n_a + n_b))
        if n_a == 0:
            choices.append(np.zeros((rows, n_b)))
            continue
        kth = np.partition(keys, n_a - 1, axis=1)[:, n_a - 1 : n_a]
        choices.append((keys <= kth).astype(np.float64))
    return flips, choices


def _is_observed(
    flips: np.ndarray, choices: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]]
) -> np.ndarray:
    same = np.asarray(~flips.any(axis=1))
    for choice, (n_a, _) in zip(choices, sizes, strict=True):
        same &= choice[:, :n_a].all(axis=1)
    return same


def _columns(prep: Prepared) -> tuple[np.ndarray, np.ndarray, float, float, float]:
    """The two vectors whose products with the matrix give U less a's paired deviations and V
    (a pair's a value leaves a's side when it swaps, its b value arrives), scaled to mean 1;
    each side's total A and B; and a's paired deviations."""
    pairs = prep.layout[0]
    count = 2 * pairs + len(prep.own)
    total = prep.pair_a.sum() + prep.pair_b.sum() + prep.own.sum() + prep.other.sum()
    scale = total / count if total > 0 else 1.0
    leaves = np.r_[-prep.pair_a, prep.own] / scale
    arrives = np.r_[prep.pair_b, prep.other] / scale
    total_a = float(prep.pair_a.sum() + prep.own.sum()) / scale
    total_b = float(prep.pair_b.sum() + prep.other.sum()) / scale
    return leaves, arrives, total_a, total_b, float(prep.pair_a.sum()) / scale


# Values per block of crossing_scales's _roots (64 k: half a MB a temporary).
ROOTS_BLOCK = 2**16


def crossing_scales(preps: Sequence[Prepared], matrix: np.ndarray) -> np.ndarray:
    """s_j per row of `matrix` (rows) for each comparison of one layout (columns), unsorted
    (module docstring): T*_j(s) >= T(s) exactly when s >= s_j (0: always; inf: never)."""
    columns = [_columns(p) for p in preps]
    products = matrix @ np.stack([c for column in columns for c in column[:2]], axis=1)
    total_a = np.array([c[2] for c in columns])
    total_b = np.array([c[3] for c in columns])
    paired_a = np.array([c[4] for c in columns])
    # a block of rows at a time, ROOTS_BLOCK values each: _roots's temporaries stay in cache
    # (a 9,999 x 1,000 layout: 4x as fast as at once, the same values)
    crossings = np.empty((len(matrix), len(columns)))
    step = max(1, ROOTS_BLOCK // len(columns))
    for start in range(0, len(matrix), step):
        block = products[start : start + step]
        # U: a's deviations left on a's side, its paired ones less those swapped away
        crossings[start : start + step] = _roots(
            paired_a + block[:, 0::2], block[:, 1::2], total_a, total_b
        )
    return crossings


def _roots(u: np.ndarray, v: np.ndarray, total_a: np.ndarray, total_b: np.ndarray) -> np.ndarray:
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


def from_crossings(
    s: np.ndarray, exact: bool, null: float = 1.0, confidence: float = 0.95
) -> list[TestResult]:
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
    return [
        TestResult(
            p=float(p[i]), interval=(float(low[i]), float(high[i])), resamples=total, exact=exact
        )
        for i in range(s.shape[1])
    ]


# A layout whose re-assignment matrix would be larger than this (about 400 values a comparison
# at N_RESAMPLES) has its re-assignments drawn and used a block of rows at a time instead of
# held whole: 10,000 seeds a side made one matrix of 800 MB, 1.6 GB while it was drawn.
MAX_MATRIX_BYTES = 32 * 2**20
# Rows per block of such a layout: a few MB each.
BLOCK_BYTES = 4 * 2**20


def randomisation_tests(
    preps: Sequence[Prepared],
    null: float = 1.0,
    confidence: float = 0.95,
    resamples: int = N_RESAMPLES,
    enumerate_up_to: int = MAX_ENUMERATED,
) -> list[TestResult]:
    """The primary test of var_a / var_b = `null` and its interval at `confidence`, for many
    comparisons: one matrix product per layout they share. Every re-assignment of a layout
    with at most `enumerate_up_to` of them (enumerated()), else `resamples` drawn ones."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prep in enumerate(preps):
        groups.setdefault(prep.layout, []).append(i)
    out: list[TestResult | None] = [None] * len(preps)
    for layout, members in groups.items():
        if (
            not enumerated(layout, resamples, enumerate_up_to)
            and resamples * sum(layout) * 8 > MAX_MATRIX_BYTES
        ):
            crossings, exact = drawn_crossing_scales([preps[i] for i in members], resamples)
        else:
            matrix, exact = assignments(layout, resamples, enumerate_up_to)
            crossings = crossing_scales([preps[i] for i in members], matrix)
        for i, result in zip(
            members, from_crossings(crossings, exact, null, confidence), strict=True
        ):
            out[i] = result
    return [r for r in out if r is not None]


def randomisation_test(
    prep: Prepared, null: float = 1.0, confidence: float = 0.95, resamples: int = N_RESAMPLES
) -> TestResult:
    """The primary test of one comparison (randomisation_tests)."""
    return randomisation_tests([prep], null, confidence, resamples)[0]
