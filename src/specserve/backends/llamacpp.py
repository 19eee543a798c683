"""The llama.cpp backend: GGUF files run as they are, through llama-cpp-python's low-level API.

One `llama_context` holds the KV cache of every sequence (a unified cache, `n_seq_max`
sequences). A forward is one `llama_batch`: each token carries its position, its sequence id
and a flag saying whether its logits row is wanted; `llama_decode` runs it; rows are read with
`llama_get_logits_ith`. Rolling a sequence back is `llama_memory_seq_rm(mem, seq, length, -1)`.

Batch invariance (docs/design.md, "Exactness on llama.cpp"). llama.cpp's CPU kernels choose
their arithmetic by how many tokens a pass carries, so K tokens verified in one pass round
differently from K one-token decoding steps, and greedy output could change for reasons other
than a near-tie. Four choices, each measured on the Qwen Q4_K_M and SmolLM2 Q4_1 packs:
- flash attention with an f16/f32 KV cache takes a tiled kernel for >= 64 queries and splits
  the KV range across threads for a single query once the cache holds >= 512 cells; with a
  q8_0 KV cache it always runs the per-query kernel;
- K-quant matmuls take a tiled GEMM for >= 8 rows (`GGML_CPU_TILED_MM=0` turns it off; the
  switch is read once per process);
- repacked weights (`use_extra_bufts`) use GEMM for groups of 4 rows and GEMV for the rest;
- llamafile's sgemm takes passes of 2+ tokens (upstream it is compiled in or out; our install
  script adds `GGML_CPU_LLAMAFILE=0` to turn it off at run time, scripts/llama_cpp_switch.py).
`batch_invariant=True` sets all four, and then a chunk, token-by-token passes, and a chunk
sharing its batch with other sequences give bit-identical logits. One more thing decides the
rounding: flash attention sums over the cache in cell order, so each sequence's cells must lie in
position order, which llama.cpp's own placement breaks when several sequences speculate at once
(our install script's `LLAMA_KV_CELL_ORDER` switch keeps them in order; `exact` sets it). A stock
build (no cell-order switch, or llamafile's sgemm with no switch), or a switch the user set
against exact mode, is refused at load with a one-line error naming the fix
(`exactness_problem`), not run inexactly. It costs throughput on
a CPU (Qwen 1.5B Q4_K_M, 2 AVX-512 cores: prefill 42 instead of 101 tok/s, a 128-token
verification 27 instead of 73 tok/s, decoding 21 instead of 26 tok/s), so it is opt-in
(`--exact`); the default runs llama.cpp's fastest kernels and the benchmark reports every
divergence from plain decoding with its logit gap.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..config import SPARE_CELLS
from ..errors import ModelLoadError
from ..hardware import available_memory
from .base import SavedSequence, SeqInput
from .compute import on_compute_thread
from .row_buffers import RowBuffers

log = logging.getLogger("specserve.llamacpp")

_init_lock = threading.Lock()
_initialised = False
# ggml-cpu kernels that break batch invariance, each with a switch read once per process (off when
# atoi reads 0): the tiled K-quant matmul (upstream) and llamafile's sgemm (our install script's patch)
KERNEL_SWITCHES = ("GGML_CPU_TILED_MM", "GGML_CPU_LLAMAFILE")
# our install script's patch: with this set (atoi not 0), a pass's tokens take cells above every cell
# their sequence holds, so each sequence's cells stay in position order (read once per process)
CELL_ORDER_SWITCH = "LLAMA_KV_CELL_ORDER"
# what `exact` sets in the environment when the user has not: the kernels off, the cells in order
EXACT_ENV = dict.fromkeys(KERNEL_SWITCHES, "0") | {CELL_ORDER_SWITCH: "1"}
_switches: dict[str, str | None] = {}  # what the first model in this process left them at
_log_tail: list[str] = []  # recent llama.cpp log lines, quoted in load errors
_LOG_KEEP = 40
# The cell-order switch's fallback (scripts/llama_cpp_switch.py): a pass with no free cell above
# its sequence's cells is placed as upstream does, and that answer may leave its solo run.
_BELOW = "no free cell above sequence"
_placed_below = 0  # such passes in this process (the log callback counts them)
# The default mode runs attention without flash attention (f16 KV cache), as llama-cpp-python's `Llama`
# does by default. Qwen 1.5B Q4_K_M, 2 AVX2 cores, 2048 cached tokens (two alternating runs each):
# one-token decoding 117/110 ms a step without it against 135/130 with llama.cpp's AUTO (which turns it
# on), prefill 34.5/37.1 against 32.8/33.7 tok/s; 128-token passes within noise. scripts/profile_plain.py.
FAST_MODE_FLASH_ATTENTION = False
# On a GPU the default mode turns it on. Without it llama.cpp keeps V transposed, and saving or
# restoring a sequence whose cells are scattered among others' (the prefix cache's host tier,
# `relocate`) copies it one value at a time: on an H200 with SmolLM2, 200 such cells took 9.4 s
# to save and 7.4 s to restore, against 112 and 85 ms with flash attention, and 4 batched chat
# requests ran at 20-66 tok/s against 826-838. A one-token step was quicker with it too (1.28
# against about 1.5 ms). docs/gpu.md.
GPU_FLASH_ATTENTION = True
DEFAULT_MAX_CONTEXT = 8192  # holds the demo's 3.8k-token prompt + 4k-token answer
KV_MEMORY_SHARE = 0.25  # the default cache takes at most this share of the memory available at start-up


def _lib():
    """Import llama_cpp lazily: the transformers path must work where it is not installed."""
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ModelLoadError(
            "the llama.cpp backend needs llama-cpp-python; install it with "
            "`pip install 'llama-cpp-python>=0.3.36,<0.4'` (or run `make venv`)"
        ) from e
    return llama_cpp


def _atoi(text: str) -> int:
    """C's atoi, which is how ggml-cpu reads its switches ("", "off" and "0x1" all read 0)."""
    text = text.lstrip()
    sign = -1 if text[:1] == "-" else 1
    text = text[1:] if text[:1] in "+-" else text
    digits = len(text) - len(text.lstrip("0123456789"))
    return sign * int(text[:digits]) if digits else 0


