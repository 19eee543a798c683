"""The `auto` governor: a drafter that costs more per committed token than plain decoding sits
out (with periodic probes); one that pays keeps drafting; outputs never change."""

from __future__ import annotations

import time

import pytest

from specserve import SamplingParams
from specserve.governor import PLAIN, Governor
from specserve.llm import LLM
from tiny import tiny_model, tiny_tokenizer


def drive(gov: Governor, source_cost: float, steps: int, plain_cost: float = 1.0) -> list[str]:
    """Simulate `steps` steps: the source commits 2 tokens at `source_cost` s; plain 1 at plain_cost."""
    used = []
    for _ in range(steps):
        if gov.wants_plain_step() or not gov.allows("draft"):
            gov.record(PLAIN, plain_cost, 1)
            used.append(PLAIN)
        else:
            gov.record("draft", source_cost, 2)
            used.append("draft")
    return used


def test_a_source_that_pays_keeps_drafting():
    used = drive(Governor(), source_cost=1.2, steps=300)  # 0.6 s per token vs plain's 1.0
    assert used.count("draft") >= 295  # plain only for the periodic re-measurements
    assert 1 <= used.count(PLAIN) <= 4


def test_a_source_that_costs_more_sits_out_but_is_probed():
    gov = Governor(probe_every=16)
    used = drive(gov, source_cost=3.0, steps=320)  # 1.5 s per token vs plain's 1.0
    assert used[:2] == ["draft", "draft"]  # warm-up: trusted only after 2 steps
    assert used[2] == PLAIN  # then plain's cost is measured
    later = used[3:]
    assert 15 <= later.count("draft") <= 25  # one probe per 16 benched steps
    assert gov.costs["draft"].per_token == pytest.approx(1.5)


def test_a_source_comes_back_when_it_pays_again():
    gov = Governor(probe_every=8)
    drive(gov, source_cost=3.0, steps=40)
    used = drive(gov, source_cost=0.5, steps=80)
    assert used[-40:].count("draft") >= 38


class SlowRunner:
    """A runner that sleeps on every forward: a draft model that cannot pay on this machine."""

    def __init__(self, runner, delay: float):
        self.runner, self.delay = runner, delay

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def forward(self, token_ids, last_only=False):
        time.sleep(self.delay)
        return self.runner.forward(token_ids, last_only)


def test_auto_benches_a_slow_draft_model_and_output_stays_exact():
    tok = tiny_tokenizer()
    llm = LLM.from_models(tiny_model(), tok, tiny_model(seed=1))
    llm.engine.draft = SlowRunner(llm.engine.draft, delay=0.02)  # each draft token costs 20 ms
    prompt = "Le café coûte 3 €. Über"
    base = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="none")
    out = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="auto")
    assert out.token_ids == base.token_ids
    draft_steps = out.stats.by_source["draft"].steps if "draft" in out.stats.by_source else 0
    assert draft_steps <= out.stats.steps // 4, llm.engine.governor.summary()
    # an explicitly chosen method is not governed: it drafts whenever it may
    forced = llm.generate(prompt, SamplingParams(max_tokens=40), speculation="draft")
    assert forced.stats.by_source["draft"].steps == forced.stats.steps - 1  # the last step has no budget
