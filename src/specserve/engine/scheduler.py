"""Which requests run in the next step, and how many tokens each feeds the target.

    admit     waiting requests join while the cache (`kv_cache_tokens`) and `max_num_seqs` allow
    prefill   prompts enter the cache in chunks; a prompt joining a running batch gets chunks
              sized so that the step costs at most `prefill_slowdown` times a step without it
    draft     each decoding request asks its proposers for a draft (its own history decides K)
    trim      with several decoding requests, drafts are cut back to what pays: see `trim_drafts`

Costs come from the engine's measured `CostModel` (a pass of n tokens, in plain steps).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..config import EngineLimits
from .governor import CostModel
from .request import DECODE, PREFILL, PROBE_TOKENS, Request

# A prefill chunk of a request that wants prompt logprobs returns a logits row per token (600 KB
# each for a 151k vocabulary): 256 of them are 156 MB, 2048 would be 1.2 GB.
PROMPT_LOGPROBS_CHUNK = 256


@dataclass
class StepPlan:
    """One step: decoding requests (pending token + draft each) and prefill chunks."""

    decode: list[Request] = field(default_factory=list)
    prefill: list[tuple[Request, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill

    @property
    def sizes(self) -> list[int]:
        """Tokens each sequence feeds the target: 1 + K per decoding request, then the chunks."""
        return [1 + len(r.draft_ids) for r in self.decode] + [n for _, n in self.prefill]

    @property
    def tokens(self) -> int:
        return sum(self.sizes)


class Scheduler:
    """The waiting queue, the running set and the cache reservations."""

    def __init__(self, limits: EngineLimits, cache_tokens: int):
        self.limits, self.cache_tokens = limits, cache_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.reserved = 0  # cache cells promised to running requests
        self.pacer = PrefillPacer(limits.prefill_slowdown)
        self.measured = StepTimes()
        self.throttled = False  # whether the last plan paced its prefill chunks

    # -- admission ------------------------------------------------------------------------------
    def can_admit(self, req: Request) -> bool:
        """Room for one more sequence and for its whole prompt + answer in the cache."""
        return len(self.running) < self.limits.max_num_seqs and self.reserved + req.reserve <= self.cache_tokens

    def fits_ever(self, req: Request) -> bool:
        """Whether the request could run on an empty engine (else it would wait forever)."""
        return req.reserve <= self.cache_tokens

    def start(self, req: Request) -> None:
        self.running.append(req)
        self.reserved += req.reserve

    def stop(self, req: Request) -> None:
        self.running.remove(req)
        self.reserved -= req.reserve

    # -- one step -------------------------------------------------------------------------------
    def plan(self, prices: CostModel | None) -> StepPlan:
        """Size the prefill chunks and trim the decoding requests' drafts to what pays (each
        decoding request has planned its draft already). prices: None for a lone request."""
        decode = [r for r in self.running if r.phase == DECODE]
        budget = self.limits.max_num_batched_tokens - len(decode)
        prefill = self._prefill_chunks(len(decode), budget, prices)
        if len(decode) > 1 and prices is not None:
            trim_drafts(
                decode, [n for _, n in prefill], self.measured.correct(prices), budget - sum(n for _, n in prefill)
            )
        return StepPlan(decode, prefill)

    def observe(self, plan: StepPlan, prices: CostModel | None, seconds: float) -> None:
        """A step ran (its drafts not yet committed): feed its time to the pacer and StepTimes."""
        self.pacer.observe(len(plan.decode), sum(n for _, n in plan.prefill), self.throttled, seconds)
        self.measured.observe(plan.sizes, prices, seconds)

    def _prefill_chunks(self, decoding: int, budget: int, prices: CostModel | None) -> list[tuple[Request, int]]:
        """Prompt chunks for this step, oldest request first.

        A prompt joining a running batch is chunked so the running streams' steps slow down by
        at most `prefill_slowdown`. A burst of arrivals (as many prompts to prefill as streams
        decoding, or more) is prefilled with the whole budget instead: the batch fills at the
        prefill rate, which is what the streams that just started are waiting for too."""
        prefilling = sum(r.phase == PREFILL for r in self.running) + len(self.waiting)
        self.throttled = bool(decoding and prices is not None and prefilling < decoding)
        if self.throttled:
            budget = min(
                budget,
                max(self.limits.min_prefill_chunk, self.pacer.scale(prefill_allowance(decoding, prices, self.limits))),
            )
        chunks = []
        for r in self.running:
            if r.phase == PREFILL and budget > 0:
                n = min(r.prefill_remaining, budget)
                if r.scores_prompt:  # every row comes back: 151k floats each
                    n = min(n, PROMPT_LOGPROBS_CHUNK)
                chunks.append((r, n))
                budget -= n
        return chunks


class StepTimes:
    """What steps of each size really cost, next to what the price curve says.

    The curve is measured on one sequence with a short cache. A batch step also pays attention
    over every running sequence's cache (llama.cpp's unified cache), so wide steps cost more
    than the curve says, more so as caches grow. Every step's seconds over its curve price are
    kept per power-of-two token count (a moving average); `correct(prices)` gives prices scaled
    by the factor measured nearest each size, so the next decisions use what this machine did."""

    def __init__(self):
        self.factor: dict[int, float] = {}  # log2 bucket of a step's tokens -> seconds per curve unit

    def observe(self, sizes: list[int], prices: CostModel | None, seconds: float) -> None:
        if prices is None or not sizes:
            return
        bucket = max(sum(sizes), 1).bit_length()
        ratio = seconds / prices.batch(sizes)
        old = self.factor.get(bucket)
        self.factor[bucket] = ratio if old is None else 0.7 * old + 0.3 * ratio

    def correct(self, prices: CostModel) -> CorrectedCosts:
        return CorrectedCosts(prices, dict(self.factor))


class CorrectedCosts:
    """A CostModel's `batch` scaled by measured factors (units become seconds where measured)."""

    def __init__(self, prices: CostModel, factor: dict[int, float]):
        self.prices, self.factor = prices, factor

    def batch(self, sizes: list[int]) -> float:
        if not self.factor:
            return self.prices.batch(sizes)
        bucket = max(sum(sizes), 1).bit_length()
        near = min(self.factor, key=lambda b: (abs(b - bucket), -b))  # the nearest measured size
        return self.prices.batch(sizes) * self.factor[near]


