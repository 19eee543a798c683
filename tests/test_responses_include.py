"""`include` on `POST /v1/responses`: OpenAI's values are an enum, and a value outside it is a 400
naming the entry; "message.output_text.logprobs" is served, the others (items this server never
writes: searches, code runs, images, encrypted reasoning) are accepted and change nothing.
In-process on a tiny model, through the SDK."""

from __future__ import annotations

import openai
import pytest
from tiny_sdk import sdk_fixtures

KW = {"model": "tiny", "input": "hi", "temperature": 0, "max_output_tokens": 3}


llm, client = sdk_fixtures()


def test_an_unknown_include_is_a_400_naming_it(client):
    """A misspelt entry ("message.output_text.logprob") was accepted: the client that asked for
    logprobs got `logprobs: []` and no word why."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**KW, include=["reasoning.encrypted_content", "message.output_text.logprob"])
    body = e.value.body
    assert body["param"] == "include[1]" and "message.output_text.logprob'" in body["message"], body
    assert "message.output_text.logprobs" in body["message"]  # the values it may take are named


def test_the_known_entries_are_accepted(client):
    known = ["reasoning.encrypted_content", "file_search_call.results", "message.input_image.image_url"]
    resp = client.responses.create(**KW, include=[*known, "message.output_text.logprobs"])
    assert resp.output[0].content[0].logprobs  # the one served
    assert client.responses.create(**KW, include=known).output[0].content[0].logprobs == []
