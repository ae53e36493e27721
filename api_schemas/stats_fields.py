"""What each field of /stats means, in one line: the fields of a per-condition summary
(ConditionStats) and of a comparison (Comparison). `seedgrid explain FIELD` prints one and
`seedgrid stats --all` prints them as its legend; a test checks that every field the API
returns has one here."""

from __future__ import annotations

CONDITION_FIELDS: dict[str, str] = {
    "condition": "the condition's grid levels, factor by factor",
    "condition_key": "the condition as one text, factor=level joined by commas",
    "n": "the runs of the condition whose metric is a number (the seeds counted)",
    "mean": "the metric's mean over the condition's seeds",
    "std": "the sample standard deviation over the seeds (n - 1 in the denominator)",
    "var": "the sample variance over the seeds: the seed-to-seed variance",
    "min": "the smallest value over the seeds",
    "median": "the median over the seeds",
    "max": "the largest value over the seeds",
    "ci95": "the 95% interval of the mean [low, high] (method: ci95_method)",
    "ci95_method": "how ci95 was computed: Student's t, or logit-t for a bounded metric",
    "values": "the metric of each counted run, in run order",
    "runs": "the same values, each with its run id and seed",
    "noise_floor_var": "the binomial test-set noise p(1 - p)/n averaged over the runs "
    "(accuracy-like metrics with a declared test set)",
    "noise_floor_share": "noise_floor_var / var: the share of the seed variance test-set "
    "noise accounts for (above 1: less seed variance than test-set noise)",
    "warnings": "what is computed from fewer seeds than it needs, each saying why",
}

COMPARISON_FIELDS: dict[str, str] = {
    "factor": "the grid factor whose two levels are compared",
    "a": "the first level compared",
    "b": "the second level compared",
    "within": "the levels of the other factors held fixed (null: pooled over them)",
    "n_a": "the seeds counted at level a",
    "n_b": "the seeds counted at level b",
    "var_a": "level a's within-cell variance (cell means removed, pooled over its cells)",
    "var_b": "level b's within-cell variance (cell means removed, pooled over its cells)",
    "dof_a": "var_a's degrees of freedom, the sum of n_k - 1 over level a's cells",
    "dof_b": "var_b's degrees of freedom, the sum of n_k - 1 over level b's cells",
    "var_ratio": "var_a / var_b: above 1, level a spreads more from seed to seed",
    "scale": "raw: variances of the metric; log: of its logarithm (relative spreads)",
    "primary_test": "the test of var_a / var_b = 1 every view reports (randomisation test of "
    "squared deviations from each cell's centre: its median, or at 6-15 unpaired seeds one "
    "mode-aligned centre, or at up to 15 paired seeds a point between its median and the "
    "midpoint of its shortest half; the name says which)",
    "primary_p": "the primary test's p-value, raw (not adjusted for other comparisons)",
    "primary_p_holm_factor": "primary_p Holm-adjusted over the factor's comparisons",
    "primary_p_holm_all": "primary_p Holm-adjusted over every comparison of the experiment",
    "primary_ci95": "the 95% interval of var_a / var_b: the ratios the primary test does not "
    "reject (high end null: unbounded)",
    "primary_resamples": "the re-assignments behind primary_p, the observed one included",
    "primary_exact": "true when every re-assignment was enumerated, false when drawn at random",
    "pairing": "paired: both levels ran the same seeds, compared seed by seed; else unpaired",
    "paired_seeds": "the seeds both levels ran (paired comparisons)",
    "seed_correlation": "the Pearson correlation of the two levels' values seed by seed",
    "pairing_note": "why the comparison is unpaired",
    "f_test_p": "the F-test's p-value, raw (assumes normal values; rejects too often otherwise)",
    "var_ratio_ci95_f": "the F-test's 95% interval of var_a / var_b (assumes normal values)",
    "brown_forsythe_p": "the Brown-Forsythe test's p-value, raw (ANOVA of absolute deviations "
    "from the cell medians)",
    "marginal_var_a": "level a's variance over all its runs, cell means included (pooled only)",
    "marginal_var_b": "level b's variance over all its runs, cell means included (pooled only)",
    "marginal_var_ratio": "marginal_var_a / marginal_var_b (descriptive: interactions inflate it)",
    "mean_diff": "mean of level a minus mean of level b (paired: over the seeds both ran)",
    "mean_test": "the test of mean_diff = 0: paired t (paired seeds) or a studentised "
    "permutation test of Welch's t (unpaired)",
    "mean_p": "the mean test's p-value, raw",
    "mean_p_holm_factor": "mean_p Holm-adjusted over the factor's comparisons",
    "mean_p_holm_all": "mean_p Holm-adjusted over every comparison of the experiment",
    "mean_diff_ci95": "the 95% interval of mean_diff",
    "mean_p_null_reason": "why mean_p is null (every paired difference is the same)",
    "welch_p": "Welch's unpaired t-test p-value of the means from Student's t, raw, whatever "
    "the pairing (over-rejects with unequal seeds on skewed metrics; mean_p does not)",
    "welch_p_null_reason": "why welch_p is null (both levels have zero variance)",
    "detectable_ratio": "the smallest var_a / var_b above 1 these seeds detect with power 0.8 "
    "at alpha 0.05",
    "target_ratio": "the ratio the spec's analysis.target_ratio asks to detect (default 2)",
    "seeds_for_target_ratio": "the seeds per level that would detect target_ratio with power 0.8",
    "f_test_p_holm_factor": "f_test_p Holm-adjusted over the factor's comparisons",
    "f_test_p_holm_all": "f_test_p Holm-adjusted over every comparison",
    "brown_forsythe_p_holm_factor": "brown_forsythe_p Holm-adjusted over the factor's comparisons",
    "brown_forsythe_p_holm_all": "brown_forsythe_p Holm-adjusted over every comparison",
    "welch_p_holm_factor": "welch_p Holm-adjusted over the factor's comparisons",
    "welch_p_holm_all": "welch_p Holm-adjusted over every comparison",
    "confounds": "config fields besides the factor whose resolved values differ between the two "
    "levels (defaults included): the comparison measures them too; each field, a's and b's",
    "warnings": "every test or interval computed from fewer seeds than it needs, and every "
    "reading the numbers do not support, each saying why",
}


def field_meaning(field: str) -> str | None:
    """The one-line meaning of a /stats field (a condition's or a comparison's), or None."""
    if field in CONDITION_FIELDS and field in COMPARISON_FIELDS:
        condition, comparison = CONDITION_FIELDS[field], COMPARISON_FIELDS[field]
        return f"per condition: {condition}; per comparison: {comparison}"
    return CONDITION_FIELDS.get(field) or COMPARISON_FIELDS.get(field)


def known_fields() -> list[str]:
    return list(dict.fromkeys([*CONDITION_FIELDS, *COMPARISON_FIELDS]))
