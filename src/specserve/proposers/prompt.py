"""Prompt drafting for `auto` when the caller sent no prediction: the prompt's code is the prediction.

Coding agents often send a whole file and ask for the whole updated file back (aider's "whole"
edit format, for one); the answer then copies the prompt's code with a few edits. That is a
prediction the client never sent, so `auto` treats it as one: the code in the prompt (its
fenced ``` blocks, or the whole prompt when it has no fence but many lines) is the reference
text of a `PredictionProposer` that starts *unanchored* and drafts only once the output's tail
matches that code (at least PROMPT_MIN_ANCHOR characters). From then on it behaves like a
prediction: long drafts priced by the cost curve, re-anchoring after a divergence, learned
substitutions. Its steps are counted under their own source, "prompt", never as prediction
tokens.
"""

from __future__ import annotations

import re

from .base import Draft, ProposerContext, register
from .prediction import PredictionProposer

FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
MIN_LINES = 20  # a prompt without a fence is taken as code only when it has this many lines
PROMPT_MIN_ANCHOR = 12  # characters of output that must match the prompt's code before it drafts


def prompt_code(text: str) -> str:
    """The code a prompt carries: its fenced blocks joined, or the prompt itself when it has no
    fence but at least MIN_LINES lines; "" when it has none."""
    blocks = [m.group(1) for m in FENCE.finditer(text) if m.group(1).strip()]
    if blocks:
        return "\n".join(blocks)
    return text if text.count("\n") >= MIN_LINES else ""


class PromptProposer(PredictionProposer):
    name = "prompt"

    def __init__(
        self,
        tokenizer,
        prompt_len: int,
        k_init: int = 8,
        k_max: int = 128,
        min_anchor_chars: int = PROMPT_MIN_ANCHOR,
        prices=None,
        learn_edits: bool = True,
    ):
        super().__init__(tokenizer, "", prompt_len, k_init, k_max, min_anchor_chars, prices, learn_edits)
        self.anchored = False  # nothing to follow until the output matches the prompt's code
        self.loaded = False

    def _load(self, tokens: list[int]) -> None:
        """Take the prompt's code as the reference text (once the whole prompt is known)."""
        self.loaded = True
        code = prompt_code(self.tok.decode(tokens[: self.prompt_len], skip_special_tokens=True))
        if code:
            self.set_text(code)

    def propose(self, tokens: list[int], max_k: int) -> Draft | None:
        return super().propose(tokens, max_k) if self.loaded else None

    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
        if not self.loaded:
            self._load(tokens)
        if self.text:
            super().observe(tokens, draft, num_accepted)


@register("prompt")
def make_prompt(ctx: ProposerContext) -> PromptProposer | None:
    """Only in `auto`, and only without a prediction (a given prediction is the better reference)."""
    if ctx.spec.method != "auto" or (ctx.prediction is not None and len(ctx.prediction) > 0):
        return None
    if ctx.tokenizer is None:
        return None
    s = ctx.spec
    k_init = s.num_speculative_tokens or 8
    return PromptProposer(
        ctx.tokenizer,
        ctx.prompt_len,
        k_init,
        max(k_init, s.prediction_k_max),
        max(PROMPT_MIN_ANCHOR, s.prediction_min_anchor_chars),
        ctx.prices,
        s.prediction_learn_edits,
    )
