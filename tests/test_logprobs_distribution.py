"""Which distribution `logprobs` / `top_logprobs` come from (docs/server.md, "Responses"): the target's
logits after `logit_bias`, the penalties and a grammar, before temperature, top-k and top-p. Pinned
here so the documented order cannot drift. In-process on a tiny model, float32."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "def add(a, b):"}],
    "max_tokens": 4,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 3,
}


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


def _content(client, **extra) -> list[dict]:
    r = client.post("/v1/chat/completions", json={**BODY, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["content"]


def test_temperature_top_k_and_top_p_leave_the_logprobs_alone(client):
    plain = _content(client)
    # top_k 1 keeps greedy's tokens; a temperature and top_p that reshape the sampled law do not show
    shaped = _content(client, temperature=1.7, top_k=1, top_p=0.5, seed=3)
    assert [e["token"] for e in shaped] == [e["token"] for e in plain]
    for a, b in zip(shaped, plain):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-5)
        assert [t["logprob"] for t in a["top_logprobs"]] == pytest.approx([t["logprob"] for t in b["top_logprobs"]])


def test_a_logit_bias_shows_in_the_logprobs(client):
    first = _content(client)[0]
    runner_up = first["top_logprobs"][1]["token"]
    tokenizer = tiny_tokenizer()
    banned = next(i for i in range(len(tokenizer)) if tokenizer.decode([i]) == runner_up)
    biased = _content(client, logit_bias={str(banned): -100})[0]
    assert biased["token"] == first["token"]
    assert biased["logprob"] > first["logprob"] + 1e-4  # the banned token's mass went to the rest
    assert runner_up not in [t["token"] for t in biased["top_logprobs"]]
