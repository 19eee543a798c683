"""The 400 for a feature this server does not implement reads as one sentence: the parameter, the
feature, "is not supported by this server", then what to send instead.

Found by using the server with the openai SDK as a newcomer: `functions=[...]` got "functions:
function calling is not supported by this server", which reads as if tool calls were not served
either (they are: `tools`), and the advice of other refusals sat in parentheses before the verb
("best_of=2 (...; ask for n choices and rank them yourself) is not supported", "conversation
objects (continue with previous_response_id) is not supported"). In-process on a tiny model.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}
RESPONSE = {"model": "tiny", "input": "hi", "max_output_tokens": 3, "temperature": 0}
FUNCTION = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}
# (path, body, the parameter the 400 names, a word of what to send instead, or None)
REFUSALS = [
    ("/v1/chat/completions", {**CHAT, "functions": [FUNCTION]}, "functions", "tools"),
    ("/v1/chat/completions", {**CHAT, "function_call": "auto"}, "function_call", "tools"),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "function", "name": "f", "content": "1"}]},
        "messages[0].role",
        "tool",
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content[0]",
        "text",
    ),
    ("/v1/chat/completions", {**CHAT, "min_p": 0.1}, "min_p", "top_p"),
    ("/v1/completions", {**COMPLETION, "best_of": 2, "n": 1}, "best_of", "rank them yourself"),
    ("/v1/completions", {**COMPLETION, "echo": True, "suffix": "x"}, "echo", None),
    ("/v1/responses", {**RESPONSE, "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ("/v1/responses", {**RESPONSE, "prompt": {"id": "pmpt_1"}}, "prompt", "instructions"),
    ("/v1/responses", {**RESPONSE, "background": True}, "background", None),
    ("/v1/responses", {**RESPONSE, "tools": [{"type": "web_search"}]}, "tools[0].type", "function tools"),
    (
        "/v1/responses",
        {**RESPONSE, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0]",
        "text parts",
    ),
]


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.mark.parametrize("path,body,param,instead", REFUSALS, ids=[r[2] for r in REFUSALS])
def test_a_refusal_names_the_parameter_then_says_what_to_send_instead(client, path, body, param, instead):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "unsupported_parameter"
    message = error["message"]
    assert message.startswith(f"{param}: ") and "\n" not in message
    feature, verb, after = message[len(param) + 2 :].partition(" is not supported by this server")
    assert verb, message
    assert not feature.endswith(")"), f"advice before the verb: {message}"
    assert not feature.endswith("s"), f"a plural feature: {message}"
    if instead is None:
        assert after == "", message
    else:
        assert after.startswith("; ") and instead in after, message
