"""A least-recently-used cache bounded by bytes, for the local backend's prompt caches.

Why: the caches were bounded by entry count (200,000) and keyed by the whole message JSON,
holding token ids as Python ints: an agent's 10-turn conversation cost about 80 KiB per
distinct request, some 15 GiB before the first clear. Here a key is kept only as a 16-byte
digest (blake2b), token ids are stored by the caller as `array('i')` (4 bytes each), and the
oldest entries go as soon as the estimated bytes pass the budget.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

ENTRY_OVERHEAD = 200  # bytes per entry: the OrderedDict slot, the digest, the tuple


def digest(key: Any) -> bytes:
    """16 bytes that stand for `key` (a str, or a tuple of str/ints/tuples)."""
    raw = key.encode() if isinstance(key, str) else repr(key).encode()
    return hashlib.blake2b(raw, digest_size=16).digest()


def size_of(value: Any) -> int:
    """An estimate of the bytes `value` holds (str, bytes, array, numbers, nested tuples/lists)."""
    if isinstance(value, array):
        return 64 + value.itemsize * len(value)
    if isinstance(value, str | bytes):
        return sys.getsizeof(value)
    if isinstance(value, tuple | list):
        return 56 + 8 * len(value) + sum(size_of(v) for v in value)
    return 32


class ByteLRU:
    """Mapping with LRU eviction once the entries' estimated bytes exceed `budget_bytes`.
    Thread-safe (scores are written from worker threads). `tag_of(key)` (optional) groups
    entries so that `drop_tag` can remove, e.g., every entry of an unloaded adapter."""

    def __init__(self, budget_bytes: int, tag_of: Callable[[Any], Hashable] | None = None) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self.tag_of = tag_of
        self.bytes = 0
        self.evictions = 0
        self._data: OrderedDict[bytes, tuple[Any, int, Hashable]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Any, default: Any = None) -> Any:
        d = digest(key)
        with self._lock:
            hit = self._data.get(d)
            if hit is None:
                return default
            self._data.move_to_end(d)
            return hit[0]

    def __setitem__(self, key: Any, value: Any) -> None:
        d = digest(key)
        size = size_of(value) + ENTRY_OVERHEAD
        tag = self.tag_of(key) if self.tag_of is not None else None
        with self._lock:
            old = self._data.pop(d, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.budget_bytes:
                return  # larger than the whole budget: not cached
            self._data[d] = (value, size, tag)
            self.bytes += size
            while self.bytes > self.budget_bytes and self._data:
                _, (_, gone, _) = self._data.popitem(last=False)
                self.bytes -= gone
                self.evictions += 1

    def drop_tag(self, tag: Hashable) -> None:
        with self._lock:
            for d in [d for d, (_, _, t) in self._data.items() if t == tag]:
                self.bytes -= self._data.pop(d)[1]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.bytes = 0
