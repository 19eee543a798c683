"""Keeps `auto` from using a drafter that does not pay for itself on this hardware.

Whether a drafter pays depends on the machine as much as on the text: verifying 16 tokens
costs about 1.2 one-token steps on an AVX-512 CPU in bf16 but 5 or more on a 2-core AVX2 one,
and a draft model's own passes cost a fraction of the target's that also varies. So costs are
measured, once per engine (`CostModel.calibrate`: a few timed forwards of the target and the
draft model), and every step is then priced in units of one plain step:

    cost(step) = target(1 + K) / target(1) + K * draft(1) / target(1)   (draft model)
    cost(step) = target(1 + K) / target(1)                               (n-gram, prediction)

where target(n) is a measured curve (a pass of n tokens, for n = 1 ... 128), not a line.

A plain step commits 1 token for 1 unit. A source that could not reach 1 token per unit even
if every draft were accepted (a draft model whose passes cost too much next to the target's,
on a CPU where every verified token costs nearly a step) is dropped from the request when it is
admitted: no probes (a probe of it could only lose), and the draft model is not even fed the
prompt, so the first token comes as soon as plain decoding's. Otherwise,
per request, the governor keeps moving averages of each source's committed tokens and cost per
step; a source whose tokens per unit fall below 1 sits out (the next source in the chain drafts, or
the step is plain), except for one probe step every `probe_every` steps so that it comes back
when the text turns predictable again.

A draft model must read what it has not seen (the prompt, on its first proposal) before it can
draft; on a CPU that read costs about `draft * target(backlog)` units, ~10 s for a 1k-token
prompt with the 0.5B draft. The governor lets it read only when the saving could repay that: at
the draft model's typical acceptance it saves `1 - 1/value` units per token, over an expected
remaining output taken as long as the output so far (the Lindy estimate: a request that has
written n tokens is likely to write about n more), capped by its `max_tokens` room. The typical
acceptance is measured with the prices: how often the draft model's greedy token is the
target's over a reference passage of prose and code (0.81 for Qwen2.5-Coder 0.5B drafting for
1.5B; 0.68 on its prose, 0.90 on its code). Priced at 0.99 instead, a probe of the draft model on
a 46-token chat answer cost 0.6 of its 3.6 s on a Xeon, where the draft model breaks even at
about 0.77. So a short answer never pays for a draft model's prefill, and a long one starts
using it once it is long enough; a backlog of a few tokens (the usual catch-up after a step) is
always worth reading.

Decisions depend only on the request's own history and the calibrated prices, never on the
wall clock during the request. For a greedy request a draft model's backlog also counts what its
prefix cache already held; a sampled one counts a shared prefix as unread
(`DraftModelProposer.backlog`), so a seeded request that a draft model drafts for (whose
sampled drafts change what it commits) stays reproducible for a given set of prices, on a cold
or a warm server. Only `auto` is
governed, and only the n-gram and draft-model sources: a prediction is the caller's explicit
choice (and its drafts are nearly free to make). Outputs never change either way: which tokens
are drafted does not change what verification commits.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..config import CALIBRATION_CONTEXT, CALIBRATION_SIZES  # the loader sizes caches from them too

GOVERNED = ("ngram", "draft")
SMALL_REPEATS = 3  # passes of <= 8 tokens are short and noisy: take the median of a few
CHEAP_PASS_S = 0.05  # a longer pass this quick (a small model) is noisy too: take the median of SMALL_REPEATS
# A saved prefix pays when saving and restoring a cell costs at most this share of prefilling
# it: the saved entry then pays for itself if one in four is used again (CostModel.copy_pays).
COPY_SHARE = 0.25


def curve_problem(curve: Sequence[tuple[int, float]]) -> str | None:
    """Why `curve` cannot be a CostModel's curve, as the end of "a cost curve ..."; None when it
    can. The one rule for prices read back from disk (prices.sane) and for a curve typed on the
    command line (bench.curves.parse_curve): a curve of one point, or of two at one token count,
    failed every step it priced (IndexError, ZeroDivisionError)."""
    counts, costs = [n for n, _ in curve], [c for _, c in curve]
    if len(curve) < 2:
        return "has at least two points"
    if tuple(curve[0]) != (1, 1.0):
        return "starts at 1:1 (one token costs one plain step)"
    if any(b <= a for a, b in zip(counts, counts[1:])):
        return "has each token count once, rising"
    if not all(math.isfinite(c) for c in costs):
        return "has finite costs"
    if any(c1 < c0 for c0, c1 in zip(costs, costs[1:])):
        return "never gets cheaper as the pass grows"
    return None


@dataclass(frozen=True)
class CostModel:
    """Prices in units of one plain (1-token) target pass.

    curve: (tokens in one pass, cost) points, (1, 1.0) first, non-decreasing; the cost of a
    pass between two points is interpolated, and past the last one extrapolated with its slope.
    On a CPU the curve is far from a line: llama.cpp's kernels change with the row count, so
    8 tokens may cost 6 passes and 128 tokens 45. draft: one 1-token pass of the draft model.
    batched: whether the backend runs many sequences in one pass (llama.cpp) or one pass per
    sequence (transformers), which decides what a step of a batch costs. agreement: how often
    the draft model's greedy token is the target's, measured on a reference passage of prose and
    code (config.AGREEMENT_TEXT); None when not measured (no draft model, no tokenizer).
    copy: what saving one cache cell to host memory and restoring it costs (the prefix cache's
    host tier, llama.cpp's `relocate`); None where the backend cannot copy its cells out. On a
    CPU it is a memory copy, a few hundred times cheaper than prefilling the token again; on a
    GPU llama.cpp copies the cells over the bus row by row, dearer than prefilling them there."""

    curve: tuple[tuple[int, float], ...] = ((1, 1.0), (2, 1.0))
    draft: float = 0.0
    batched: bool = True
    agreement: float | None = None  # draft model's greedy token == target's, share of a reference text's positions
    copy: float | None = None  # one cell saved and restored, in plain passes

    @classmethod
    def linear(cls, per_token: float, draft: float = 0.0, batched: bool = True) -> CostModel:
        """Every token past the first costs `per_token` (tests and back-of-envelope figures)."""
        return cls(((1, 1.0), (2, 1.0 + per_token)), draft, batched)

    def target(self, tokens: int) -> float:
        """Cost of one target pass over `tokens` tokens (0 tokens: no pass)."""
        if tokens <= 0:
            return 0.0
        pts = self.curve
        for (n0, c0), (n1, c1) in zip(pts, pts[1:]):
            if tokens <= n1:
                return c0 + (c1 - c0) * (tokens - n0) / (n1 - n0)
        (n0, c0), (n1, c1) = pts[-2], pts[-1]
        return c1 + (c1 - c0) / (n1 - n0) * (tokens - n1)

    def step(self, fed: int, draft_passes: int) -> float:
        """Cost of a step feeding `fed` tokens to the target after `draft_passes` draft passes."""
        return self.target(fed) + draft_passes * self.draft

    def batch(self, sizes: list[int]) -> float:
        """Cost of one engine step whose sequences feed `sizes` tokens each."""
        if self.batched:
            return self.target(sum(sizes))
        return sum(self.target(n) for n in sizes)

    @property
    def copy_pays(self) -> bool:
        """Whether saving and restoring a cell costs at most COPY_SHARE of prefilling it (per
        token of the curve's longest pass); False where it was not measured."""
        n, cost = self.curve[-1]
        return self.copy is not None and self.copy <= COPY_SHARE * cost / n

    @property
    def per_token(self) -> float:
        """The extra cost of each token of a 32-token pass (a one-number summary for reports)."""
        return (self.target(32) - 1.0) / 31

    @classmethod
    def calibrate(cls, target, draft=None, batched: bool = True, reference: Sequence[int] = ()) -> CostModel:
        """Time passes of CALIBRATION_SIZES tokens on the target runner (and a 1-token pass on
        the draft's), and measure the draft model's agreement on the `reference` token ids (when
        given); both runners are reset afterwards."""
        context = min(CALIBRATION_CONTEXT, target.max_context // 4)
        sizes = tuple(n for n in CALIBRATION_SIZES if context + n <= target.max_context)  # small test models
        copies: list[float | None] = []  # timed on the cells the untimed longest pass leaves: no prefill of its own
        times = _time_passes(target, sizes, context, while_full=lambda r: copies.append(_time_copy(r)))
        t1 = times[0]
        curve, last = [], 1.0
        for n, t in zip(sizes, times):
            last = max(last, t / t1)  # timing noise must not make a longer pass cheaper
            curve.append((n, last))
        d1 = _time_passes(draft, (1,), context)[0] / t1 if draft is not None else 0.0
        agreement = measure_agreement(target, draft, reference) if draft is not None else None
        copy = copies[0]
        return cls(tuple(curve), d1, batched, agreement, None if copy is None else copy / t1)


@dataclass(frozen=True)
class ContextCost:
    """What attention over a long cache adds to a pass, in units of a one-token step after
    CALIBRATION_CONTEXT cached tokens (where the prices are timed): `per_pair` for every token of
    a multi-token pass and every cached token past that context, `per_cached` for a one-token step
    and every such cached token (a lone token reads the whole cache for itself, so it pays more
    per cached token). Reports only: the prices that size drafts stay the short-context ones,
    which choose much the same K (docs/benchmarks.md)."""

    per_pair: float
    per_cached: float
    cached: int  # the context it was timed at

    def extra(self, tokens: int, context: int) -> float:
        """What a pass of `tokens` tokens after `context` cached tokens costs beyond the curve."""
        past = max(0, context - CALIBRATION_CONTEXT)
        return self.per_cached * past if tokens == 1 else self.per_pair * tokens * past


def measure_context_cost(runner, cached: int, tokens: int = 64) -> ContextCost:
    """Time a one-token step and a pass of `tokens` tokens after CALIBRATION_CONTEXT cached
    tokens and after `cached`; what the longer cache adds, per cached token, is the ContextCost
    (never below 0: timing noise must not make a long cache cheaper)."""
    if cached <= CALIBRATION_CONTEXT:  # a context too small to tell anything
        return ContextCost(0.0, 0.0, cached)
    short = _time_passes(runner, (1, tokens), CALIBRATION_CONTEXT)
    long = _time_passes(runner, (1, tokens), cached)
    past, t1 = cached - CALIBRATION_CONTEXT, short[0]
    return ContextCost(
        per_pair=max(0.0, (long[1] - short[1]) / t1 / (tokens * past)),
        per_cached=max(0.0, (long[0] - short[0]) / t1 / past),
        cached=cached,
    )


def measure_agreement(target, draft, ids: Sequence[int]) -> float | None:
    """The share of positions of `ids` (a reference text: the first token is context only) where
    the draft model's greedy next token equals the target's, both reading the same text; None
    for fewer than 2 tokens. A teacher-forced stand-in for greedy acceptance, one pass of each
    model; the runners are reset afterwards."""
    ids = list(ids)[: min(target.max_context, draft.max_context)]
    if len(ids) < 2:
        return None
    target.reset()
    draft.reset()
    try:
        want = target.forward(ids)[:-1].argmax(-1)  # [T-1]: the target's next token after each prefix
        got = draft.forward(ids)[:-1].argmax(-1)  # [T-1]
    finally:
        target.reset()
        draft.reset()
    return float((want == got).float().mean())


def _time_passes(runner, sizes: tuple[int, ...], context: int, while_full=None) -> list[float]:
    """Seconds of one pass of each size after `context` cached tokens: the median of
    SMALL_REPEATS for small sizes and for any pass quicker than CHEAP_PASS_S (a one-off stall
    of a millisecond would otherwise price a small model's whole curve); the runner is reset
    afterwards. The longest pass runs once untimed first, as it will have in a serving engine:
    its first run faults in the memory its logits rows land in (backends/row_buffers.py).
    while_full(runner): called once while the runner holds those context + longest cells, which
    it must leave as they are (calibrate times a copy of them there)."""
    runner.reset()
    runner.forward([1] * context, last_only=True)
    runner.forward([1] * max(sizes))  # untimed: the first pass this long pays to fault in its output memory
    if while_full is not None:
        while_full(runner)
    runner.truncate(context)
    out = []
    for n in sizes:
        runs: list[float] = []
        while len(runs) < SMALL_REPEATS and (n <= 8 or not runs or runs[0] < CHEAP_PASS_S):
            t = time.perf_counter()
            runner.forward([1] * n)
            runs.append(time.perf_counter() - t)
            runner.truncate(context)
        out.append(statistics.median(runs))
    runner.reset()
    return out


def _time_copy(runner) -> float | None:
    """Seconds to save the runner's cells to host memory and restore them, per cell (the median
    of SMALL_REPEATS); None where its backend cannot. The runner holds the same cells afterwards
    (fed again if a restore failed)."""
    backend = getattr(runner, "backend", None)
    if not hasattr(backend, "save_sequence") or not hasattr(backend, "restore_sequence") or not runner.length:
        return None
    cells = runner.length
    runs: list[float] = []
    while len(runs) < SMALL_REPEATS:
        t = time.perf_counter()
        saved = backend.save_sequence(runner.seq)
        if saved is None:
            return None
        backend.truncate(runner.seq, 0)
        if not backend.restore_sequence(runner.seq, saved):
            runner.forward([1] * cells, last_only=True)
            return None
        runs.append(time.perf_counter() - t)
    return statistics.median(runs) / cells


@dataclass
class Governor:
    """One request's view. From the acceptance rate a source has shown in this request (a prior
    of 1 accepted in 2 before it has drafted), it picks the K that maximises the expected tokens
    per unit, (1 - a^(K+1)) / (1 - a) / cost(K); K = 0 (the source sits out) when no K beats a
    plain step by `margin`. A benched source still drafts a small probe every `probe_every`
    steps, so that it comes back when the text turns predictable."""

    prices: CostModel
    prompt_len: int = 0  # tokens before the output: what the request has produced is the rest
    margin: float = 1.0
    probe_every: int = 16
    probe_k: int = 2
    prior: tuple[float, float] = (1.0, 2.0)  # (accepted, proposed) before any draft
    counts: dict[str, list[float]] = field(default_factory=dict)
    _steps: int = 0
    _benched_at: dict[str, int] = field(default_factory=dict)

    def acceptance(self, source: str) -> float:
        accepted, proposed = self.counts.get(source, self.prior)
        return min(accepted / proposed, 0.99)

    def k_cap(self, source: str, k_max: int, tokens: int = 0, backlog: int = 0, room: int | None = None) -> int:
        """How many tokens, at most k_max, `source` may draft in this step (0: none), with `tokens`
        in the sequence so far, `backlog` of them still to be read by the source (a draft model)
        and `room` tokens the request may still write (default k_max)."""
        if source not in GOVERNED or k_max <= 0:
            return k_max
        if self.never_pays(source, k_max):
            return 0  # cannot pay even if always right (a draft model on a CPU where verifying is dear): no probes
        room = k_max if room is None else room
        if backlog > 0 and not self.worth_reading(source, backlog, tokens - self.prompt_len, room, k_max):
            return 0  # reading what it has not seen would cost more than it could save: no probe either
        best_k = self._best_k(source, self.acceptance(source), k_max)
        if best_k:
            self._benched_at.pop(source, None)
            return best_k
        since = self._benched_at.setdefault(source, self._steps)
        probe = (self._steps - since) % self.probe_every == self.probe_every - 1
        return min(self.probe_k, k_max) if probe else 0

    def never_pays(self, source: str, k_max: int) -> bool:
        """Whether `source` could not beat plain decoding even with every draft of up to k_max
        tokens accepted: the engine then drops it from the request before it costs anything (a
        draft model's prefill included)."""
        return source in GOVERNED and not self._best_k(source, 0.99, k_max)

    def worth_reading(self, source: str, backlog: int, produced: int, room: int, k_max: int | None = None) -> bool:
        """Whether `source` could repay reading `backlog` unseen tokens: its saving per token at
        the agreement measured at load (every draft accepted where none was measured; drafts of
        up to k_max, default room) times the expected remaining output (as long as the output so
        far, at most `room`) against the read, priced as the target's curve scaled by the
        draft's 1-token price."""
        a = self.typical_acceptance(source)
        k = self._best_k(source, a, min(room, k_max or room))
        if not k:
            return False
        saving = 1 - 1 / self._value(source, a, k)  # units per output token
        read = self.prices.target(backlog) * (self.prices.draft if source == "draft" else 0.0)
        return min(produced, room) * saving >= read

    def typical_acceptance(self, source: str) -> float:
        """What `source` is expected to reach before it has drafted: the draft model's measured
        agreement where known, else every draft accepted (0.99)."""
        agreement = self.prices.agreement if source == "draft" else None
        return 0.99 if agreement is None else min(agreement, 0.99)

    def _value(self, source: str, a: float, k: int) -> float:
        """Expected tokens per unit of a K-token draft at acceptance a (a draft model also pays K passes)."""
        return (1 - a ** (k + 1)) / (1 - a) / self.prices.step(k + 1, k if source == "draft" else 0)

    def best_k(self, source: str, k_max: int) -> int:
        """The K, at most k_max, with the most expected tokens per unit at the acceptance `source`
        has shown so far; 0 if none beats `margin` (no probes: a caller that wants them uses k_cap)."""
        return self._best_k(source, self.acceptance(source), k_max)

    def _best_k(self, source: str, a: float, k_max: int) -> int:
        """The K with the most expected tokens per unit at acceptance a; 0 if none beats `margin`."""
        best_k, best = 0, self.margin
        for k in range(1, k_max + 1):
            value = self._value(source, a, k)
            if value > best:
                best_k, best = k, value
        return best_k

    def record(self, source: str, fed: int, committed: int) -> None:
        """One finished step: its source, tokens fed to the target, tokens committed."""
        self._steps += 1
        if source in GOVERNED and fed > 1:
            accepted, proposed = self.counts.get(source, list(self.prior))
            self.counts[source] = [accepted + committed - 1, proposed + fed - 1]
