"""`truncation: "auto"` drops the conversation's oldest turns until the input fits the context
(with room for `max_output_tokens`), as OpenAI's reference says; `"disabled"`, the default, is a
400 for an input over it. In-process on a tiny model (512 tokens of context), through the SDK."""

from __future__ import annotations

import openai
import pytest
from tiny_sdk import sdk_fixtures

KW = {"model": "tiny", "temperature": 0, "max_output_tokens": 4}
LONG = "word " * 100  # about 300 tokens: two such turns do not fit in 512, one does
OLD = [{"role": "user", "content": LONG}, {"role": "assistant", "content": "ok"}]
NEW = [{"role": "user", "content": LONG + "and now?"}]


llm, client = sdk_fixtures()


def test_auto_drops_the_oldest_turns_until_the_input_fits(client):
    """ "auto" was accepted and changed nothing: the same 400 as "disabled", and the answer said
    "truncation": "disabled"."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input=OLD + NEW, instructions="Be brief.", **KW)
    assert e.value.body["code"] == "context_length_exceeded"
    cut = client.responses.create(input=OLD + NEW, instructions="Be brief.", truncation="auto", **KW)
    alone = client.responses.create(input=NEW, instructions="Be brief.", **KW)
    assert cut.truncation == "auto" and alone.truncation == "disabled"
    assert cut.output_text == alone.output_text and cut.usage.input_tokens == alone.usage.input_tokens
    counted = client.responses.input_tokens.count(input=OLD + NEW, instructions="Be brief.", truncation="auto")
    assert counted.input_tokens == cut.usage.input_tokens


def test_auto_keeps_a_conversation_that_fits_and_a_last_turn_that_does_not_is_still_a_400(client):
    short = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and?"},
    ]
    kept = client.responses.create(input=short, truncation="auto", **KW)
    assert kept.usage.input_tokens == client.responses.create(input=short, **KW).usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input=[{"role": "user", "content": LONG * 2}], truncation="auto", **KW)
    assert e.value.body["code"] == "context_length_exceeded"


def test_a_continued_conversation_is_cut_as_the_same_input_would_be(client):
    first = client.responses.create(input=OLD[:1], **KW)
    later = client.responses.create(input=NEW, previous_response_id=first.id, truncation="auto", **KW)
    alone = client.responses.create(input=NEW, **KW)
    assert later.usage.input_tokens == alone.usage.input_tokens and later.output_text == alone.output_text


def test_an_input_over_the_context_is_told_in_a_sentence_that_agrees(client):
    """Chat's "the messages have N tokens", renamed for a Responses client, read "the input have"."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input=LONG * 2, **KW)
    message = e.value.body["message"]
    assert "the input has " in message and " have " not in message, message


def test_auto_templates_a_long_conversation_a_few_times_not_once_per_turn(client, llm, monkeypatch):
    """Each dropped turn templated and tokenized the whole conversation again: 40 turns over the
    context were about 40 templatings on the prep thread. The turns to drop are found by bisection."""
    calls = []
    real = llm.apply_chat_template
    monkeypatch.setattr(llm, "apply_chat_template", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    turns = [m for i in range(40) for m in ({"role": "user", "content": f"turn {i} " + "word " * 20}, OLD[1])]
    cut = client.responses.create(input=[*turns, *NEW], truncation="auto", **KW)
    assert cut.output_text == client.responses.create(input=NEW, **KW).output_text
    assert len(calls) <= 12, len(calls)  # bisection over 40 turns: about 2 + log2(40), and the plain create's 1


TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
OPENINGS = {  # what a conversation may open with before its first user message
    "an assistant greeting": [{"role": "assistant", "content": LONG}],
    "a tool call and its output": [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": LONG},
    ],
}


@pytest.mark.parametrize("opening", list(OPENINGS))
def test_auto_drops_what_comes_before_the_first_user_message_first(client, opening):
    """A turn began at a user message, so what a conversation opened with before its first one was
    in no turn and never dropped: with one user message after it, the 400 of an input over the
    context, where that last turn alone fits (docs/server.md: only a last turn over the context
    alone is still the 400). It is now the oldest turn."""
    cut = client.responses.create(input=[*OPENINGS[opening], *NEW], tools=[TOOL], truncation="auto", **KW)
    alone = client.responses.create(input=NEW, tools=[TOOL], **KW)
    assert cut.usage.input_tokens == alone.usage.input_tokens
