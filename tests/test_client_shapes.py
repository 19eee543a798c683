"""Requests shaped exactly as real clients send them (captured from the openai SDK, openai-agents,
langchain-openai and litellm against `specserve serve`; docs/server.md, "Tried with"), each one
that a client sent and the server mishandled pinned here. In-process on a tiny model; the openai
SDK talks to the app through the test client (an httpx client)."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import ServerOptions, create_app

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
RESPONSE = {"model": "tiny", "input": "hi", "max_output_tokens": 3, "temperature": 0}


class City(BaseModel):  # no docstring: the SDK's pydantic_function_tool sends "description": null
    city: str = Field(max_length=4)  # a short string: the tiny model's forced call ends


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.fixture(scope="module")
def sdk(client):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client, max_retries=0)


def test_a_pydantic_function_tool_in_responses_parse_is_served(sdk):
    resp = sdk.responses.parse(
        model="tiny",
        input="Weather in Paris?",
        tools=[openai.pydantic_function_tool(City)],
        tool_choice="required",
        max_output_tokens=120,
    )
    [call] = [item for item in resp.output if item.type == "function_call"]
    assert call.name == "City" and isinstance(call.parsed_arguments, City)


@pytest.mark.parametrize("field", ["description", "parameters", "strict"])
def test_a_null_tool_field_is_read_as_absent(client, field):
    fn = {"name": "f", "description": "a tool", "parameters": {"type": "object", "properties": {}}, field: None}
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": [{"type": "function", "function": fn}]})
    assert r.status_code == 200, r.text
    r = client.post("/v1/responses", json={**RESPONSE, "tools": [{"type": "function", **fn}]})
    assert r.status_code == 200, r.text
    forced = {"tools": [{"type": "function", "function": fn}], "tool_choice": "required", "max_tokens": 200}
    r = client.post("/v1/chat/completions", json={**CHAT, **forced})
    assert r.status_code == 200, r.text
    [call] = r.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "f" and call["function"]["arguments"].startswith("{")


def test_a_stored_prompt_template_is_a_400_not_ignored(client):
    """openai-agents' `Agent(prompt={"id": "pmpt_..."})` sends `prompt` (a template stored at OpenAI,
    holding the instructions) and may leave `model` to it: answered without it, the agent ran with
    no instructions at all."""
    for prompt in ({"id": "pmpt_1"}, {"id": "pmpt_1", "version": "2", "variables": {"city": "Paris"}}):
        r = client.post("/v1/responses", json={**RESPONSE, "prompt": prompt})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "prompt"
    assert client.post("/v1/responses", json={**RESPONSE, "prompt": None}).status_code == 200


def test_chat_web_search_options_are_a_400_not_ignored(client):
    """`web_search_options` (the SDK's `chat.completions.create(web_search_options={})`, litellm's
    `web_search_options`) asks for answers from a web search this server cannot run: served without
    one, the model made the results up. A Responses `web_search` tool is refused the same way."""
    for options in ({}, {"search_context_size": "low"}):
        r = client.post("/v1/chat/completions", json={**CHAT, "web_search_options": options})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "web_search_options"
    assert client.post("/v1/chat/completions", json={**CHAT, "web_search_options": None}).status_code == 200


def _two_tools(flat: bool) -> list[dict]:
    fns = [{"name": n, "parameters": {"type": "object", "properties": {}}} for n in ("f", "g")]
    return [{"type": "function", **fn} if flat else {"type": "function", "function": fn} for fn in fns]


def test_an_allowed_tools_choice_limits_the_calls_to_those_it_names(client):
    """OpenAI's `tool_choice: {"type": "allowed_tools", ...}` (the SDK types it on both endpoints,
    litellm passes it on): the model may call only the named tools, `mode` "required" forcing one
    of them. It was a 400 ("tool_choice must be 'none', 'auto', 'required' or ...")."""
    chat_choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [_ref("g", flat=False)]}}
    r = client.post(
        "/v1/chat/completions", json={**CHAT, "tools": _two_tools(False), "tool_choice": chat_choice, "max_tokens": 200}
    )
    assert r.status_code == 200, r.text
    assert [c["function"]["name"] for c in r.json()["choices"][0]["message"]["tool_calls"]] == ["g"]
    flat_choice = {"type": "allowed_tools", "mode": "required", "tools": [_ref("g", flat=True)]}
    body = {**RESPONSE, "tools": _two_tools(True), "tool_choice": flat_choice, "max_output_tokens": 200}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert [item["name"] for item in r.json()["output"] if item["type"] == "function_call"] == ["g"]
    auto = {"type": "allowed_tools", "mode": "auto", "tools": [_ref("f", flat=True)]}
    assert client.post("/v1/responses", json={**body, "tool_choice": auto}).status_code == 200


def _ref(name: str, flat: bool) -> dict:
    return {"type": "function", "name": name} if flat else {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize(
    "allowed, param",
    [
        ({"mode": "sometimes", "tools": [{"type": "function", "function": {"name": "f"}}]}, "allowed_tools.mode"),
        ({"mode": "auto", "tools": []}, "allowed_tools.tools"),
        ({"mode": "auto", "tools": [{"type": "function", "function": {"name": "h"}}]}, "allowed_tools.tools[0]"),
    ],
)
def test_a_bad_allowed_tools_choice_is_a_400_naming_it(client, allowed, param):
    choice = {"type": "allowed_tools", "allowed_tools": allowed}
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": _two_tools(False), "tool_choice": choice})
    assert r.status_code == 400 and r.json()["error"]["param"] == f"tool_choice.{param}", r.text
    refs = [_ref(t["function"]["name"], flat=True) for t in allowed["tools"]]
    flat = {"type": "allowed_tools", "mode": allowed["mode"], "tools": refs}
    r = client.post("/v1/responses", json={**RESPONSE, "tools": _two_tools(True), "tool_choice": flat})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice." + param.split(".", 1)[1], r.text


def test_a_forced_allowed_tool_refused_for_its_schema_is_named_by_its_own_index(client):
    """allowed_tools offers the model a subset of the tools, and a forced call's schema is checked
    for what its grammar cannot enforce: the 400 names the tool by its index in the request's
    `tools` (it named it by its index in the subset, tools[0] for the second tool)."""
    tools = _two_tools(False)
    tools[1]["function"]["parameters"] = {"type": "object", "properties": {"x": {"type": "string", "format": "nope"}}}
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [_ref("g", flat=False)]}}
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": tools, "tool_choice": choice})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1].function.parameters", r.text
    flat_tools = [{"type": "function", **t["function"]} for t in tools]
    flat = {"type": "allowed_tools", "mode": "required", "tools": [_ref("g", flat=True)]}
    r = client.post("/v1/responses", json={**RESPONSE, "tools": flat_tools, "tool_choice": flat})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1].parameters", r.text


def test_an_assistant_refusal_part_in_the_history_is_its_text(client):
    """A conversation carried over from OpenAI (an openai-agents run whose history an earlier model
    wrote; a chat log replayed) may hold an assistant turn whose content is a `refusal` part, which
    OpenAI's types allow there: it was a 400 ("content part type 'refusal' ... not supported")."""
    said = [{"type": "refusal", "refusal": "I can't help with that."}]
    plain = [{"type": "text", "text": "I can't help with that."}]
    turns = [{"role": "user", "content": "hi"}, None, {"role": "user", "content": "ok"}]

    def chat(content):
        messages = [turns[0], {"role": "assistant", "content": content}, turns[2]]
        r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    assert chat(said) == chat(plain)
    messages = [turns[0], {"role": "assistant", "content": None, "refusal": said[0]["refusal"]}, turns[2]]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})  # the SDK's message, replayed
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == chat(plain), r.text
    output = {"type": "message", "role": "assistant", "content": [{**said[0], "type": "refusal"}]}
    r = client.post("/v1/responses", json={**RESPONSE, "input": [turns[0], output, turns[2]]})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == chat(plain)
    user_refusal = [{"role": "user", "content": said}]  # only an assistant turn may hold one
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": user_refusal})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]", r.text


