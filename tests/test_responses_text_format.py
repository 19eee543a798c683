"""Where the Responses API's shapes differ from chat's. Its `text.format` of type `json_schema`
requires `name` and `schema`, as OpenAI's reference does (ResponseFormatTextJSONSchemaConfig);
chat's `response_format.json_schema` requires only `name` there (its `schema` is optional), and a
missing schema stays served as a JSON object. Its function tools are flat (`name` beside `type`),
and a chat-shaped one is told so. In-process on a tiny model."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
RESPONSES = {"model": "tiny", "input": "hi", "max_output_tokens": 8, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.mark.parametrize(
    "fmt,param",
    [
        ({"type": "json_schema", "name": "answer"}, "text.format.schema"),  # was served as any JSON object
        ({"type": "json_schema", "schema": SCHEMA}, "text.format.name"),
        ({"type": "json_schema", "name": 5, "schema": SCHEMA}, "text.format.name"),
    ],
)
def test_a_json_schema_format_without_schema_or_name_is_a_400(client, fmt, param):
    r = client.post("/v1/responses", json={**RESPONSES, "text": {"format": fmt}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]


def test_a_whole_json_schema_format_is_served(client):
    fmt = {"type": "json_schema", "name": "answer", "schema": SCHEMA}
    r = client.post("/v1/responses", json={**RESPONSES, "max_output_tokens": 20, "text": {"format": fmt}})
    assert r.status_code == 200, r.text


def test_chat_without_schema_is_accepted_as_openai_accepts_it(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer"}}
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 30, "response_format": fmt})
    assert r.status_code == 200, r.text
    body = r.json()["choices"][0]
    if body["finish_reason"] == "stop":  # a finished answer is a JSON object
        assert isinstance(json.loads(body["message"]["content"]), dict)


def test_a_chat_shaped_tool_is_told_the_flat_shape(client):
    """A chat tool (`{"type": "function", "function": {...}}`, what `openai.pydantic_function_tool`
    returns) sent to the Responses API was told "tools[0].name must be 1-64 letters, digits, '_' or
    '-'", about a name it had, one level down."""
    tool = {"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}
    r = client.post("/v1/responses", json={**RESPONSES, "tools": [tool]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools[0].name" and error["code"] == "missing_required_parameter", error
    assert "missing required parameter 'tools[0].name'" in error["message"] and "flat" in error["message"]
