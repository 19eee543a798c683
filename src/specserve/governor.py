"""Keeps `auto` from using a drafter that does not pay for itself on this hardware.

Whether a drafter pays depends on the machine as much as on the text: verifying 16 tokens
costs about 1.2 one-token steps on an AVX-512 CPU in bf16 but 5 or more on a 2-core AVX2 one,
and a draft model's own passes cost a fraction of the target's that also varies. So costs are
measured, once per engine (`CostModel.calibrate`: a few timed forwards of the target and the
draft model), and every step is then priced in units of one plain step:

    cost(step) = target(1 + K) / target(1) + K * draft(1) / target(1)   (draft model)
    cost(step) = target(1 + K) / target(1)                               (n-gram, prediction)

A plain step commits 1 token for 1 unit. A source that could not reach 1 token per unit even
if every draft were accepted (a draft model whose passes cost too much next to the target's,
on a CPU where every verified token costs nearly a step) sits out from the start. Otherwise,
per request, the governor keeps moving averages of each source's committed tokens and cost per
step; a source whose tokens per unit fall below 1 sits out (the next source in the chain drafts, or the step is plain), except for one probe
step every `probe_every` steps so that it comes back when the text turns predictable again.

Decisions depend only on the request's own history and the calibrated prices, never on the
wall clock during the request, so a seeded request stays reproducible. Only `auto` is
governed, and only the n-gram and draft-model sources: a prediction is the caller's explicit
choice (and its drafts are nearly free to make). Outputs never change either way: which tokens
are drafted does not change what verification commits.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

GOVERNED = ("ngram", "draft")
CALIBRATION_CONTEXT = 32  # tokens cached before timing, so attention is not free
CALIBRATION_CHUNK = 32  # the many-token pass timed to price verification


@dataclass(frozen=True)
class CostModel:
    """Prices in units of one plain (1-token) target step.

    per_token: the extra cost of each further token in a target pass; draft: one 1-token pass
    of the draft model."""

    per_token: float = 0.0
    draft: float = 0.0

    def step(self, fed: int, draft_passes: int) -> float:
        """Cost of a step feeding `fed` tokens to the target after `draft_passes` draft passes."""
        return 1.0 + max(fed - 1, 0) * self.per_token + draft_passes * self.draft

    @classmethod
    def calibrate(cls, target, draft=None, repeats: int = 3) -> "CostModel":
        """Time a few forwards of the target (and draft) runners; they are reset afterwards."""
        t1, tk = _time_passes(target, repeats)
        per_token = max(tk - t1, 0.0) / (CALIBRATION_CHUNK - 1) / t1
        d1 = _time_passes(draft, repeats)[0] / t1 if draft is not None else 0.0
        return cls(per_token=per_token, draft=d1)


def _time_passes(runner, repeats: int) -> tuple[float, float]:
    """(median seconds of a 1-token pass, seconds of a CALIBRATION_CHUNK-token pass) after a
    short context; the runner is reset afterwards."""
    runner.reset()
    runner.forward([1] * CALIBRATION_CONTEXT, last_only=True)
    ones = []
    for _ in range(repeats):
        t = time.perf_counter()
        runner.forward([1])
        ones.append(time.perf_counter() - t)
        runner.truncate(CALIBRATION_CONTEXT)
    t = time.perf_counter()
    runner.forward([1] * CALIBRATION_CHUNK)
    chunk = time.perf_counter() - t
    runner.reset()
    return statistics.median(ones), chunk


@dataclass
class Governor:
    """One request's view. From the acceptance rate a source has shown in this request (a prior
    of 1 accepted in 2 before it has drafted), it picks the K that maximises the expected tokens
    per unit, (1 - a^(K+1)) / (1 - a) / cost(K); K = 0 (the source sits out) when no K beats a
    plain step by `margin`. A benched source still drafts a small probe every `probe_every`
    steps, so that it comes back when the text turns predictable."""

    prices: CostModel
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

    def k_cap(self, source: str, k_max: int) -> int:
        """How many tokens `source` may draft in this step (0: none)."""
        if source not in GOVERNED or k_max <= 0:
            return k_max
        a = self.acceptance(source)
        passes = (lambda k: k) if source == "draft" else (lambda k: 0)
        best_k, best = 0, self.margin
        for k in range(1, k_max + 1):
            value = (1 - a ** (k + 1)) / (1 - a) / self.prices.step(k + 1, passes(k))
            if value > best:
                best_k, best = k, value
        if best_k:
            self._benched_at.pop(source, None)
            return best_k
        since = self._benched_at.setdefault(source, self._steps)
        probe = (self._steps - since) % self.probe_every == self.probe_every - 1
        return min(self.probe_k, k_max) if probe else 0

    def record(self, source: str, fed: int, draft_passes: int, committed: int) -> None:
        """One finished step: its source, tokens fed to the target, draft passes, tokens committed."""
        self._steps += 1
        if source in GOVERNED and fed > 1:
            accepted, proposed = self.counts.get(source, list(self.prior))
            self.counts[source] = [accepted + committed - 1, proposed + fed - 1]
