"""One request's state inside the engine, from the queue to its last token.

A request lives through four phases, each a method the engine core calls:

    admit    -> a cache sequence and the proposer chain (waiting -> prefill, or -> decode)
    prefill  -> `prefilled(n)` after each chunk of the prompt enters the cache
    decode   -> `plan_draft(limit)`, then the scheduler may `trim_draft(n)`, then the core
                runs one forward over `step_tokens()` and calls `commit(logits)`
    finish   -> stop/EOS/length/abort; the core frees the sequence

Everything here is about this request alone: verification, stop handling, statistics and
what the proposers hear. The decisions that weigh requests against each other live in
scheduler.py.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from collections.abc import Callable

import torch

from ..config import SamplingParams, SpeculationConfig
from ..errors import ContextLengthError, InvalidRequestError
from ..proposers.base import Draft, Proposer, choose_draft
from .detokenize import OutputBuilder
from .governor import Governor
from .sampling import Noise, apply_penalties, bias_vector, draft_prefix_counts, probs_from_logits
from .stats import RequestOutput, SpecStats, StepEvent, TokenLogprob
from .verify import verify_greedy, verify_sampled

_ids = itertools.count()

WAITING, PREFILL, DECODE, FINISHED = "waiting", "prefill", "decode", "finished"
PROBE_EVERY = 8  # a request whose drafts were trimmed away this many steps verifies one in full
PROBE_TOKENS = 8  # ... of at most this many tokens


class Request:
    """What the engine knows about one request. Built (and validated) by the caller's thread;
    every other method runs on the thread that steps the engine.

    on_event: called with each StepEvent on the stepping thread (the server posts it to its
    event loop); events are also queued in `events` for callers that poll.
    """

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        spec: SpeculationConfig,
        *,
        max_context: int,
        prediction: str | list[int] | None = None,
        constraint=None,
        should_cancel: Callable[[], bool] | None = None,
        on_event: Callable[[Request, StepEvent], None] | None = None,
    ):
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        # A prompt may fill the context: the one token written after it is never cached (its
        # logits come from the last prompt position), which is what scoring a full window needs.
        if len(prompt_ids) > max_context:
            raise ContextLengthError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context length is {max_context}"
            )
        self.id = next(_ids)
        self.prompt_ids, self.params, self.spec = list(prompt_ids), params, spec
        self.prediction, self.constraint = prediction, constraint
        self.max_context = max_context
        self._asked = should_cancel
        self.dropped = False  # its caller stopped reading (Generation closed): cancelled like a client gone
        self.callback_error: Exception | None = None  # raised by the caller's should_cancel or on_event
        self.on_event = on_event
        self.events: deque[StepEvent] = deque()
        self.phase = WAITING
        self.output: RequestOutput | None = None
        self.noise = Noise(params.seed if params.seed is not None else random.getrandbits(63))
        self.seq: int | None = None  # the target cache sequence, once admitted
        self.cached = 0  # prompt tokens in the target cache (prefill progress)
        self.above_others = False  # admitted while other sequences held cells: its own may sit above theirs
        # False for choices 1..n-1 of one answer (the server's n): they copy choice 0's prefill, and
        # their reuse is not prefix-cache savings of their own (/health counts as usage does)
        self.counts_reuse = True
        self.chain: list[Proposer] = []
        self.governor: Governor | None = None
        self.error: Exception | None = None  # set when the request failed

    # -- sizes the scheduler reads ------------------------------------------------------------
    @property
    def reserve(self) -> int:
        """Cache cells this request may ever hold: prompt + answer but its last token, which is
        never fed (drafts stop short of it: `room`). Counting that token too refused a scored
        prompt (max_tokens 1) that fills a cache smaller than the context, one cell over it."""
        return min(self.max_context, len(self.prompt_ids) + self.params.max_tokens - 1)

    @property
    def scores_prompt(self) -> bool:
        """Whether the prompt's own logprobs are wanted: every prefill row comes back, and no
        prompt token may come from the prefix cache, whose cells hold no logits."""
        return self.params.prompt_logprobs is not None

    @property
    def prefill_remaining(self) -> int:
        """Prompt tokens still to enter the cache (all but the last, which is the first pending)."""
        return len(self.prompt_ids) - 1 - self.cached

    @property
    def finished(self) -> bool:
        return self.phase == FINISHED

    # -- admit ----------------------------------------------------------------------------------
    def admit(
        self, seq: int, governor: Governor | None, tokenizer, eos_token_ids: set[int], vocab_size: int, cached: int = 0
    ) -> None:
        """Take a cache sequence (the proposers were built with the request); start the clock of
        the request's own stats. cached: prompt tokens the sequence already holds (a prefix
        copied from the prefix cache); only the rest is prefilled."""
        self.seq, self.governor = seq, governor
        self.t0 = time.perf_counter()
        self.stats = SpecStats(prompt_tokens=len(self.prompt_ids), cached_tokens=cached)
        self.cached = cached
        self.builder = OutputBuilder(tokenizer, self.prompt_ids, self.params, eos_token_ids)
        self.counts = torch.zeros(vocab_size) if self.params.has_penalties else None  # [V]
        self.bias = bias_vector(self.params, vocab_size)  # [V] or None
        self.tokens = list(self.prompt_ids)
        self.sources: list[str] = []
        self.logprobs: list[TokenLogprob] | None = [] if self.params.logprobs is not None else None
        self.sent = 0  # output tokens (ids, sources, logprobs) the events have carried (see _released)
        # the prompt's scores: none for its first token, which follows nothing
        self.prompt_logprobs: list[TokenLogprob | None] | None = [None] if self.scores_prompt else None
        self.timeline: list[dict] = []
        self.draft: Draft | None = None
        self.draft_ids: list[int] = []
        self.planned = 0  # draft tokens the proposers offered this step, before any trimming
        self.starved = 0  # steps in a row whose draft was trimmed away entirely
        self.phase = PREFILL
        self.prefilled(0)

    def prefilled(self, n: int, logits: torch.Tensor | None = None) -> None:
        """n more prompt tokens are in the target cache; the proposers catch up with them.
        logits: [n, V], the rows of those positions, when the request wants prompt logprobs
        (row i scores the prompt token after position cached + i)."""
        if self.prompt_logprobs is not None and n:
            following = self.prompt_ids[self.cached + 1 : self.cached + 1 + n]
            self.prompt_logprobs += _logprobs(logits, following, self.params.prompt_logprobs)
        self.cached += n
        for proposer in self.chain:
            proposer.prefill(self.prompt_ids[: self.cached + 1])
        if self.prefill_remaining == 0:
            self.phase = DECODE
            self.stats.prefill_time = time.perf_counter() - self.t0

    # -- decode: draft ------------------------------------------------------------------------
    def room(self) -> int:
        """Draft tokens this step may carry: output and context room left after the pending token."""
        return min(self.params.max_tokens - len(self.builder.token_ids) - 1, self.max_context - len(self.tokens) - 1)

    def plan_draft(self) -> None:
        """Ask the proposer chain for this step's draft (the governor caps `auto` sources)."""
        t = time.perf_counter()
        limit = self.room()
        draft = choose_draft(self.chain, self.tokens, limit, self.governor)
        ids = draft.token_ids[:limit] if draft else []
        if self.constraint is not None:  # cut at the first token the grammar rejects (and plan the row masks)
            ids = self.constraint.cut(
                ids, sampled=not self.params.greedy and draft is not None and draft.probs is not None
            )
        self.draft, self.draft_ids, self.planned = draft, ids, len(ids)
        self.stats.draft_time += time.perf_counter() - t

    def trim_draft(self, n: int) -> None:
        """Verify only the first n draft tokens this step (the scheduler's load decision)."""
        self.draft_ids = self.draft_ids[:n]

    @property
    def trimmable(self) -> bool:
        """Whether the scheduler may shorten this step's draft. Greedy and deterministic drafts
        commit the same tokens at any length (sampled ones use their positions' random numbers).
        A draft model's sampled draft changes which tokens a sampled request commits, so its
        length follows the request's own history only. A seeded request that may draft with one
        keeps every draft, deterministic ones too: under `auto` the governor and each source's K
        follow the drafts as verified, and a trimmed n-gram draft could hand a later step to the
        draft model. A seeded request then samples the same tokens alone and in any batch; an
        unseeded one promises no tokens, only the target's distribution, which a shorter draft
        keeps. A probe is not trimmed either (see `probing`)."""
        sampled_draft = self.draft is not None and self.draft.probs is not None and not self.params.greedy
        return not (sampled_draft or self.seeded_with_draft_model or self.probing)

    @property
    def seeded_with_draft_model(self) -> bool:
        """A seeded sampled request with a draft model among its sources (its drafts can be sampled)."""
        return not self.params.greedy and self.params.seed is not None and any(p.name == "draft" for p in self.chain)

    @property
    def probing(self) -> bool:
        """This step's draft is verified whatever the load (at most PROBE_TOKENS of it), so the
        request's acceptance stays measured: its source's first draft, and a draft after
        PROBE_EVERY steps whose drafts were all trimmed away."""
        if not self.draft_ids:
            return False
        return self.stats.by_source[self.draft.source].proposed == 0 or self.starved >= PROBE_EVERY

    def acceptance(self) -> float:
        """Share of this step's source's draft tokens accepted so far in this request (with a
        prior of 1 in 2 before any): what one more draft token is expected to be worth."""
        if self.draft is None:
            return 0.0
        s = self.stats.by_source[self.draft.source]
        return (s.accepted + 1) / (s.proposed + 2)

    def step_tokens(self) -> list[int]:
        """What this step feeds the target: the pending token, then the draft."""
        return [self.tokens[-1]] + self.draft_ids

    # -- decode: verify and commit ------------------------------------------------------------
    def commit(self, logits: torch.Tensor, step_time: float) -> int:
        """Verify the step's logits [K+1, V], commit, and emit a StepEvent. Returns how many
        tokens of this step stay in the target cache (the caller truncates to it)."""
        draft, draft_ids, params = self.draft, self.draft_ids, self.params
        if self.bias is not None:
            logits = logits + self.bias  # [K+1, V]: every row, as plain decoding biases every step
        if self.counts is not None:
            logits = apply_penalties(logits, draft_prefix_counts(self.counts, draft_ids), params)
        if self.constraint is not None:  # row i: tokens the grammar allows after draft[:i]
            logits = self.constraint.mask(logits)  # [K+1, V]
        n_acc, next_tok = _verify(logits, draft_ids, draft, params, self.noise, len(self.tokens))
        keep = len(self.tokens) + n_acc  # pending + accepted are cached; next_tok is the new pending

        new = draft_ids[:n_acc] + [next_tok]
        src = draft.source if draft and draft_ids else "none"
        committed = 0
        for tok in new:
            committed += 1
            if self.builder.add(tok):
                break
        new = new[:committed]
        new_sources = ([src] * n_acc + ["target"])[:committed]
        self.tokens += new
        self.sources += new_sources
        if self.constraint is not None:
            self.constraint.advance(new)
        if self.counts is not None:
            for tok in new:
                self.counts[tok] += 1
        if self.logprobs is not None:
            self.logprobs.extend(_logprobs(logits, new, params.logprobs))
        # Draft tokens cut by a stop/EOS/max_tokens inside the draft never reach the output:
        # count them as not accepted, so accepted prediction tokens <= completion tokens (the
        # timeline below says the same: it said n_acc, so its steps disagreed with the stats).
        accepted = min(n_acc, committed)
        self.stats.record_step(src, len(draft_ids), accepted, committed)
        self.stats.verify_time += step_time
        if self.governor is not None:
            self.governor.record(src, 1 + len(draft_ids), n_acc + 1)
        heard = Draft(draft_ids, src, None) if src != "none" else None
        for p in self.chain:
            p.observe(self.tokens, heard, n_acc)
        if self.stats.time_to_first_token is None:
            self.stats.time_to_first_token = time.perf_counter() - self.t0
        self.timeline.append(
            {
                "source": src,
                "proposed": len(draft_ids),
                "accepted": accepted,
                "committed": committed,
                "time": round(step_time, 5),
            }
        )
        self.starved = self.starved + 1 if self.planned and not draft_ids else 0
        self.draft, self.draft_ids, self.planned = None, [], 0
        reason = self.builder.finish_reason
        if reason is None and len(self.tokens) >= self.max_context:
            self.builder.finish("length")
        text = self.builder.release()
        self._emit(StepEvent(*self._released(text), self.builder.finish_reason, step_time))
        return keep

    def _released(self, text: str) -> tuple[list[int], list[str], str, list[TokenLogprob] | None]:
        """(token ids, sources, text, logprobs) a stream may show now: the tokens whose text is
        released, so that the tokens of a stop string (held back with its text, then cut) are
        never listed, and the events joined list what RequestOutput does. Before, an event carried
        every token its step committed while its logprobs and text were held back and cut."""
        end = max(self.sent, self.builder.released_tokens)
        ids, sources = self.builder.token_ids[self.sent : end], self.sources[self.sent : end]
        logprobs = None if self.logprobs is None else self.logprobs[self.sent : end]
        self.sent = end
        return ids, sources, text, logprobs

    # -- finish -------------------------------------------------------------------------------
    def should_cancel(self) -> bool:
        """Whether the request is to end now: its caller stopped reading, asked to cancel, or one of
        its callbacks raised. A caller's `should_cancel` or `on_event` that raises ends this request
        with that error; raised in the step, it failed every request in the batch."""
        if self.dropped or self.callback_error is not None:
            return True
        if self._asked is None:
            return False
        try:
            return bool(self._asked())
        except Exception as e:  # noqa: BLE001 - the caller's fault: this request ends with it
            self.callback_error = e
            return True

    def abort(self) -> None:
        """End without another step (cancelled, timed out, or the engine is shutting down); after a
        callback of the caller's raised, with that error."""
        if self.phase == FINISHED:
            return
        if self.callback_error is not None:
            self.fail(self.callback_error)
            return
        if self.phase == WAITING:  # never admitted: nothing was decoded
            self.phase = FINISHED
            self.output = RequestOutput(
                self.prompt_ids, [], "", "abort", SpecStats(len(self.prompt_ids)), request_id=str(self.id)
            )
            self._deliver(StepEvent([], [], "", None, "abort"))
            return
        self.builder.finish("abort")
        text = self.builder.release()
        self._emit(StepEvent(*self._released(text), "abort"))

    def fail(self, error: Exception) -> None:
        """End with an error (a backend or proposer failure): the caller gets `error` raised."""
        if self.phase == FINISHED:
            return
        self.error = error
        self.phase = FINISHED
        self._deliver(StepEvent([], [], "", None, "error"))

    def _emit(self, event: StepEvent) -> None:
        if event.finish_reason is not None:
            self.stats.output_tokens = len(self.builder.token_ids)
            self.stats.total_time = time.perf_counter() - self.t0
            kept = self.builder.kept_tokens  # the tokens of the returned text: a cut stop string's are not listed
            self.output = RequestOutput(
                self.prompt_ids,
                self.builder.token_ids[:kept],
                self.builder.text,
                self.builder.finish_reason,
                self.stats,
                self.sources[:kept],
                None if self.logprobs is None else self.logprobs[:kept],
                self.timeline,
                self.prompt_logprobs,
                request_id=str(self.id),
                stop_reason=self.builder.stop_reason,
            )
            self.phase = FINISHED
        self._deliver(event)

    def _deliver(self, event: StepEvent) -> None:
        self.events.append(event)
        if self.on_event is not None:
            try:
                self.on_event(self, event)
            except Exception as e:  # noqa: BLE001 - not called again: the request ends at the next step
                self.on_event = None
                self.callback_error = self.callback_error or e