def switch_off(value: str | None) -> bool:
    """Whether a ggml-cpu kernel switch (GGML_CPU_TILED_MM, GGML_CPU_LLAMAFILE) is off for this
    value: each kernel runs unless its variable is set and atoi reads 0."""
    return value is not None and _atoi(value) == 0


def switch_on(value: str | None) -> bool:
    """Whether a llama.cpp switch that is off unless set (LLAMA_KV_CELL_ORDER) is on: set, and not
    read as 0 by atoi."""
    return value is not None and _atoi(value) != 0


def exactness_problem(system_info: str, switches: dict[str, str | None]) -> str | None:
    """Why this llama.cpp build and environment cannot give the batch-invariant kernels and the
    in-order cells `exact` relies on, as a one-line error naming the fix; None when they can.

    system_info: `llama_print_system_info()` ("KV_CELL_ORDER_SWITCH = 1 | CPU : SSE3 = 1 | ... |
    LLAMAFILE = 1 | ..."): it lists llamafile's sgemm when it is compiled in, and our install
    script's two switches when it built them in (scripts/llama_cpp_switch.py). switches: the
    values of EXACT_ENV's variables that llama.cpp reads (or read) on its first pass. The other
    two causes (KV cache type and repacked weights) are set per model by this backend."""
    reinstall = "reinstall it with scripts/install_llama_cpp.sh (or `make venv`)"
    if "KV_CELL_ORDER_SWITCH = 1" not in system_info:
        return (
            "--exact needs llama.cpp to keep each sequence's cache cells in position order, which a "
            f"stock llama-cpp-python does not: {reinstall}"
        )
    if not switch_on(switches.get(CELL_ORDER_SWITCH)):
        return (
            f"--exact needs {CELL_ORDER_SWITCH}=1, but the environment sets "
            f"{CELL_ORDER_SWITCH}={switches.get(CELL_ORDER_SWITCH)}: unset it (exact mode then sets 1) or set it to 1"
        )
    needed = ["GGML_CPU_TILED_MM"]
    if "LLAMAFILE = 1" in system_info:
        if "LLAMAFILE_SWITCH = 1" not in system_info:
            return (
                "--exact needs llama.cpp's llamafile sgemm off, but this llama-cpp-python compiles it in "
                f"with no switch (LLAMAFILE = 1): {reinstall}"
            )
        needed.append("GGML_CPU_LLAMAFILE")
    for name in needed:
        if not switch_off(switches.get(name)):
            return (
                f"--exact needs {name}=0, but the environment sets {name}={switches.get(name)}: "
                "unset it (exact mode then sets 0) or set it to 0"
            )
    return None


