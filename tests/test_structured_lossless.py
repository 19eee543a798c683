"""Losslessness under a grammar: chi-square against the exact *constrained* target law.

The synthetic bigram target of test_lossless.py over V = 6 tokens, whose vocabulary is the six
strings "a".."f", constrained by a real xgrammar regex. The exact law of the first two output
tokens is the target's, masked by the grammar at each position, then tempered. Each test also
runs against a deliberately broken implementation and must reject it: the residual step
removed, and a sampled draft cut *before* its first disallowed token (sampling the bonus from
p there instead of the residual max(0, p - q) is not lossless).
"""

import random

import numpy as np
import pytest
import torch
from synthetic import BigramRunner
from test_lossless import (
    BROKEN,
    BROKEN_P,
    ONEHOT_PROMPT,
    PASS_P,
    V,
    p_values,
    target_table,
)
from tiny import tiny_tokenizer

import specserve.engine.constrain as constrain
import specserve.engine.verify as verify
from specserve import SamplingParams, SpeculationConfig
from specserve.engine import Engine
from specserve.engine.constrain import ConstraintFactory, GrammarSpec
from specserve.engine.sampling import probs_from_logits

VOCAB = list("abcdef")
# first token in {a, b, c, d}; after a/b: {b, c, d, e}; after c: {a, e, f}; after d: {a, b}
REGEX = "([ab][b-e]|c[aef]|d[ab])[a-f]*"
N = 4000


def factory() -> ConstraintFactory:
    return ConstraintFactory.from_vocab(VOCAB, stop_token_ids=set())


def allowed_after(prefix: list[int]) -> torch.Tensor:
    """[V] bool: tokens the grammar allows after the output prefix (computed by xgrammar itself)."""
    c = factory()(GrammarSpec("regex", REGEX))
    c.advance(prefix)
    c.cut([])
    return torch.isfinite(c.mask(torch.zeros(1, V)))[0]


def constrained_pair_law(table: torch.Tensor, first: int, params: SamplingParams) -> np.ndarray:
    """P(x1, x2) with the grammar mask applied before temperature / top-k, as the engine does. [V, V]"""

    def law(logits, prefix):
        masked = logits.masked_fill(~allowed_after(prefix), float("-inf"))  # [V]
        return probs_from_logits(masked.unsqueeze(0), params)[0].double()

    p1 = law(table[first], [])  # [V]
    out = np.zeros((V, V))
    for x1 in range(V):
        if p1[x1] > 0:
            out[x1] = (p1[x1] * law(table[x1], [x1])).numpy()
    return out


def sample_pairs(draft_kind: str, params: SamplingParams, seed0: int = 0) -> np.ndarray:
    """Counts [V, V] of the first two output tokens over N seeded constrained requests."""
    from synthetic import random_table

    target = BigramRunner(target_table())
    if draft_kind == "sampled":
        draft, method, prompt = BigramRunner(random_table(V, seed=13)), "draft", [0, 1]
    else:  # n-gram proposes "b c f" after "f a": deterministic
        draft, method, prompt = None, "ngram", ONEHOT_PROMPT
    engine = Engine(target, tiny_tokenizer(), draft, eos_token_ids=set())
    spec = SpeculationConfig(method=method, num_speculative_tokens=3)
    fac = factory()
    compiled = fac.compile(GrammarSpec("regex", REGEX))
    counts = np.zeros((V, V))
    for i in range(N):
        p = SamplingParams(max_tokens=2, temperature=params.temperature, top_k=params.top_k, seed=seed0 + i)
        out = engine.generate(prompt, p, spec, constraint=constrain.Constraint(compiled, V)).run()
        counts[out.token_ids[0], out.token_ids[1]] += 1
    return counts


CASES = [("sampled", SamplingParams(temperature=1.0)), ("onehot", SamplingParams(temperature=0.8))]


def law_for(kind, params):
    return constrained_pair_law(target_table(), 0 if kind == "onehot" else 1, params)


@pytest.mark.parametrize("draft_kind,params", CASES, ids=[c[0] for c in CASES])
def test_constrained_output_follows_constrained_law(draft_kind, params):
    pv = p_values(sample_pairs(draft_kind, params), law_for(draft_kind, params))
    assert min(pv.values()) > PASS_P, pv


@pytest.mark.parametrize("draft_kind,params", CASES, ids=[c[0] for c in CASES])
def test_catches_broken_sampler(monkeypatch, draft_kind, params):
    random.seed(0)
    monkeypatch.setattr(verify, *BROKEN[draft_kind])
    pv = p_values(sample_pairs(draft_kind, params, seed0=10_000), law_for(draft_kind, params))
    assert min(pv.values()) < BROKEN_P, pv


def test_catches_sampled_draft_cut_before_its_rejected_token(monkeypatch):
    real_cut = constrain.Constraint.cut
    monkeypatch.setattr(constrain.Constraint, "cut", lambda self, draft, sampled=False: real_cut(self, draft, False))
    kind, params = CASES[0]
    pv = p_values(sample_pairs(kind, params, seed0=20_000), law_for(kind, params))
    assert min(pv.values()) < BROKEN_P, pv


def test_grammar_masks_the_draft():
    """Sanity: the mask really constrains (else the tests above would test nothing new)."""
    assert allowed_after([]).tolist() == [True, True, True, True, False, False]
    assert allowed_after([2]).tolist() == [True, False, False, False, True, True]
