"""n-gram / prompt-lookup drafter: continue the latest n-gram as it continued before.

An index maps every n-gram (n in [n_min, n_max]) seen so far to the position just after its
most recent earlier occurrence, so a lookup is O(n_max) per step however long the context.
"""

from __future__ import annotations

from .base import AdaptiveK, Draft, ProposerContext, register


class NgramProposer:
    name = "ngram"

    def __init__(self, n_min: int = 2, n_max: int = 4, k_init: int = 4, k_max: int = 16):
        self.n_min, self.n_max = n_min, n_max
        self.k = AdaptiveK(k_init, 1, k_max)
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token that followed it
        self.indexed = 0  # positions < indexed have had the n-grams ending just before them indexed

    def _extend_index(self, tokens: list[int]) -> None:
        # Index n-grams whose *following* token exists, i.e. those ending at j - 1 for j < len(tokens).
        for j in range(max(self.indexed, 1), len(tokens)):
            for n in range(self.n_min, self.n_max + 1):
                if j - n >= 0:
                    self.index[tuple(tokens[j - n : j])] = j
        self.indexed = len(tokens)

    def prefill(self, prompt_ids: list[int]) -> None:
        self._extend_index(prompt_ids)

    def propose(self, tokens: list[int], max_k: int) -> Draft | None:
        self._extend_index(tokens)
        k = min(self.k.k, max_k)
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(tokens) < n:
                continue
            start = self.index.get(tuple(tokens[-n:]))
            if start is not None:
                cont = continuation(tokens, start, k)
                if cont:
                    return Draft(cont, self.name)
        return None

    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
        if draft is not None and draft.source == self.name:
            self.k.update(len(draft.token_ids), num_accepted)


def continuation(tokens: list[int], start: int, k: int) -> list[int]:
    """Up to k tokens copied from `start` on. A copy that reaches the end stops there, unless the
    text is looping: when the tokens from `start` on already came twice in a row, the copy goes
    round the loop again. Otherwise a loop of period p could only be drafted p tokens at a time,
    however cheap a long pass is (a small model's "```\n" loop: 2 tokens a step on a GPU)."""
    cont = tokens[start : start + k]
    period = len(tokens) - start
    if len(cont) < k and len(tokens) >= 2 * period and tokens[-2 * period : -period] == tokens[-period:]:
        cont = [tokens[start + i % period] for i in range(k)]
    return cont


@register("ngram")
def make_ngram(ctx: ProposerContext) -> NgramProposer:
    s = ctx.spec
    k_init = s.num_speculative_tokens or 4
    return NgramProposer(s.ngram_n_min, s.ngram_n_max, k_init, max(s.ngram_k_max, k_init))
