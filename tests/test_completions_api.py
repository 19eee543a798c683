"""/v1/completions against OpenAI's legacy API reference, in-process on a tiny model: what it
refuses as OpenAI (and vLLM) refuse it."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

BODY = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.mark.parametrize(
    "path,extra,param",
    [
        # best_of below n: OpenAI and vLLM refuse it; it was served as n choices
        ("/v1/completions", {"n": 2, "best_of": 1}, "best_of"),
        # stream_options without stream: OpenAI's "only allowed when 'stream' is enabled"; it was ignored
        ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
        ("/v1/chat/completions", {"stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
    ],
)
def test_what_openai_refuses_is_a_400_naming_the_parameter(client, path, extra, param):
    body = {**(BODY if path == "/v1/completions" else CHAT), **extra}
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_what_openai_allows_still_passes(client):
    assert client.post("/v1/completions", json={**BODY, "n": 1, "best_of": 1}).status_code == 200
    r = client.post("/v1/completions", json={**BODY, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and '"usage":{"prompt_tokens"' in r.text


def _streamed(client, body: dict) -> tuple[dict, dict | None]:
    """A stream's choices put together as the answer without stream shows them, and its usage."""
    r = client.post("/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    choices: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            got = choices.setdefault(c["index"], {"index": c["index"], "text": "", "logprobs": None})
            got["text"] += c["text"]
            got["finish_reason"] = c["finish_reason"] or got.get("finish_reason")
            if c["logprobs"]:
                got["logprobs"] = got["logprobs"] or {k: [] for k in c["logprobs"]}
                for k, v in c["logprobs"].items():
                    got["logprobs"][k] += v
    return [choices[i] for i in sorted(choices)], chunks[-1]["usage"]


@pytest.mark.parametrize(
    "extra",
    [
        {"echo": True},
        {"echo": True, "logprobs": 2},
        {"echo": True, "logprobs": 1, "max_tokens": 0},  # a scored prompt: the prompt alone
        {"echo": True, "logprobs": 0, "n": 2, "prompt": ["def add(a, b):", "import os"]},
        {"echo": True, "logprobs": 1, "prompt": [[5, 17, 30], [41, 12]]},
        {"echo": True, "logprobs": 1, "stop": "E"},
    ],
)
def test_echo_streams_what_it_answers_without_stream(client, extra):
    """echo with stream was a 400; OpenAI and vLLM stream the prompt first, then the completion."""
    body = {**BODY, "max_tokens": 6, **extra}
    full = client.post("/v1/completions", json=body).json()
    choices, usage = _streamed(client, body)
    assert choices == [{k: c[k] for k in ("index", "text", "logprobs", "finish_reason")} for c in full["choices"]]
    assert usage == full["usage"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_echoed_prompt_is_scored_without_the_logit_bias(client, stream):
    """The prompt's scores are the model's own (docs/server.md, "Scoring a text"); the bias shapes
    the completion only, as OpenAI's logit_bias and vLLM's prompt logprobs do."""
    prompt = [5, 17, 30, 41, 12]
    body = {**BODY, "prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 2}
    bias = {"17": -100, "41": -100, "30": 100}

    def scored(extra):
        b = {**body, **extra}
        choice = _streamed(client, b)[0][0] if stream else client.post("/v1/completions", json=b).json()["choices"][0]
        return choice["logprobs"]

    plain, biased = scored({}), scored({"logit_bias": bias})
    n = len(prompt)
    assert biased["token_logprobs"][:n] == pytest.approx(plain["token_logprobs"][:n], abs=1e-5)
    assert biased["token_logprobs"][0] is None and min(biased["token_logprobs"][1:n]) > -50  # not banned
    assert [list(t) for t in biased["top_logprobs"][1:n]] == [list(t) for t in plain["top_logprobs"][1:n]]
    assert biased["token_logprobs"][n:] == pytest.approx([0.0, 0.0], abs=1e-4)  # the completion is forced


@pytest.mark.parametrize("prompt", [[True, 5], ["a", [5, 17]], [[1, 2], "x"], [1.5], {"a": 1}, [[1, "2"]]])
def test_a_malformed_prompt_is_told_which_shapes_a_prompt_takes(client, prompt):
    """pydantic's own message was "Input should be a valid string", the first of four shapes."""
    r = client.post("/v1/completions", json={**BODY, "prompt": prompt})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and "a list of token ids" in err["message"] and "valid string" not in err["message"]


@pytest.mark.parametrize("prompt", ["x", ["a", "b"], [5, 17], [5.0, 17], [[5, 17], [3]]])
def test_every_prompt_shape_is_still_served(client, prompt):
    r = client.post("/v1/completions", json={**BODY, "prompt": prompt})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == (len(prompt) if isinstance(prompt[0], str | list) and prompt != "x" else 1)
