"""The speculative decoding loop for one request.

    prefill target with prompt[:-1]  (the last prompt token is the first *pending* token)
    loop: propose  -> draft tokens from the first proposer in the chain that has some
          verify   -> one target forward over [pending] + draft, accept / reject
          commit   -> accepted + recovered/bonus token, token by token through stop handling
          rollback -> truncate the target cache to the committed length
          stream   -> yield a StepEvent

With method "none" the chain is empty and every step is a plain decoding step: one code path,
so plain and speculative outputs can only differ if verification is wrong.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Iterator

import torch

from .config import SamplingParams, SpeculationConfig
from .detokenize import OutputBuilder
from .errors import ContextLengthError, InvalidRequestError, ModelLoadError
from .governor import CostModel, Governor
from .proposer import Draft, ProposerContext, build_chain, choose_draft
from .sampling import apply_penalties, draft_prefix_counts, probs_from_logits
from .stats import RequestOutput, SpecStats, StepEvent, TokenLogprob
from .verify import verify_greedy, verify_sampled


class Engine:
    """Binds a target runner (and optionally a draft runner) to a tokenizer."""

    def __init__(self, target, tokenizer, draft=None, eos_token_ids: set[int] | None = None):
        self.target = target
        self.draft = draft
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids or ())
        self._prices: CostModel | None = None  # calibrated on the first `auto` request
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise ModelLoadError(
                f"the draft model's vocabulary ({draft.vocab_size} tokens) differs from the target's "
                f"({target.vocab_size}); pick a draft model of the same family"
            )

    def prices(self) -> CostModel:
        """What a step costs on this machine, measured once (a few forwards; see governor.py)."""
        if self._prices is None:
            self._prices = CostModel.calibrate(self.target, self.draft)
        return self._prices

    def generate(self, prompt_ids: list[int], params: SamplingParams, spec: SpeculationConfig,
                 prediction: str | list[int] | None = None,
                 should_cancel: Callable[[], bool] | None = None, constraint=None) -> "Generation":
        """Start a request; iterate the result for StepEvents, then read `.output`.

        constraint: an optional grammar (constrain.Constraint) that cuts drafts, masks the
        verified logits rows and follows the committed tokens."""
        return Generation(self, list(prompt_ids), params, spec, prediction, should_cancel, constraint)


class Generation:
    """One running request: an iterator of StepEvents with the final RequestOutput at the end."""

    def __init__(self, engine: Engine, prompt_ids, params, spec, prediction, should_cancel, constraint=None):
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        ctx = engine.target.max_context
        if len(prompt_ids) >= ctx:
            raise ContextLengthError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context length is {ctx}"
            )
        self.engine, self.prompt_ids, self.params, self.spec = engine, prompt_ids, params, spec
        self.prediction, self.constraint = prediction, constraint
        self.should_cancel = should_cancel or (lambda: False)
        self.generator = torch.Generator().manual_seed(params.seed if params.seed is not None
                                                       else random.getrandbits(63))
        # Built here so that a request the proposers refuse fails before the first step.
        self.chain = build_chain(ProposerContext(spec, params, len(prompt_ids), engine.tokenizer,
                                                 prediction, engine.draft, self.generator))
        self.output: RequestOutput | None = None
        self._events = self._run()

    def __iter__(self) -> Iterator[StepEvent]:
        return self._events

    def __next__(self) -> StepEvent:
        return next(self._events)

    def run(self) -> RequestOutput:
        """Drive the request to the end and return its output."""
        for _ in self._events:
            pass
        return self.output

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> Iterator[StepEvent]:
        eng, params = self.engine, self.params
        target = eng.target
        generator, chain = self.generator, self.chain
        governor = Governor(eng.prices()) if self.spec.method == "auto" and chain else None
        stats = SpecStats(prompt_tokens=len(self.prompt_ids))
        t0 = time.perf_counter()
        builder = OutputBuilder(eng.tokenizer, self.prompt_ids, params, eng.eos_token_ids)
        counts = torch.zeros(target.vocab_size) if params.has_penalties else None  # [V]
        tokens = list(self.prompt_ids)
        sources: list[str] = []
        logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        timeline: list[dict] = []

        target.reset()
        if len(tokens) > 1:
            target.forward(tokens[:-1], last_only=True)
        for proposer in chain:
            proposer.prefill(tokens)
        stats.prefill_time = time.perf_counter() - t0

        while builder.finish_reason is None:
            if self.should_cancel():
                builder.finish("abort")
                break
            if len(tokens) >= target.max_context:
                builder.finish("length")
                break
            step_start = time.perf_counter()
            budget = min(params.max_tokens - len(builder.token_ids) - 1, target.max_context - len(tokens) - 1)
            draft = choose_draft(chain, tokens, budget, governor)
            draft_ids = draft.token_ids[:budget] if draft else []
            if self.constraint is not None:  # (a) cut at the first token the grammar rejects
                draft_ids = self.constraint.cut(draft_ids, sampled=not params.greedy and draft is not None
                                                and draft.probs is not None)
            t_verify = time.perf_counter()
            stats.draft_time += t_verify - step_start

            logits = target.forward([tokens[-1]] + draft_ids)  # [K+1, V]
            if counts is not None:
                logits = apply_penalties(logits, draft_prefix_counts(counts, draft_ids), params)
            if self.constraint is not None:  # (b) row i: tokens the grammar allows after draft[:i]
                logits = self.constraint.mask(logits)  # [K+1, V]
            n_acc, next_tok = _verify(logits, draft_ids, draft, params, generator)
            target.truncate(len(tokens) + n_acc)  # pending + accepted are cached; next_tok is the new pending
            t_done = time.perf_counter()
            stats.verify_time += t_done - t_verify

            new = draft_ids[:n_acc] + [next_tok]
            src = draft.source if draft else "none"
            new_sources = [src] * n_acc + ["target"]
            committed = 0
            for tok in new:
                committed += 1
                if builder.add(tok):
                    break
            new, new_sources = new[:committed], new_sources[:committed]
            tokens += new
            sources += new_sources
            if self.constraint is not None:  # (c) follow the committed tokens
                self.constraint.advance(new)
            if counts is not None:
                for tok in new:
                    counts[tok] += 1
            step_lp = _logprobs(logits, new, params.logprobs) if logprobs is not None else None
            if step_lp:
                logprobs.extend(step_lp)
            # Draft tokens cut by a stop/EOS/max_tokens inside the draft never reach the output:
            # count them as not accepted, so accepted prediction tokens <= completion tokens.
            stats.record_step(src, len(draft_ids), min(n_acc, committed), committed)
            if governor is not None:
                governor.record(src, 1 + len(draft_ids), len(draft_ids) if src == "draft" else 0, n_acc + 1)
            for p in chain:
                p.observe(tokens, Draft(draft_ids, src, None) if draft else None, n_acc)
            if stats.time_to_first_token is None:
                stats.time_to_first_token = time.perf_counter() - t0
            step_time = time.perf_counter() - step_start
            timeline.append({"source": src, "proposed": len(draft_ids), "accepted": n_acc,
                             "committed": committed, "time": round(step_time, 5)})
            event = StepEvent(new, new_sources, builder.release(), step_lp, builder.finish_reason, step_time)
            if builder.finish_reason is not None:
                self._finish(builder, stats, sources, logprobs, timeline, t0)
            yield event

        if self.output is None:  # ended outside a step: cancelled, or the context is full
            tail = builder.release()
            self._finish(builder, stats, sources, logprobs, timeline, t0)
            yield StepEvent([], [], tail, None, builder.finish_reason)

    def _finish(self, builder, stats, sources, logprobs, timeline, t0) -> None:
        stats.output_tokens = len(builder.token_ids)
        stats.total_time = time.perf_counter() - t0
        self.output = RequestOutput(self.prompt_ids, builder.token_ids, builder.text, builder.finish_reason,
                                    stats, sources, logprobs, timeline)


def _verify(logits: torch.Tensor, draft_ids: list[int], draft: Draft | None, params: SamplingParams,
            generator: torch.Generator):
    """Greedy: exact argmax path. Sampling: lossless rejection sampling. logits: [K+1, V]."""
    if params.greedy:
        v = verify_greedy(logits, draft_ids)
    else:
        probs = probs_from_logits(logits, params)  # [K+1, V]
        q = draft.probs[: len(draft_ids)] if draft is not None and draft.probs is not None else None
        v = verify_sampled(probs, draft_ids, q, generator)
    return v.num_accepted, v.next_token


def _logprobs(logits: torch.Tensor, new: list[int], top_n: int) -> list[TokenLogprob]:
    """Log-probabilities of the committed tokens under the (penalised) target logits."""
    lp = torch.log_softmax(logits[: len(new)].float(), dim=-1)  # [n, V]
    out = []
    for i, tok in enumerate(new):
        top = torch.topk(lp[i], top_n) if top_n else None
        pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
        pairs = [(t, v) for t, v in pairs if v != float("-inf")]  # tokens a grammar masked out
        out.append(TokenLogprob(tok, float(lp[i, tok]), pairs))
    return out
