"""A synthetic bigram "model" over a small vocabulary, with the runner interface.

Its next-token logits depend only on the last token fed, so the exact distribution of any
output sequence is known in closed form — what the statistical tests compare against.
"""

from __future__ import annotations

import torch


class BigramRunner:
    """Runner whose logits for a fed token t are table[t]. table: [V, V] logits."""

    def __init__(self, table: torch.Tensor, max_context: int = 64):
        self.table = table.float()
        self.vocab_size = table.shape[0]
        self.max_context = max_context
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        self.length += len(token_ids)
        rows = self.table[torch.tensor(token_ids)]  # [T, V]
        return rows[-1:] if last_only else rows

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


def random_table(vocab: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, vocab, generator=g) * scale  # [V, V]
