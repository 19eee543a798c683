"""Turning target logits into the distribution we sample from.

Every function here is applied identically to plain and speculative decoding, row by row,
so that speculation cannot change the output distribution.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

from ..config import SamplingParams

# Below this, logits / temperature may overflow float32 (a temperature of 5e-324 is 0 in float32)
# and softmax returns NaN: logits reach ~3e5 at most (a frequency penalty of 2 over a 128k-token
# answer, plus a bias of 100), 3e35 over this floor, well inside float32. Any temperature under it
# is the argmax's distribution already, to float32 precision. (It was 1e-4, which took a request's
# temperature of 1e-5 as ten times larger.)
MIN_TEMPERATURE = 1e-30


def bias_vector(params: SamplingParams, vocab_size: int) -> torch.Tensor | None:
    """The request's logit_bias as a dense [V] float32 row, or None without one."""
    if not params.logit_bias:
        return None
    bias = torch.zeros(vocab_size)  # [V]
    ids, values = zip(*params.logit_bias)
    bias[list(ids)] = torch.tensor(values)
    return bias


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """OpenAI presence/frequency penalties.

    logits: [T, V] float32; counts: [T, V] how often each token already appeared in the
    output before each row's position. Returns a new [T, V] tensor.
    """
    return logits - counts * params.frequency_penalty - (counts > 0).to(logits.dtype) * params.presence_penalty


def draft_prefix_counts(base: torch.Tensor, draft: list[int]) -> torch.Tensor:
    """Per-row output token counts for a verify batch of len(draft) + 1 positions.

    base: [V] counts of the committed output. Row i adds the first i draft tokens, because
    position i is scored as if draft[:i] had already been generated.
    Returns [K+1, V].
    """
    counts = base.unsqueeze(0).repeat(len(draft) + 1, 1)  # [K+1, V]
    for i, tok in enumerate(draft):
        counts[i + 1 :, tok] += 1
    return counts


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p; returns probabilities [T, V] (float32).

    Must not be called for greedy requests: greedy has its own exact argmax path.
    """
    assert params.temperature > 0, "greedy requests take the argmax path"
    x = logits.float() / max(params.temperature, MIN_TEMPERATURE)  # [T, V]
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [T, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)  # [T, V]
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # probability mass ranked above each token
        drop_sorted = mass_before >= params.top_p  # keep the smallest prefix whose mass reaches top_p
        drop_sorted[..., 0] = False  # a top_p below float32's resolution (5e-324) must still keep the top token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


# -- random numbers keyed by position -----------------------------------------------------------
SAMPLE, ACCEPT, DRAFT = 0, 1, 2  # independent streams: the committed token, an accept test, a draft


@dataclass(frozen=True)
class Noise:
    """A request's random numbers, each fixed by (seed, token position, stream) rather than drawn
    from a running stream. The token at position i is sampled with `u(i)` whatever happened
    before it, so a seeded request gives the same tokens with or without deterministic drafts
    (prediction, prompt, n-gram), at any draft length, alone or in any batch, in any process."""

    seed: int

    def u(self, position: int, stream: int = SAMPLE) -> float:
        """A uniform number in [0, 1) with 53 random bits."""
        key = struct.pack("<QQQ", self.seed & 0xFFFFFFFFFFFFFFFF, position, stream)
        word = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
        return (word >> 11) * 2.0**-53


def sample_at(probs: torch.Tensor, u: float) -> int:
    """The token whose slice of the cumulative distribution holds u (inverse-CDF sampling).
    probs: [V], need not sum to exactly 1. Only tokens with probability > 0 can come out."""
    cdf = probs.double().cumsum(0)  # [V]; float64 so 151k float32 terms add up without drift
    idx = int(torch.searchsorted(cdf, u * float(cdf[-1]), right=True))
    return min(idx, probs.shape[0] - 1)
