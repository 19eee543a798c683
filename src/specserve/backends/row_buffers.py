"""Reused float32 blocks for logits rows: a verification pass must not pay to fault in new memory.

A pass that verifies K draft tokens returns K+1 rows of a 151k-token vocabulary: 78 MB at K=127.
glibc serves an allocation that large with a fresh `mmap` every time (its threshold stops
rising at 32 MB), so each pass wrote its rows into pages the kernel had to fault in first. On
a 2-core EPYC VM that took 140-180 ms of a 1.4 s 128-token pass, and it priced every pass of 64
rows or more dearer per token than a 32-row pass, so the draft lengths chosen from those prices
stayed short (docs/benchmarks.md, "Logits rows in reused memory").

`RowBuffers.take(rows)` hands out a `[rows, width]` view of a block kept from an earlier pass.
The block goes back to the pool only when that view is garbage (every tensor made from it
keeps it alive), so a caller may hold its logits as long as it likes.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

MIN_ROWS = 16  # smaller outputs (one row per prefill, short drafts) are cheap to allocate as they come
KEEP = 4  # free blocks kept; more in use at once are simply allocated


class RowBuffers:
    """A small free list of `[capacity, width]` float32 blocks, capacities rounded up to powers of two."""

    def __init__(self, width: int, keep: int = KEEP):
        self.width = width
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()  # views die on whatever thread drops them
        self.allocated = 0  # blocks ever allocated (tests and docs read it)

    def take(self, rows: int) -> np.ndarray:
        """An uninitialised float32 array [rows, width]."""
        if rows < MIN_ROWS:
            return np.empty((rows, self.width), dtype=np.float32)
        block = self._reuse(rows)
        if block is None:
            capacity = 1 << (rows - 1).bit_length()
            block = np.empty((capacity, self.width), dtype=np.float32)
            self.allocated += 1
        view = block[:rows]
        weakref.finalize(view, self._give_back, block)
        return view

    def _reuse(self, rows: int) -> np.ndarray | None:
        """The smallest free block that holds `rows`, taken off the free list."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if len(b) >= rows]
            if not fits:
                return None
            return self._free.pop(min(fits, key=lambda i: len(self._free[i])))

    def _give_back(self, block: np.ndarray) -> None:
        with self._lock:
            self._free.append(block)
            if len(self._free) > self.keep:  # drop the smallest: big passes are the ones that fault
                self._free.pop(min(range(len(self._free)), key=lambda i: len(self._free[i])))