def _verify(
    logits: torch.Tensor, draft_ids: list[int], draft: Draft | None, params: SamplingParams, noise: Noise, position: int
):
    """Greedy: exact argmax path. Sampling: lossless rejection sampling with the random numbers
    of the positions from `position` on (that of the first token this step commits). logits: [K+1, V]."""
    if params.greedy:
        v = verify_greedy(logits, draft_ids)
    else:
        probs = probs_from_logits(logits, params)  # [K+1, V]
        q = draft.probs[: len(draft_ids)] if draft is not None and draft.probs is not None else None
        v = verify_sampled(probs, draft_ids, q, noise, position)
    return v.num_accepted, v.next_token


def _logprobs(logits: torch.Tensor, new: list[int], top_n: int) -> list[TokenLogprob]:
    """Log-probabilities of the committed tokens under the (penalised) target logits, with each
    token's rank: 1 + the tokens more probable than it (vLLM's rank; ties share the better one)."""
    lp = torch.log_softmax(logits[: len(new)].float(), dim=-1)  # [n, V]
    out = []
    for i, tok in enumerate(new):
        top = torch.topk(lp[i], top_n) if top_n else None
        pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
        pairs = [(t, v) for t, v in pairs if v != float("-inf")]  # tokens a grammar masked out
        chosen = lp[i, tok]
        out.append(TokenLogprob(tok, float(chosen), pairs, int((lp[i] > chosen).sum()) + 1))
    return out
