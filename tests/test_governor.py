"""The `auto` governor: a drafter that commits fewer tokens per unit of cost than plain
decoding sits out (with periodic probes); one that pays keeps drafting; outputs never change."""

from __future__ import annotations

import pytest

from specserve import SamplingParams
from specserve.governor import CostModel, Governor
from specserve.llm import LLM
from tiny import tiny_model, tiny_tokenizer

# A CPU where each extra verified token costs 0.3 of a plain step and a draft pass 0.4.
PRICES = CostModel(per_token=0.3, draft=0.4)


def drive(gov: Governor, accepted: int, steps: int, k: int = 4, source: str = "draft") -> list[str]:
    """Simulate steps where `source` drafts k tokens and `accepted` of them are accepted."""
    used = []
    for _ in range(steps):
        if gov.allows(source):
            gov.record(source, 1 + k, k if source == "draft" else 0, accepted + 1)
            used.append(source)
        else:
            gov.record("none", 1, 0, 1)
            used.append("none")
    return used


def test_prices():
    assert PRICES.step(1, 0) == 1.0
    assert PRICES.step(5, 4) == pytest.approx(1 + 4 * 0.3 + 4 * 0.4)


def test_a_source_that_pays_keeps_drafting():
    # 4 drafted, 3 accepted: 4 tokens for 3.8 units
    assert drive(Governor(PRICES), accepted=3, steps=200) == ["draft"] * 200


def test_a_source_that_costs_more_sits_out_but_is_probed():
    gov = Governor(PRICES, probe_every=16)
    used = drive(gov, accepted=1, steps=323)  # 2 tokens for 3.8 units
    assert used[:3] == ["draft"] * 3  # warm-up: trusted after 3 steps
    assert used[3:].count("draft") == 20  # then one probe every 16 steps
    assert gov.averages["draft"].tokens_per_unit == pytest.approx(2 / 3.8)


def test_a_source_comes_back_when_it_pays_again():
    gov = Governor(PRICES, probe_every=8)
    drive(gov, accepted=0, steps=40)
    used = drive(gov, accepted=4, steps=80)
    assert used[-40:] == ["draft"] * 40


def test_the_prediction_source_is_never_governed():
    gov = Governor(PRICES)
    assert drive(gov, accepted=0, steps=50, source="prediction") == ["prediction"] * 50


def test_auto_benches_a_costly_draft_model_and_output_stays_exact():
    tok = tiny_tokenizer()
    llm = LLM.from_models(tiny_model(), tok, tiny_model(seed=1))  # a draft that is rarely right
    llm.engine._prices = CostModel(per_token=0.2, draft=1.5)  # and costs more than the target
    prompt = "Le café coûte 3 €. Über"
    base = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="none")
    out = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="auto")
    assert out.token_ids == base.token_ids
    assert out.stats.by_source["draft"].steps <= out.stats.steps // 4
    again = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="auto")
    strip = lambda o: [(s["source"], s["proposed"], s["accepted"]) for s in o.steps]  # noqa: E731
    assert strip(again) == strip(out)  # decisions do not depend on the clock
    # an explicitly chosen method is not governed: it drafts whenever it may
    forced = llm.generate(prompt, SamplingParams(max_tokens=40), speculation="draft")
    assert forced.stats.by_source["draft"].steps == forced.stats.steps - 1  # the last step has no budget


def test_calibration_on_a_real_runner():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1))
    prices = llm.engine.prices()
    assert prices is llm.engine.prices()  # measured once
    assert prices.per_token >= 0 and prices.draft > 0
    assert llm.engine.target.length == 0  # the runners are left empty
