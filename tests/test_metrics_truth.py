"""The numbers /metrics shows, checked against what the requests did, in-process on a tiny float32 model.

Each series is compared with a count made independently of the engine's own bookkeeping: the
requests answered, the usage they reported, the tokens each step fed the target and committed."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from server_proc import metric_value
from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

ASK = "class UserController:\n    def get_user(self, user_id):\n        return self.db.find(user_id)\n"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": ASK}], "max_tokens": 12, "temperature": 0}


@pytest.fixture()
def client():
    """A fresh app per test: every counter starts at 0."""
    llm = steady_prices(LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="auto"))[0]
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


def _series(client, *names: str) -> dict[str, float]:
    text = client.get("/metrics").text
    return {name: metric_value(text, name) for name in names}


def _post(client, body: dict, stream: bool) -> dict:
    """The answer's usage (a stream's usage chunk)."""
    if not stream:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return chunks[-1]["usage"]


@pytest.mark.parametrize("stream", [False, True])
def test_latencies_and_prefix_hits_count_each_request_once_whatever_its_n(client, stream):
    """A request with n = 3 is one request: one end-to-end latency, one time to first token, one
    time per output token, and a prefix hit only when its usage reports cached prompt tokens.
    Each choice was observed on its own before, so the histograms counted 3 requests where
    specserve_requests_total counted 1, and a cold prompt's two choices that copy choice 0's
    prefill counted as 2 prefix-cache hits while usage (and the cached-tokens counter) said 0."""
    counted = (
        "specserve_e2e_request_latency_seconds_count",
        "specserve_time_to_first_token_seconds_count",
        "specserve_time_per_output_token_seconds_count",
        "specserve_requests_total",
        "specserve_prefix_cache_hit_requests_total",
        "specserve_prompt_tokens_cached_total",
    )
    cold = _post(client, {**CHAT, "n": 3}, stream)
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    got = _series(client, *counted)
    assert got == {**dict.fromkeys(counted[:4], 1.0), counted[4]: 0.0, counted[5]: 0.0}
    warm = _post(client, {**CHAT, "n": 3}, stream)  # the same prompt again: its prefix is cached
    cached = warm["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    got = _series(client, *counted)
    assert got == {**dict.fromkeys(counted[:4], 2.0), counted[4]: 1.0, counted[5]: float(cached)}


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_with_a_long_stop_string_has_its_time_to_first_token_counted(client, stream):
    """A stop string holds back the text that may start it, and the tokens of that text with it:
    the first step's event then lists no token. Without stream only each choice's first event
    reached the handler, which takes the time to first token from an event that lists tokens, so
    with a stop string longer than the first token's text no time to first token (nor per output
    token) was ever observed; a stream's was, at its first text."""
    counted = ("specserve_time_to_first_token_seconds_count", "specserve_time_per_output_token_seconds_count")
    usage = _post(client, {**CHAT, "stop": ["</never-written>"]}, stream)
    assert usage["completion_tokens"] == CHAT["max_tokens"]  # the stop string never came: a whole answer
    assert _series(client, *counted) == dict.fromkeys(counted, 1.0)


class _Truth:
    """Counts each step's draft as it is fed and what the step committed, apart from the engine's
    own counting: a draft token is accepted when it is the token committed at its position (a
    rejected one never is: greedy commits the argmax it missed, sampling the residual, where the
    rejected token has no mass). Counted when the step emits its event, before any answer goes
    out. Per source: [proposed, accepted, steps]."""

    def __init__(self, monkeypatch):
        from specserve.engine.request import Request

        self.counts: dict[str, list[int]] = {}
        commit, emit = Request.commit, Request._emit

        def fed(req, logits, step_time):
            draft = list(req.draft_ids)
            req.truth_step = (req.draft.source if req.draft is not None and draft else "none", draft, len(req.tokens))
            return commit(req, logits, step_time)

        def emitted(req, event):
            step, req.truth_step = getattr(req, "truth_step", None), None
            if step is not None:
                self.count(*step, req.tokens)
            emit(req, event)

        monkeypatch.setattr(Request, "commit", fed)
        monkeypatch.setattr(Request, "_emit", emitted)

    def count(self, source: str, draft: list[int], pos: int, tokens: list[int]) -> None:
        after = tokens[pos:]
        accepted = next((i for i, (a, b) in enumerate(zip(draft, after)) if a != b), min(len(draft), len(after)))
        c = self.counts.setdefault(source, [0, 0, 0])
        c[0], c[1], c[2] = c[0] + len(draft), c[1] + accepted, c[2] + 1


