"""`GET /v1/responses/{id}/input_items`, in-process on a tiny model, read through the `openai` SDK.

OpenAI's list: `object` "list", `data` (input items, each with an id), `first_id`, `last_id`,
`has_more`; `limit` 1..100 (20), `order` asc | desc (desc), `after` an item id. A response made with
`previous_response_id` lists the whole chain: the earlier turns' inputs and the answers to them,
then its own input (OpenAI answers so, and so do the servers that copy it)."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

KW = {"model": "tiny", "temperature": 0, "max_output_tokens": 3}


@pytest.fixture(scope="module")
def http():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.fixture(scope="module")
def client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def _texts(items) -> list[str]:
    return [item.content[0].text if item.type == "message" else item.type for item in items]


def test_a_string_input_is_one_user_message_item(client):
    resp = client.responses.create(input="hello there", **KW)
    page = client.responses.input_items.list(resp.id)
    assert page.object == "list" and page.has_more is False
    [item] = page.data
    assert item.type == "message" and item.role == "user" and item.id.startswith("msg_")
    assert item.content[0].type == "input_text" and item.content[0].text == "hello there"
    assert page.first_id == page.last_id == item.id


def test_items_keep_their_order_kinds_and_ids(client):
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}", "id": "fc_given"}
    items = [
        {"role": "user", "content": "a"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": "c"},
        {"role": "developer", "content": [{"type": "input_text", "text": "d"}]},
    ]
    resp = client.responses.create(input=items, **KW)
    data = client.responses.input_items.list(resp.id, order="asc").data
    assert _texts(data) == ["a", "b", "function_call", "function_call_output", "d"]
    assert data[1].content[0].type == "output_text" and data[1].role == "assistant"
    assert (data[2].id, data[2].call_id, data[2].name, data[2].arguments) == ("fc_given", "call_1", "f", "{}")
    assert data[3].call_id == "call_1" and data[3].output == "c"
    ids = [item.id for item in data]
    assert all(ids) and len(set(ids)) == len(ids)
    desc = client.responses.input_items.list(resp.id).data  # OpenAI's default order: newest first
    assert [item.id for item in desc] == ids[::-1]


def test_limit_and_after_page_through_the_items(client, http):
    resp = client.responses.create(input=[{"role": "user", "content": str(i)} for i in range(5)], **KW)
    first = http.get(f"/v1/responses/{resp.id}/input_items", params={"limit": 2, "order": "asc"}).json()
    assert [i["content"][0]["text"] for i in first["data"]] == ["0", "1"] and first["has_more"] is True
    assert first["last_id"] == first["data"][-1]["id"] and first["first_id"] == first["data"][0]["id"]
    rest = http.get(
        f"/v1/responses/{resp.id}/input_items", params={"limit": 2, "order": "asc", "after": first["last_id"]}
    ).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["2", "3"] and rest["has_more"] is True
    every = client.responses.input_items.list(resp.id, limit=2, order="asc")  # the SDK pages on with `after`
    assert [item.content[0].text for item in every] == ["0", "1", "2", "3", "4"]
    assert http.get(f"/v1/responses/{resp.id}/input_items", params={"include": ["message.output_text.logprobs"]}).json()


def test_a_chained_response_lists_the_earlier_turns_and_their_answers(client):
    first = client.responses.create(input="one", **KW)
    second = client.responses.create(previous_response_id=first.id, input="two", **KW)
    data = client.responses.input_items.list(second.id, order="asc").data
    assert [item.role for item in data] == ["user", "assistant", "user"]
    assert data[0].content[0].text == "one" and data[2].content[0].text == "two"
    assert data[1].id == first.output[0].id and data[1].content[0].text == first.output_text
    assert len(client.responses.input_items.list(first.id).data) == 1  # the first response's own list is unchanged


@pytest.mark.parametrize(
    "query,param",
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"order": "up"}, "order"),
        ({"before": "msg_x"}, "before"),
    ],
)
def test_a_bad_query_is_a_400_naming_it(client, http, query, param):
    """`before` is not in OpenAI's list since openai-python 1.101.0 (the API dropped it); older
    SDKs still send it for the previous page, which was served as the first page without a word."""
    resp = client.responses.create(input="hi", **KW)
    r = http.get(f"/v1/responses/{resp.id}/input_items", params=query)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_an_unknown_response_or_item_is_openai_shaped(client, http):
    r = http.get("/v1/responses/resp_nope/input_items")
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")
    kept = client.responses.create(input="hi", **KW)
    r = http.get(f"/v1/responses/{kept.id}/input_items", params={"after": "msg_nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "after"
    unkept = client.responses.create(input="hi", store=False, **KW)
    assert http.get(f"/v1/responses/{unkept.id}/input_items").status_code == 404
