"""The one thread that runs every model computation in a process.

OpenMP (ggml-cpu's build, and torch, which ships the same libgomp) gives each calling thread its
own team of worker threads, and once libgomp manages more threads than there are CPUs its
barriers (hundreds per forward) sleep instead of spinning. A second calling thread is easy to
come by: the server measures prices at load on the main thread and then steps the engine on its
worker thread, and the benchmark runs peers on the main thread. On a 2-core Xeon a decoding step
on such a second thread was 27-34% slower: Qwen 1.5B Q4_K_M on llama.cpp at 2981 cached tokens
107 ms against 81; Qwen 0.5B float32 on transformers 8.9 tokens/s against 11.6. So engine
steps, backend forwards, model loading and any parallel torch op (an argmax over a [rows, V]
logits tensor is enough to form a team) are handed to one long-lived thread (about 50 us a
call), and calls made on that thread run at once. Code on other threads (the grammar thread,
the server's event loop) keeps to numpy and Python.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

COMPUTE_THREAD = "specserve-compute"
T = TypeVar("T")
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _forget_pool_in_child() -> None:
    """A forked child has none of its parent's threads: it starts its own compute thread."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def on_compute_thread(fn: Callable[[], T]) -> T:
    """fn(), run on the compute thread; its result or its exception comes back to the caller."""
    global _pool
    if threading.current_thread().name.startswith(COMPUTE_THREAD):
        return fn()
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=COMPUTE_THREAD)
    return _pool.submit(fn).result()
