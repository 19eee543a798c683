"""What OpenAI does only for responses created with `background: true`, which this server refuses.
`POST /v1/responses/{id}/cancel` (`client.responses.cancel`): a kept response is OpenAI's 400 for a
synchronous one ("Cannot cancel a synchronous response.") and stays as it was; an id that is not
kept is the 404 of the other stored-response routes. `GET /v1/responses/{id}?stream=true` (a
background response's events) is a 400 naming `stream`. In-process on a tiny model."""

from __future__ import annotations

import openai
import pytest
from tiny_sdk import sdk_fixtures

KW = {"model": "tiny", "input": "hi", "temperature": 0, "max_output_tokens": 3}


llm, client = sdk_fixtures()


def test_a_kept_response_is_refused_as_synchronous_and_stays_as_it_was(client):
    """The route was missing: the SDK got a 404 `Invalid URL`, as if the response were unknown."""
    made = client.responses.create(**KW)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(made.id)
    body = e.value.body
    assert body["message"] == "Cannot cancel a synchronous response." and body["type"] == "invalid_request_error"
    assert client.responses.retrieve(made.id).model_dump() == made.model_dump()


def test_an_unknown_or_unkept_response_is_a_404(client):
    unkept = client.responses.create(**KW, store=False)
    for response_id in ("resp_none", unkept.id):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.cancel(response_id)
        assert e.value.body["code"] == "response_not_found" and response_id in e.value.body["message"]


def test_a_background_response_is_refused_when_created(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**KW, background=True)
    assert e.value.body["param"] == "background"


def test_a_stream_of_a_kept_response_is_a_400_naming_stream(client):
    """`retrieve(id, stream=True)` (OpenAI streams a background response's events) got the JSON
    body, in which the SDK found no events: an empty stream and no error."""
    made = client.responses.create(**KW)
    with pytest.raises(openai.BadRequestError) as e:
        list(client.responses.retrieve(made.id, stream=True))
    assert e.value.body["param"] == "stream" and "background" in e.value.body["message"]
    assert client.responses.retrieve(made.id, stream=False).id == made.id
