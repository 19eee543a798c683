"""The engine as a service: one worker thread steps it, any thread submits and cancels.

The HTTP server (and anything else that serves many callers) talks to the engine only through
`EngineClient`: submit requests, cancel them, read the queue. Each request reports back through
its own `on_event` callback, called on the worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from .core import EngineCore, EngineFault
from .request import Request

log = logging.getLogger("specserve.engine")

HOST_SAVE_EVERY_S = 30.0  # how much of the on-disk host tier a crash can lose (engine/host_store.py)


class QueueFull(Exception):
    """More requests are waiting than the client accepts."""

    def __init__(self, waiting: int):
        super().__init__(f"{waiting} requests are waiting")
        self.waiting = waiting


class ShuttingDown(Exception):
    """The client is stopping and takes no more requests."""


class EngineDead(EngineFault):
    """The thread that steps the engine died on an unexpected error: nothing will step it again.
    `submit` raises it at once, and every request in flight when it died fails with it (the
    server answers 503 to both, and /health says unavailable)."""


class EngineClient(Protocol):
    """What the server needs from an engine."""

    max_queue: int

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def submit(self, requests: Sequence[Request]) -> None:
        """Queue requests together, or raise QueueFull / ShuttingDown / EngineDead without queueing any."""

    def has_room(self, n: int = 1) -> bool:
        """Whether `submit` would take n requests now (a hint: the queue may fill meanwhile)."""

    def wake(self) -> None:
        """Something changed (a request was cancelled): step soon even if idle."""


class EngineWorker:
    """An EngineClient running an EngineCore on one background thread.

    max_queue: requests allowed to wait for a place in the running batch; beyond it `submit`
    raises QueueFull (the server answers 429). Cancelled requests still in the queue do not count.

    An exception in a step fails that step's requests and the worker goes on. If the thread
    itself dies (an error outside the step's handler, or a BaseException), it fails every request
    in flight with EngineDead on its way out, and `submit` refuses from then on.

    With a host-tier folder, a second thread writes the tier there every `save_every` seconds
    while it changes, so a crash or a kill loses at most that much; `stop` writes the rest."""

    def __init__(self, core: EngineCore, max_queue: int, save_every: float = HOST_SAVE_EVERY_S):
        self.core, self.max_queue, self.save_every = core, max_queue, save_every
        self._cond = threading.Condition()
        self._stopping = False
        self._dead: EngineDead | None = None  # set when the thread died
        self._thread: threading.Thread | None = None
        self._saver: threading.Thread | None = None
        self._saver_stop = threading.Event()

    @property
    def num_waiting(self) -> int:
        return self.core.num_waiting

    @property
    def num_running(self) -> int:
        return self.core.num_running

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="specserve-worker", daemon=True)
        self._thread.start()
        if self.core.host_store is not None:
            self._saver = threading.Thread(target=self._save_loop, name="specserve-kv-writer", daemon=True)
            self._saver.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything in flight (each request reports "abort"), then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._saver_stop.set()
        if self._saver is not None:
            self._saver.join()  # one writer at a time: the last write below is the whole tier
        self.core.abort_all()
        self._save_host_cache()
        if self.core.host_store is not None:
            self.core.host_store.close()

    def _save_loop(self) -> None:
        """Write the host tier to its folder while it changes. The entries are copied under the
        engine's lock; the files are written outside it, so steps go on meanwhile (a saved
        entry's bytes are never changed, only dropped)."""
        written = None
        while not self._saver_stop.wait(self.save_every):
            mark, entries = self.core.host_snapshot()
            if mark == written:
                continue
            try:
                self.core.host_store.save(entries)
            except OSError as e:  # a full disk: the tier in memory still serves
                log.warning("could not write the prefix cache to %s: %s", self.core.host_store.folder, e)
                continue
            written = mark

    def _save_host_cache(self) -> None:
        """Write the prefix cache's host tier to its folder, if one was given (a full disk is a
        warning: the server still stops, and starts cold next time)."""
        if self.core.host_store is None:
            return
        start = time.perf_counter()
        try:
            with self.core.lock:
                n = self.core.save_host_cache()
        except OSError as e:
            log.warning("could not save the prefix cache to %s: %s", self.core.host_store.folder, e)
            return
        log.info(
            "saved %d prefix-cache entries to %s in %.1f s",
            n,
            self.core.host_store.folder,
            time.perf_counter() - start,
        )

    def submit(self, requests: Sequence[Request]) -> None:
        with self._cond:
            if self._dead is not None:  # a new instance each time: raising one again would grow its traceback
                raise EngineDead(self._dead.__cause__, str(self._dead))
            if self._stopping:
                raise ShuttingDown()
            if self._refuses(len(requests)):
                raise QueueFull(self.core.num_waiting)
            for r in requests:
                self.core.add(r)
            self._cond.notify()

    def has_room(self, n: int = 1) -> bool:
        with self._cond:
            return not self._refuses(n)

    def _refuses(self, n: int) -> bool:
        """Whether n more requests would overfill the queue (the caller holds the lock). While
        nothing waits, a job larger than the queue (a batch of prompts, n > 1) is taken: one larger
        than the queue and the batch together would be refused for ever, and a smaller one was
        refused while a full batch ran where a larger one was taken. With --max-queue 0 only the
        first holds: nothing is meant to wait."""
        waiting = self.core.num_waiting
        if not waiting and (n > self.max_queue > 0 or n > self.max_queue + self.core.limits.max_num_seqs):
            return False
        return waiting + n > self.max_queue + self._free_slots()

    def _free_slots(self) -> int:
        """Requests that would join the batch at once rather than wait."""
        return max(0, self.core.limits.max_num_seqs - self.core.num_running)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 - the thread dies: nobody may be left waiting on it
            self._die(e)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self.core.has_work():
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                self.core.step()
            except Exception as e:  # noqa: BLE001 - a bug in a step fails what is in flight, not the server
                log.exception("engine step failed")
                self.core.fail_all(e)

    def _die(self, error: BaseException) -> None:
        """Refuse new requests, then fail every request in flight (none can finish now)."""
        log.critical("the engine's worker thread died; the server cannot serve until restarted", exc_info=error)
        dead = EngineDead(
            error,
            f"the engine stopped: its worker thread died ({type(error).__name__}: {error}); "
            "the server must be restarted",
        )
        with self._cond:  # after this, submit refuses: nothing can slip into the queue unseen
            self._dead = dead
        self.core.fail_all(dead)
