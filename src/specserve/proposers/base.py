"""The drafter interface, the registry of draft sources and the `auto` order.

A proposer answers one question: given the tokens so far (prompt + committed output), what
are up to K next tokens? It returns them as a `Draft`, with the probabilities it sampled them
from only when it sampled (None means deterministic: verification treats it as one-hot).
After every step each proposer hears what was committed, so it can adapt K and re-anchor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ..config import SamplingParams, SpeculationConfig
from ..errors import InvalidRequestError

if TYPE_CHECKING:  # the engine imports the proposers: a run-time import here would be a cycle
    from ..engine.sampling import Noise


@dataclass
class Draft:
    token_ids: list[int]
    source: str  # "prediction" | "prompt" | "ngram" | "draft"
    probs: torch.Tensor | None = None  # [K, V] when sampled, else None (one-hot)


class Proposer(Protocol):
    name: str

    def prefill(self, prompt_ids: list[int]) -> None:
        """The target has cached prompt_ids[:-1] (called after each prefill chunk, with a longer
        prefix each time, ending with the whole prompt): warm caches, build indexes."""

    def propose(self, tokens: list[int], max_k: int) -> Draft | None:
        """Up to max_k draft tokens to follow `tokens`, or None when it has nothing."""

    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
        """Called after each step with all tokens so far (the step's commit included)."""

    # Optional: `backlog(tokens) -> int`, the tokens this proposer must read before it can draft
    # (a draft model's unread prompt). The governor weighs that read; a proposer without the
    # method reads nothing (indexes are built as tokens arrive).


class AdaptiveK:
    """K grows (doubles) while whole drafts are accepted and falls back after a rejection."""

    def __init__(self, k_init: int, k_min: int, k_max: int):
        self.k_init, self.k_min, self.k_max = k_init, k_min, max(k_max, k_min)
        self.k = min(max(k_init, k_min), self.k_max)

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        if accepted == proposed:
            self.k = min(self.k_max, max(self.k, proposed) * 2)
        else:
            self.k = max(self.k_min, min(self.k, accepted + 1))

    def restart(self) -> None:
        self.k = min(max(self.k_init, self.k_min), self.k_max)


@dataclass
class ProposerContext:
    """What a proposer factory may need to build its drafter for one request."""

    spec: SpeculationConfig
    params: SamplingParams
    prompt_len: int
    tokenizer: object | None
    prediction: str | list[int] | None
    draft_runner: object | None
    noise: Noise  # the request's random numbers, keyed by token position
    prices: Callable[[], object] | None = None  # () -> the engine's CostModel, or None while unmeasured
    prompt_ids: Sequence[int] = ()  # the prompt itself (prompt drafting reads its code)


Factory = Callable[[ProposerContext], "Proposer | None"]
REGISTRY: dict[str, Factory] = {}


def register(name: str):
    """Decorator: make a proposer factory available as a speculation method."""

    def wrap(factory: Factory) -> Factory:
        REGISTRY[name] = factory
        return factory

    return wrap


AUTO_ORDER = ("prediction", "prompt", "ngram", "draft")  # "prompt": the prompt's code, when no prediction


def build_chain(ctx: ProposerContext) -> list[Proposer]:
    """Proposers for one request, in the order they are asked (first with a draft wins)."""
    from . import draft_model, ngram, prediction, prompt  # noqa: F401  (fill REGISTRY)

    method = ctx.spec.method
    if method == "none":
        return []
    if method == "draft" and ctx.draft_runner is None:
        raise InvalidRequestError("speculation method 'draft' needs a draft model (load one with draft_model=...)")
    names = AUTO_ORDER if method == "auto" else (method,)
    chain = [REGISTRY[n](ctx) for n in names]
    return [p for p in chain if p is not None]


def largest_draft(proposer: Proposer) -> int:
    """The most tokens a proposer will ever draft in one step: its own ceiling where it has one
    (a prediction's priced K goes up to `prediction_k_max`, past its adaptive K's 128), else its
    adaptive K's."""
    ceiling = getattr(proposer, "k_max", None)
    return ceiling if ceiling is not None else getattr(getattr(proposer, "k", None), "k_max", 128)


def choose_draft(chain: list[Proposer], tokens: list[int], max_k: int, governor=None) -> Draft | None:
    """Ask each proposer in order; the first non-empty draft wins. A `governor.Governor` (auto
    only) caps each source's K to what pays on this machine, or skips it."""
    if max_k <= 0:
        return None
    for proposer in chain:
        if governor is None:
            k = max_k
        else:
            # K is priced up to the proposer's own ceiling, not the whole room: a chat request
            # without max_tokens has a room of the rest of the context, and pricing every K up to
            # 30k cost the governor ~100 ms a step
            backlog = proposer.backlog(tokens) if hasattr(proposer, "backlog") else 0
            cap = min(max_k, largest_draft(proposer))
            k = governor.k_cap(proposer.name, cap, len(tokens), backlog, room=max_k)
        if k <= 0:
            continue
        draft = proposer.propose(tokens, k)
        if draft is not None and draft.token_ids:
            return draft
    return None
