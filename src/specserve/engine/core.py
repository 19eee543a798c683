"""The engine core: every running request advances together, one step at a time.

    step():  retire    cancelled requests leave and free their caches
             admit     waiting requests join while the cache has room for them
             schedule  prefill chunks, each decoding request's draft, trimmed to what pays
             run       one target forward over all of it (ragged: 1 + K tokens per decoding
                       request, a chunk per prefilling one)
             commit    each request verifies its rows, commits, streams; proposers observe
             retire    finished requests leave

Requests are added from any thread; `step()` runs on whichever thread drives the engine (the
caller's for `LLM.generate`, the worker's for the server), one at a time under a lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from ..backends import Backend, SeqInput, SequenceRunner
from ..config import EngineLimits
from ..errors import ContextLengthError, ModelLoadError
from ..proposers.base import ProposerContext, build_chain
from .governor import CALIBRATION_CONTEXT, CALIBRATION_SIZES, CostModel, Governor
from .prices import measured
from .request import DECODE, FINISHED, Request
from .scheduler import Scheduler, StepPlan

SPARE_CELLS = CALIBRATION_CONTEXT + max(CALIBRATION_SIZES)  # what measuring prices holds for a moment


@dataclass(frozen=True)
class StepInfo:
    """What one step did, for metrics: requests in it, tokens fed, cache use, queue depth."""

    decoding: int
    prefilling: int
    tokens: int
    draft_tokens: int
    seconds: float
    cache_used: float  # share of cache cells reserved by running requests
    waiting: int


class EngineCore:
    """Owns the target (and draft) backend, the scheduler and every request in flight."""

    def __init__(self, target: Backend, tokenizer, draft: Backend | None = None,
                 eos_token_ids: set[int] | None = None, limits: EngineLimits | None = None):
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise ModelLoadError(
                f"the draft model's vocabulary ({draft.vocab_size} tokens) differs from the target's "
                f"({target.vocab_size}); pick a draft model of the same family"
            )
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.eos_token_ids = set(eos_token_ids or ())
        limits = limits or EngineLimits()
        # One sequence stays spare for measuring prices while others run (a one-sequence
        # backend measures before its request starts instead).
        seqs = min(limits.max_num_seqs, max(1, target.max_sequences - 1))
        self.limits = replace(limits, max_num_seqs=seqs)
        cache = self.limits.cache_tokens(target.max_context)
        if getattr(target, "cache_tokens", None):  # llama.cpp: cells allocated up front, a few kept spare
            cache = min(cache, target.cache_tokens - (SPARE_CELLS if target.max_sequences > 1 else 0))
        self.scheduler = Scheduler(self.limits, cache)
        self._prices: CostModel | None = None
        self._incoming: deque[Request] = deque()
        self.lock = threading.RLock()
        self.on_step = None  # optional callback(StepInfo), e.g. the server's metrics

    # -- requests in ------------------------------------------------------------------------------
    def make_request(self, prompt_ids, params, spec, prediction=None, constraint=None, should_cancel=None,
                     on_event=None) -> Request:
        """Validate a request and build its proposers (raises InvalidRequestError and the like
        here, on the caller's thread, before anything is queued)."""
        req = Request(list(prompt_ids), params, spec, max_context=self.target.max_context, prediction=prediction,
                      constraint=constraint, should_cancel=should_cancel, on_event=on_event)
        if not self.scheduler.fits_ever(req):
            raise ContextLengthError(f"the request needs {req.reserve} cache cells (prompt + max_tokens) but the "
                                     f"engine's cache holds {self.scheduler.cache_tokens}; lower max_tokens")
        req.draft_runner = SequenceRunner(self.draft) if self.draft is not None else None
        req.chain = build_chain(ProposerContext(spec, params, len(req.prompt_ids), self.tokenizer, prediction,
                                                req.draft_runner, req.generator, prices=lambda: self._prices))
        return req

    def add(self, req: Request) -> None:
        """Queue a request; it joins the running batch at a coming step. Any thread."""
        self._incoming.append(req)

    @property
    def waiting(self) -> int:
        return len(self._incoming) + len(self.scheduler.waiting)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def cache_used(self) -> float:
        """Share of the cache cells reserved by running requests."""
        s = self.scheduler
        return s.reserved / s.cache_tokens if s.cache_tokens else 0.0

    def has_work(self) -> bool:
        return bool(self._incoming or self.scheduler.waiting or self.scheduler.running)

    # -- prices -----------------------------------------------------------------------------------
    def prices(self) -> CostModel:
        """What a pass costs on this machine, measured once on a spare sequence (governor.py), or
        read from the price cache (prices.py)."""
        with self.lock:
            if self._prices is None:
                target, draft = SequenceRunner(self.target), SequenceRunner(self.draft) if self.draft else None
                try:
                    batched = self.target.batches_sequences
                    self._prices = measured(self.target, self.draft, batched,
                                            lambda: CostModel.calibrate(target, draft, batched))
                finally:
                    target.close()
                    if draft is not None:
                        draft.close()
            return self._prices

    def _needs_prices(self, req: Request) -> bool:
        """`auto` requests need them for their governor, a second running request for scheduling.
        A lone plain request never pays for the measurement."""
        return (req.spec.method == "auto" and bool(req.chain)) or bool(self.scheduler.running)

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> None:
        """Advance every running request by one step (see the module docstring)."""
        with self.lock:
            self._retire()
            self._admit()
            self._draft()
            plan = self.scheduler.plan(self._prices if self.running > 1 else None)
            if plan.empty:
                return
            info = self._info(plan)
            start = time.perf_counter()
            logits = self._run(plan)
            seconds = time.perf_counter() - start
            self.scheduler.observe(plan, self._prices, seconds)
            if logits is not None:
                self._commit(plan, logits, seconds)
            self._retire()
            if self.on_step is not None:
                self.on_step(replace(info, seconds=seconds))

    def _admit(self) -> None:
        sched = self.scheduler
        while self._incoming:
            sched.waiting.append(self._incoming.popleft())
        while sched.waiting:
            req = sched.waiting[0]
            if req.should_cancel():
                sched.waiting.popleft().abort()
                self._close(req)
                continue
            if not sched.can_admit(req):
                break
            sched.waiting.popleft()
            try:
                governor = None
                if self._needs_prices(req):  # measured before the request takes its sequence
                    prices = self.prices()
                    if req.spec.method == "auto" and req.chain:
                        governor = Governor(prices)
                req.admit(self.target.new_sequence(), governor, self.tokenizer, self.eos_token_ids,
                          self.target.vocab_size)
            except Exception as e:  # noqa: BLE001 - this request fails; the others run on
                self._fail(req, e)
                continue
            sched.start(req)

    def _draft(self) -> None:
        """Every decoding request asks its proposers for this step's draft."""
        for r in list(self.scheduler.running):
            if r.phase == DECODE:
                try:
                    r.plan_draft()
                except Exception as e:  # noqa: BLE001 - a proposer failed: this request fails
                    self._fail(r, e)

    def _run(self, plan: StepPlan):
        inputs = [SeqInput(r.seq, r.step_tokens(), "all") for r in plan.decode]
        inputs += [SeqInput(r.seq, r.prompt_ids[r.cached : r.cached + n], "none") for r, n in plan.prefill]
        try:
            return self.target.forward(inputs)
        except Exception as e:  # noqa: BLE001 - every request of this pass fails; the engine lives on
            for r in plan.decode + [r for r, _ in plan.prefill]:
                self._fail(r, e)
            return None

    def _commit(self, plan: StepPlan, logits, seconds: float) -> None:
        for r, rows in zip(plan.decode, logits):
            try:
                keep = r.commit(rows, seconds)
                if r.phase != FINISHED:
                    self.target.truncate(r.seq, keep)
            except Exception as e:  # noqa: BLE001
                self._fail(r, e)
        for r, n in plan.prefill:
            try:
                r.prefilled(n)
            except Exception as e:  # noqa: BLE001
                self._fail(r, e)

    def _retire(self) -> None:
        """Requests that finished or were cancelled leave the batch and free their caches."""
        for r in list(self.scheduler.running):
            if r.phase != FINISHED and r.should_cancel():
                r.abort()
            if r.phase == FINISHED:
                self.scheduler.stop(r)
                self.target.free_sequence(r.seq)
                self._close(r)

    def _fail(self, req: Request, error: Exception) -> None:
        req.fail(error)
        if req in self.scheduler.running:
            self.scheduler.stop(req)
            self.target.free_sequence(req.seq)
        self._close(req)

    @staticmethod
    def _close(req: Request) -> None:
        if getattr(req, "draft_runner", None) is not None:
            req.draft_runner.close()

    def abort_all(self) -> None:
        """End every request, queued or running (shutdown)."""
        with self.lock:
            while self._incoming:
                self.scheduler.waiting.append(self._incoming.popleft())
            while self.scheduler.waiting:
                req = self.scheduler.waiting.popleft()
                req.abort()
                self._close(req)
            for r in list(self.scheduler.running):
                r.abort()
            self._retire()

    def fail_all(self, error: Exception) -> None:
        """Fail every request in flight (after an unexpected error in a step)."""
        with self.lock:
            while self._incoming:
                self.scheduler.waiting.append(self._incoming.popleft())
            for r in list(self.scheduler.waiting) + list(self.scheduler.running):
                self._fail(r, error)
            self.scheduler.waiting.clear()

    def _info(self, plan: StepPlan) -> StepInfo:
        return StepInfo(len(plan.decode), len(plan.prefill), plan.tokens, sum(len(r.draft_ids) for r in plan.decode),
                        0.0, self.cache_used, self.waiting)

