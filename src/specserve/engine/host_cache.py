"""The prefix cache's second tier: finished requests' caches kept in host memory.

On llama.cpp's unified cache every pass attends over every held cell, so a prefix-cache entry
left in cells slows every other request, and it pays rent until it goes (prefix_cache.py). Once
gone, the next request that starts like it (an agent's next turn, a second edit of the same file)
would prefill it all again: 10-12 ms a token of the 1.5B model on 2 CPU cores. Copying the
entry's cells out to host memory and back costs about 60 us a token (2000 tokens: a 55 MiB copy,
56-68 ms out and about as much back). So an entry leaving the cells by rent or by LRU is saved
here first, and a prompt that starts like a saved entry restores its cells into the request's
own sequence and prefills only the rest.

    budget     bytes of host memory the saved entries take at most; least recently used out
               first, and an entry larger than the whole budget is not kept
    supersede  a saved entry whose tokens start a newer one's (a conversation's earlier turn)
               is dropped when the newer one comes: the newer one serves every prompt it served
    match      the entry sharing the longest prefix of a prompt (all but its last token, whose
               logits are always computed), found by comparing token ids; a few dozen entries
               take microseconds

Bookkeeping only: the engine core saves and restores through the backend (`save_sequence`,
`restore_sequence`) and hands the copies to this class.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..backends.base import SavedSequence
from .prefix_cache import BLOCK, common_prefix

GIB = 2**30
DEFAULT_HOST_CACHE_BYTES = 4 * GIB  # at most, and at most HOST_MEMORY_SHARE of what is available
HOST_MEMORY_SHARE = 0.25


def default_budget(available: int | None) -> int:
    """The host tier's default size: DEFAULT_HOST_CACHE_BYTES, or a quarter of the memory
    available at start-up where that is less (None: unknown, the default)."""
    if available is None:
        return DEFAULT_HOST_CACHE_BYTES
    return min(DEFAULT_HOST_CACHE_BYTES, int(HOST_MEMORY_SHARE * available))


def starts(tokens: list[int], prefix: list[int]) -> bool:
    """Whether `tokens` begins with every token of `prefix`."""
    return len(tokens) >= len(prefix) and tokens[: len(prefix)] == prefix


@dataclass
class Saved:
    """A finished request's cache in host memory: its first `len(tokens)` positions."""

    tokens: list[int]
    copy: SavedSequence
    used: int  # LRU clock
    draft: tuple[SavedSequence, list[int]] | None = None  # the draft model's copy, and its tokens

    @property
    def size(self) -> int:
        """Bytes of host memory it takes, the draft copy's included."""
        return self.copy.size + (self.draft[0].size if self.draft else 0)


@dataclass(frozen=True)
class HostHit:
    saved: Saved
    length: int  # prompt tokens it holds


class HostCache:
    """Saved entries, bounded by bytes."""

    def __init__(self, budget: int, block: int = BLOCK):
        self.budget, self.block = budget, block
        self.saved: list[Saved] = []
        self._clock = itertools.count(1)
        self.saves = self.restores = self.tokens_restored = self.failed_restores = 0

    @property
    def bytes(self) -> int:
        return sum(s.size for s in tuple(self.saved))

    def stats(self) -> dict:
        return {
            "entries": len(self.saved),
            "bytes": self.bytes,
            "budget_bytes": self.budget,
            "saves": self.saves,
            "restores": self.restores,
            "tokens_restored": self.tokens_restored,
            "failed_restores": self.failed_restores,
        }

    def put(self, tokens: list[int], copy: SavedSequence, draft: tuple[SavedSequence, list[int]] | None = None) -> bool:
        """Keep the copy of a sequence holding `tokens` (and of the draft model's sequence beside
        it). False: not kept (larger than the budget, or a saved entry already starts with every
        one of these tokens)."""
        entry = Saved(list(tokens[: copy.length]), copy, next(self._clock), draft)
        if entry.size > self.budget or len(entry.tokens) < self.block:
            return False
        if any(starts(s.tokens, entry.tokens) for s in self.saved):
            return False
        self.saved = [s for s in self.saved if not starts(entry.tokens, s.tokens)]
        self.saved.append(entry)
        self.saves += 1
        while self.bytes > self.budget:
            self.saved.remove(min(self.saved, key=lambda s: s.used))
        return True

    def match(self, prompt: list[int]) -> HostHit | None:
        """The saved entry holding the longest prefix of prompt[:-1], or None below one block."""
        limit = len(prompt) - 1
        best, best_n = None, 0
        for s in self.saved:
            n = common_prefix(s.tokens, prompt, limit)
            if n > best_n:
                best, best_n = s, n
        if best is None or best_n < self.block:
            return None
        return HostHit(best, best_n)

    def restored(self, hit: HostHit, ok: bool) -> None:
        """Book a restore the engine made from `hit` (ok: the backend had room for it)."""
        if ok:
            hit.saved.used = next(self._clock)
            self.restores += 1
            self.tokens_restored += hit.length
        else:
            self.failed_restores += 1

    def clear(self) -> None:
        self.saved = []
