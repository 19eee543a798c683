"""Mixed load on random engine limits: each request answers as it would alone, and none is starved.

Each trial draws engine limits (max_num_seqs 1 to 4, a KV cache that holds one long request or
a few, the step's token budget, prefix caching on or off) and groups of requests: n > 1 choices
of one prompt (seeds derived as the server derives them), JSON-schema constrained answers, stop
strings, max_tokens 1, a prompt near the context's end whose max_tokens runs past it, prompt
logprobs, penalties and logit bias, greedy or seeded sampling, every speculation method. They
join at random steps and some are cancelled at random steps, queued or running. Then:

- every request left to finish gives plain decoding's answer alone (tokens, text, finish reason,
  logprobs): greedy, and seeded sampling with deterministic drafts (prediction, n-gram: the
  position-keyed noise of docs/design.md, "Seeds"); a draft model's sampled draft changes which
  tokens are sampled, so such a request is held to its own method alone, as the docs promise;
- with max_num_seqs 1 requests start in the order they arrived (FIFO: none overtakes another);
- afterwards nothing is held: no reservation, no request, no sequence beyond the prefix cache's.

A second test submits such requests to an `EngineWorker` from another thread while it steps (as
the server does), with cancellations and deadlines (the server's --request-timeout is a deadline
checked the same way) that expire in the queue or mid-answer: every request ends, those left to
finish answer as alone, and the gauges the server reads (queue depth, running, cache use) are 0.

The draws are seeded, so a failure names its trial.
"""

from __future__ import annotations

import functools
import random
import threading
import warnings

import pytest
from test_batching_random import assert_idle, same
from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.backends.transformers import TransformersBackend
from specserve.config import EngineLimits
from specserve.engine import scheduler
from specserve.engine.client import EngineWorker
from specserve.engine.constrain import GrammarSpec
from specserve.llm import LLM, ContextCutWarning
from specserve.server.structured import choice_params

