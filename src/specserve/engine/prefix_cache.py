"""Automatic prefix caching: a request starts from the longest prefix of its prompt that some
target cache sequence already holds, and prefills only the rest.

    owners   every target sequence whose cached tokens we know: a running request's (what it has
             prefilled and committed so far) and a finished request's, kept after it ends as a
             cache *entry* (its sequence and cells stay allocated until evicted)
    index    each full block of BLOCK tokens an owner holds is keyed by a hash chained with its
             parent block's hash (vLLM's scheme): one key names a whole prefix, so walking the
             prompt's blocks finds the deepest block some owner shares; the match then extends
             token by token into the next block, and is checked against the owner's tokens
             (a hash collision can never make a wrong prefix)
    evict    entries, least recently used first, when admission needs their cells or their
             sequence ids; running requests are never evicted (their cells are theirs)
    sibling  a request that shares most of an entry's prompt (a second edit of the same file,
             a regenerated answer) supersedes that entry: the engine releases it once the prefix
             is copied, because on llama.cpp's unified cache the entry's unshared cells would
             make every pass of the new request attend over them (docs/design.md, "What an
             entry costs the others")
    rent     on such a backend an entry no request has used while the engine fed `rent_limit`
             tokens is released: its cells have by then slowed the other requests about as
             much as prefilling it again would cost (rent or buy: never worse than twice the
             better choice in hindsight), or, with a host tier, as saving and restoring it
    spill    an entry leaving by rent or LRU is first handed to the `spill` callback, which
             saves it to the host tier (host_cache.py); one a request copied, or that `clear`
             drops, is not

The engine core asks `match`, copies the prefix into the new request's sequence with the
backend's `copy_prefix` (llama.cpp: the cells are shared, nothing is computed; transformers: the
cache slices are copied), and prefills the rest. Everything here is bookkeeping on token ids;
the backend is touched only through the `free` callback that releases an evicted sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

BLOCK = 16  # tokens per hashed block; a prefix shorter than one block is not worth a lookup
SIBLING_SHARE = 0.5  # a hit covering this share of an entry's prompt makes the new request its sibling
# Tokens the engine may feed while an unused entry stays (llama.cpp's unified cache). On 2 AVX-512
# EPYC cores (Qwen 1.5B Q4_K_M) a held cell adds ~2 us to each token of a long pass and ~5 us to a
# one-token step, and prefilling a token costs 8-13 ms: an entry has cost about its own prefill
# after 2,600-6,500 fed tokens. The ratio, not the CPU's speed, sets this, so one figure serves.
ENTRY_RENT_TOKENS = 4096
# The same with a host tier (host_cache.py), where an entry leaving the cells is saved and restored
# at about 60 us a token instead of prefilled again: its held cells cost the others that much after
# ~20-40 fed tokens (2.8 us a held cell per token of a 64-token pass, measured on the same CPU).
SAVED_ENTRY_RENT_TOKENS = 64


def common_prefix(a: list[int], b: list[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of a and b (at most `limit`). Prefix equality is
    monotone in the length, so a binary search over slice comparisons (C speed) finds it."""
    lo, hi = 0, min(len(a), len(b), limit if limit is not None else len(a))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Owner:
    """A target sequence whose first `length` cached tokens are `tokens[:length]`."""

    seq: int
    tokens: list[int]
    length: int
    live: bool  # a running request's sequence (never evicted here) or a cache entry
    hashes: list[int] = field(default_factory=list)  # chained hash of each indexed full block
    used: int = 0  # LRU clock: the last lookup that chose it (or when it was kept)
    prompt: int = 0  # prompt tokens of the request that left this entry (0: unknown)
    rent: int = 0  # tokens the engine has fed since the entry was kept or last chosen


