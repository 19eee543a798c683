"""The model runner: one causal LM and its KV cache.

forward(tokens) appends tokens to the cache and returns logits for the fed positions;
truncate(length) forgets the cache tail, which is how rejected draft tokens are rolled back.
Everything above this file is model-agnostic: tests and the replay estimator plug in their own
runners with the same four members (length, vocab_size, max_context, forward/truncate/reset).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


class ModelRunner:
    """Owns one Hugging Face causal LM and a single-sequence KV cache."""

    def __init__(self, model: PreTrainedModel, max_context: int | None = None):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        cfg_ctx = getattr(model.config, "max_position_embeddings", None) or 2048
        self.max_context: int = min(max_context, cfg_ctx) if max_context else cfg_ctx
        self.cache = DynamicCache(config=model.config)
        self.length = 0  # tokens held in the cache

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Feed token_ids after the cached ones. Returns float32 logits [T, V] ([1, V] if last_only)."""
        if self.length + len(token_ids) > self.max_context:
            raise ValueError(f"cache would exceed the context length {self.max_context}")
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)  # [1, T]
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        self.length += len(token_ids)
        return out.logits[0].float().cpu()  # [T, V]

    def truncate(self, length: int) -> None:
        """Forget every cached position at or after `length`."""
        if length < self.length:
            self.cache.crop(length - self.length)  # negative: number of positions to drop
            self.length = length