def amx_repacks(system_info: str) -> bool:
    """Whether this llama.cpp build has ggml's AMX kernels (`AMX_INT8 = 1`), which take every
    weight they can into their own repacked buffer when a model allows extra buffer types. In
    llama-cpp-python 0.3.36 those kernels segfault on K-quant weights (upstream llama.cpp#20824;
    here every pass of 2+ tokens on the Qwen Q4_K_M pack, on a Xeon with AMX), so a model loaded
    by a build that has them keeps its weights in plain CPU buffers. Our install script compiles
    them out (scripts/install_llama_cpp.sh); a user's own `pip install` on such a CPU has them."""
    return "AMX_INT8 = 1" in system_info


def system_info() -> str:
    """llama.cpp's build summary ("CPU : SSE3 = 1 | ... | AMX_INT8 = 1 | LLAMAFILE = 1 | ...")."""
    info = _lib().llama_print_system_info()
    return info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)


def _init_backend(batch_invariant: bool) -> None:
    """Initialise llama.cpp once per process and route its log into a short buffer; for an exact
    model, refuse (ModelLoadError) unless the build and environment give batch-invariant kernels."""
    global _initialised, _log_callback
    with _init_lock:
        first = not _initialised
        if first:
            if batch_invariant:  # read by llama.cpp on its first pass; a user's own setting wins (or is refused)
                for name, value in EXACT_ENV.items():
                    os.environ.setdefault(name, value)
            _switches.update({name: os.environ.get(name) for name in EXACT_ENV})
            ll = _lib()

            @ll.llama_log_callback
            def _log_callback(level, text, user_data):  # noqa: ARG001 - fixed C signature
                global _placed_below
                line = text.decode("utf-8", "replace").strip() if text else ""
                if len(line) > 1:  # skip the progress dots
                    _log_tail.append(line)
                    del _log_tail[:-_LOG_KEEP]
                if _BELOW in line:
                    _placed_below += 1
                    if _placed_below == 1:
                        log.warning(
                            "--exact: a pass found no free KV cell above its sequence and was placed "
                            "below it, so that answer may differ from the same request run alone; "
                            "give the cache more room (--kv-cache-tokens) or fewer requests "
                            "(--max-num-seqs). /health counts such passes (exact_cells_out_of_order)"
                        )

            ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialised = True
        if batch_invariant:  # checked before any model runs a matmul (when ggml reads the switches)
            info = system_info()
            problem = exactness_problem(info, _switches)
            if problem and not first and exactness_problem(info, EXACT_ENV) is None:
                problem = (  # the build is fine: a fast model came first and left the switches on
                    "batch-invariant (exact) llama.cpp models must be loaded before any other "
                    "llama.cpp model in a process (its switches are read once); start a "
                    "fresh process"
                )
            if problem:
                raise ModelLoadError(problem)


