"""The numbers /metrics shows, checked against what the requests did, in-process on a tiny float32 model.

Each series is compared with a count made independently of the engine's own bookkeeping: the
requests answered, the usage they reported, the tokens each step fed the target and committed."""

from __future__ import annotations

import json

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
