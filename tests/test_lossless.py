"""Losslessness at temperature > 0: chi-square goodness of fit against the exact target law.

A synthetic bigram target and draft over V = 6 tokens make the exact distribution of the
first two output tokens known in closed form. Every test is also run against a deliberately
broken sampler and must reject it, which shows the test has the power to catch the bug it is
there for: for a sampled draft, the residual step removed (recover from p instead of
max(0, p - q)); for a deterministic draft, its analogue (accept x on a coin of p(x) drawn apart
from the token committed on rejection, which may then be x again).
"""

import random
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
from specserve.engine.sampling import Noise, sample_at

V = 6
# Draft seed 13 overlaps the target by sum(min(p, q)) = 0.36 after token 1, and the n-gram draft
# proposes the target's favourite token (p = 0.70 after token 0 at T = 0.8): both settings make
# the broken sampler's law differ from the target's by chi2/N > 0.015, so N = 4000 rejects it.
ONEHOT_PROMPT = [5, 0, 1, 2, 5, 0]
N = 4000
PASS_P = 1e-3  # a correct sampler fails this with probability 0.1% per check (seeds are fixed)
BROKEN_P = 1e-6  # the broken sampler must be rejected far more decisively than that


def target_table() -> torch.Tensor:
    return random_table(V, seed=11)


def exact_pair_law(table: torch.Tensor, first: int, params: SamplingParams) -> np.ndarray:
    """P(x1, x2 | last prompt token = first) under the target with temperature/top-k applied. [V, V]"""
    from specserve.engine.sampling import probs_from_logits

    p = probs_from_logits(table, params).double()  # [V, V]: row t = next-token law after t
    return (p[first].unsqueeze(1) * p).numpy()  # [V, V]


def sample_pairs(draft_kind: str, params: SamplingParams, n: int = N, seed0: int = 0) -> np.ndarray:
    """Counts [V, V] of the first two output tokens over n seeded requests."""
    target = BigramRunner(target_table())
    if draft_kind == "sampled":  # a different bigram model, sampled with the same params
        draft, method, prompt = BigramRunner(random_table(V, seed=13)), "draft", [0, 1]
    elif draft_kind == "disjoint":  # draft mass only where the target has none (after top-k)
        t = target_table()
        worst = t.argsort(dim=-1)[:, :2]  # [V, 2]: the two tokens top-k=4 removes from every row
        d = torch.full((V, V), -30.0).scatter(1, worst, 5.0)
        draft, method, prompt = BigramRunner(d), "draft", [0, 1]
    elif draft_kind == "onehot":  # n-gram lookup proposes a fixed continuation deterministically
        draft, method, prompt = None, "ngram", ONEHOT_PROMPT  # "5 0" recurs: proposes [1, 2, 5]
    else:
        raise ValueError(draft_kind)
    engine = Engine(target, tiny_tokenizer(), draft, eos_token_ids=set())
    spec = SpeculationConfig(method=method, num_speculative_tokens=3)
    counts = np.zeros((V, V))
    for i in range(n):
        p = SamplingParams(max_tokens=2, temperature=params.temperature, top_k=params.top_k, seed=seed0 + i)
        out = engine.generate(prompt, p, spec).run()
        counts[out.token_ids[0], out.token_ids[1]] += 1
    return counts


def p_values(counts: np.ndarray, law: np.ndarray) -> dict[str, float]:
    """Chi-square p-values: joint (x1, x2), and the marginals of each position. Zero-mass cells must be empty."""
    n = counts.sum()
    assert counts[law == 0].sum() == 0, "sampled a token the target gives probability 0"

    def test(obs, exp):
        exp = exp * n / exp.sum()
        small = exp < 5  # pool rare cells so every bin expects >= 5 (chi-square's validity rule)
        obs_b = np.append(obs[~small], obs[small].sum())
        exp_b = np.append(exp[~small], exp[small].sum())
        keep = exp_b > 0
        return chisquare(obs_b[keep], exp_b[keep]).pvalue

    return {
        "joint": test(counts.ravel(), law.ravel()),
        "first": test(counts.sum(1), law.sum(1)),
        "second": test(counts.sum(0), law.sum(0)),
    }


def broken_residual(p, q):
    return p  # the bug: recover from p itself, double-counting what the draft already covered


def broken_onehot(p, x, u):
    """The same bug for a deterministic draft: accept on a coin of p(x), else commit a sample of
    p itself (which can be x again)."""
    return random.random() < float(p[x]), sample_at(p, u)


BROKEN = {"sampled": ("residual", broken_residual), "onehot": ("verify_onehot", broken_onehot)}


