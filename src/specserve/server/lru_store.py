"""What the stateful endpoints keep: entries in memory, least recently used first out.

`LruStore` is the one memory both stores use (the Responses API's `ResponseStore`, the stored chat
completions' `ChatCompletionStore`): entries by id, each with its size (the JSON it holds, as
`json_size` counts it), dropped least recently used first once their sizes add up past the bound
(the newest one is always kept). It is thread-safe (the event loop writes, the prep thread reads)
and lives in one process: a restart forgets everything.

The bound counts JSON, so the stores keep their heavy parts `Packed`: as Python dicts and strings a
stored chat completion took 5.6 times its JSON (5,155 bytes for 917), and a 64 MB store could hold
about 360 MB; packed, it holds about what it counts.
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


class Packed:
    """A value kept as its pickle, about the size of its JSON, rather than as Python objects;
    each `unpack` gives a fresh copy, so a caller that changes it changes nothing kept."""

    __slots__ = ("_data",)

    def __init__(self, value: Any):
        self._data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def unpack(self) -> Any:
        return pickle.loads(self._data)


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
