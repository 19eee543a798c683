"""The engine: requests in, one batched step at a time, tokens out.

core.py          EngineCore.step(): retire -> admit -> draft -> schedule -> run -> commit
request.py       one request's state: prefill progress, draft, verification, stop handling
scheduler.py     admission by cache capacity, prefill chunks, drafts trimmed to what pays
client.py        the worker thread and the small interface the HTTP server talks to

sampling.py      logits -> the distribution sampled from; per-position random numbers (Noise)
verify.py        how many draft tokens the target accepts, and the next token
detokenize.py    committed tokens -> text, with EOS, stop strings and max_tokens
constrain/       grammar constraints (structured outputs) over xgrammar
governor.py      prices a step (CostModel) and keeps `auto` from drafters that do not pay
prices.py        the measured prices kept on disk, keyed by machine and model set-up
prefix_cache.py  requests start from the longest cached prefix of their prompt
draft_prefix.py  the draft model's sequences follow the target's prefix cache
host_cache.py    the prefix cache's second tier, in host memory
host_store.py    the host tier kept on disk between runs
stats.py         per-request statistics and the output types (RequestOutput, StepEvent)
tokenizer.py     one tokenizer copy per thread
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..backends import SequenceRunner, as_backend
from ..config import EngineLimits, SamplingParams, SpeculationConfig
from .core import EngineCore, StepInfo
from .request import FINISHED, Request
from .stats import RequestOutput, StepEvent
from .tokenizer import per_thread


class Engine:
    """A target backend (and optional draft backend) with a tokenizer, ready to generate.

    target/draft: a `Backend`, or a single-sequence `Runner` (tests, the replay oracle), which
    then runs one request at a time."""

    def __init__(
        self, target, tokenizer, draft=None, eos_token_ids: set[int] | None = None, limits: EngineLimits | None = None
    ):
        target = as_backend(target)
        draft = as_backend(draft) if draft is not None else None
        self.core = EngineCore(target, per_thread(tokenizer), draft, eos_token_ids, limits)

    @property
    def eos_token_ids(self) -> set[int]:
        return self.core.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: set[int]) -> None:
        self.core.eos_token_ids = set(ids)

    @property
    def vocab_size(self) -> int:
        return self.core.target.vocab_size

    def prices(self):
        return self.core.prices()

    @property
    def measured_prices(self):
        """The prices if they are known already (never measures them)."""
        return self.core.measured_prices

    def context_cost(self, cached: int):
        """Time what attention over a long cache adds to a pass (benchmark reports only)."""
        return self.core.context_cost(cached)

    @property
    def measured_context_cost(self):
        """The context cost if it was timed (never times it)."""
        return self.core.measured_context_cost

    def clear_prefix_cache(self) -> None:
        """Free every cached prefix of finished requests, in the cache and in host memory
        (benchmark runs start cold)."""
        with self.core.lock:
            if self.core.prefix is not None:
                self.core.prefix.clear()
            if self.core.host is not None:
                self.core.host.clear()

    def save_prefix_cache(self) -> int | None:
        """Write the host tier, with the entries still in the KV cache, to `limits.host_cache_dir`
        (the server does it when it stops). Returns the entries saved; None without a folder."""
        with self.core.lock:
            return self.core.save_host_cache()

    def use_prices(self, prices) -> None:
        """Price steps with this CostModel instead of measuring (the replay simulates a backend
        whose curve was measured elsewhere; a price cache restores one)."""
        with self.core.lock:
            self.core._prices = prices
            self.core._price_copies()

    @contextmanager
    def scratch(self) -> Iterator[SequenceRunner]:
        """A runner on a spare target sequence, for scoring outside any request (benchmarks);
        the engine does not step meanwhile, and the sequence is freed afterwards. Cached prefixes
        leave the cells first, so it may hold what running requests do not reserve (a whole
        context when none runs)."""
        with self.core.lock:
            self.core.evict_entries()
            runner = SequenceRunner(self.core.target)
            try:
                yield runner
            finally:
                runner.close()

    def request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        spec: SpeculationConfig,
        prediction: str | list[int] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        constraint=None,
        on_event=None,
    ) -> Request:
        """A validated request, not yet queued (see `EngineCore.make_request`)."""
        return self.core.make_request(prompt_ids, params, spec, prediction, constraint, should_cancel, on_event)

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        spec: SpeculationConfig,
        prediction: str | list[int] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        constraint=None,
    ) -> Generation:
        """Start a request; iterate the result for StepEvents, then read `.output`.

        constraint: an optional grammar (constrain.Constraint) that cuts drafts, masks the
        verified logits rows and follows the committed tokens."""
        return Generation(self.core, self.request(prompt_ids, params, spec, prediction, should_cancel, constraint))

    def run(self, requests: list[Request]) -> list[RequestOutput]:
        """Run requests together (continuous batching) until all have finished. Left early (a
        KeyboardInterrupt in a notebook, an error from a step), the unfinished ones are released:
        they held their cells and went on decoding inside the next caller's steps."""
        for r in requests:
            self.core.add(r)
        pending = 0  # requests before this one have finished (a rescan per step would be O(n^2) in a big run)
        try:
            while pending < len(requests):
                if requests[pending].finished:
                    pending += 1
                else:
                    self.core.step()
        finally:
            for r in requests[pending:]:
                if r.phase != FINISHED:
                    self.core.release(r)
        for r in requests:
            if r.error is not None:
                raise r.error
        return [r.output for r in requests]


class Generation:
    """One request as an iterator of StepEvents; `.output` holds its RequestOutput at the end.

    Iterating drives the engine (every request in flight advances, not only this one); the
    request joins the engine on the first `next()`. finish: applied once to the output when it is
    first read (LLM fills the fields that need the caller's prompt or the tokenizer)."""

    def __init__(self, core: EngineCore, request: Request, finish: Callable[[RequestOutput], object] | None = None):
        self.core, self.request = core, request
        self._finish = finish
        self._events = _drive(core, request)  # holds no reference back: dropping this closes it

    @property
    def output(self) -> RequestOutput | None:
        out = self.request.output
        if out is not None and self._finish is not None:
            finish, self._finish = self._finish, None
            finish(out)
        return out

    def __iter__(self) -> Iterator[StepEvent]:
        return self._events

    def __next__(self) -> StepEvent:
        return next(self._events)

    def run(self) -> RequestOutput:
        """Drive the request to the end and return its output."""
        for _ in self._events:
            pass
        return self.output

    def close(self) -> None:
        """Stop the request where it is and free what it holds. Dropping the Generation does the
        same, and so does leaving a `with` block around it; a `break` alone leaves it open while
        the variable holds it, and the engine steps it along with the others meanwhile."""
        self._events.close()

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drive(core: EngineCore, req: Request) -> Iterator[StepEvent]:
    """Queue the request and step the engine until it ends, yielding its events. Closed before
    the end (a `break`, an exception in the caller's loop, the Generation dropped), the request
    is cancelled and its sequence freed at once."""
    core.add(req)
    try:
        while True:
            while req.events:
                event = req.events.popleft()
                if req.error is not None:
                    raise req.error
                yield event
                if event.finish_reason is not None:
                    return
            core.step()
    finally:
        if req.phase != FINISHED:
            core.release(req)


__all__ = ["Engine", "EngineCore", "EngineLimits", "Generation", "Request", "StepInfo"]