TRIALS = 8
WORKER_TRIALS = 3
LONG = "The quick brown fox jumps over the lazy dog. " * 25  # 251 of the 512 positions
NEAR_END = "class UserController:\n    def get_user(self, user_id):\n        return self.db.find(user_id)\n" * 22  # 484
PROMPTS = [
    "def add(a, b):",
    "import os\nimport",
    "Le café coûte 3 €. 東京",
    "function getUser(req, res) {",
    LONG,
    NEAR_END,
]
PREDICTIONS = [LONG, "def add(a, b):\n    return a + b\n"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
MAX_STEPS = 5000


@functools.cache
def models():
    return tiny_model("qwen2", 0), tiny_model("qwen2", 1)


def make(limits: EngineLimits) -> LLM:
    target, draft = models()
    (llm,) = steady_prices(
        LLM.from_backends(
            TransformersBackend(target), tiny_tokenizer(), TransformersBackend(draft), name="tiny", limits=limits
        )
    )
    return llm


@pytest.fixture(scope="module")
def alone():
    """One request at a time, nothing cached: the reference answers."""
    return make(EngineLimits(max_num_seqs=1, prefix_caching=False))


def draw_limits(rng: random.Random) -> EngineLimits:
    return EngineLimits(
        max_num_seqs=rng.choice([1, 2, 3, 4]),
        kv_cache_tokens=rng.choice([None, 520, 700, 1000]),  # 520: one request near the context's end at a time
        max_num_batched_tokens=rng.choice([8, 64, 512]),
        min_prefill_chunk=rng.choice([4, 16]),
        prefix_caching=rng.random() < 0.7,
    )


def draw_group(rng: random.Random) -> list[dict]:
    """One request, or the n > 1 choices of one (a prompt and params shared, seeds derived)."""
    prompt = rng.choice(PROMPTS)
    method = rng.choice(["none", "ngram", "draft", "prediction", "auto"])
    kw = dict(max_tokens=rng.choice([1, 1, rng.randint(2, 40), 600]), logprobs=rng.choice([None, None, 0, 2]))
    if rng.random() < 0.4:
        kw.update(temperature=rng.choice([0.6, 1.0]), top_p=rng.choice([1.0, 0.9]), seed=rng.randrange(2**32))
        if rng.random() < 0.3:
            kw["top_k"] = rng.choice([1, 5, 40])
    if rng.random() < 0.3:
        kw["stop"] = (rng.choice(["(", "e", " ", "\n", "user", "a"]),)
    if rng.random() < 0.15:
        kw["presence_penalty"] = 0.5
    if rng.random() < 0.1:
        kw["logit_bias"] = {rng.randrange(5, 280): rng.choice([-100, 5])}
    if rng.random() < 0.1:
        kw.update(prompt_logprobs=1, max_tokens=min(kw["max_tokens"], 4))
    guide = GrammarSpec("json_schema", SCHEMA) if rng.random() < 0.15 else None
    if guide is not None:
        kw["max_tokens"] = 60 if kw["max_tokens"] == 600 else max(kw["max_tokens"], 30)
    prediction = rng.choice([prompt, *PREDICTIONS]) if method == "prediction" else None
    n = rng.choice([1, 1, 1, 2, 3])
    return [
        dict(prompt=prompt, params=p, spec=method, prediction=prediction, guide=guide)
        for p in choice_params(SamplingParams(**kw), n)
    ]


def draw_requests(rng: random.Random) -> list[dict]:
    return [s for _ in range(rng.randint(2, 6)) for s in draw_group(rng)]


def build(llm: LLM, s: dict, should_cancel, on_event=None):
    with warnings.catch_warnings():  # max_tokens 600 runs past the context: cut there, as the warning says
        warnings.simplefilter("ignore", ContextCutWarning)
        return llm.request(
            s["prompt"], s["params"], s["prediction"], s["spec"], should_cancel, guide=s["guide"], on_event=on_event
        )


def reference(alone: LLM, s: dict):
    """What the request must answer: plain decoding alone, or its own method alone where a draft
    model samples its drafts (then the draft changes which tokens are sampled)."""
    samples_drafts = not s["params"].greedy and s["spec"] in ("draft", "auto")
    spec, prediction = (s["spec"], s["prediction"]) if samples_drafts else ("none", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextCutWarning)
        return alone.generate(s["prompt"], s["params"], prediction, spec, guide=s["guide"])


def check_answers(alone: LLM, specs: list[dict], reqs: list, cancelled: list[bool]) -> None:
    for s, r, cut in zip(specs, reqs, cancelled):
        assert r.finished and r.error is None, r.error
        if cut and r.output.finish_reason == "abort":
            continue
        same(r.output, reference(alone, s))


@pytest.mark.parametrize("trial", range(TRIALS))
def test_mixed_load_on_random_limits_answers_as_alone_in_arrival_order(alone, trial):
    rng = random.Random(trial)
    llm = make(draw_limits(rng))
    core = llm.engine.core
    specs = draw_requests(rng)
    cancels = [rng.random() < 0.2 for _ in specs]
    joins = sorted(rng.randint(0, 12) for _ in specs)
    ends = [j + rng.randint(0, 14) for j in joins]  # when a cancel comes (at its join: while queued)
    flags = [False] * len(specs)
    reqs = [build(llm, s, lambda i=i: flags[i]) for i, s in enumerate(specs)]
    started = []
    start = core.scheduler.start
    core.scheduler.start = lambda r: (started.append(r), start(r))[1]
    step = 0
    while step <= joins[-1] or not all(r.finished for r in reqs):
        for i, r in enumerate(reqs):
            if step == joins[i]:
                core.add(r)  # arrival order: index order
            if step == ends[i] and cancels[i]:
                flags[i] = True
        core.step()
        step += 1
        assert step < MAX_STEPS, f"the batch did not end: {[r.phase for r in reqs]}"
    check_answers(alone, specs, reqs, cancels)
    if core.limits.max_num_seqs == 1:
        assert [r.id for r in started] == [r.id for r in reqs if r in started]  # FIFO: arrival (index) order
    assert_idle(llm)


@pytest.mark.parametrize("trial", range(WORKER_TRIALS))
def test_requests_from_another_thread_with_deadlines_all_end_and_leave_nothing_held(alone, trial):
    rng = random.Random(100 + trial)
    llm = make(draw_limits(rng))
    core = llm.engine.core
    worker = EngineWorker(core, max_queue=1000)
    worker.start()
    specs = draw_requests(rng)
    stops = [threading.Event() for _ in specs]  # set at a random point: a cancel, or a deadline reached
    cut = [rng.random() < 0.3 for _ in specs]
    ended = [threading.Event() for _ in specs]  # set by the worker with each request's last event
    reqs = [
        build(llm, s, stop.is_set, lambda r, e, end=end: end.set() if e.finish_reason else None)
        for s, stop, end in zip(specs, stops, ended)
    ]
    try:
        for i, r in enumerate(reqs):
            worker.submit([r])
            for j in range(i + 1):  # an earlier request's deadline passes: queued, or mid-answer
                if cut[j] and rng.random() < 0.3:
                    stops[j].set()
        for stop, c in zip(stops, cut):
            if c:
                stop.set()
        for end in ended:
            assert end.wait(120), f"a request never ended: {[r.phase for r in reqs]}"
        with core.lock:  # the step that ended the last one has retired it too
            assert (core.num_waiting, core.num_running, core.cache_used) == (0, 0, 0.0)
    finally:
        worker.stop()
    check_answers(alone, specs, reqs, cut)
    assert_idle(llm)


def drop_every_trimmable_draft(decode, prefill, prices, budget) -> None:
    """A planner under heavy load: the floor plan, every draft it may trim dropped (a plan
    trim_drafts itself picks when the drafts do not pay)."""
    for r in decode:
        if r.trimmable:
            r.trim_draft(0)


def test_a_seeded_auto_request_with_a_draft_model_samples_as_alone_however_the_load_trims(monkeypatch):
    """Under `auto` the governor and each source's K follow the drafts as verified. A sampled
    request's n-gram drafts were trimmed by the load like a greedy request's, so its history
    differed from its solo run's, a later step went to the draft model instead, and that sampled
    draft changed the tokens: seed 7 on the class prompt left its solo answer (found by a worker
    fuzz on the llama.cpp --exact tiny pair: 8 of 8 repeats of one trial). Such a request's
    drafts are now fixed costs of the step, as a draft model's sampled drafts were already."""
    llm = make(EngineLimits(max_num_seqs=4, prefix_caching=False))
    params = SamplingParams(max_tokens=64, temperature=0.8, seed=7)
    prompt = "class UserController:\n    def get_user(self, user_id):\n" * 3
    alone = llm.generate(prompt, params, speculation="auto")
    monkeypatch.setattr(scheduler, "trim_drafts", drop_every_trimmable_draft)
    others = [llm.request(p, SamplingParams(max_tokens=64), None, "ngram") for p in PROMPTS[:2]]
    me = llm.request(prompt, params, None, "auto")
    assert me.chain[-1].name == "draft" and alone.stats.by_source["ngram"].proposed  # both sources drafted
    batched = llm.engine.run([*others, me])[-1]
    same(batched, alone)


def test_only_a_seeded_request_keeps_its_deterministic_drafts_untrimmed():
    """Keeping every draft untrimmed makes a busy step dearer, and only a seed promises tokens:
    an unseeded sampled request promises the target's distribution, which a shorter draft keeps,
    so its n-gram and prediction drafts stay trimmable (temperature 1 is OpenAI's default)."""
    llm = make(EngineLimits(max_num_seqs=4, prefix_caching=False))
    prompt = "class UserController:\n    def get_user(self, user_id):\n"
    seeded = llm.request(prompt, SamplingParams(max_tokens=8, temperature=0.8, seed=7), None, "auto")
    unseeded = llm.request(prompt, SamplingParams(max_tokens=8, temperature=0.8), None, "auto")
    greedy = llm.request(prompt, SamplingParams(max_tokens=8), None, "auto")
    assert seeded.chain[-1].name == "draft" and unseeded.chain[-1].name == "draft"
    for r in (seeded, unseeded, greedy):
        r.draft, r.draft_ids = None, []  # as when it is started: no draft model's sampled draft yet
    assert not seeded.trimmable and unseeded.trimmable and greedy.trimmable
