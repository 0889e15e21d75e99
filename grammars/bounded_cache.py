"""`BoundedCache`: an LRU map bounded in entries and in estimated bytes, for the parts of a
grammar that requests share (a tool's JSON Schema rules): an agent's tool list is mostly the
same from one request to the next, so each part is built once and assembled."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class BoundedCache(Generic[V]):
    """Least recently used entries go first, past `max_entries` or `max_bytes` (the sum of
    the sizes given to `put`; an entry larger than `max_bytes` alone is not kept)."""

    def __init__(self, max_entries: int, max_bytes: int):
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("cache bounds must be non-negative")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_build(self, key: Hashable, build: Callable[[], tuple[V, int]]) -> V:
        """The value for `key`, built (value, estimated bytes) and kept on a miss."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return found[0]
        self.misses += 1
        value, size = build()
        if self.max_entries and size <= self.max_bytes:
            self._entries[key] = (value, size)
            self.bytes += size
            while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped
        return value

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = self.hits = self.misses = 0
