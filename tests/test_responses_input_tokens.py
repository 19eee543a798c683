"""`POST /v1/responses/input_tokens` (`client.responses.input_tokens.count`) counts a Responses
request's prompt without compiling its grammar: a `text.format` schema or a forced tool call
constrains the answer, not the prompt, so the count is the same with or without one, and the
request's fields are still checked as a create checks them (a bad schema is the same 400).
In-process on a tiny model, through the `openai` SDK."""

from __future__ import annotations

import openai
import pytest
from tiny_sdk import sdk_fixtures

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
TOOL = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}


llm, client = sdk_fixtures()


@pytest.fixture
def compiled(llm, monkeypatch) -> list:
    """The grammars the model is asked to compile while a test runs."""
    specs = []
    real = llm.compile_guide

    def spy(spec, wait=True):
        specs.append(spec)
        return real(spec, wait)

    monkeypatch.setattr(llm, "compile_guide", spy)
    return specs


@pytest.mark.parametrize(
    "plain,extra",
    [({}, {"text": FORMAT}), ({"tools": [TOOL]}, {"tool_choice": "required"})],
    ids=["text.format", "forced-call"],
)
def test_a_count_compiles_no_grammar_and_counts_what_a_create_bills(client, compiled, plain, extra):
    """The count started the grammar's compilation on the grammar threads and never awaited it: a
    big schema held a compiler (which creates wait for) for nothing."""
    plain = {"input": "hi", **plain}
    counted = client.responses.input_tokens.count(model="tiny", **plain, **extra)
    assert compiled == []
    assert counted.input_tokens == client.responses.input_tokens.count(model="tiny", **plain).input_tokens
    made = client.responses.create(model="tiny", max_output_tokens=2, **plain, **extra)
    assert made.usage.input_tokens == counted.input_tokens and len(compiled) == 1  # a create compiles it


@pytest.mark.parametrize(
    "text,param",
    [
        ({"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}, "text.format.schema"),
        ({"format": {"type": "json_schema", "schema": SCHEMA}}, "text.format.name"),
        ({"format": {"type": "yaml"}}, "text.format.type"),
    ],
)
def test_a_count_refuses_a_format_a_create_refuses(client, compiled, text, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.input_tokens.count(model="tiny", input="hi", text=text)
    assert e.value.body["param"] == param and compiled == [], e.value.body