def default_threads() -> int:
    """Cores this process may run on (the model's threads should own the machine's cores)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_TELLING = ("error", "failed", "unknown", "invalid", "does not", "unable", "not supported", "unsupported")


def _load_error(path: Path) -> str:
    """The most telling llama.cpp log line about why a load failed: the first one that says
    "error", else the first with another telling word (file paths are left out of the search)."""
    for word in _TELLING:
        for line in _log_tail:
            if word in line.replace(str(path), "").lower():
                return line.split(": ", 1)[-1] if ": " in line else line
    return "not a GGUF model llama.cpp can load (truncated file or unsupported architecture?)"


class LlamaCppBackend:
    """Owns one GGUF model, one llama.cpp context and the cache of up to `max_sequences` sequences.

    threads: CPU threads for decoding and batches (default: every core this process may use).
    max_context: tokens one sequence may hold (default: the model's training context, capped
    at DEFAULT_MAX_CONTEXT). cache_tokens: cells of the cache all sequences share (default
    max_context for each sequence but one, which the engine keeps spare for measuring prices,
    plus SPARE_CELLS for it); the engine admits requests only while their prompt + answer
    fits. Keep both near what
    requests need: on the CPU a decoding step's attention cost follows the allocated context
    (Qwen 1.5B with 3.8k tokens cached: 17.3 tok/s at 16384, 18.5 at 8192, 19.5 at 4608).
    batch_invariant: kernels that round a chunk exactly as token-by-token passes (see above).
    prefix_sequences: sequence ids beyond `max_sequences` for the prefix cache's entries
    (finished requests' sequences kept for reuse); they add no cells: entries live in the same
    `cache_tokens`, and the engine evicts them first when a request needs room.
    """

    name = "llama.cpp"
    batches_sequences = True
    # one unified cache: a pass attends over every used cell up to the highest, whoever holds it,
    # so cells kept for the prefix cache slow every other request (engine/prefix_cache.py, rent)
    attends_every_cell = True

    def __init__(
        self,
        gguf_path: str | Path,
        max_context: int | None = None,
        max_sequences: int = 1,
        cache_tokens: int | None = None,
        threads: int | None = None,
        batch_invariant: bool = False,
        n_batch: int = 512,
        gpu_layers: int | None = None,
        prefix_sequences: int = 0,
    ):
        _init_backend(batch_invariant)
        ll = self._ll = _lib()
        self.path = Path(gguf_path)
        if not self.path.is_file():
            raise ModelLoadError(f"no such GGUF file: {self.path}")
        self.threads = threads or default_threads()
        self.batch_invariant = batch_invariant
        self._model = self._load_model(gpu_layers)
        self.flash_attention = batch_invariant or (GPU_FLASH_ATTENTION if self.on_gpu else FAST_MODE_FLASH_ATTENTION)
        vocab = ll.llama_model_get_vocab(self._model)
        self.vocab_size: int = ll.llama_vocab_n_tokens(vocab)
        self._vocab = vocab
        self._rows = RowBuffers(self.vocab_size)  # logits rows land in reused memory (row_buffers.py)
        self.trained_context: int = ll.llama_model_n_ctx_train(self._model) or 2048
        train_ctx = self.trained_context
        self.max_context: int = min(max_context or min(train_ctx, DEFAULT_MAX_CONTEXT), train_ctx)
        self.cache_tokens = cache_tokens or self._default_cells(max_sequences)
        self.max_sequences = max_sequences + prefix_sequences
        self.n_batch = n_batch
        self._ctx = self._new_context()
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = ll.llama_batch_init(n_batch, 0, 1)
        self._lengths: dict[int, int] = {}
        self._free_ids = list(range(self.max_sequences - 1, -1, -1))
        # Sliding-window attention (Gemma 3: 512 positions; 0 = none). llama.cpp's cache for those
        # layers treats a cell whose position fell out of its sequence's window as free: any pass
        # may overwrite it (the default placement; `exact`'s in-order placement takes only empty
        # cells), and a saved copy leaves it out. A sequence cut back below its longest length
        # would then attend over positions that are gone.
        self.sliding_window: int = ll.llama_model_n_swa(self._model)
        self._longest: dict[int, int] = {}  # per sequence: its length when a pass ran (sliding window only)

    # -- set-up ---------------------------------------------------------------------------
    def _load_model(self, gpu_layers: int | None):
        ll = self._ll
        params = ll.llama_model_default_params()
        # Every layer on the GPU where the build has one; exact mode keeps them on the CPU, whose
        # kernels are the ones made batch-invariant (a GPU's matmuls change with the batch size).
        if self.batch_invariant and gpu_layers:
            raise ModelLoadError("exact mode runs on the CPU kernels made batch-invariant: gpu_layers must be 0")
        gpu = ll.llama_supports_gpu_offload()
        params.n_gpu_layers = (-1 if gpu and not self.batch_invariant else 0) if gpu_layers is None else gpu_layers
        self.gpu_layers: int = params.n_gpu_layers  # -1: all
        self.on_gpu = gpu and params.n_gpu_layers != 0
        # repacked weights: not batch-invariant, and on builds with AMX kernels a crash (amx_repacks)
        params.use_extra_bufts = not self.batch_invariant and not amx_repacks(system_info())
        _log_tail.clear()
        model = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            raise ModelLoadError(f"cannot load {self.path.name} with llama.cpp: {_load_error(self.path)}")
        return model

    @property
    def cells_out_of_order(self) -> int:
        """Passes in this process that `exact` could not place above their sequence's cells."""
        return _placed_below

    def cell_bytes(self) -> int:
        """Bytes one cache cell takes: keys and values of every layer, in the cache's type (f16,
        or q8_0 with batch-invariant kernels: 34 bytes per 32 values)."""
        ll, m = self._ll, self._model
        width = ll.llama_model_n_embd(m) // max(1, ll.llama_model_n_head(m)) * ll.llama_model_n_head_kv(m)
        per_value = 34 / 32 if self.batch_invariant else 2
        return int(2 * ll.llama_model_n_layer(m) * width * per_value)

    def _default_cells(self, sequences: int) -> int:
        """A full context for each sequence but the spare one, which measures prices on SPARE_CELLS
        cells (the engine keeps those free where there is more than one sequence); at most
        KV_MEMORY_SHARE of the available memory, and at least one request of full length. The
        spare sequence was given a whole context, which the engine never hands out: `generate`
        (one request) allocated 9 contexts of SmolLM2, 73,728 cells (1.6 GiB), to use 8,192.
        Exact mode keeps that context: free cells above every sequence's are what its in-order
        placement needs (docs/design.md, "cells_out_of_order"), and a full cache runs out of them."""
        spare = (self.max_context if self.batch_invariant else SPARE_CELLS) if sequences > 1 else 0
        one = self.max_context + spare
        want = self.max_context * max(1, sequences - 1) + spare
        free = available_memory()
        if free is None:
            return want
        budget = int(KV_MEMORY_SHARE * free / self.cell_bytes())
        return max(min(want, budget), one)

    @property
    def kernels(self) -> str:
        """The kernel choices a pass's cost depends on (part of the price cache's key): the
        llama-cpp-python release, flash attention, and the llama.cpp switches this process read."""
        switches = ",".join(f"{k}={v}" for k, v in sorted(_switches.items()))
        release = getattr(self._ll, "__version__", "?")
        return f"llama-cpp-python {release}; flash_attn={self.flash_attention}; {switches}"

    def describe_cache(self) -> str:
        """What the cache was sized to, for the start-up log."""
        mib = self.cache_tokens * self.cell_bytes() / 2**20
        return f"KV cache {self.cache_tokens} cells ({mib:.0f} MiB), {self.max_sequences} sequence ids"

    def _new_context(self):
        ll = self._ll
        p = ll.llama_context_default_params()
        p.n_ctx = self.cache_tokens
        p.n_batch = p.n_ubatch = self.n_batch
        p.n_seq_max = self.max_sequences
        p.n_threads = p.n_threads_batch = self.threads
        p.kv_unified = True
        if self.batch_invariant:  # see the module docstring
            p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
            p.type_k = p.type_v = ll.GGML_TYPE_Q8_0
            p.offload_kqv = p.op_offload = False  # a GPU build would take long passes' matmuls there
        elif self.flash_attention:  # on a GPU
            p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
        else:
            p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED

        p.no_perf = True
        ctx = ll.llama_init_from_model(self._model, p)
        if not ctx:
            raise ModelLoadError(
                f"cannot create a llama.cpp context for {self.path.name} "
                f"({self.cache_tokens} cache cells, {self.max_sequences} sequences): "
                f"{_load_error(self.path)}"
            )
        return ctx

    def close(self) -> None:
        """Free the context and model (also done when the object is collected)."""
        ll = getattr(self, "_ll", None)
        if ll is None:
            return
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            ll.llama_free(self._ctx)
            self._ctx = None
            self._lengths = {}  # no sequence is left to free (freeing one would touch the freed context)
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- metadata ---------------------------------------------------------------------------
    def eog_token_ids(self) -> set[int]:
        """Every token llama.cpp treats as end of generation (EOS, EOT, <|im_end|>, ...)."""
        is_eog = self._ll.llama_vocab_is_eog
        return {t for t in range(self.vocab_size) if is_eog(self._vocab, t)}

    # -- sequences --------------------------------------------------------------------------
    def new_sequence(self) -> int:
        if not self._free_ids:
            raise RuntimeError(f"all {self.max_sequences} sequences are in use")
        seq = self._free_ids.pop()
        self._lengths[seq] = 0
        self._longest[seq] = 0
        return seq

    def free_sequence(self, seq: int) -> None:
        if seq in self._lengths:
            self._ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
            del self._lengths[seq]
            self._free_ids.append(seq)

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def truncate(self, seq: int, length: int) -> None:
        if length < self._lengths[seq]:
            self._ll.llama_memory_seq_rm(self._mem, seq, length, -1)
            self._lengths[seq] = length

    def keeps_prefix(self, seq: int, length: int) -> bool:
        """Whether `seq`'s cells still hold everything a sequence cut to its first `length`
        positions attends to (`copy_prefix`, `truncate`). Always, except on a sliding-window model
        whose cells for positions that left the window may have been overwritten (see __init__):
        then only a cut at or above the longest length the sequence had when a pass ran."""
        if not self.sliding_window or (self.batch_invariant and not _placed_below):
            return True
        longest = self._longest.get(seq, 0)
        return length >= longest or longest < self.sliding_window

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """`dst` (empty) shares `src`'s cells for positions [0, length): `llama_memory_seq_cp` tags
        those cells with `dst` too; nothing is computed or copied, and a cell is free again once
        no sequence holds it (the unified cache makes a range copy possible)."""
        if self._lengths[dst]:
            raise ValueError(f"sequence {dst} is not empty")
        if not 0 <= length <= self._lengths[src]:
            raise ValueError(f"sequence {src} holds {self._lengths[src]} positions, not {length}")
        if length:
            self._ll.llama_memory_seq_cp(self._mem, src, dst, 0, length)
        self._lengths[dst] = length

    def save_sequence(self, seq: int) -> SavedSequence | None:
        """A copy of `seq`'s cells (keys, values, positions) in host memory, the sequence left as
        it is; None when it is empty or llama.cpp cannot save it. 2000 tokens of the 1.5B model:
        55 MiB, 56-68 ms on 2 EPYC cores (the prefix cache's host tier, engine/host_cache.py)."""
        ll, n = self._ll, self._lengths[seq]
        if not n or n > self.sliding_window > 0:  # the copy would lack what fell out of the window
            return None
        size = ll.llama_state_seq_get_size(self._ctx, seq)
        data = (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data(self._ctx, data, size, seq) != size:
            return None
        return SavedSequence(data, n)

    def restore_sequence(self, seq: int, saved: SavedSequence) -> bool:
        """Make the empty sequence `seq` hold the saved cells, as if it had been fed the same
        tokens. llama.cpp places them from the first free cells. False when it cannot (no room):
        `seq` is left empty."""
        if self._lengths[seq]:
            raise ValueError(f"sequence {seq} is not empty")
        data = saved.data  # our own copy, or a writable buffer read back from disk (host_store.py)
        if not isinstance(data, ctypes.Array):
            data = (ctypes.c_uint8 * saved.size).from_buffer(data)
        if self._ll.llama_state_seq_set_data(self._ctx, data, saved.size, seq) != saved.size:
            self._ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
            return False
        self._lengths[seq] = saved.length
        return True

    def relocate(self, seq: int) -> bool:
        """Move `seq`'s cells to the lowest free ones, keys and values byte for byte; False when
        llama.cpp could not save the sequence (nothing is touched then, and it stays where it is).

        On the unified cache every pass attends over every cell up to the highest one in use, so
        a sequence placed above cells that have since been freed (a released prefix-cache entry)
        keeps every pass as slow as if they were still held. Saving the sequence's state, removing
        it and restoring it puts it back from the start of the free space (llama.cpp searches
        from the first cell when the cells above its head are mostly free). Positions and the
        order of the cells are kept, so with flash attention (`--exact`) the logits are bit for
        bit the same; the default kernels may round a pass over differently placed cells
        differently, as they round batches of other shapes. Costs one copy of the sequence's
        cache each way (see save_sequence). Call it only when the cache has room for the
        sequence's cells apart from its own, as it has when no other sequence holds any."""
        saved = self.save_sequence(seq)
        if saved is None:
            return False
        self._ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._lengths[seq] = 0
        if not self.restore_sequence(seq, saved):
            raise RuntimeError(f"llama.cpp could not restore sequence {seq} ({saved.length} cells) after moving it")
        return True

    # -- the forward ------------------------------------------------------------------------
    def forward(self, inputs: Sequence[SeqInput]) -> list[torch.Tensor | None]:
        """Decode every input's tokens in batches of at most n_batch tokens; gather wanted rows."""
        for x in inputs:
            if self._lengths[x.seq] + len(x.token_ids) > self.max_context:
                raise ValueError(f"cache would exceed the context length {self.max_context}")
        flat = [(i, x.seq, tok, self._wants(x, j)) for i, x in enumerate(inputs) for j, tok in enumerate(x.token_ids)]
        out = [self._output(x) for x in inputs]  # [T_i, V], [1, V] or None, filled row by row
        filled = [0] * len(inputs)

        def decode_all() -> None:
            for start in range(0, len(flat), self.n_batch):
                self._decode(flat[start : start + self.n_batch], out, filled)

        on_compute_thread(decode_all)
        return [None if o is None else torch.from_numpy(o) for o in out]

    @staticmethod
    def _wants(x: SeqInput, j: int) -> bool:
        return x.logits == "all" or (x.logits == "last" and j == len(x.token_ids) - 1)

    def _output(self, x: SeqInput) -> np.ndarray | None:
        """The float32 array one input's logits rows are copied into (None for "none")."""
        if x.logits == "none":
            return None
        n = len(x.token_ids) if x.logits == "all" else min(1, len(x.token_ids))
        return self._rows.take(n)

    def _decode(self, chunk: list[tuple[int, int, int, bool]], out: list[np.ndarray | None], filled: list[int]) -> None:
        """One llama_decode over `chunk` = [(input index, seq, token, wants logits)]; the wanted
        rows are copied from llama.cpp's buffer (overwritten by the next decode) into `out`."""
        b = self._batch
        if self.sliding_window:  # the placement may overwrite what fell out of any sequence's window
            for seq, n in self._lengths.items():
                self._longest[seq] = max(self._longest.get(seq, 0), n)
        for k, (_, seq, tok, want) in enumerate(chunk):
            b.token[k] = tok
            b.pos[k] = self._lengths[seq]
            b.n_seq_id[k] = 1
            b.seq_id[k][0] = seq
            b.logits[k] = want
            self._lengths[seq] += 1
        b.n_tokens = len(chunk)
        rc = self._ll.llama_decode(self._ctx, b)
        if rc != 0:
            for _, seq, _, _ in chunk:  # nothing of this chunk is trustworthy: forget it
                self._lengths[seq] -= 1
            for seq in {seq for _, seq, _, _ in chunk}:
                self._ll.llama_memory_seq_rm(self._mem, seq, self._lengths[seq], -1)
            raise RuntimeError(f"llama_decode failed with code {rc} (KV cache full or bad batch)")
        for k, (i, _, _, want) in enumerate(chunk):
            if want:
                ptr = self._ll.llama_get_logits_ith(self._ctx, k)
                out[i][filled[i]] = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))  # [V]
                filled[i] += 1
