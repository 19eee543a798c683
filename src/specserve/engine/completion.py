"""vLLM's CompletionOutput, Logprob and prompt logprobs, as a view of our flat RequestOutput.

Code ported from vLLM reads `out.outputs[0].text`, `.token_ids`, `.logprobs` and friends; our
RequestOutput keeps those fields on itself (`out.text`). `completion_output` builds the vLLM
shape from them, so the same answer reads both ways. Where ours differs, the docstrings say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .stats import RequestOutput, TokenLogprob


@dataclass
class Logprob:
    """One token's entry in a position's logprobs, as vLLM's Logprob.

    rank: 1 for the most probable token. decoded_token: the token's text decoded alone (None
    where no tokenizer was at hand: outputs made outside `LLM`)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One sample of a request, as vLLM's CompletionOutput.

    logprobs: per token, {token id: Logprob}, the chosen token first, then the top alternatives
    (vLLM's shape); None when the request asked for none. cumulative_logprob: the chosen tokens'
    logprobs summed, None without logprobs (as vLLM's engine). Where ours differs: after a stop
    string, token_ids and logprobs leave out the tokens wholly inside the cut stop string (vLLM
    lists every token through the one that completed it), so both cover `text` only. stop_reason:
    the stop string that ended the answer, None at EOS or length (vLLM's; there are no stop token ids)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


def vllm_logprobs(lps: list[TokenLogprob], token_text: dict[int, str]) -> list[dict[int, Logprob]]:
    """Our per-token logprobs in vLLM's shape. A chosen token that is also a top one keeps its
    place first and its rank (equal to its place among the top, but for ties)."""
    out = []
    for lp in lps:
        entry = {lp.token_id: Logprob(lp.logprob, lp.rank, token_text.get(lp.token_id))}
        for rank, (token, value) in enumerate(lp.top, 1):
            entry.setdefault(token, Logprob(value, rank, token_text.get(token)))
        out.append(entry)
    return out


def vllm_prompt_logprobs(lps: list[TokenLogprob | None], token_text: dict[int, str]) -> list[dict[int, Logprob] | None]:
    """Our per-prompt-token logprobs in vLLM's shape: None where ours is None (the first token,
    which nothing before it scores), else the entry vllm_logprobs gives a generated token."""
    return [None if lp is None else vllm_logprobs([lp], token_text)[0] for lp in lps]


def completion_output(out: RequestOutput, index: int = 0) -> CompletionOutput:
    """The vLLM view of one finished request (one sample: index 0)."""
    lps = out.logprobs
    return CompletionOutput(
        index=index,
        text=out.text,
        token_ids=out.token_ids,
        cumulative_logprob=None if lps is None else sum(lp.logprob for lp in lps),
        logprobs=None if lps is None else vllm_logprobs(lps, out.token_text),
        finish_reason=out.finish_reason,
        stop_reason=out.stop_reason,
    )
