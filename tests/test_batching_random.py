"""Randomized batch composition: a request answers the same alone and in any batch.

Each trial draws a few requests (prompts, speculation methods, max_tokens, stop strings,
penalties, logprobs; greedy or seeded sampling), runs each alone, then runs them together on
the tiny float32 transformers pair, joining at random steps, with companions cancelled, closed
(`Generation.close()`'s path, `EngineCore.release`) or failing on a grammar that dead-ends, at
random steps from the queue to the last chunk. Every request left to finish must give its solo
tokens, text, finish reason and logprobs (token ids exact; values within float32 rounding: a
verification pass of another length rounds the same row differently, see `same`), every other
one ends (no hang), and afterwards the engine holds nothing: no reservation, no request, no
target or draft sequence beyond the prefix cache's entries.

The draws are seeded, so a failure names its trial; `TRIALS` keeps the suite fast (a longer
sweep: raise it locally).
"""

from __future__ import annotations

import random

import pytest
from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.backends.transformers import TransformersBackend
from specserve.config import EngineLimits
from specserve.engine.constrain import GrammarSpec
from specserve.llm import LLM

TRIALS = 4  # per decoding mode; each trial is one batch of 2-6 requests
LIMITS = EngineLimits(max_num_seqs=3, max_num_batched_tokens=64, min_prefill_chunk=16)  # joins, chunked prefills
PROMPTS = [
    "def add(a, b):",
    "import os\nimport",
    "Le café coûte 3 €. 東京",
    "class UserController:\n    def get_user(self, user_id):\n" * 3,
    "function getUser(req, res) {",
]
PREDICTIONS = ["def add(a, b):\n    return a + b\n", PROMPTS[3]]
DEAD_END = GrammarSpec("ebnf", 'root ::= "a" b\nb ::= b "x"')  # after "a" nothing is allowed
MAX_STEPS = 3000


@pytest.fixture(scope="module")
def llm():
    (llm,) = steady_prices(
        LLM.from_backends(
            TransformersBackend(tiny_model("qwen2", 0)),
            tiny_tokenizer(),
            TransformersBackend(tiny_model("qwen2", 1)),
            name="tiny",
            limits=LIMITS,
        )
    )
    return llm


def draw(rng: random.Random, sampled: bool) -> dict:
    """One random request: prompt, method, params (a seed when sampled) and prediction."""
    prompt = rng.choice(PROMPTS)
    method = rng.choice(["none", "ngram", "draft", "prediction", "auto"])
    kw = dict(max_tokens=rng.randint(1, 32), logprobs=rng.choice([None, 0, 2]))
    if sampled:
        kw.update(temperature=rng.choice([0.6, 1.0]), top_p=rng.choice([1.0, 0.9]), seed=rng.randrange(2**32))
    if rng.random() < 0.3:
        kw["stop"] = (rng.choice(["(", "e", " ", "\n"]),)
    if rng.random() < 0.2:
        kw["presence_penalty"] = 0.5
    prediction = rng.choice([prompt, *PREDICTIONS]) if method == "prediction" else None
    return dict(prompt=prompt, params=SamplingParams(**kw), spec=method, prediction=prediction)


def answer(out) -> tuple:
    """What must not depend on the batch: tokens, text, finish reason, each logprob's token and
    its alternatives' ids."""
    ids = None if out.logprobs is None else [(t.token_id, [i for i, _ in t.top]) for t in out.logprobs]
    return out.token_ids, out.text, out.finish_reason, ids


def same(batched, alone) -> None:
    assert answer(batched) == answer(alone)
    if alone.logprobs is not None:  # a row verified in a pass of another length: float32 rounding only
        for a, b in zip(batched.logprobs, alone.logprobs):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
            assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-5)


def run_trial(llm, rng: random.Random, sampled: bool) -> list[tuple[str, object]]:
    """Run one random batch by hand, step by step; returns (fate, Request) per request."""
    core = llm.engine.core
    n = rng.randint(2, 6)
    specs = [draw(rng, sampled) for _ in range(n)]
    fates = ["finish"] + [rng.choice(["finish", "finish", "cancel", "close", "fail"]) for _ in range(n - 1)]
    joins = sorted(rng.randint(0, 10) for _ in range(n))
    ends = [j + rng.randint(0, 14) for j in joins]  # when a cancel or close comes (0: while queued)
    flags = [False] * n
    reqs = [
        llm.request(
            s["prompt"],
            s["params"],
            s["prediction"],
            s["spec"],
            should_cancel=lambda i=i: flags[i],
            guide=DEAD_END if fate == "fail" else None,
        )
        for i, (s, fate) in enumerate(zip(specs, fates))
    ]
    step, cut = 0, []  # cut: requests cancelled before they finished, which must end at the next step
    while True:
        for i, r in enumerate(reqs):
            if step == joins[i]:
                core.add(r)
            if step == ends[i] and fates[i] == "cancel" and not r.finished:
                flags[i] = True
                cut.append(r)
            if step == ends[i] and fates[i] == "close" and not r.finished:
                core.release(r)  # at once, without a step: nobody may step the engine for a while
                assert r.finished and r not in core.scheduler.running and r.output.finish_reason == "abort"
        if step > joins[-1] and all(r.finished for r in reqs):
            break
        core.step()
        step += 1
        assert all(r.finished and r.output.finish_reason == "abort" for r in cut)
        assert step < MAX_STEPS, f"the batch did not end: {[r.phase for r in reqs]}"
    return list(zip(fates, reqs, specs))


def assert_idle(llm) -> None:
    """Nothing held: no reservation, no request, no sequence but the prefix cache's entries'."""
    core = llm.engine.core
    s = core.scheduler
    assert (s.reserved, len(s.running), len(s.waiting), len(core._incoming)) == (0, 0, 0, 0)
    entries = set(core.prefix.owners) if core.prefix is not None else set()
    assert set(core.target._caches) == entries
    kept = {d for d, _ in core.draft_prefixes.held.values()} if core.draft_prefixes is not None else set()
    assert set(core.draft._caches) == kept


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_random_batch_answers_as_each_request_alone(llm, sampled, trial):
    rng = random.Random(1000 * sampled + trial)
    ran = run_trial(llm, rng, sampled)
    for fate, req, spec in ran:
        if fate == "finish":
            assert req.error is None, req.error
            same(req.output, llm.generate(spec["prompt"], spec["params"], spec["prediction"], spec["spec"]))
        elif fate == "fail":  # failed on its grammar, or was cut short before it got there
            assert req.error is not None or req.output.finish_reason in ("length", "stop")
        else:
            assert req.finished and (req.error is None)
    assert_idle(llm)
