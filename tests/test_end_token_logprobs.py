"""Logprobs list the tokens of the answer's text, not the end-of-text token that ended it.

OpenAI's logprobs (chat `logprobs.content`, the legacy completions `logprobs`, the Responses API's
output_text `logprobs`) never show the token that ends an answer with finish_reason "stop"; vLLM
lists it (an empty-text token). Ours listed it too: its text is not in the answer, so the entries
did not spell the text. `usage.completion_tokens` still counts it: the model generated it.

On the SmolLM2 pack, whose instruct answer to a short question ends on `<|im_end|>`.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from specserve.llm import LLM
from specserve.server.app import create_app

MESSAGES = [{"role": "user", "content": "Say hello."}]
COMMON = {"model": "smol", "max_tokens": 60, "temperature": 0}


@pytest.fixture(scope="module")
def client(smol_gguf):
    llm = LLM(model=str(smol_gguf), exact=True, speculation="none")
    with TestClient(create_app(llm, "smol")) as http:
        http.prompt = llm.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        yield http


def _ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _events(r) -> list[dict]:
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_chat_lists_no_end_token(client):
    body = {**COMMON, "messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    answer = _ok(client.post("/v1/chat/completions", json=body))
    choice, tokens = answer["choices"][0], [e["token"] for e in answer["choices"][0]["logprobs"]["content"]]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"]
    assert "".join(tokens) == choice["message"]["content"] and "<|im_end|>" not in tokens
    assert answer["usage"]["completion_tokens"] == len(tokens) + 1  # the end token is counted, not listed
    chunks = _events(client.post("/v1/chat/completions", json={**body, "stream": True}))
    lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert [e["token"] for lp in lps for e in lp["content"]] == tokens
    assert all(lp["content"] for lp in lps)  # no chunk is sent for the end token alone


def test_completions_list_no_end_token(client):
    body = {**COMMON, "prompt": client.prompt, "logprobs": 1}
    answer = _ok(client.post("/v1/completions", json=body))
    choice, lp = answer["choices"][0], answer["choices"][0]["logprobs"]
    assert choice["finish_reason"] == "stop" and choice["text"]
    assert "".join(lp["tokens"]) == choice["text"] and "<|im_end|>" not in lp["tokens"]
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == len(lp["tokens"])
    assert answer["usage"]["completion_tokens"] == len(lp["tokens"]) + 1
    chunks = _events(client.post("/v1/completions", json={**body, "stream": True}))
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]


def test_responses_list_no_end_token(client):
    body = {"model": "smol", "input": MESSAGES, "temperature": 0, "max_output_tokens": 60}
    body["include"] = ["message.output_text.logprobs"]
    answer = _ok(client.post("/v1/responses", json=body))
    assert answer["status"] == "completed"
    part = answer["output"][0]["content"][0]
    tokens = [e["token"] for e in part["logprobs"]]
    assert part["text"] and "".join(tokens) == part["text"] and "<|im_end|>" not in tokens
    assert answer["usage"]["output_tokens"] == len(tokens) + 1
    r = client.post("/v1/responses", json={**body, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    deltas = [lp["token"] for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    assert [e["token"] for e in done["logprobs"]] == deltas == tokens
