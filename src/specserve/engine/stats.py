"""Per-request speculation statistics and the request output types.

The vocabulary is the one in docs/design.md: a *step* is one target verification pass,
*proposed* draft tokens are sent to it, *accepted* ones matched, and each step commits
accepted + 1 tokens (the recovered or bonus token).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import asdict, dataclass, field

from .completion import CompletionOutput, Logprob, completion_output, vllm_prompt_logprobs

SOURCES = ("prediction", "prompt", "ngram", "draft", "none")  # "none": a step with no draft at all


class _Acceptance:
    """rejected and acceptance rate, derived from `proposed` and `accepted` (fields or properties)."""

    proposed: int
    accepted: int

    @property
    def rejected(self) -> int:
        return self.proposed - self.accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class SourceStats(_Acceptance):
    """Counters for one draft source."""

    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    committed: int = 0  # tokens its steps committed: accepted + 1 each, less where a stop cut the step

    @property
    def tokens_per_step(self) -> float:
        """Tokens committed per step. Not (accepted + steps) / steps: a step that a stop string
        or EOS ends inside its draft commits no bonus token, and that counted one too many."""
        return self.committed / self.steps if self.steps else 0.0

    def to_dict(self) -> dict:
        return {
            "proposed": self.proposed,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "steps": self.steps,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_step": round(self.tokens_per_step, 4),
        }


@dataclass
class SpecStats(_Acceptance):
    """Everything we measured about one request."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache (not prefilled)
    by_source: dict[str, SourceStats] = field(default_factory=lambda: {s: SourceStats() for s in SOURCES})
    tokens_per_step_hist: Counter = field(default_factory=Counter)  # tokens committed per step -> count
    prefill_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    total_time: float = 0.0
    time_to_first_token: float | None = None
    last_step: tuple[str, int, int] | None = None  # (source, proposed, accepted) of the latest step

    def record_step(self, source: str, proposed: int, accepted: int, committed: int) -> None:
        self.last_step = (source, proposed, accepted)
        s = self.by_source[source]
        s.proposed += proposed
        s.accepted += accepted
        s.steps += 1
        s.committed += committed
        self.steps += 1
        self.tokens_per_step_hist[committed] += 1

    @property
    def proposed(self) -> int:
        return sum(s.proposed for s in self.by_source.values())

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.by_source.values())

    @property
    def tokens_per_step(self) -> float:
        return self.output_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per second of generation, prefill excluded."""
        t = self.total_time - self.prefill_time
        return self.output_tokens / t if t > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_step": round(self.tokens_per_step, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "by_source": {k: v.to_dict() for k, v in self.by_source.items() if v.steps},
            "tokens_per_step_hist": {str(k): v for k, v in sorted(self.tokens_per_step_hist.items())},
            "prefill_time": round(self.prefill_time, 4),
            "draft_time": round(self.draft_time, 4),
            "verify_time": round(self.verify_time, 4),
            "total_time": round(self.total_time, 4),
            "time_to_first_token": None if self.time_to_first_token is None else round(self.time_to_first_token, 4),
        }


@dataclass
class TokenLogprob:
    """One token's log-probability, with the top alternatives where asked.

    rank: the token's place in the vocabulary by probability, 1 for the most probable (vLLM's
    Logprob.rank); None only where the engine did not compute it (outputs made by hand)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob), best first
    rank: int | None = None


@dataclass
class StepEvent:
    """What one engine step committed, as streamed to callers.

    token_ids are the tokens whose text this event releases (with logprobs, one per token):
    those committed this step, less any whose text is held back as a possible stop string's
    start (they come with the event that releases their text) or lies wholly inside a cut stop
    string (never listed), so the events joined list RequestOutput.token_ids. sources[i] says
    where token i came from: a draft source name when it was an accepted draft token, "target"
    for the recovered/bonus token. text is the newly releasable text (may be "" while held back).
    """

    token_ids: list[int]
    sources: list[str]
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # "stop" | "length" | None while running
    step_time: float = 0.0


@dataclass
class RequestOutput:
    """The final result of one request.

    Flat: `text`, `token_ids`, `finish_reason`, `logprobs` are the answer's own. `outputs` is
    vLLM's view of the same answer (a list of CompletionOutputs), for code ported from vLLM; with
    SamplingParams(n > 1) it lists every sample, and the flat fields and stats are sample 0's."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: SpecStats
    token_sources: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    steps: list[dict] = field(default_factory=list)  # per-step timeline: source, proposed, accepted, time
    # ours, per prompt token (None for the first); `prompt_logprobs` is vLLM's view of it
    prompt_token_logprobs: list[TokenLogprob | None] | None = None
    # the text of each token the logprobs name, decoded alone (LLM fills it): outputs' decoded_token
    token_text: dict[int, str] = field(default_factory=dict, repr=False, compare=False)
    request_id: str = ""  # the engine's id for the request, as vLLM's (a string)
    prompt: str | None = None  # vLLM's: the text given (LLM fills it), None for token ids
    stop_reason: str | None = None  # the stop string that ended the answer (vLLM's); None at EOS or length
    # samples 1..n-1 of SamplingParams(n=...) through LLM.generate / chat: this output is sample 0
    other_samples: list[RequestOutput] = field(default_factory=list, repr=False)

    # vLLM's generate and chat return a list even for one prompt, so ported code reads out[0]:
    # an output is also a list of one, itself (ours returns it alone; out.text reads as before).
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> RequestOutput:
        if index not in (0, -1):
            raise IndexError(f"index {index}: the output of one prompt is a list of one (as vLLM's)")
        return self

    def __iter__(self):
        yield self

    @property
    def finished(self) -> bool:
        """vLLM's flag: a RequestOutput is only made when its request ends (an abort too)."""
        return self.finish_reason is not None

    @property
    def num_cached_tokens(self) -> int:
        """vLLM's name for cached_tokens."""
        return self.cached_tokens

    @functools.cached_property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's `RequestOutput.outputs`: this answer as a CompletionOutput (index 0), then one for
        each of other_samples (SamplingParams.n). Built once, on first read, from the flat fields."""
        return [completion_output(out, i) for i, out in enumerate([self, *self.other_samples])]

    @functools.cached_property
    def prompt_logprobs(self) -> list[dict[int, Logprob] | None] | None:
        """vLLM's `RequestOutput.prompt_logprobs`: per prompt token None for the first, then
        {token_id: Logprob} with the prompt's token first and the top k after it; None when not
        asked. Built once, on first read, from prompt_token_logprobs (the server reads those)."""
        lps = self.prompt_token_logprobs
        return None if lps is None else vllm_prompt_logprobs(lps, self.token_text)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens reused from the prefix cache (OpenAI's usage.prompt_tokens_details)."""
        return self.stats.cached_tokens

    def to_dict(self) -> dict:
        d = {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }
        if self.logprobs is not None:
            d["logprobs"] = [asdict(lp) for lp in self.logprobs]
        if self.prompt_token_logprobs is not None:
            d["prompt_logprobs"] = [asdict(lp) if lp else None for lp in self.prompt_token_logprobs]
        return d
