"""What the stateful endpoints keep: entries in memory, least recently used first out.

`LruStore` is the one memory both stores use (the Responses API's `ResponseStore`, the stored chat
completions' `ChatCompletionStore`): entries by id, each with its size, dropped least recently used
first once their sizes add up past the bound (the newest one is always kept). It is thread-safe (the
event loop writes, the prep thread reads) and lives in one process: a restart forgets everything.

The bound is on memory: the stores keep each entry's heavy parts `Packed` (pickled), and `pack`
counts an entry as its pickle, the JSON of what it keeps as it is (what list queries filter on), and
ENTRY_OVERHEAD for the rest. Kept as Python dicts and strings, a stored chat completion took 5.6
times its JSON (5,155 bytes for 917), so a 64 MB store could hold about 360 MB; packed and counted
so, a store holds about its bound whatever the size of its entries (tests/test_store_memory.py).
"""

from __future__ import annotations

import json
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


def json_size(*objects) -> int:
    """The bytes of the objects' JSON, in UTF-8."""
    return sum(len(json.dumps(x, ensure_ascii=False).encode()) for x in objects)


# Bytes an entry keeps besides its pickle and its unpacked parts' JSON: the Packed object, the
# entry's tuple, its id and the LRU's node, the unpacked parts' Python objects over their JSON.
# Measured: about 630 for a small chat completion (tests/test_store_memory.py).
ENTRY_OVERHEAD = 640


class Packed:
    """A value kept as its pickle, about the size of its JSON, rather than as Python objects;
    each `unpack` gives a fresh copy, so a caller that changes it changes nothing kept."""

    __slots__ = ("_data",)

    def __init__(self, value: Any):
        self._data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    @property
    def size(self) -> int:
        """Bytes of the pickle."""
        return len(self._data)

    def unpack(self) -> Any:
        return pickle.loads(self._data)


def pack(value: Any, *as_is: Any) -> tuple[Packed, int]:
    """`value` packed, and the size to count for an entry that keeps it and `as_is` (kept unpacked,
    for list queries): the memory it takes. Call it before taking a store's lock: pickling a big
    entry would hold up every other call on the store."""
    packed = Packed(value)
    return packed, packed.size + (json_size(*as_is) if as_is else 0) + ENTRY_OVERHEAD


class LruStore:
    """Entries by id, bounded by `max_size` in all; `on_drop(id, value)` is told of every entry
    that leaves (evicted, deleted or replaced), with the lock held."""

    def __init__(self, max_size: int, on_drop: Callable[[str, Any], None] | None = None):
        self.max_size = max_size
        self.size = 0
        self.lock = threading.RLock()
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._on_drop = on_drop

    def put(self, key: str, value: Any, size: int) -> None:
        """Keep (or replace) an entry as the most recently used; older ones go beyond the bound."""
        with self.lock:
            self.pop(key)
            self._entries[key] = (value, size)
            self.size += size
            while self.size > self.max_size and len(self._entries) > 1:
                self.pop(next(iter(self._entries)))

    def get(self, key: str) -> Any | None:
        """An entry's value (now the most recently used), or None."""
        with self.lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def peek(self, key: str) -> Any | None:
        """An entry's value without counting a use (a list cursor's lookup), or None."""
        with self.lock:
            entry = self._entries.get(key)
            return None if entry is None else entry[0]

    def pop(self, key: str) -> bool:
        """Drop an entry; False if there was none."""
        with self.lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self.size -= entry[1]
            if self._on_drop is not None:
                self._on_drop(key, entry[0])
            return True

    def values(self) -> list[Any]:
        """Every kept value, least recently used first (a copy: listing does not count as use)."""
        with self.lock:
            return [value for value, _ in self._entries.values()]
