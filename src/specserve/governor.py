"""Keeps `auto` from using a drafter that does not pay for itself on this hardware.

Whether a drafter pays depends on the machine as much as on the text: a draft model that
doubles throughput on one CPU can halve it on a 2-core one, where a forward over 8 tokens may
cost 5x a 1-token forward. So the governor measures instead of assuming. Per draft source it
keeps a moving average of the seconds spent per committed token in the steps that source
drafted (drafting + verification), and the same for plain one-token steps. A source whose cost
per token is above plain's sits out (the step is plain, or the next source in the chain
drafts), except for one probe step every `probe_every` steps so that it can come back when
the text becomes predictable again. When plain's cost is unknown or stale, one plain step is
made to measure it: a plain step is never slower than plain decoding.

Only `auto` is governed; an explicitly chosen method always drafts. Output is unaffected
either way: which tokens are drafted never changes what is committed (lossless verification).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLAIN = "none"


@dataclass
class _Cost:
    """A moving average of seconds per committed token, from `n` observed steps."""

    per_token: float = 0.0
    n: int = 0

    def add(self, seconds: float, committed: int, alpha: float) -> None:
        value = seconds / max(committed, 1)
        self.per_token = value if self.n == 0 else (1 - alpha) * self.per_token + alpha * value
        self.n += 1


@dataclass
class Governor:
    """margin: a source must cost at most margin x a plain step per token to keep drafting.
    probe_every: steps between probes of a benched source. plain_every: steps between plain
    measurements (a plain step's cost grows with the context). warmup: steps a source drafts
    before its cost is trusted."""

    margin: float = 1.0
    probe_every: int = 16
    plain_every: int = 128
    warmup: int = 2
    alpha: float = 0.25
    costs: dict[str, _Cost] = field(default_factory=dict)
    _steps: int = 0
    _last_plain: int = -(10**9)
    _benched_since: dict[str, int] = field(default_factory=dict)

    def wants_plain_step(self) -> bool:
        """True when a plain step should be made now to (re)measure plain decoding's cost."""
        drafted = any(c.n >= self.warmup for s, c in self.costs.items() if s != PLAIN)
        return drafted and self._steps - self._last_plain >= self.plain_every

    def allows(self, source: str) -> bool:
        """Whether `source` may draft this step."""
        mine, plain = self.costs.get(source), self.costs.get(PLAIN)
        if mine is None or plain is None or mine.n < self.warmup:
            return True
        if mine.per_token <= self.margin * plain.per_token:
            self._benched_since.pop(source, None)
            return True
        since = self._benched_since.setdefault(source, self._steps)
        if (self._steps - since) % self.probe_every == self.probe_every - 1:
            return True  # a probe: one draft to refresh this source's cost
        return False

    def record(self, source: str, seconds: float, committed: int) -> None:
        """One finished step: who drafted it (PLAIN for none), its seconds, tokens committed."""
        self._steps += 1
        if source == PLAIN:
            self._last_plain = self._steps
        self.costs.setdefault(source, _Cost()).add(seconds, committed, self.alpha)

    def summary(self) -> dict:
        return {s: {"seconds_per_token": round(c.per_token, 5), "steps": c.n} for s, c in self.costs.items()}
