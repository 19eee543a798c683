"""Two requests OpenAI refuses and this server serves on purpose (docs/server.md, "Tools"), as vLLM
does, because vLLM-style clients send them: `tools: []` (no tools: the answer is not parsed for
calls; `tool_choice` "auto" / "required" beside it are still 400s), and an assistant turn whose
tool calls no tool message answers. Pinned so that the documented leniences stay true.
In-process on a tiny model."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


def test_an_empty_tools_list_is_served_as_no_tools(client):
    plain = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    for extra in ({"tools": []}, {"tools": [], "tool_choice": "none"}):
        r = client.post("/v1/chat/completions", json={**CHAT, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == plain["content"]
    r = client.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 3, "tools": []})
    assert r.status_code == 200, r.text
    named = {"type": "function", "function": {"name": "f"}}
    for choice in ("auto", "required", named):  # a choice that needs a tool still has none to choose
        r = client.post("/v1/chat/completions", json={**CHAT, "tools": [], "tool_choice": choice})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


def test_tool_calls_no_tool_message_answers_are_served(client):
    messages = [*CHAT["messages"], {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": [*messages, {"role": "user", "content": "go"}]})
    assert r.status_code == 200, r.text
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    items = [{"role": "user", "content": "hi"}, call, {"role": "user", "content": "go"}]
    r = client.post("/v1/responses", json={"model": "tiny", "input": items, "max_output_tokens": 3})
    assert r.status_code == 200, r.text