def _by_source(spec: dict | list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for s in spec if isinstance(spec, list) else [spec]:
        for source, v in s["by_source"].items():
            c = out.setdefault(source, [0, 0, 0])
            c[0], c[1], c[2] = c[0] + v["proposed"], c[1] + v["accepted"], c[2] + v["steps"]
    return out


def _spec_metrics(client) -> dict[str, list[float]]:
    text = client.get("/metrics").text
    names = ("proposed_tokens", "accepted_tokens", "steps")
    sources = ("prediction", "prompt", "ngram", "draft", "none")
    counts = {s: [metric_value(text, f"specserve_spec_{n}_total", source=s) for n in names] for s in sources}
    return {s: c for s, c in counts.items() if any(c)}


def test_speculation_counts_equal_an_independent_count_of_the_steps(client, monkeypatch):
    """Each answer's `speculation` per source, its usage's accepted / rejected prediction tokens
    and the /metrics counters against the truth counted from the steps, over predictions that
    are followed, edited and cut by a stop string, n > 1, sampling, n-grams and `auto`; the
    completion tokens are the answer's tokens, rejected prediction tokens not included."""
    base = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 40, "speculation": "none"}).json()
    text = base["choices"][0]["message"]["content"]
    before = _spec_metrics(client)
    truth = _Truth(monkeypatch)
    bodies = [
        {"prediction": {"type": "content", "content": text[:12] + "xx = yy\n" + text[12:]}},
        {"prediction": {"type": "content", "content": text}, "n": 2},
        {"prediction": {"type": "content", "content": text}, "stop": [text[15:18]]},
        {"prediction": {"type": "content", "content": "zz " * 30 + text}, "temperature": 0.9, "seed": 4},
        {"messages": [{"role": "user", "content": ASK * 3}], "speculation": "ngram"},
    ]
    totals: dict[str, list[int]] = {}
    for extra in bodies:
        for stream in (False, True):
            truth.counts.clear()
            body = {**CHAT, "max_tokens": 40, **extra}
            usage, spec = _answer(client, body, stream)
            assert _by_source(spec) == truth.counts, (extra, stream)
            proposed, accepted, _ = truth.counts.get("prediction", [0, 0, 0])
            details = usage["completion_tokens_details"]
            assert (details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]) == (
                accepted,
                proposed - accepted,
            )
            specs = spec if isinstance(spec, list) else [spec]
            assert usage["completion_tokens"] == sum(s["output_tokens"] for s in specs)
            for source, c in truth.counts.items():
                t = totals.setdefault(source, [0, 0, 0])
                totals[source] = [a + b for a, b in zip(t, c)]
    assert totals["prediction"][0] > totals["prediction"][1] > 0 and totals["ngram"][1] > 0
    deadline = time.monotonic() + 10  # the worker counts a step just after its answers go out
    while True:
        after = _spec_metrics(client)
        moved = {s: [int(a - b) for a, b in zip(c, before.get(s, [0, 0, 0]))] for s, c in after.items()}
        moved = {s: c for s, c in moved.items() if any(c)}
        if moved == totals or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert moved == totals


def _answer(client, body: dict, stream: bool):
    """(usage, speculation) of one chat answer, streamed or not; a stream's come on its usage chunk,
    sent after the engine's last step has been counted (its finish follows the step's commit)."""
    if not stream:
        r = client.post("/v1/chat/completions", json=body).json()
        return r["usage"], r["speculation"]
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return chunks[-1]["usage"], chunks[-1]["speculation"]