def test_embeddings_are_refused_as_an_unknown_url(sdk):
    """langchain-openai's OpenAIEmbeddings (and litellm.embedding) reach `POST /v1/embeddings`, which
    this server does not serve: the SDK gets OpenAI's own 404 for an unknown URL, not a 500."""
    with pytest.raises(openai.NotFoundError) as e:
        sdk.embeddings.create(model="tiny", input=["hi"], encoding_format="base64")
    assert e.value.body["message"] == "Invalid URL (POST /v1/embeddings)"


def test_responses_compaction_is_refused_as_an_unknown_url(sdk):
    """`client.responses.compact(...)` (`POST /v1/responses/compact`, which Codex calls to compact a
    long conversation) matched the kept-response path's GET and DELETE: a 405 "Method not allowed",
    which the SDK raises as a bare APIStatusError. It is OpenAI's 404 for a URL not served, as
    embeddings' is."""
    with pytest.raises(openai.NotFoundError) as e:
        sdk.responses.compact(model="tiny", input="hi")
    assert e.value.body["message"] == "Invalid URL (POST /v1/responses/compact)"


def test_with_an_api_key_an_unserved_url_is_a_404_to_the_keyed_and_a_401_to_the_rest():
    """With --api-key, `POST /v1/responses/compact` (a route of ours that only answers 404) checks
    the key first: the right key gets OpenAI's 404 for an unknown URL, as any unknown URL gets it;
    no key or a wrong one gets the 401 (checked: nothing to fix, pinned here)."""
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny", ServerOptions(api_key="k"))) as http:
        keyed = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=http, max_retries=0)
        with pytest.raises(openai.NotFoundError) as e:
            keyed.responses.compact(model="tiny", input="hi")
        assert e.value.body == {
            "message": "Invalid URL (POST /v1/responses/compact)",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        for path in ("/v1/responses/compact", "/v1/nothing"):
            r = http.post(path, json=RESPONSE, headers={"Authorization": "Bearer k"})
            assert r.status_code == 404 and r.json()["error"]["message"] == f"Invalid URL (POST {path})"
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = http.post("/v1/responses/compact", json=RESPONSE, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text


def test_responses_input_tokens_count_what_a_create_would_bill(sdk):
    """`client.responses.input_tokens.count(...)` (`POST /v1/responses/input_tokens`) counts the input
    a Responses request with the same fields would bill as `usage.input_tokens`. It was a 405 (the
    path matched `GET /v1/responses/{id}`), which the SDK raises as a bare APIStatusError."""
    ask = {"instructions": "Be brief.", "input": [{"role": "user", "content": "Weather in Paris?"}]}
    tools = [{"type": "function", "name": "weather", "parameters": City.model_json_schema()}]
    for extra in ({}, {"tools": tools}):
        made = sdk.responses.create(model="tiny", max_output_tokens=3, **ask, **extra)
        counted = sdk.responses.input_tokens.count(model="tiny", **ask, **extra)
        assert counted.object == "response.input_tokens" and counted.input_tokens == made.usage.input_tokens
    later = {"input": "And in Rome?", "previous_response_id": made.id}
    then = sdk.responses.create(model="tiny", max_output_tokens=3, **later)
    assert sdk.responses.input_tokens.count(**later).input_tokens == then.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        sdk.responses.input_tokens.count(input="hi", previous_response_id="resp_none")
    assert e.value.body["param"] == "previous_response_id"


BEGUN = [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "    return"}]


def test_an_assistant_prefix_message_is_continued_as_continue_final_message(client):
    """aider, when a model's metadata says `supports_assistant_prefill` and an answer stops at its
    length, sends the partial answer back as `{"role": "assistant", "content": ..., "prefix": true}`
    (DeepSeek's and Mistral's prefix completion; litellm passes it through) and joins the reply to
    it. The flag was dropped as an unknown field: the assistant turn was closed and a new one
    answered, so aider joined a fresh answer to the old one."""
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    went_on = client.post("/v1/chat/completions", json={**CHAT, "messages": BEGUN, **extra}).json()
    prefixed = [BEGUN[0], {**BEGUN[1], "prefix": True}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": prefixed})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == went_on["usage"]["prompt_tokens"]
    assert r.json()["choices"][0]["message"]["content"] == went_on["choices"][0]["message"]["content"]
    counted = client.post("/tokenize", json={"model": "tiny", "messages": prefixed}).json()
    assert counted["count"] == went_on["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    "messages, param",
    [
        ([{**BEGUN[1], "prefix": True}, BEGUN[0]], "messages[0].prefix"),  # not the last message
        ([{**BEGUN[0], "prefix": True}], "messages[0].prefix"),  # not an assistant message
        ([BEGUN[0], {**BEGUN[1], "prefix": "yes"}], "messages[1].prefix"),  # not a boolean
    ],
)
def test_a_prefix_flag_that_cannot_be_continued_is_a_400_naming_it(client, messages, param):
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_false_prefix_flag_changes_nothing(client):
    plain = client.post("/v1/chat/completions", json={**CHAT, "messages": BEGUN}).json()
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": [BEGUN[0], {**BEGUN[1], "prefix": False}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    assert r.json()["choices"][0]["message"] == plain["choices"][0]["message"]


FORCED = {
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
    "tool_choice": "required",
}


def _streamed(client, body: dict) -> tuple[str, list[dict], str]:
    """A streamed chat answer as (its content joined, its tool-call deltas, its finish reason)."""
    content, deltas, reason = "", [], None
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    content += choice["delta"].get("content") or ""
                    deltas += choice["delta"].get("tool_calls") or []
                    reason = choice["finish_reason"] or reason
    return content, deltas, reason


@pytest.mark.parametrize("max_tokens", [4, 12, 16, 30, 40])
def test_a_tool_call_cut_by_max_tokens_is_a_call_not_its_markup(client, max_tokens):
    """A call cut off by `max_tokens` comes back as OpenAI's does: `finish_reason: "length"` with
    the call (its arguments as far as they got, maybe none), never the server's `<tool_call>`
    markup as content, which agents showed as the answer or sent back in the history (the tiny
    model's forced call at 30 tokens was the content '<tool_call>\\n{"name": "f", "arg'). A
    block cut before its name is complete is no call, and no content either."""
    body = {**CHAT, **FORCED, "max_tokens": max_tokens}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    assert (choice["finish_reason"], choice["message"]["content"]) == ("length", None)
    assert [c["function"]["name"] for c in calls] in ([], ["f"])
    content, deltas, reason = _streamed(client, body)
    assert (content or None, reason) == (choice["message"]["content"], "length")
    assert [d["function"].get("name") for d in deltas if "id" in d] == [c["function"]["name"] for c in calls]
    streamed_args = "".join(d["function"]["arguments"] for d in deltas)
    assert streamed_args == "".join(c["function"]["arguments"] for c in calls)
    flat = {**RESPONSE, **FORCED, "tools": [_flat(FORCED)], "max_output_tokens": max_tokens}
    items = client.post("/v1/responses", json=flat).json()["output"]
    assert [i for i in items if i["type"] == "message"] == []
    assert [(i["name"], i["status"]) for i in items if i["type"] == "function_call"] == [
        ("f", "incomplete") for _ in calls
    ]


@pytest.mark.parametrize("max_tokens, arguments", [(16, None), (30, ""), (40, "{")])
def test_a_cut_call_is_returned_once_its_name_is_written(client, max_tokens, arguments):
    """The tiny model's forced call, cut: at 16 tokens '{"na' (no call), at 30 the name written
    and no arguments yet, at 40 the arguments' first brace."""
    body = {**CHAT, **FORCED, "max_tokens": max_tokens}
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["content"] is None
    written = [c["function"]["arguments"] for c in message.get("tool_calls") or []]
    assert written == ([] if arguments is None else [arguments])


def _flat(forced: dict) -> dict:
    return {"type": "function", **forced["tools"][0]["function"]}
