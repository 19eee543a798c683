"""Predicted Outputs drafter: propose the next tokens of a reference text the caller gave us.

While the output follows the prediction token for token, we simply walk a pointer along the
prediction's tokens and propose long drafts (K doubles up to k_max). When the output diverges
(an inserted, changed or deleted line), we *re-anchor*: find the longest tail of the output
text that occurs in the prediction text, nearest to where we were, and resume right after it.
Anchoring works on text, not tokens, because the same text may tokenize differently in context
than on its own; when the anchor falls inside a prediction token, the rest of that token's text
is re-tokenized into a short *bridge* that is drafted before the prediction's own tokens.
"""

from __future__ import annotations

from bisect import bisect_left

from ..engine.detokenize import IncrementalDetokenizer
from .base import AdaptiveK, Draft, ProposerContext, register

TAIL_TOKENS = 48  # how much recent output (in tokens) is decoded to look for an anchor


class PredictionProposer:
    name = "prediction"

    def __init__(self, tokenizer, prediction: str | list[int], prompt_len: int,
                 k_init: int = 8, k_max: int = 128, min_anchor_chars: int = 4):
        self.tok = tokenizer
        self.prompt_len = prompt_len
        self.k = AdaptiveK(k_init, 1, k_max)
        self.min_anchor_chars = min_anchor_chars
        self.need = min_anchor_chars  # anchor length required now: doubles after each wasted draft
        if isinstance(prediction, str):
            self.text = prediction
            enc = tokenizer(prediction, add_special_tokens=False, return_offsets_mapping=True)
            self.ids: list[int] = list(enc["input_ids"])
            self.starts = _token_starts(enc["offset_mapping"])
        else:
            self.ids = list(prediction)
            self.text, self.starts = _decode_with_starts(tokenizer, self.ids)
        self.pos = 0  # next prediction token we expect the output to produce
        self.bridge: list[int] = []  # tokens expected before ids[pos] (re-tokenized partial token)
        self.char_pos = 0  # where in self.text the output currently is
        self.anchored = True  # False after a divergence that found no anchor yet

    def prefill(self, prompt_ids: list[int]) -> None:
        pass  # the prediction was tokenized in __init__

    # -- drafting -------------------------------------------------------------------------
    def expected(self, n: int) -> list[int]:
        """The next n tokens we expect, if the output keeps following the prediction."""
        head = self.bridge[:n]
        return head + self.ids[self.pos : self.pos + n - len(head)]

    def propose(self, tokens: list[int], max_k: int) -> Draft | None:
        if not self.anchored:
            return None
        draft = self.expected(min(self.k.k, max_k))
        return Draft(draft, self.name) if draft else None

    # -- following the output ---------------------------------------------------------------
    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
        committed = num_accepted + 1 if draft is not None else 1
        new = tokens[-committed:]
        if draft is not None and draft.source == self.name:
            self.k.update(len(draft.token_ids), num_accepted)
            # A draft rejected at its first token means the anchor was wrong: trust only longer
            # anchors until one works, so noisy output lets the n-gram / draft model take over.
            self.need = self.min_anchor_chars if num_accepted else min(2 * self.need, 64)
        if self.anchored and new == self.expected(len(new)):
            self._advance(len(new))
            return
        self._reanchor(tokens)

    def _advance(self, n: int) -> None:
        used = min(n, len(self.bridge))
        self.bridge = self.bridge[used:]
        self.pos = min(len(self.ids), self.pos + n - used)
        self.char_pos = self.starts[self.pos] if self.pos < len(self.ids) else len(self.text)

    def _reanchor(self, tokens: list[int]) -> None:
        out = tokens[self.prompt_len :]
        tail = self.tok.decode(out[-TAIL_TOKENS:], skip_special_tokens=True).rstrip("\ufffd")
        end = self._find_anchor(tail)
        if end is None:
            self.anchored = False
            return
        idx = bisect_left(self.starts, end)  # first token starting at or after the anchor
        nxt = self.starts[idx] if idx < len(self.starts) else len(self.text)
        self.bridge = self.tok.encode(self.text[end:nxt], add_special_tokens=False) if nxt > end else []
        self.pos, self.char_pos, self.anchored = idx, end, True
        self.k.restart()

    def _find_anchor(self, tail: str) -> int | None:
        """Char offset in the prediction right after the longest tail of `tail` found in it."""
        lo, hi = 0, len(tail)  # invariant: tail[-lo:] occurs (lo == 0 trivially)
        while lo < hi:  # occurrence is monotone in suffix length: binary search the longest
            mid = (lo + hi + 1) // 2
            if tail[-mid:] in self.text:
                lo = mid
            else:
                hi = mid - 1
        suffix = tail[-lo:]
        if lo == 0 or (lo < self.need and lo < len(tail)) or len("".join(suffix.split())) < 3:
            return None  # too short, or only whitespace/indentation: it would match almost anywhere
        start = self.text.find(suffix, max(0, self.char_pos - lo))  # nearest at or after where we were
        if start < 0:
            start = self.text.rfind(suffix)
        return start + lo


def _token_starts(offsets) -> list[int]:
    """Start char of each token, made non-decreasing (byte-level pieces may share a char)."""
    starts, last = [], 0
    for s, _ in offsets:
        last = max(last, s)
        starts.append(last)
    return starts


def _decode_with_starts(tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """Decode ids and record where each token's text starts (incremental: one short decode per token)."""
    detok = IncrementalDetokenizer(tokenizer, [])
    starts, text = [], ""
    for tok in ids:
        starts.append(len(text))
        text += detok.add(tok)
    return text + detok.flush(), starts


@register("prediction")
def make_prediction(ctx: ProposerContext) -> PredictionProposer | None:
    if ctx.prediction is None or len(ctx.prediction) == 0:
        return None
    s = ctx.spec
    k_init = s.num_speculative_tokens or 8
    return PredictionProposer(ctx.tokenizer, ctx.prediction, ctx.prompt_len, k_init, max(k_init, s.prediction_k_max),
                              s.prediction_min_anchor_chars)
