"""The LRU cache of compiled grammars, bounded in bytes.

Compiled grammars are kept per tokenizer in a `GrammarCache` bounded by `GRAMMAR_CACHE_BYTES`,
each counted with xgrammar's `memory_size_bytes` plus its key (`key_bytes`: the schema, regex or
EBNF text); xgrammar's own (unbounded) cache is off. Until 2026-12-06 the key was not counted: a
schema's descriptions, which xgrammar ignores, made keys of up to the body cap (megabytes) for
grammars of a few kB, and distinct ones piled up far past the budget.
A retry of a grammar whose compilation overran its request's time limit finds it here.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import CompiledGuide

GRAMMAR_CACHE_BYTES = 256 << 20  # compiled grammars kept (LRU), per tokenizer


def key_bytes(key: tuple) -> int:
    """The memory of a cache key's text parts (the schema, regex or EBNF it was compiled from):
    what an entry holds besides its compiled grammar, and for a schema with long descriptions
    (which do not reach the grammar) by far the larger part."""
    return sum(sys.getsizeof(part) for part in key if isinstance(part, str))


class GrammarCache:
    """Compiled grammars by spec key, least recently used first out once over `max_bytes`.

    A grammar larger than the whole budget is not kept. Thread-safe (compile threads put, request
    threads get)."""

    def __init__(self, max_bytes: int = GRAMMAR_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple, tuple[CompiledGuide, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: tuple) -> bool:
        return key in self._items

    def get(self, key: tuple) -> CompiledGuide | None:
        """The grammar kept under `key` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: tuple, guide: CompiledGuide, nbytes: int) -> None:
        """Keep `guide` (nbytes large), dropping the least recently used ones until all fit."""
        with self._lock:
            if key in self._items:
                self.bytes -= self._items.pop(key)[1]
            if nbytes > self.max_bytes:
                return
            self._items[key] = (guide, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes:
                self.bytes -= self._items.popitem(last=False)[1][1]
