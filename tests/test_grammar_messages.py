"""A grammar xgrammar cannot compile is a one-line 400 in the client's words, not xgrammar's log line.

Found by sending a json_schema whose `pattern` is not a regex ("(a|b") through the openai SDK: the
400 read "cannot compile the json_schema constraint: [04:56:58] /project/cpp/regex_converter.cc:94:
Regex parsing error at position 5: The parenthesis is not closed.\\n", the time and source file of
xgrammar's C++ build and a newline in an OpenAI error message. Forced tool calls said the same
through their own path (`tools.call_grammar`). In-process on a tiny model.
"""

from __future__ import annotations

import string

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve import LLM
from specserve.engine.constrain import ConstraintError, ConstraintFactory, GrammarSpec, xgrammar_message
from specserve.server.app import create_app

BAD_PATTERN = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a|b"}}, "required": ["a"]}
VOCAB = list(string.printable) + ["<eos>"]
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


def assert_clean(message: str, words: str) -> None:
    assert words in message, message
    assert "\n" not in message and ".cc:" not in message and not message.startswith("["), message


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.mark.parametrize(
    "kind,source,words",
    [
        ("regex", "(a|b", "The parenthesis is not closed."),
        ("grammar", 'root ::= "a" | foo', 'Rule "foo" is not defined'),
    ],
)
def test_a_compile_error_is_xgrammars_words_alone(kind, source, words):
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    with pytest.raises(ConstraintError) as e:
        f.prepare(GrammarSpec(kind, source, param=f"structured_outputs.{kind}"))
    message = str(e.value)
    assert message.startswith(f"cannot compile the {kind} constraint: ")
    assert_clean(message, words)


def test_the_log_prefix_and_a_stack_trace_are_dropped():
    raw = RuntimeError("[04:56:58] /project/cpp/grammar_parser.cc:820: EBNF parser error\nStack trace:\n  [bt] (0) x")
    assert xgrammar_message(raw) == "EBNF parser error"
    assert xgrammar_message(ValueError("plain words\n")) == "plain words"


def test_a_json_schema_with_a_broken_pattern_is_a_clean_400(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": BAD_PATTERN}}
    r = client.post("/v1/chat/completions", json={**CHAT, "response_format": fmt})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert_clean(error["message"], "The parenthesis is not closed.")


def test_a_forced_tool_with_a_broken_pattern_is_a_clean_400(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": BAD_PATTERN}}
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools"
    assert_clean(error["message"], "The parenthesis is not closed.")