PACER_AIM = 0.75  # aim below the slowdown, so that the slowest steps (p99) stay within it


class PrefillPacer:
    """Corrects the prefill allowance with measured step times.

    The price curve is measured on one sequence with a short cache; a prompt joining a batch
    also pays attention over its own growing cache, so its chunks cost more than the curve says,
    more so as it fills. After every step the pacer compares the step's time with the latest
    step without prefill, and scales the allowance down (or back up) so that steps with a chunk
    take `slowdown` times a step without one. Only chunk sizes follow the clock: outputs never do.
    """

    def __init__(self, slowdown: float):
        self.slowdown = slowdown
        self.factor = 1.0  # measured correction of the curve's allowance
        self.plain_s: float | None = None  # the latest decode-only step time
        self.plain_batch = 0

    def scale(self, allowance: int) -> int:
        return int(allowance * self.factor)

    def observe(self, decoding: int, prefill_tokens: int, throttled: bool, seconds: float) -> None:
        if decoding and not prefill_tokens:
            if decoding != self.plain_batch or self.plain_s is None:
                self.plain_s, self.plain_batch = seconds, decoding
            else:
                self.plain_s = 0.7 * self.plain_s + 0.3 * seconds
        elif throttled and self.plain_s and decoding == self.plain_batch:
            ratio = seconds / self.plain_s
            self.factor = min(4.0, max(0.01, self.factor * min(1.5, max(0.5, self.slowdown * PACER_AIM / ratio))))


def prefill_allowance(decoding: int, prices: CostModel, limits: EngineLimits) -> int:
    """The largest prefill chunk that keeps a step of `decoding` one-token requests within
    `prefill_slowdown` times its cost without the chunk (at least `min_prefill_chunk`)."""
    base = [1] * decoding
    limit = limits.prefill_slowdown * prices.batch(base)
    lo, hi = 0, limits.max_num_batched_tokens  # cost grows with the chunk: binary search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if prices.batch(base + [mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return max(lo, limits.min_prefill_chunk)


def trim_drafts(decode: list[Request], prefill: list[int], prices: CostModel, budget: int) -> None:
    """Cut drafts so that the step's expected committed tokens per unit of cost is the best
    this step can reach, and never worse than plain batched decoding.

    Every draft token is worth its request's acceptance so far (`Request.acceptance`); pending
    tokens are worth 1. Draft tokens are taken most valuable first, and the step keeps the
    prefix with the highest (expected tokens) / (step cost): a token that costs more than it
    brings, at this batch size and on this machine, is not verified. Only greedy requests are
    trimmed (`Request.trimmable`); the others' drafts are fixed costs of the step, and a probe
    (`Request.probing`) is cut to PROBE_TOKENS. `budget`: draft tokens the step may still carry."""
    for r in decode:
        if r.params.greedy and r.probing:
            r.trim_draft(PROBE_TOKENS)
    sizes = [1 + (0 if r.trimmable else len(r.draft_ids)) for r in decode] + list(prefill)
    value = sum(1 + (0 if r.trimmable else r.acceptance() * len(r.draft_ids)) for r in decode)
    budget -= sum(len(r.draft_ids) for r in decode if not r.trimmable)
    candidates = sorted(
        ((r.acceptance(), i) for i, r in enumerate(decode) if r.trimmable for _ in range(len(r.draft_ids))),
        key=lambda c: -c[0],
    )
    best, best_m = value / prices.batch(sizes), 0
    for m, (a, i) in enumerate(candidates[: max(budget, 0)], start=1):
        sizes[i] += 1
        value += a
        ratio = value / prices.batch(sizes)
        if ratio > best:
            best, best_m = ratio, m
    keep = [0] * len(decode)
    for _, i in candidates[:best_m]:
        keep[i] += 1
    for i, r in enumerate(decode):
        if r.trimmable:
            r.trim_draft(keep[i])