CASES = [
    ("sampled", SamplingParams(temperature=1.0)),
    ("onehot", SamplingParams(temperature=0.8)),
    ("disjoint", SamplingParams(temperature=1.0, top_k=4)),
]


@pytest.mark.parametrize("draft_kind,params", CASES, ids=[c[0] for c in CASES])
def test_output_follows_target_law(draft_kind, params):
    prompt_last = 0 if draft_kind == "onehot" else 1
    law = exact_pair_law(target_table(), prompt_last, params)
    pv = p_values(sample_pairs(draft_kind, params), law)
    assert min(pv.values()) > PASS_P, pv


@pytest.mark.parametrize("draft_kind,params", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_chi_square_catches_broken_sampler(monkeypatch, draft_kind, params):
    random.seed(0)
    monkeypatch.setattr(verify, *BROKEN[draft_kind])
    prompt_last = 0 if draft_kind == "onehot" else 1
    law = exact_pair_law(target_table(), prompt_last, params)
    pv = p_values(sample_pairs(draft_kind, params, seed0=10_000), law)
    assert min(pv.values()) < BROKEN_P, pv


def test_disjoint_draft_is_always_rejected():
    params = SamplingParams(temperature=1.0, top_k=4, max_tokens=2, seed=1)
    t = target_table()
    worst = t.argsort(dim=-1)[:, :2]
    engine = Engine(
        BigramRunner(t),
        tiny_tokenizer(),
        BigramRunner(torch.full((V, V), -30.0).scatter(1, worst, 5.0)),
        eos_token_ids=set(),
    )
    out = engine.generate([0, 1], params, SpeculationConfig("draft", 3)).run()
    assert out.stats.by_source["draft"].proposed > 0 and out.stats.by_source["draft"].accepted == 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_acceptance_rate_matches_sum_of_min(temperature):
    """One-token drafts from q, verified against p: P(accept) must equal sum_x min(p(x), q(x))."""
    from specserve.engine.sampling import probs_from_logits

    params = SamplingParams(temperature=temperature)
    p = probs_from_logits(random_table(V, 21)[:1], params)  # [1, V]
    q = probs_from_logits(random_table(V, 22)[:1], params)  # [1, V]
    expected = torch.minimum(p, q).sum().item()
    g = torch.Generator().manual_seed(5)
    n, accepted = 20_000, 0
    for i in range(n):
        x = int(torch.multinomial(q[0], 1, generator=g))
        target = torch.cat([p, p])  # [K+1 = 2, V]
        accepted += verify.verify_sampled(target, [x], q, Noise(i), 0).num_accepted
    sd = (expected * (1 - expected) / n) ** 0.5
    assert abs(accepted / n - expected) < 4 * sd, (accepted / n, expected)


def test_verify_sampled_first_token_law_and_broken_residual(monkeypatch):
    """The pure function alone: the first committed token is distributed as p."""
    from specserve.engine.sampling import probs_from_logits

    params = SamplingParams(temperature=1.0)
    p = probs_from_logits(random_table(V, 31)[:2], params)  # [2, V]
    q = probs_from_logits(random_table(V, 32)[:1], params)  # [1, V]

    def first_tokens():
        g = torch.Generator().manual_seed(9)
        counts = np.zeros(V)
        for i in range(N):
            x = int(torch.multinomial(q[0], 1, generator=g))
            v = verify.verify_sampled(p, [x], q, Noise(i), 0)
            counts[x if v.num_accepted else v.next_token] += 1
        return chisquare(counts, p[0].double().numpy() * N).pvalue

    assert first_tokens() > PASS_P
    monkeypatch.setattr(verify, "residual", broken_residual)
    assert first_tokens() < BROKEN_P


def test_seeded_sampling_is_reproducible():
    engine = Engine(
        BigramRunner(target_table()), tiny_tokenizer(), BigramRunner(random_table(V, 12)), eos_token_ids=set()
    )
    for method in ("none", "draft", "ngram"):
        runs = [
            engine.generate(
                [0, 1, 2, 0, 1], SamplingParams(temperature=1.0, max_tokens=20, seed=42), SpeculationConfig(method)
            )
            .run()
            .token_ids
            for _ in range(2)
        ]
        assert runs[0] == runs[1]
    other = (
        engine.generate(
            [0, 1, 2, 0, 1], SamplingParams(temperature=1.0, max_tokens=20, seed=43), SpeculationConfig("draft")
        )
        .run()
        .token_ids
    )
    assert other != runs[0]


def test_deterministic_drafts_never_change_a_seeded_sample():
    """Random numbers keyed by position: with n-gram drafts (deterministic) a seeded request
    commits the very tokens plain decoding samples, whatever was drafted, accepted or not."""
    engine = Engine(BigramRunner(target_table()), tiny_tokenizer(), None, eos_token_ids=set())
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]  # "0 1 2" recurs: the n-gram lookup drafts
    drafted = 0
    for seed in range(20):
        params = SamplingParams(temperature=1.0, max_tokens=24, seed=seed)
        plain = engine.generate(prompt, params, SpeculationConfig("none")).run()
        spec = engine.generate(prompt, params, SpeculationConfig("ngram", 3)).run()
        assert spec.token_ids == plain.token_ids, seed
        drafted += spec.stats.by_source["ngram"].proposed
    assert drafted > 50  # the drafts were there to change something


