"""One tokenizer per thread: the server tokenizes on its prep thread, names tokens on the event
loop and detokenizes on the engine worker, all at once.

Why copies and not a lock. A Hugging Face fast tokenizer is one Rust object behind a borrow
flag, plus Python state that `encode` may rewrite on the way in (truncation, padding, the
special-token split flag: `set_truncation_and_padding` and `_encode_plus` change them whenever a
call asks for other settings than the last one). Rust encodes release the GIL, so a second
thread can get in meanwhile: depending on the versions that is a `RuntimeError: Already
borrowed`, or worse, silently wrong ids (measured with tokenizers 0.23 / transformers 5.24: one
thread toggling `truncation=True, max_length=5` made 7 of 40 concurrent long encodes of another
thread come back truncated, with no error). A lock would make the engine worker, which decodes
every committed token, wait behind the prep thread's tokenization of a long prompt or
prediction (tens of ms), stalling every running stream; a copy per thread costs nothing on the
hot path but one attribute look-up (`threading.local`), and once per thread a deep copy of the
tokenizer (measured on SmolLM2, 49k tokens: ~8 MB and ~0.3-0.8 s on a busy 2-core machine).

The tokenizer handed in is kept as a read-only *template*: no thread calls it; each thread
gets its own deep copy on first use (made under a lock, so copying never races). Code that
needs the real object for a read-only walk of the vocabulary (xgrammar's TokenizerInfo) gets
the template through `shared`.
"""

from __future__ import annotations

import copy
import threading


class PerThreadTokenizer:
    """Forwards every attribute and call to the calling thread's own copy of a tokenizer."""

    __slots__ = ("_template", "_local", "_lock", "__weakref__")

    def __init__(self, tokenizer):
        object.__setattr__(self, "_template", tokenizer)
        object.__setattr__(self, "_local", threading.local())
        object.__setattr__(self, "_lock", threading.Lock())

    def thread_copy(self):
        """This thread's copy (made on first use)."""
        try:
            return self._local.tok
        except AttributeError:
            with self._lock:
                tok = copy.deepcopy(self._template)
            self._local.tok = tok
            return tok

    def __getattr__(self, name: str):
        return getattr(self.thread_copy(), name)

    def __call__(self, *args, **kwargs):
        return self.thread_copy()(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.thread_copy())

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(
            f"cannot set {name!r} on a per-thread tokenizer: set it on the tokenizer before "
            "wrapping it (each thread holds its own copy)"
        )

    def __reduce__(self):
        return PerThreadTokenizer, (self._template,)

    def __repr__(self) -> str:
        return f"PerThreadTokenizer({self._template!r})"


def per_thread(tokenizer):
    """Wrap a tokenizer so that each thread uses its own copy (idempotent; None stays None)."""
    if tokenizer is None or isinstance(tokenizer, PerThreadTokenizer):
        return tokenizer
    return PerThreadTokenizer(tokenizer)


def warm(tokenizer, run=None) -> None:
    """Make a thread's copy now, not on its first use: 0.7-0.8 s for Qwen2.5's 151k-token
    vocabulary on 2 EPYC cores, which a fresh server's first request used to wait for, once per
    thread it crossed. run: a callable that runs a function on the thread meant (an executor's
    `submit(...).result`, `on_compute_thread`); None: this thread."""
    if isinstance(tokenizer, PerThreadTokenizer):
        (run or (lambda fn: fn()))(tokenizer.thread_copy)


def shared(tokenizer):
    """The one underlying tokenizer object, for read-only use (a key, xgrammar's vocabulary walk)."""
    return tokenizer._template if isinstance(tokenizer, PerThreadTokenizer) else tokenizer