@pytest.mark.parametrize("n", [1, 3])
def test_prefix_cache_savings_agree_in_metrics_health_and_a_count_by_hand(client, monkeypatch, n):
    """Prompt tokens reused from the prefix cache, counted by hand: an answer's prompt counts once
    (as usage and specserve_prompt_tokens_total count it), so it reused the prompt tokens that
    enter the cache (all but the last) less those the target computed for it, over all its
    choices. With n = 3 /health's tokens_saved also counted the prefill that choices 1 and 2 copy
    from choice 0: a cold prompt saved 2 prefills there (a hit rate near 200% against the prompt
    tokens) while the cached-tokens counter and usage said 0."""
    from specserve.engine.request import Request

    fed: dict[int, int] = {}
    prefilled = Request.prefilled

    def counting(req, k, logits=None):
        fed[req.id] = fed.get(req.id, 0) + k
        return prefilled(req, k, logits)

    monkeypatch.setattr(Request, "prefilled", counting)
    names = ("specserve_prompt_tokens_cached_total", "specserve_prefix_cache_hit_requests_total")
    follow_up = {**CHAT, "messages": [*CHAT["messages"], {"role": "user", "content": "And the tests?"}]}
    by_hand = hits = 0
    for asked, ask in enumerate((CHAT, CHAT, follow_up), 1):
        fed.clear()
        usage = _post(client, {**ask, "n": n}, stream=False)
        reused = usage["prompt_tokens"] - 1 - sum(fed.values())
        assert usage["prompt_tokens_details"]["cached_tokens"] == reused
        by_hand, hits = by_hand + reused, hits + (reused > 0)
        health = client.get("/health").json()["prefix_cache"]
        assert _series(client, *names) == dict(zip(names, (by_hand, hits), strict=True))
        assert (health["tokens_saved"], health["hits"], health["lookups"]) == (by_hand, hits, asked)
    assert hits == 2  # the same prompt again and the follow-up start from cached prefixes


@pytest.mark.parametrize("n", [1, 2])
def test_prefix_hits_count_each_prompt_in_health_and_metrics(client, n):
    """A completions request with several prompts is one answer of several lookups: /health counted
    a hit per prompt that started from a cached prefix, specserve_prefix_cache_hit_requests_total
    one per answer (a repeat of two prompts: 2 hits in /health, 1 in /metrics; found comparing the
    two after a batched request). Both now count per prompt, as docs/server.md says of /health;
    the later choices of n > 1 copy choice 0's prefill and are not hits of their own in either."""
    names = ("specserve_prompt_tokens_cached_total", "specserve_prefix_cache_hit_requests_total")
    prompts = [ASK, "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n", "x"]
    body = {"model": "tiny", "prompt": prompts, "max_tokens": 4, "temperature": 0, "n": n}
    reported = 0
    for _ in range(2):  # cold, then the same prompts again: the two long ones hit, "x" cannot
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        reported += r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        health = client.get("/health").json()["prefix_cache"]
        cached, hits = _series(client, *names).values()
        assert (health["tokens_saved"], health["hits"]) == (cached, hits) and cached == reported
    assert (health["hits"], health["lookups"]) == (2, 6)


def test_a_stream_hung_up_after_a_prefix_hit_counts_the_hit_in_health_and_metrics(client):
    """A prompt that started from a cached prefix is a hit in /health as soon as it is admitted,
    whether or not its answer is ever sent; the Prometheus counters counted only answers sent in
    full (a 200), so a stream hung up mid-way left /health one hit (and its tokens) ahead for good
    (found by a soak: /health 23 hits, /metrics 21, after streams hung up by their clients)."""
    names = ("specserve_prompt_tokens_cached_total", "specserve_prefix_cache_hit_requests_total")
    _post(client, CHAT, stream=False)  # the prompt's prefix is cached now
    _hang_up(client, CHAT)
    health = client.get("/health").json()["prefix_cache"]
    assert health["hits"] == 1 and health["tokens_saved"] > 0
    assert _series(client, *names) == dict(zip(names, (health["tokens_saved"], health["hits"]), strict=True))


