"""Keeps `auto` from using a drafter that does not pay for itself on this hardware.

Whether a drafter pays depends on the machine as much as on the text: verifying 16 tokens
costs about 1.2 one-token steps on an AVX-512 CPU in bf16 but 5 or more on a 2-core AVX2 one,
and a draft model's own passes cost a fraction of the target's that also varies. So costs are
measured, once per engine (`CostModel.calibrate`: a few timed forwards of the target and the
draft model), and every step is then priced in units of one plain step:

    cost(step) = target(1 + K) / target(1) + K * draft(1) / target(1)   (draft model)
    cost(step) = target(1 + K) / target(1)                               (n-gram, prediction)

A plain step commits 1 token for 1 unit. Per request, the governor keeps moving averages of
each source's committed tokens and cost per step; a source whose tokens per unit fall below 1
sits out (the next source in the chain drafts, or the step is plain), except for one probe
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
class _Average:
    """Moving averages of a source's committed tokens and cost per step, from `n` steps."""

    committed: float = 0.0
    cost: float = 1.0
    n: int = 0

    def add(self, committed: int, cost: float, alpha: float) -> None:
        if self.n == 0:
            self.committed, self.cost = float(committed), cost
        else:
            self.committed = (1 - alpha) * self.committed + alpha * committed
            self.cost = (1 - alpha) * self.cost + alpha * cost
        self.n += 1

    @property
    def tokens_per_unit(self) -> float:
        return self.committed / self.cost


@dataclass
class Governor:
    """One request's view: margin (tokens per unit a source must keep), probe_every (steps
    between probes of a benched source), warmup (steps before a source's average is trusted)."""

    prices: CostModel
    margin: float = 1.0
    probe_every: int = 16
    warmup: int = 3
    alpha: float = 0.3
    averages: dict[str, _Average] = field(default_factory=dict)
    _steps: int = 0
    _benched_at: dict[str, int] = field(default_factory=dict)

    def allows(self, source: str) -> bool:
        """Whether `source` may draft in this step."""
        avg = self.averages.get(source)
        if source not in GOVERNED or avg is None or avg.n < self.warmup:
            return True
        if avg.tokens_per_unit >= self.margin:
            self._benched_at.pop(source, None)
            return True
        since = self._benched_at.setdefault(source, self._steps)
        return (self._steps - since) % self.probe_every == self.probe_every - 1  # a probe

    def record(self, source: str, fed: int, draft_passes: int, committed: int) -> None:
        """One finished step: its source, tokens fed to the target, draft passes, tokens committed."""
        self._steps += 1
        cost = self.prices.step(fed, draft_passes)
        self.averages.setdefault(source, _Average()).add(committed, cost, self.alpha)

    def summary(self) -> dict:
        return {s: {"tokens_per_unit": round(a.tokens_per_unit, 3), "steps": a.n} for s, a in self.averages.items()}
