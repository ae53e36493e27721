"""A small thread-safe least-recently-used cache, bounded by entries or by bytes: the
statistics keep their re-assignment matrices and computed comparisons in one."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """At most `max_items` entries, and (with `size`) at most `max_bytes` of them by that
    measure; the least recently used go first (the newest always stays)."""

    def __init__(
        self, max_items: int, max_bytes: int | None = None, size: Callable[[V], int] | None = None
    ) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.size = size
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            if key in self._entries:
                self._bytes -= self._measure(self._entries.pop(key))
            self._entries[key] = value
            self._bytes += self._measure(value)
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_items
                or (self.max_bytes is not None and self._bytes > self.max_bytes)
            ):
                self._bytes -= self._measure(self._entries.popitem(last=False)[1])

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _measure(self, value: V) -> int:
        return self.size(value) if self.size is not None else 0


def deep_size(value: Any) -> int:
    """The bytes a value of plain data holds (dicts, lists, tuples, strings, numbers, None, numpy
    arrays), its containers' contents included: what a cache bounded by bytes counts for an
    entry it cannot measure with one attribute. Each object is counted once however often it is
    referred to; what every entry shares counts nothing: None, True, False, the small ints
    Python keeps once, and dict keys that are strings (field names, one object for all
    entries)."""
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or item is True or item is False or id(item) in seen:
            continue
        if type(item) is int and -5 <= item <= 256:
            continue
        seen.add(id(item))
        nbytes = getattr(item, "nbytes", None)  # a numpy array: its buffer
        total += sys.getsizeof(item) + (nbytes if isinstance(nbytes, int) else 0)
        if isinstance(item, dict):
            stack.extend(key for key in item if not isinstance(key, str))
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
    return total