@dataclass(frozen=True)
class Hit:
    seq: int  # the sequence to copy from
    length: int  # prompt tokens it holds (what the new request need not prefill)
    entry: bool  # a finished request's entry (not a running request)
    held: int  # tokens the owner holds; length == held: a copy makes an entry redundant
    prompt: int = 0  # the entry's own prompt tokens (0: unknown, or a running request)

    @property
    def whole(self) -> bool:
        return self.length == self.held

    @property
    def sibling(self) -> bool:
        """The new request shares most of the entry's prompt and parts from it there: a second
        answer to (nearly) the same question, after which the first one's tail is dead weight."""
        return self.entry and self.prompt > 0 and self.length >= SIBLING_SHARE * self.prompt


class PrefixCache:
    """Cached prefixes of target sequences, found by token ids.

    free: releases an evicted entry's sequence in the backend. max_entries: finished requests'
    sequences kept at most (the backend's spare sequence ids; 0 keeps none, and then only running
    requests are shared). rent_limit: see `charge` (None: entries cost the others nothing, as
    with per-sequence caches). spill: called with an entry evicted by rent or LRU before its
    sequence is freed (None: it is just freed)."""

    def __init__(
        self,
        free: Callable[[int], None],
        max_entries: int,
        block: int = BLOCK,
        rent_limit: int | None = None,
        spill: Callable[[Owner], None] | None = None,
    ):
        self.free, self.max_entries, self.block, self.rent_limit = free, max_entries, block, rent_limit
        self.spill = spill
        self.owners: dict[int, Owner] = {}
        self._index: dict[int, dict[int, None]] = {}  # block hash -> owner seqs (insertion ordered)
        self._clock = itertools.count(1)
        # prompts looked up (admitted), those with a hit, their tokens, the tokens of theirs reused
        self.lookups = self.hits = self.tokens_queried = self.tokens_saved = 0

    # -- what is cached ---------------------------------------------------------------------------
    @property
    def entries(self) -> int:
        return sum(not o.live for o in self._owners_now())

    @property
    def cells(self) -> int:
        """Cells held by entries (an upper bound: entries may share cells with each other and with
        running requests). Admission counts them against the cache and evicts them first."""
        return sum(o.length for o in self._owners_now() if not o.live)

    def _owners_now(self) -> tuple:
        """A snapshot of the owners: /health and /metrics read these figures from other threads
        while the engine's worker adds and drops owners (a tuple of a dict's values is taken whole,
        under the GIL; iterating the live dict could raise "changed size during iteration")."""
        return tuple(self.owners.values())

    def stats(self) -> dict:
        return {
            "entries": self.entries,
            "cells": self.cells,
            "lookups": self.lookups,
            "hits": self.hits,
            "hit_rate": round(self.hits / self.lookups, 4) if self.lookups else 0.0,
            "tokens_queried": self.tokens_queried,
            "tokens_saved": self.tokens_saved,
        }

    # -- owners -----------------------------------------------------------------------------------
    def track(self, seq: int, tokens: list[int], length: int, parent: int | None = None) -> None:
        """A running sequence holds tokens[:length]: index its full blocks not yet indexed.
        parent: the sequence its first blocks were copied from (their hashes are reused)."""
        owner = self.owners.get(seq)
        if owner is not None and length < len(owner.hashes) * self.block:  # rolled back: index afresh
            self.drop(seq)
            owner = None
        if owner is None:
            owner = self.owners[seq] = Owner(seq, tokens, 0, live=True)
            if parent is not None and parent in self.owners:
                for h in self.owners[parent].hashes[: length // self.block]:
                    owner.hashes.append(h)
                    self._index.setdefault(h, {})[seq] = None
        owner.tokens, owner.length = tokens, length
        b = self.block
        h = owner.hashes[-1] if owner.hashes else 0
        for start in range(len(owner.hashes) * b, length - b + 1, b):
            h = hash((h, *tokens[start : start + b]))
            owner.hashes.append(h)
            self._index.setdefault(h, {})[seq] = None

    def keep(self, seq: int, tokens: list[int], length: int, prompt: int = 0) -> bool:
        """A request ended and its sequence holds tokens[:length], the first `prompt` of them its
        prompt: keep it as an entry (evicting the least recently used entry when all entry slots
        are taken). False: not kept (nothing worth keeping, or no slots); the caller frees the
        sequence."""
        if self.max_entries <= 0 or length < self.block:
            self.drop(seq)
            return False
        self.track(seq, tokens, length)
        owner = self.owners[seq]
        owner.tokens, owner.live, owner.used = list(tokens[:length]), False, next(self._clock)
        owner.prompt, owner.rent = prompt, 0
        while self.entries > self.max_entries and self.evict(keep=seq):
            pass
        if self.entries > self.max_entries:  # the slots shrank while evicting (a free failed: see EngineCore._lose)
            self.drop(seq)
            return False
        return True

    def drop(self, seq: int) -> None:
        """Forget a sequence (the caller frees it, or already has)."""
        owner = self.owners.pop(seq, None)
        if owner is None:
            return
        for h in owner.hashes:
            seqs = self._index.get(h)
            if seqs is not None:
                seqs.pop(seq, None)
                if not seqs:
                    del self._index[h]

    def evict(self, keep: int | None = None) -> bool:
        """Free the least recently used entry (not `keep`). False when there is none."""
        entries = [o for o in self.owners.values() if not o.live and o.seq != keep]
        if not entries:
            return False
        self.release(min(entries, key=lambda o: o.used).seq, spill=True)
        return True

    def clear(self) -> None:
        """Free every entry, saving none (running requests' sequences stay indexed)."""
        for o in self._owners_now():
            if not o.live:
                self.release(o.seq)

    # -- lookup -----------------------------------------------------------------------------------
    def match(self, prompt: list[int]) -> Hit | None:
        """The owner holding the longest prefix of prompt[:-1] (the last prompt token is always
        computed: its logits choose the first output token), or None below one block."""
        limit, b = len(prompt) - 1, self.block
        h, depth, candidates = 0, 0, None
        for start in range(0, limit - b + 1, b):
            h = hash((h, *prompt[start : start + b]))
            seqs = self._index.get(h)
            if not seqs:
                break
            depth, candidates = start + b, seqs
        best: Owner | None = None
        best_n = 0
        for seq in candidates or ():
            o = self.owners[seq]
            if o.tokens[:depth] != prompt[:depth]:  # a hash collision: not this one
                continue
            n = depth + common_prefix(o.tokens[depth : o.length], prompt[depth:limit])
            if n > best_n or (n == best_n and best is not None and o.used > best.used):
                best, best_n = o, n
        if best is None:
            return None
        best.used, best.rent = next(self._clock), 0
        return Hit(best.seq, best_n, entry=not best.live, held=best.length, prompt=0 if best.live else best.prompt)

    def charge(self, tokens: int) -> int:
        """The engine fed `tokens` tokens in a step: each entry's rent grows by them, and an
        entry whose rent reaches rent_limit is released. Returns how many were released."""
        if self.rent_limit is None or not tokens:
            return 0
        due = []
        for o in self._owners_now():
            if not o.live:
                o.rent += tokens
                if o.rent >= self.rent_limit:
                    due.append(o.seq)
        for seq in due:
            self.release(seq, spill=True)
        return len(due)

    def release(self, seq: int, spill: bool = False) -> None:
        """Forget an entry and free its sequence (its cells stay with whoever shares them).
        spill: hand it to the `spill` callback first (rent and LRU evictions)."""
        owner = self.owners.get(seq)
        if spill and self.spill is not None and owner is not None:
            self.spill(owner)
        self.drop(seq)
        self.free(seq)

    def record(self, tokens: int, prompt: int) -> None:
        """A request was admitted with `tokens` of its `prompt` tokens reused. The prompt tokens
        are summed here, beside the reused ones, so a token hit rate divides two counts of the
        same prompts (the answers' usage leaves out the requests that end without an answer)."""
        self.lookups += 1
        self.tokens_queried += prompt
        if tokens:
            self.hits += 1
            self.tokens_saved += tokens