def test_onehot_acceptance_is_p_of_x():
    """A deterministic draft token x is accepted with probability p(x) (the rule with q = one-hot)."""
    from specserve.engine.sampling import probs_from_logits

    p = probs_from_logits(random_table(V, 41)[:1], SamplingParams(temperature=1.0))  # [1, V]
    x = int(p[0].argmax())
    n = 20_000
    accepted = sum(verify.verify_sampled(torch.cat([p, p]), [x], None, Noise(i), 0).num_accepted for i in range(n))
    expected = float(p[0, x])
    sd = (expected * (1 - expected) / n) ** 0.5
    assert abs(accepted / n - expected) < 4 * sd, (accepted / n, expected)


def test_sample_at_covers_the_distribution_and_nothing_else():
    p = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    assert sample_at(p, 0.0) == 1 and sample_at(p, 0.2499) == 1 and sample_at(p, 0.25) == 3
    assert sample_at(p, 1 - 2.0**-53) == 3  # never a zero-probability token past the end
    assert sample_at(p * 3, 0.5) == 3  # unnormalised weights are fine
    us = [Noise(7).u(i) for i in range(2000)]
    assert len(set(us)) == 2000 and 0.45 < sum(us) / 2000 < 0.55
    assert Noise(7).u(3) == Noise(7).u(3) != Noise(8).u(3) and Noise(7).u(3, 1) != Noise(7).u(3)


# Penalties and logit bias make each row depend on the tokens before it: row i of a verified draft
# counts draft[:i] as already written (draft_prefix_counts). top_p then cuts the penalised row.
PENALISED = SamplingParams(
    temperature=1.0, top_p=0.95, presence_penalty=1.5, frequency_penalty=1.0, logit_bias={2: 1.5}
)


def penalised_pair_law(params: SamplingParams, first: int) -> np.ndarray:
    """P(x1, x2 | last prompt token = first): x2's row is penalised for x1 having been written. [V, V]"""
    from specserve.engine.sampling import apply_penalties, bias_vector, probs_from_logits

    biased = target_table() + bias_vector(params, V)  # [V, V]
    p1 = probs_from_logits(biased[first : first + 1], params)[0].double()  # [V]
    written = torch.eye(V)  # row x1: counts after writing x1
    p2 = probs_from_logits(apply_penalties(biased, written, params), params).double()  # [V, V]
    return (p1.unsqueeze(1) * p2).numpy()


def sample_penalised_pairs(params: SamplingParams, seed0: int) -> np.ndarray:
    """Counts [V, V] of the first two tokens with a sampled draft (a different bigram model)."""
    engine = Engine(
        BigramRunner(target_table()), tiny_tokenizer(), BigramRunner(random_table(V, 13)), eos_token_ids=set()
    )
    counts = np.zeros((V, V))
    for i in range(N):
        p = replace(params, max_tokens=2, seed=seed0 + i)
        out = engine.generate([0, 1], p, SpeculationConfig(method="draft", num_speculative_tokens=3)).run()
        counts[out.token_ids[0], out.token_ids[1]] += 1
    return counts


def test_penalties_bias_and_top_p_stay_lossless_under_a_sampled_draft(monkeypatch):
    law = penalised_pair_law(PENALISED, 1)
    pv = p_values(sample_penalised_pairs(PENALISED, 0), law)
    assert min(pv.values()) > PASS_P, pv
    # broken: every row penalised for the committed output only, as if no draft token came before it
    monkeypatch.setattr(request_module, "draft_prefix_counts", lambda base, draft: base.repeat(len(draft) + 1, 1))
    try:
        pv = p_values(sample_penalised_pairs(PENALISED, 10_000), law)
    except AssertionError:  # it sampled a token the penalised law gives probability 0
        return
    assert min(pv.values()) < BROKEN_P, pv
