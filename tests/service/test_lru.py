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
