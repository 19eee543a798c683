"""Compiling grammars off the request path, with a time limit: the pool and the wait.

xgrammar's compile time is not bounded by the size of the request: measured on SmolLM2's
49k-token vocabulary, an `anyOf` of 100 short string patterns takes ~3 s and of 1000 ~32 s, and
ten levels of nested objects ~1.5 s. So a `ConstraintFactory` (factory.py) compiles on its own
small pool of threads (`GRAMMAR_WORKERS`), never on the caller's thread: `submit` returns a
`PendingGuide` at once, and whoever waits for it (the server's event loop, or `prepare` for the
Python API) gives up after `GRAMMAR_TIME_LIMIT_S` with a ConstraintError that says so (a 400).

A thread cannot be killed: a compilation that overran keeps its pool thread until it finishes,
and its result then goes into the cache (cache.py), so a retry of the same grammar is instant.
At most `GRAMMAR_WORKERS` compilations run at once, overrunning or not; a grammar still queued
when its time is up is dropped without being compiled, and the caller gets `GrammarBusy` (a 503:
the server, not the request, is at fault). The same grammar asked for again while it compiles
joins that compilation instead of starting another. The pool threads are not daemons: a process
that exits while an overrunning compilation runs waits for it (a daemon thread inside xgrammar's
C++ at interpreter exit aborts the process instead: "terminate called without an active
exception", measured).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from .errors import ConstraintError, GrammarBusy

if TYPE_CHECKING:
    from .spec import CompiledGuide, GrammarSpec

GRAMMAR_TIME_LIMIT_S = 10.0  # how long a request waits for its grammar to compile
GRAMMAR_WORKERS = 2  # compilations at once (overrunning ones included) per tokenizer


class CompilePool:
    """`workers` threads compiling in order; `running` counts compilations under way (overrunning
    ones included). A job cancelled while queued is never started (Future.cancel)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="specserve-grammar")
        self._lock = threading.Lock()
        self.running = 0

    def submit(self, fn) -> Future:
        """Queue `fn` (no arguments); its Future holds what it returns or raises."""
        return self._executor.submit(self._run, fn)

    def _run(self, fn):
        """Run `fn` on a pool thread, counted in `running` while it runs."""
        with self._lock:
            self.running += 1
        try:
            return fn()
        finally:
            with self._lock:
                self.running -= 1


class PendingGuide:
    """A grammar being compiled for one request: wait with `result()` (any thread) or
    `await wait_async()` (an event loop); both give up at the same deadline, set at submission."""

    def __init__(self, future: Future, spec: GrammarSpec, limit_s: float, pool: CompilePool | None):
        self.future, self.spec, self.limit_s, self.pool = future, spec, limit_s, pool
        self.deadline = time.monotonic() + limit_s

    def result(self) -> CompiledGuide:
        """Wait (blocking this thread) until the grammar is compiled or the deadline passes."""
        try:
            return self.future.result(max(0.0, self.deadline - time.monotonic()))
        except TimeoutError:
            raise self._overdue() from None
        except CancelledError:
            raise self._overdue() from None

    async def wait_async(self) -> CompiledGuide:
        """Wait on the event loop, without blocking it, until the grammar is compiled or the deadline passes."""
        wrapped = asyncio.wrap_future(self.future)
        done, _ = await asyncio.wait({wrapped}, timeout=max(0.0, self.deadline - time.monotonic()))
        if not done:  # the compilation goes on (or is dropped, if still queued)
            raise self._overdue()
        wrapped.exception()  # retrieved here, so asyncio does not log it as never retrieved
        return self.result()

    def _overdue(self) -> ConstraintError:
        """The error for a deadline that passed: queued (busy, dropped) or compiling (too slow)."""
        if self.future.done() and not self.future.cancelled() and self.future.exception() is not None:
            return self.future.exception()  # it failed just as time ran out: the real reason
        if self.future.cancel() or self.future.cancelled():  # still queued: drop it, it never runs
            running = self.pool.running if self.pool is not None else 0
            return GrammarBusy(
                f"the server's grammar compilers were busy ({running} compilations running) for "
                f"the whole {self.limit_s:g} s limit; retry later",
                self.spec.param,
            )
        return ConstraintError(
            f"compiling the {self.spec.kind} constraint exceeded the server's limit of "
            f"{self.limit_s:g} s; simplify it (fewer anyOf/enum alternatives, less nesting, "
            f"smaller repetition bounds)",
            self.spec.param,
        )
