"""The transformers backend: a Hugging Face causal LM in torch, one `DynamicCache` per sequence.

It runs each sequence of a forward separately (no padding or ragged attention), which keeps
every sequence's numerics exactly those of running it alone: the exact f32 reference the tests
compare against. Rolling back is `DynamicCache.crop`, which drops the tail without copying.
A sequence's cache can be copied to host memory and back (the prefix cache's host tier,
engine/host_cache.py) as safetensors bytes: restored, it holds the same keys and values bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from transformers import DynamicCache, PreTrainedModel

from .base import SavedSequence, SeqInput
from .compute import on_compute_thread


def _full_cache() -> DynamicCache:
    """An empty cache that keeps every position in every layer. Built from the model's config, a
    sliding-window layer's cache (Gemma 3, Mistral) drops the positions that leave its window: it
    could not be cut back after a rejected draft (transformers raised "`crop` was called, but the
    current layer does not track past states", a 500 on the first rejection past the window), nor
    copied as a prefix. The model's attention mask still keeps those layers to their window."""
    return DynamicCache()


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
        self.trained_context: int = cfg_ctx  # the longest context max_context may be raised to
        self.max_context: int = min(max_context, cfg_ctx) if max_context else cfg_ctx
        self.max_sequences = max_sequences
        self._caches: dict[int, DynamicCache] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0

    @property
    def on_gpu(self) -> bool:
        """Whether the caches live in accelerator memory (a copy to host memory crosses a bus)."""
        return self.device.type != "cpu"

    def new_sequence(self) -> int:
        if len(self._caches) >= self.max_sequences:
            raise RuntimeError(f"all {self.max_sequences} sequences are in use")
        seq, self._next_id = self._next_id, self._next_id + 1
        self._caches[seq] = _full_cache()
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
        cache = _full_cache()
        if length:
            for i, layer in enumerate(self._caches[src].layers):  # keys/values [B, heads, T, head_dim]
                cache.update(layer.keys[:, :, :length], layer.values[:, :, :length], i)  # cat: a copy
        self._caches[dst] = cache
        self._lengths[dst] = length

    def truncate(self, seq: int, length: int) -> None:
        cur = self._lengths[seq]
        if length < cur:
            if length == 0:
                self._caches[seq] = _full_cache()
            else:
                self._caches[seq].crop(length - cur)  # negative: number of positions to drop
            self._lengths[seq] = length

    def save_sequence(self, seq: int) -> SavedSequence | None:
        """A copy of `seq`'s keys and values in host memory (safetensors bytes, one key and one
        value tensor [1, heads, T, head_dim] per layer), the sequence left as it is. None when it
        is empty or a layer does not hold every position (a sliding-window layer past its window)."""
        n = self._lengths[seq]
        if not n:
            return None
        tensors = {}
        for i, layer in enumerate(self._caches[seq].layers):
            if getattr(layer, "keys", None) is None or layer.keys.shape[-2] != n:
                return None
            tensors[f"k{i}"], tensors[f"v{i}"] = layer.keys.contiguous(), layer.values.contiguous()  # cropped: a view
        return SavedSequence(save_tensors(tensors), n)

    def restore_sequence(self, seq: int, saved: SavedSequence) -> bool:
        """Make the empty sequence `seq` hold the saved keys and values, as if it had been fed the
        same tokens. False (`seq` left empty) when the copy does not fit this model: another layer
        count, shape or dtype (a file from another set-up), more positions than the context, or
        bytes that are not a copy at all (a damaged file)."""
        if self._lengths[seq]:
            raise ValueError(f"sequence {seq} is not empty")
        data = saved.data if isinstance(saved.data, bytes) else bytes(saved.data)  # read back from disk: a bytearray
        try:
            tensors = load_tensors(data)
        except Exception:  # noqa: BLE001  safetensors' own error type for bytes that are not its format
            return False
        cache = _full_cache()
        layers = len(tensors) // 2
        if saved.length > self.max_context or layers != self.model.config.num_hidden_layers:
            return False
        for i in range(layers):
            k, v = tensors.get(f"k{i}"), tensors.get(f"v{i}")
            if k is None or v is None or k.dtype != self.dtype or k.shape[-2] != saved.length:
                return False
            cache.update(k.to(self.device), v.to(self.device), i)
        self._caches[seq] = cache
        self._lengths[seq] = saved.length
        return True
