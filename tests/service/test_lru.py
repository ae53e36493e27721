"""service.lru: the statistics' bounded caches drop the least recently used entry first."""

from __future__ import annotations

from service.lru import LruCache


def test_the_least_recently_used_entry_goes_first_when_entries_run_out() -> None:
    cache: LruCache[str] = LruCache(max_items=2)
    cache.put("a", "1")
    cache.put("b", "2")
    assert cache.get("a") == "1"  # a is now the most recently used
    cache.put("c", "3")
    assert cache.get("b") is None and cache.get("a") == "1" and cache.get("c") == "3"
    assert len(cache) == 2


def test_a_byte_bound_drops_entries_until_it_holds_and_keeps_the_newest() -> None:
    cache: LruCache[bytes] = LruCache(max_items=100, max_bytes=10, size=len)
    cache.put("a", b"12345")
    cache.put("b", b"1234")
    cache.put("c", b"123")  # 12 bytes: a goes
    assert cache.get("a") is None and cache.get("b") == b"1234"
    cache.put("d", b"x" * 50)  # larger than the bound alone: it stays, the rest go
    assert len(cache) == 1 and cache.get("d") == b"x" * 50
    cache.put("d", b"y")  # replacing an entry counts its new size only
    cache.put("e", b"123456789")
    assert cache.get("d") == b"y" and cache.get("e") == b"123456789"
    cache.clear()
    assert len(cache) == 0 and cache.get("e") is None


def test_deep_size_counts_what_python_holds_for_a_comparison_result() -> None:
    # The comparison results the statistics cache (service.analysis.variance) are bounded by
    # deep_size: it must count what they hold, within a factor of 1.5 of what tracemalloc sees
    # the analysis keep for them (issue 38: memory bounded by bytes, not entries).
    import gc
    import tracemalloc

    import numpy as np

    from service.analysis import resampling, variance
    from service.lru import deep_size

    rng = np.random.default_rng(38)

    def scopes(count: int) -> list[variance.Scope]:
        return [
            variance.Scope(
                (resampling.Stratum(rng.lognormal(size=6), rng.normal(size=6)),), pooled=False
            )
            for _ in range(count)
        ]

    variance.analyse(scopes(2))  # the (6, 6) layout's matrix, made and cached once
    fresh = scopes(200)  # the data exist before the count starts
    variance._results.clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        results = variance.analyse(fresh)
        del results  # what the analysis keeps is the cache's entries
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    counted = sum(deep_size(entry) for entry in variance._results._entries.values())
    assert len(variance._results) == 200
    assert counted / 1.5 <= kept <= counted * 1.5, (counted, kept)
    print(f"deep_size {counted:,} B, tracemalloc {kept:,} B")
    assert 1_000 < counted / 200 < 20_000


def test_the_result_caches_are_bounded_by_bytes() -> None:
    from service.analysis import omnibus, variance

    for cache in (variance._results, omnibus._omnibus_results):
        assert cache.max_bytes is not None and cache.size is not None
    assert variance._results.max_bytes == variance.MAX_RESULT_BYTES
