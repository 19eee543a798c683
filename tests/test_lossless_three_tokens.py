"""Losslessness over three tokens, with penalties, logit bias, top-k and a low temperature, for
every kind of draft: the law of the first three output tokens (chi-square against the exact law
in closed form, on the synthetic V = 6 bigram target).

Three tokens, because the third row is penalised for the first two, one of which may have been
committed by an earlier step than the one that samples it: the penalty of a row must count the
draft tokens before it within a step (as if generated), and, after a step, only the tokens it
committed, never the draft tokens it rejected. Each case runs with a draft model (a sampled
draft: the rejection rule proper), an n-gram draft (one-hot, deterministic) and `auto` (both,
step by step).

Every check was first shown to FAIL against deliberately broken samplers, and the last tests
keep showing it: a sampler that accepts every draft token (n-gram and auto: chi-square p = 0 to
float precision; draft model: it wrote a sequence of probability 0), one that recovers from p
instead of the residual max(0, p - q) (draft: joint p ~ 1e-56; auto ~ 1e-49), and one whose
penalty counts rejected draft tokens as written (every method: a sequence of probability 0,
the wrongly penalised row moving a token into the top k). The correct sampler's smallest
p-value over the four checks was 0.015 (draft), 0.47 (n-gram) and 0.36 (auto).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from synthetic import BigramRunner, random_table
from tiny import tiny_tokenizer

import specserve.engine.request as request_module
import specserve.engine.verify as verify
from specserve import SamplingParams, SpeculationConfig
from specserve.engine import Engine
from specserve.engine.governor import CostModel
from specserve.engine.sampling import apply_penalties, bias_vector, probs_from_logits

V = 6
N = 5000
MAX_TOKENS = 4
PASS_P = 1e-3  # a correct sampler fails a check with probability 0.1% (the seeds are fixed: it does not)
BROKEN_P = 1e-6
# "5 0" recurs, so the n-gram drafter proposes [1, 2, 5] first, and again after any output that
# continues a bigram of the prompt; under `auto` the draft model drafts where it has nothing
PROMPT = [5, 0, 1, 2, 5, 0]
PARAMS = SamplingParams(
    temperature=0.7, top_k=4, presence_penalty=1.2, frequency_penalty=0.8, logit_bias={1: 1.0, 4: -0.5}
)


def target_table() -> torch.Tensor:
    return random_table(V, seed=11)


def draft_table() -> torch.Tensor:
    return random_table(V, seed=13)


def exact_law(params: SamplingParams) -> np.ndarray:
    """P(x1, x2, x3 | the prompt) under the target, each row biased, penalised for the output
    before it, then tempered and cut to the top k. [V, V, V]"""
    biased = target_table() + bias_vector(params, V)  # [V, V]: row t = logits after t

    def row(last: int, written: list[int]) -> np.ndarray:
        counts = torch.zeros(1, V)
        for t in written:
            counts[0, t] += 1
        return probs_from_logits(apply_penalties(biased[last : last + 1], counts, params), params)[0].double().numpy()

    law = np.zeros((V, V, V))
    p1 = row(PROMPT[-1], [])
    for a in range(V):
        p2 = row(a, [a])
        for b in range(V):
            law[a, b] = p1[a] * p2[b] * row(b, [a, b])
    return law


def engine() -> Engine:
    """The bigram target and draft, with pinned prices, so that `auto` lets the draft model draft
    (the law must not depend on which source drafts, but the test must see both do)."""
    e = Engine(BigramRunner(target_table()), tiny_tokenizer(), BigramRunner(draft_table()), eos_token_ids=set())
    e.use_prices(CostModel.linear(0.05, draft=0.2))
    return e


def sample_triples(method: str, params: SamplingParams, seed0: int) -> np.ndarray:
    """Counts [V, V, V] of the first three output tokens over N seeded requests (of four tokens,
    so that later steps have room to draft)."""
    e, spec = engine(), SpeculationConfig(method=method, num_speculative_tokens=3)
    counts = np.zeros((V, V, V))
    for i in range(N):
        out = e.generate(PROMPT, replace(params, max_tokens=MAX_TOKENS, seed=seed0 + i), spec).run()
        counts[tuple(out.token_ids[:3])] += 1
    return counts


def p_values(counts: np.ndarray, law: np.ndarray) -> dict[str, float]:
    """Chi-square p-values of the joint law and of each position's marginal; rare cells pooled
    so that every bin expects at least 5. A token of probability 0 must never come out."""
    n = counts.sum()
    assert counts[law == 0].sum() == 0, "sampled a sequence the target gives probability 0"

    def test(obs: np.ndarray, exp: np.ndarray) -> float:
        exp = exp * n / exp.sum()
        small = exp < 5
        obs_b, exp_b = np.append(obs[~small], obs[small].sum()), np.append(exp[~small], exp[small].sum())
        keep = exp_b > 0
        return chisquare(obs_b[keep], exp_b[keep]).pvalue

    return {
        "joint": test(counts.ravel(), law.ravel()),
        "first": test(counts.sum((1, 2)), law.sum((1, 2))),
        "second": test(counts.sum((0, 2)), law.sum((0, 2))),
        "third": test(counts.sum((0, 1)), law.sum((0, 1))),
    }


def drafted(method: str) -> dict[str, int]:
    """Draft tokens proposed per source over a few requests: the drafts the test relies on exist."""
    e, spec = engine(), SpeculationConfig(method=method, num_speculative_tokens=3)
    total: dict[str, int] = {}
    for i in range(50):
        out = e.generate(PROMPT, replace(PARAMS, max_tokens=MAX_TOKENS, seed=i), spec).run()
        for source, s in out.stats.by_source.items():
            total[source] = total.get(source, 0) + s.proposed
    return total


@pytest.mark.parametrize("method", ["none", "draft", "ngram", "auto"])
def test_three_tokens_follow_the_target_law(method):
    if method != "none":
        sources = drafted(method)
        assert sum(sources.values()) > 50, sources
        if method == "auto":  # both kinds of draft, mixed
            assert sources.get("ngram", 0) > 0 and sources.get("draft", 0) > 0, sources
    pv = p_values(sample_triples(method, PARAMS, 0), exact_law(PARAMS))
    assert min(pv.values()) > PASS_P, pv


def accept_everything(target_probs, draft, draft_probs, noise, position):
    """Broken: every draft token stands, and the bonus token follows."""
    from specserve.engine.sampling import sample_at

    return verify.Verdict(len(draft), sample_at(target_probs[len(draft)], noise.u(position + len(draft))))


def counts_rejected_tokens(monkeypatch) -> None:
    """Broken: after each step the penalty counts the rejected draft tokens as written too."""
    commit = request_module.Request.commit

    def broken(self, logits, step_time):
        draft, before = list(self.draft_ids), len(self.tokens)
        keep = commit(self, logits, step_time)
        if self.counts is not None:
            for tok in draft[keep - before :]:
                self.counts[tok] += 1
        return keep

    monkeypatch.setattr(request_module.Request, "commit", broken)


def _rejects(method: str, seed0: int) -> None:
    try:
        pv = p_values(sample_triples(method, PARAMS, seed0), exact_law(PARAMS))
    except AssertionError:  # it sampled a sequence of probability 0: caught all the same
        return
    assert min(pv.values()) < BROKEN_P, pv


@pytest.mark.parametrize("method", ["draft", "ngram", "auto"])
def test_the_check_rejects_a_sampler_that_accepts_every_draft_token(monkeypatch, method):
    monkeypatch.setattr(request_module, "verify_sampled", accept_everything)
    _rejects(method, 20_000)


def test_the_check_rejects_a_sampler_without_the_residual(monkeypatch):
    monkeypatch.setattr(verify, "residual", lambda p, q: p)
    _rejects("draft", 30_000)


@pytest.mark.parametrize("method", ["draft", "ngram", "auto"])
def test_the_check_rejects_a_penalty_that_counts_rejected_draft_tokens(monkeypatch, method):
    counts_rejected_tokens(monkeypatch)
    _rejects(method, 40_000)
