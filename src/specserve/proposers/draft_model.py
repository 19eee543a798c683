"""Draft-model drafter: a small model of the same vocabulary proposes K tokens.

Greedy requests draft greedily (a deterministic, one-hot draft). Sampled requests draft by
sampling from the small model's distribution with the same temperature / top-k / top-p (each
token with its position's DRAFT random number), and return those probabilities so verification
can apply the exact rejection rule. A request's logit_bias biases the drafts as it biases the
target, so a banned token is not drafted only to be rejected.
The draft model keeps its own KV cache; before each proposal it is rolled back to the longest
prefix it shares with the committed tokens and fed what it has not seen.
"""

from __future__ import annotations

import torch

from ..engine.sampling import DRAFT, Noise, bias_vector, probs_from_logits, sample_at
from ..engine.verify import argmax_rows
from .base import AdaptiveK, Draft, ProposerContext, register


class DraftModelProposer:
    name = "draft"

    def __init__(self, runner, params, noise: Noise, k_init: int = 4, k_max: int = 8):
        self.runner = runner
        self.params = params
        self.noise = noise
        self.k = AdaptiveK(k_init, 1, k_max)
        self.fed: list[int] = []  # tokens in the draft model's cache, in order
        self.committed = 0  # len(tokens) at the last proposal: fed[:committed] are known-good
        self.shared = 0  # prompt tokens another request's draft cache gave us, until we first feed
        self.bias: torch.Tensor | None = None  # [V], made at the first logits when the request has a logit_bias

    def _sync(self, tokens: list[int]) -> torch.Tensor:
        """Roll the cache back to what matches `tokens`, feed the rest; logits of the last token [V]."""
        keep = self.committed
        while keep < min(len(self.fed), len(tokens)) and self.fed[keep] == tokens[keep]:
            keep += 1
        keep = min(keep, len(tokens) - 1)  # always re-feed at least the last token to get its logits
        self.runner.truncate(keep)
        self.fed = tokens[:]
        logits = self.runner.forward(tokens[keep:], last_only=True)  # [1, V]
        self.committed, self.shared = len(tokens), 0
        return self._biased(logits[-1])

    def _biased(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.params.logit_bias:
            return logits
        if self.bias is None:
            self.bias = bias_vector(self.params, logits.shape[-1])  # [V]
        return logits + self.bias  # [V]

    def adopt_prefix(self, prefix: list[int]) -> None:
        """The draft cache was given `prefix` (copied from another request's draft sequence)."""
        self.fed, self.committed, self.shared = list(prefix), len(prefix), len(prefix)

    def backlog(self, tokens: list[int]) -> int:
        """Tokens the next proposal must feed before drafting (all of the prompt the first time),
        as the governor prices them. A sampled request counts a shared prefix as unread: whether
        the draft model drafts changes what a sampled request commits, so that choice must not
        depend on what the prefix cache happened to hold (a seeded request then gives the same
        text on a cold and a warm server)."""
        unread = len(tokens) - self.committed
        return unread if self.params.greedy else unread + self.shared

    def prefill(self, prompt_ids: list[int]) -> None:
        """Nothing: the draft model reads the prompt on its first proposal (`_sync` feeds what it
        has not seen, in n_batch chunks). Under `auto` the governor may never call it, when the
        prediction or the prompt drafts every step, or when the prices say it cannot pay; fed
        during prefill, a 1k-token prompt cost the 0.5B draft ~10 s before the first token
        (docs/benchmarks.md, the Qwen `--session` runs). With `speculation="draft"` the cost is
        the same, paid after the first token instead of before it."""

    def propose(self, tokens: list[int], max_k: int) -> Draft | None:
        k = min(self.k.k, max_k, self.runner.max_context - len(tokens))
        if k <= 0:
            return None
        logits = self._sync(tokens)  # [V]
        ids: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            if self.params.greedy:
                tok = argmax_rows(logits)
            else:
                q = probs_from_logits(logits.unsqueeze(0), self.params)[0]  # [V]
                tok = sample_at(q, self.noise.u(len(tokens) + i, DRAFT))
                probs.append(q)
            ids.append(tok)
            if i + 1 < k:
                logits = self._biased(self.runner.forward([tok], last_only=True)[-1])  # [V]
                self.fed.append(tok)
        return Draft(ids, self.name, torch.stack(probs) if probs else None)  # probs: [K, V]

    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
        if draft is not None and draft.source == self.name:
            self.k.update(len(draft.token_ids), num_accepted)


@register("draft")
def make_draft(ctx: ProposerContext) -> DraftModelProposer | None:
    if ctx.draft_runner is None:
        return None
    s = ctx.spec
    k_init = s.num_speculative_tokens or 4
    return DraftModelProposer(ctx.draft_runner, ctx.params, ctx.noise, k_init, max(k_init, s.draft_k_max))
