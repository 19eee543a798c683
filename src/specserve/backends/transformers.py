"""The transformers backend: a Hugging Face causal LM in torch, one `DynamicCache` per sequence.

It runs each sequence of a forward separately (no padding or ragged attention), which keeps
every sequence's numerics exactly those of running it alone: the exact f32 reference the tests
compare against. Rolling back is `DynamicCache.crop`, which drops the tail without copying.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import SeqInput
from .compute import on_compute_thread


class TransformersBackend:
    """Owns one Hugging Face causal LM and the KV caches of its sequences."""

    name = "transformers"
    batches_sequences = False  # each sequence runs its own pass: exactly its numerics alone

    def __init__(self, model: PreTrainedModel, max_context: int | None = None, max_sequences: int = 64):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        cfg_ctx = getattr(model.config, "max_position_embeddings", None) or 2048
        self.max_context: int = min(max_context, cfg_ctx) if max_context else cfg_ctx
        self.max_sequences = max_sequences
        self._caches: dict[int, DynamicCache] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0

    def new_sequence(self) -> int:
        if len(self._caches) >= self.max_sequences:
            raise RuntimeError(f"all {self.max_sequences} sequences are in use")
        seq, self._next_id = self._next_id, self._next_id + 1
        self._caches[seq] = DynamicCache(config=self.model.config)
        self._lengths[seq] = 0
        return seq

    def free_sequence(self, seq: int) -> None:
        self._caches.pop(seq, None)
        self._lengths.pop(seq, None)

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def forward(self, inputs: Sequence[SeqInput]) -> list[torch.Tensor | None]:
        return on_compute_thread(lambda: self._forward_all(inputs))  # see backends/compute.py

    @torch.inference_mode()  # thread-local: set on the thread that computes
    def _forward_all(self, inputs: Sequence[SeqInput]) -> list[torch.Tensor | None]:
        return [self._forward_one(x) for x in inputs]

    def _forward_one(self, x: SeqInput) -> torch.Tensor | None:
        if not x.token_ids:
            return torch.empty(0, self.vocab_size) if x.logits == "all" else None
        if self._lengths[x.seq] + len(x.token_ids) > self.max_context:
            raise ValueError(f"cache would exceed the context length {self.max_context}")
        ids = torch.tensor([list(x.token_ids)], dtype=torch.long, device=self.device)  # [1, T]
        keep = 0 if x.logits == "all" else 1
        out = self.model(input_ids=ids, cache=self._caches[x.seq], use_cache=True, logits_to_keep=keep)
        self._lengths[x.seq] += len(x.token_ids)
        return None if x.logits == "none" else out.logits[0].float().cpu()  # [T, V] or [1, V]

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """`dst` (empty) gets a copy of `src`'s first `length` positions, layer by layer (the same
        keys and values its own prefill would have computed for those tokens alone)."""
        if self._lengths[dst]:
            raise ValueError(f"sequence {dst} is not empty")
        if not 0 <= length <= self._lengths[src]:
            raise ValueError(f"sequence {src} holds {self._lengths[src]} positions, not {length}")
        cache = DynamicCache(config=self.model.config)
        if length:
            for i, layer in enumerate(self._caches[src].layers):  # keys/values [B, heads, T, head_dim]
                cache.update(layer.keys[:, :, :length], layer.values[:, :, :length], i)  # cat: a copy
        self._caches[dst] = cache
        self._lengths[dst] = length

    def truncate(self, seq: int, length: int) -> None:
        cur = self._lengths[seq]
        if length < cur:
            if length == 0:
                self._caches[seq] = DynamicCache(config=self.model.config)
            else:
                self._caches[seq].crop(length - cur)  # negative: number of positions to drop
            self._lengths[seq] = length
