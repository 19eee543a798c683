"""A request's speculation stats (`RequestOutput.stats`, the server's `speculation` object) against
what its steps did: tokens per step, overall and per source, add up to the tokens written."""

from __future__ import annotations

import pytest
from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.llm import LLM

ASK = "class UserController:\n    def get_user(self, user_id):\n"


@pytest.fixture(scope="module")
def llm():
    return steady_prices(LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="auto"))[0]


def test_a_step_cut_by_a_stop_string_counts_the_tokens_it_committed_in_its_source_tokens_per_step(llm):
    """The prediction is the answer itself, so the first step drafts the whole of it and a stop
    string ends the request inside that draft. The step committed the tokens through the stop
    string, and its source's tokens per step said one more (accepted + 1, as if a bonus token
    followed), so the sources' tokens summed past the tokens the request wrote."""
    plain = llm.generate(ASK, SamplingParams(max_tokens=24), speculation="none")
    stop = plain.text[10:13]
    out = llm.generate(ASK, SamplingParams(max_tokens=24, stop=[stop]), prediction=plain.text)
    assert out.finish_reason == "stop" and out.stats.by_source["prediction"].accepted > 0
    assert [s["committed"] for s in out.steps if s["source"] == "prediction"][-1] <= out.steps[-1]["accepted"]
    by_source = out.stats.by_source.values()
    assert sum(round(s.tokens_per_step * s.steps) for s in by_source) == out.stats.output_tokens
    assert len(out.token_ids) < out.stats.output_tokens  # token_ids: the returned text's, not the stop string's
    assert out.stats.to_dict()["by_source"]["prediction"]["tokens_per_step"] == pytest.approx(
        out.stats.tokens_per_step, abs=1e-4
    )


def test_the_step_timeline_counts_accepted_tokens_as_the_stats_do(llm):
    """The timeline (`RequestOutput.steps`, the HTML report's step bars) said a step cut by a stop
    string accepted every draft token the target agreed with, where the request's stats (and its
    usage) count those past the cut as rejected: the two disagreed on the same step."""
    plain = llm.generate(ASK, SamplingParams(max_tokens=24), speculation="none")
    out = llm.generate(ASK, SamplingParams(max_tokens=24, stop=[plain.text[10:13]]), prediction=plain.text)
    for source, s in out.stats.by_source.items():
        steps = [st for st in out.steps if st["source"] == source]
        assert (sum(st["proposed"] for st in steps), sum(st["accepted"] for st in steps)) == (s.proposed, s.accepted)
    assert all(st["accepted"] <= st["committed"] for st in out.steps)
