"""Read a GGUF file once while transformers loads it.

transformers' GGUF path (`load_gguf_checkpoint`) builds a fresh `gguf.GGUFReader` each time it
is asked for the config, the weights and the tokenizer, and every read parses the whole metadata
table (the vocabulary and merges of a 49k-token tokenizer: ~9 s here) again. While matching
tensor names it also rebuilds gguf's `TensorNameMap` for every module (~12 s for a 30-layer
model). Both are pure functions of their arguments, so during one of our loads we memoize them:
the SmolLM2-135M GGUF went from 47 s to about half that.

transformers imports both names from `gguf` at call time, which is what lets the memo apply; if a
later release binds them elsewhere, the memo simply stops applying and nothing else changes.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within the block, one `GGUFReader` per file and one `TensorNameMap` per (arch, layers)."""
    try:
        import gguf
    except ImportError:  # transformers will say that gguf is needed
        yield
        return
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, object] = {}

    def reader(path, mode="r"):
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map
