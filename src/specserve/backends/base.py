"""The seam between the engine and whatever executes a model.

A *backend* owns one model's weights and the KV cache of **many sequences**. One `forward`
carries new tokens for several sequences at once (ragged: each its own count) and returns
logits only for the rows asked for; `truncate` rolls one sequence's cache back, which is how
rejected draft tokens are forgotten. Everything above this file (proposers, verification,
sampling, stops, stats) is backend-agnostic.

`SequenceRunner` is the single-sequence view the draft proposer and the cost calibration drive:
`forward(tokens) -> logits [T, V]`, `truncate(length)`, `reset()`. Tests and the replay oracle
plug in their own objects with the same members (the `Runner` protocol); `RunnerBackend` turns
one of those into a one-sequence Backend, so the engine core runs them unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SeqInput:
    """New tokens for one sequence in a forward.

    logits: which rows come back: "all" ([T, V]), "last" ([1, V]) or "none" (prefill chunk).
    """

    seq: int
    token_ids: Sequence[int]
    logits: str = "all"


class Backend(Protocol):
    """Executes one model for many sequences. Positions are implicit: a sequence's new tokens
    follow the tokens already in its cache."""

    name: str  # "transformers" | "llama.cpp"
    vocab_size: int  # rows of the output layer (logits width V)
    max_context: int  # longest sequence one cache holds
    trained_context: int  # the model's own context (GGUF n_ctx_train, max_position_embeddings): max_context's cap
    max_sequences: int  # sequences that may exist at once
    batches_sequences: bool  # one pass for all sequences (llama.cpp), or one pass each (transformers)

    def new_sequence(self) -> int:
        """Allocate an empty sequence; returns its id."""

    def free_sequence(self, seq: int) -> None:
        """Release a sequence and its cache."""

    def length(self, seq: int) -> int:
        """Tokens held in the sequence's cache."""

    def forward(self, inputs: Sequence[SeqInput]) -> list[torch.Tensor | None]:
        """One pass over every input's new tokens. Returns, per input, float32 logits on the CPU:
        [T_i, V] for "all", [1, V] for "last", None for "none"."""

    def truncate(self, seq: int, length: int) -> None:
        """Forget every cached position of `seq` at or after `length`."""

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Make the empty sequence `dst` hold `src`'s first `length` cached positions, as if it had
        been fed the same tokens (prefix caching; engine/prefix_cache.py). llama.cpp shares the
        cells, transformers copies the cache slices. Optional: a backend without it (a one-sequence
        `RunnerBackend`) runs with the prefix cache off."""

    # Optional, with copy_prefix: the prefix cache's host tier (engine/host_cache.py) keeps
    # evicted entries in host memory through these two (llama.cpp and transformers have them).
    #   save_sequence(seq) -> SavedSequence | None: a copy of seq's cache; None if it cannot
    #   restore_sequence(seq, saved) -> bool: the empty seq holds the copy; False (seq left
    #   empty) when the cache has no room
    #
    # Optional members the engine reads where a backend has them (llama.cpp has them all,
    # transformers only on_gpu); without one, the engine takes the default in brackets:
    #   cache_tokens: int           cells allocated up front; admission keeps within them [EngineLimits.cache_tokens]
    #   attends_every_cell: bool    a pass attends over every used cell, so cached prefixes pay
    #                               rent (prefix_cache.py) and a lone request is moved down [False]
    #   relocate(seq) -> bool       move seq's cells to the lowest free ones (with attends_every_cell)
    #   keeps_prefix(seq, n) -> bool  seq's cells still hold what a cut to n positions attends to
    #                               (a sliding window may have overwritten them) [always]
    #   on_gpu: bool                the cache lives in accelerator memory: copying it out to the
    #                               host tier may not pay [False]
    #   cell_bytes() -> int         bytes one cache cell takes (part of the host store's key)


@dataclass(frozen=True)
class SavedSequence:
    """A sequence's cache copied to host memory: `data` is the backend's own serialisation (a
    ctypes byte array for llama.cpp, safetensors bytes for transformers, or a bytearray of the
    same bytes read back from disk), of `length` positions."""

    data: object
    length: int

    @property
    def size(self) -> int:
        """Bytes of host memory it takes."""
        return len(memoryview(self.data).cast("B"))


class Runner(Protocol):
    """One sequence, as the engine and the draft proposer see it."""

    vocab_size: int
    max_context: int
    length: int

    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor: ...

    def truncate(self, length: int) -> None: ...

    def reset(self) -> None: ...


class SequenceRunner:
    """A `Runner` over one sequence of a `Backend`, allocated on first use and released by
    `close()` (a proposer built with the request allocates nothing until the request runs)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.seq: int | None = None
        self.vocab_size = backend.vocab_size
        self.max_context = backend.max_context

    def _seq(self) -> int:
        if self.seq is None:
            self.seq = self.backend.new_sequence()
        return self.seq

    @property
    def length(self) -> int:
        return 0 if self.seq is None else self.backend.length(self.seq)

    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Feed token_ids after the cached ones. Returns float32 logits [T, V] ([1, V] if last_only)."""
        if self.length + len(token_ids) > self.max_context:
            raise ValueError(f"cache would exceed the context length {self.max_context}")
        (logits,) = self.backend.forward([SeqInput(self._seq(), token_ids, "last" if last_only else "all")])
        return logits

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.backend.truncate(self.seq, length)

    def reset(self) -> None:
        self.truncate(0)

    def close(self) -> None:
        if self.seq is not None:
            self.backend.free_sequence(self.seq)
            self.seq = None


class RunnerBackend:
    """A one-sequence Backend over a `Runner` (synthetic test models, the replay oracle)."""

    name = "runner"
    max_sequences = 1
    batches_sequences = False

    def __init__(self, runner: Runner):
        self.runner = runner
        self.vocab_size, self.max_context = runner.vocab_size, runner.max_context
        self._taken = False

    def new_sequence(self) -> int:
        if self._taken:
            raise RuntimeError("all 1 sequences are in use")
        self._taken = True
        self.runner.reset()
        return 0

    def free_sequence(self, seq: int) -> None:
        self._taken = False

    def length(self, seq: int) -> int:
        return self.runner.length

    def forward(self, inputs: Sequence[SeqInput]) -> list[torch.Tensor | None]:
        out = []
        for x in inputs:
            if not x.token_ids:
                out.append(None)
                continue
            logits = self.runner.forward(list(x.token_ids), last_only=x.logits != "all")
            out.append(None if x.logits == "none" else logits)
        return out

    def truncate(self, seq: int, length: int) -> None:
        self.runner.truncate(length)


def as_backend(model) -> Backend:
    """A Backend as it is, or a Runner wrapped as a one-sequence Backend."""
    return model if hasattr(model, "new_sequence") else RunnerBackend(model)
