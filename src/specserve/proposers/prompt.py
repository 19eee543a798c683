"""Prompt drafting for `auto` when the caller sent no prediction: the prompt's code is the prediction.

Coding agents often send a whole file and ask for the whole updated file back (aider's "whole"
edit format, for one); the answer then copies the prompt's code with a few edits. That is a
prediction the client never sent, so `auto` treats it as one: the code in the prompt (its
fenced ``` blocks, or the whole prompt when it has no fence but many lines) is the reference
text of a `PredictionProposer` that starts *unanchored* and drafts only once the output's tail
matches that code (at least PROMPT_MIN_ANCHOR characters). From then on it behaves like a
prediction, a more cautious one (see the class): long drafts priced by the cost curve,
re-anchoring after a divergence, learned substitutions. Its steps are counted under their own
source, "prompt", never as prediction tokens. The reference is taken when the request is made
(the server's prep thread), not on the engine's worker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .base import Draft, ProposerContext, register
from .prediction import PredictionProposer

FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
MIN_LINES = 20  # a prompt without a fence is taken as code only when it has this many lines
PROMPT_MIN_ANCHOR = 12  # characters of output that must match the prompt's code before it drafts
PRIOR_YOUNG_PROMPT = (1.0, 4.0)  # (divergences, followed tokens) assumed for a young run before the request shows any


def prompt_code(text: str) -> str:
    """The code a prompt carries: its fenced blocks joined, or the prompt itself when it has no
    fence but at least MIN_LINES lines; "" when it has none."""
    blocks = [m.group(1) for m in FENCE.finditer(text) if m.group(1).strip()]
    if blocks:
        return "\n".join(blocks)
    return text if text.count("\n") >= MIN_LINES else ""


class PromptProposer(PredictionProposer):
    """A prediction drafter whose reference is the prompt's code. Nobody promised that the
    output copies it, so it is more cautious than a caller's prediction: it never drafts from an
    anchor the output has not yet followed (a prediction probes such anchors), and a run that has
    just come back is priced with odds of one divergence in PRIOR_YOUNG_PROMPT tokens (a
    prediction's young runs: one in 16). Replayed on 30 fill-in-the-middle gaps and 30
    whole-file edits under the 2-core EPYC's prices, this took the gaps from 0.95x to 0.99x plain
    decoding (the worst from 0.81x to 0.94x) and the whole files from 2.965x to 2.959x."""

    name = "prompt"
    prior_young = PRIOR_YOUNG_PROMPT

    def __init__(
        self,
        tokenizer,
        prompt_len: int,
        k_init: int = 8,
        k_max: int = 128,
        min_anchor_chars: int = PROMPT_MIN_ANCHOR,
        prices=None,
        learn_edits: bool = True,
        prompt_ids: Sequence[int] = (),
    ):
        super().__init__(tokenizer, "", prompt_len, k_init, k_max, min_anchor_chars, prices, learn_edits)
        self.anchored = False  # nothing to follow until the output matches the prompt's code
        # The prompt's code is read here, where the request is made (the server's prep thread),
        # not on the engine's worker at the first step: for a 3.5k-token prompt this takes about
        # 10 ms, which would stall every request in the batch. Without it there is nothing to draft.
        code = prompt_code(self.tok.decode(list(prompt_ids), skip_special_tokens=True)) if prompt_ids else ""
        if code:
            self.set_text(code)

    def draft_length(self, max_k: int) -> int:
        """No probe of an unconfirmed anchor where drafts are priced: in code written anew (an
        infilled gap) most short anchors are chance matches, and a rejected probe costs about
        two plain steps. The next token the output writes along the prompt confirms it."""
        if not self.trusted and self.prices() is not None:
            return 0
        return super().draft_length(max_k)

    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
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
        ctx.prompt_ids,
    )