def _hang_up(client, body: dict) -> None:
    """Stream `body` long, hang up after its first chunk, and wait until the engine has dropped it."""
    with client.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": 200, "stream": True}) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith("data: {"))  # then hang up
    for _ in range(600):  # the engine drops the request at its next step
        if client.get("/health").json()["active"] == 0:
            break
        time.sleep(0.05)
    assert client.get("/health").json()["active"] == 0


def test_the_token_hit_rate_counts_the_same_prompts_above_and_below(client):
    """The prefix cache's token hit rate is cached tokens over the tokens of the prompts looked up,
    both counted by the engine at admission, so a prompt hung up after its prefix hit is in both.
    docs/server.md divided specserve_prompt_tokens_cached_total (every admitted prompt's reuse) by
    specserve_prompt_tokens_total (only answered prompts' usage): a cold answer and the same
    prompt hung up read a rate near 100% where half the prompt tokens were prefilled (found by
    reading the two counters' help texts side by side)."""
    cold = _post(client, CHAT, stream=False)["prompt_tokens"]  # prefilled in full
    _hang_up(client, CHAT)  # admitted from the cached prefix, then gone
    health = client.get("/health").json()["prefix_cache"]
    names = (
        "specserve_prompt_tokens_cached_total",
        "specserve_prefix_cache_queried_tokens_total",
        "specserve_prefix_cache_lookups_total",
        "specserve_prompt_tokens_total",
    )
    got = _series(client, *names)
    assert 0 < health["tokens_saved"] < cold
    assert (health["tokens_queried"], health["lookups"]) == (2 * cold, 2)
    assert got == dict(zip(names, (health["tokens_saved"], 2 * cold, 2, cold), strict=True))


def test_lookups_agree_in_health_and_metrics_after_hang_ups_faults_and_n(monkeypatch):
    """One lookup is one prompt admitted to the batch: an answer of n = 2 is one (its second choice
    copies the first's prefill), a stream hung up after admission is one, a request whose pass
    failed after admission is one. /health and the four Prometheus counters say the same after
    each, and the prompt tokens looked up are the prompts' usage, counted by hand."""
    from specserve.server import faults

    monkeypatch.setenv(faults.ENV, "1")
    llm = steady_prices(LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="auto"))[0]
    body = {**CHAT, "n": 2}
    names = (
        "specserve_prefix_cache_lookups_total",
        "specserve_prefix_cache_hit_requests_total",
        "specserve_prefix_cache_queried_tokens_total",
        "specserve_prompt_tokens_cached_total",
    )
    with TestClient(create_app(llm, "tiny")) as client:
        prompt = _post(client, body, stream=False)["prompt_tokens"]
        _hang_up(client, body)
        assert client.post("/debug/fault", json={"kind": "step"}).status_code == 200
        assert client.post("/v1/chat/completions", json=body).status_code == 500
        _post(client, body, stream=True)
        health = client.get("/health").json()["prefix_cache"]
        got = _series(client, *names)
    assert (health["lookups"], health["tokens_queried"]) == (4, 4 * prompt) and health["hits"] >= 2
    assert got == dict(zip(names, (health[k] for k in ("lookups", "hits", "tokens_queried", "tokens_saved"))))


def test_host_restored_tokens_is_a_counter_that_only_grows():
    """specserve_prefix_cache_host_restored_tokens was a gauge set to the host tier's running total:
    a total is a counter (`_total`, `# TYPE ... counter`), so rate() and resets read right. It
    now grows by what the host tier restored since the last scrape, and never falls."""
    from specserve.server.metrics import Metrics

    metrics, name = Metrics(), "specserve_prefix_cache_host_restored_tokens"

    def scrape(restored: int | None) -> str:
        host = None if restored is None else {"bytes": 64, "tokens_restored": restored}
        metrics.set_engine_state(0, 0, 0.0, 0, host)
        return metrics.render()[0].decode()

    text = scrape(5)
    assert f"# TYPE {name}_total counter" in text.splitlines()
    seen = [metric_value(text, f"{name}_total")]
    for restored in (12, 12, None, 30):
        seen.append(metric_value(scrape(restored), f"{name}_total"))
    assert seen == [5, 12, 12, 12, 30]
