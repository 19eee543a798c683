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


class BigramBackend:
    """The bigram model as a many-sequence Backend, so statistical tests can run in batches."""

    name = "bigram"
    batches_sequences = True

    def __init__(self, table: torch.Tensor, max_sequences: int = 16, max_context: int = 64):
        self.table = table.float()
        self.vocab_size = table.shape[0]
        self.max_sequences, self.max_context = max_sequences, max_context
        self._lengths: dict[int, int] = {}

    def new_sequence(self) -> int:
        seq = next(i for i in range(self.max_sequences) if i not in self._lengths)
        self._lengths[seq] = 0
        return seq

    def free_sequence(self, seq: int) -> None:
        self._lengths.pop(seq, None)

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def forward(self, inputs):
        out = []
        for x in inputs:
            self._lengths[x.seq] += len(x.token_ids)
            rows = self.table[torch.tensor(list(x.token_ids))]  # [T, V]
            out.append(None if x.logits == "none" else rows if x.logits == "all" else rows[-1:])
        return out

    def truncate(self, seq: int, length: int) -> None:
        self._lengths[seq] = min(self._lengths[seq], length)
