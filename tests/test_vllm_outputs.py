"""vLLM-shaped outputs: code ported from vLLM reads `out[0].outputs[0].text`, `.token_ids`,
`.finish_reason`, `.logprobs` ({token id: Logprob} per token), `.cumulative_logprob`, `.index`,
and `out[0].prompt`, `.prompt_token_ids`, `.request_id`, `.finished`. Our RequestOutput is flat
(`out.text`): these tests hold the vLLM view to the flat fields it is built from, on the SmolLM2 pack."""

from __future__ import annotations

import pytest

from specserve import LLM, SamplingParams

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def smol(smol_gguf):
    with LLM(model=str(smol_gguf), speculation="none", max_model_len=512) as model:
        yield model


def test_each_logprob_carries_the_tokens_rank_in_the_vocabulary(smol):
    """vLLM's Logprob has the token's rank (1 = the most probable). The engine computed only the
    chosen token's logprob and the top alternatives, so a chosen token outside them had no rank."""
    greedy = smol.generate(PROMPT, SamplingParams(max_tokens=8, logprobs=2))
    assert [lp.rank for lp in greedy.logprobs] == [1] * 8  # greedy picks the most probable token
    sampled = smol.generate(PROMPT, SamplingParams(max_tokens=24, logprobs=3, temperature=1.5, seed=11))
    for lp in sampled.logprobs:
        above = [v for _, v in lp.top if v > lp.logprob]
        assert lp.rank >= len(above) + 1 and (lp.rank > len(lp.top) or lp.rank == len(above) + 1)
    assert any(lp.rank > 1 for lp in sampled.logprobs)  # a hot sample leaves the top token somewhere
    scored = smol.generate(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert scored.prompt_logprobs[0] is None and all(lp.rank >= 1 for lp in scored.prompt_logprobs[1:])
