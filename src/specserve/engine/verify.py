"""Verification: decide how many draft tokens the target accepts, and the next token.

Pure functions of tensors. Greedy has its own exact path (argmax match). Sampling uses the
rejection rule of Leviathan et al. / Chen et al., which keeps the output distributed exactly
as the target's: accept draft token x with probability min(1, p(x) / q(x)); at the first
rejection sample the *recovered* token from max(0, p - q) renormalised; if all K are accepted
sample the *bonus* token from p at position K + 1. A deterministic draft (prediction, n-gram,
greedy draft model) has q = one-hot(x): accept with probability p(x), recover from p without x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # leading draft tokens accepted
    next_token: int  # recovered token (after a rejection) or bonus token (all accepted)


def verify_greedy(target_logits: torch.Tensor, draft: list[int]) -> Verdict:
    """target_logits: [K+1, V], row i scores the token after draft[:i]. Exact argmax match."""
    choice = target_logits.argmax(dim=-1).tolist()  # [K+1]
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return Verdict(n, choice[n])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q) renormalised: what p still owes after q's proposals were accepted. [V] -> [V]."""
    r = torch.clamp(p - q, min=0.0)
    total = r.sum()
    if total <= 0:  # p == q up to rounding: a rejection is (almost) impossible; p is the right answer
        return p
    return r / total


def verify_sampled(
    target_probs: torch.Tensor,
    draft: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Lossless rejection sampling.

    target_probs: [K+1, V] processed target distribution per position.
    draft_probs: [K, V] the distribution each draft token was sampled from, or None for a
    deterministic (one-hot) draft.
    """
    k = len(draft)
    if k:
        idx = torch.tensor(draft, dtype=torch.long)  # [K]
        rows = torch.arange(k)
        p_x = target_probs[rows, idx]  # [K]
        q_x = draft_probs[rows, idx] if draft_probs is not None else torch.ones(k)  # [K]
        u = torch.rand(k, generator=generator)  # [K]
        accepted = (u * q_x < p_x).tolist()  # u < p/q without dividing by zero
        n = accepted.index(False) if False in accepted else k
    else:
        n = 0
    if n == k:
        dist = target_probs[k]  # bonus
    else:
        if draft_probs is not None:
            q = draft_probs[n]
        else:
            q = torch.zeros_like(target_probs[n])
            q[draft[n]] = 1.0
        dist = residual(target_probs[n], q)  # recovered
    token = int(torch.multinomial(dist, 1, generator=generator).item())
    return Verdict(n, token)
