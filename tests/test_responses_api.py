"""OpenAI's Responses API (`POST /v1/responses`), driven by the official `openai` SDK.

Each Responses request means a chat request (server/responses_api.py), so the tests hold the two
side by side: the same prompt gives the same text (greedy, float32), and what only the Responses
shape has (output items, typed stream events, status, usage names, refused stateful fields) is
checked on its own.
"""

from __future__ import annotations

import json

import openai
import pytest
from server_proc import ServerProcess
from tiny import save_tiny

MODEL = "tiny"
ASK = "def get_user(self, user_id):"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 6}},
        "required": ["city"],
        "additionalProperties": False,
    },
}

OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target, draft = save_tiny(root / "target"), save_tiny(root / "draft", seed=1)
    with ServerProcess(target, "--draft-model", draft, "--served-model-name", MODEL) as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=60)


def chat_text(client, messages, **kw) -> str:
    resp = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)
    return resp.choices[0].message.content


def test_a_text_response_is_the_chat_answer(client):
    resp = client.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=24)
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.output_text == chat_text(client, [{"role": "user", "content": ASK}], max_tokens=24)
    [message] = resp.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=24)
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.status in ("completed", "incomplete")
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens" and resp.usage.output_tokens == 24


def test_instructions_and_message_items_are_the_chat_messages(client):
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        {"role": "user", "content": ASK},
    ]
    resp = client.responses.create(
        model=MODEL, instructions="Be brief.", input=items, temperature=0, max_output_tokens=16
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": ASK},
    ]
    assert resp.output_text == chat_text(client, messages, max_tokens=16)
    assert resp.instructions == "Be brief."


def test_max_output_tokens_cuts_the_answer_as_incomplete(client):
    resp = client.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3 and resp.output[0].status == "incomplete"


def test_the_stream_is_typed_events_that_add_up_to_the_response(client):
    kw = dict(model=MODEL, input=ASK, temperature=0, max_output_tokens=24)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    final = events[-1]
    assert final.type == ("response.completed" if whole.status == "completed" else "response.incomplete")
    assert final.response.output_text == whole.output_text and final.response.usage.output_tokens > 0
    # The SDK's accumulating helper checks the order (and wants an answer that completed: the
    # tiny model never writes EOS, a grammar makes it end).
    kw["text"] = {"format": {"type": "json_schema", "name": "answer", "schema": OK_SCHEMA}}
    whole = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert final.status == whole.status == "completed" and final.output_text == whole.output_text


def test_a_forced_function_call_is_a_function_call_item_and_its_output_goes_back(client):
    kw = dict(model=MODEL, tools=[WEATHER], temperature=0, max_output_tokens=150)
    resp = client.responses.create(input="Weather in Paris?", tool_choice="required", **kw)
    [call] = resp.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"city"}
    streamed = list(client.responses.create(input="Weather in Paris?", tool_choice="required", stream=True, **kw))
    done = [e.item for e in streamed if e.type == "response.output_item.done"]
    assert [(i.type, i.name, i.arguments) for i in done] == [("function_call", call.name, call.arguments)]
    [args_done] = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert (args_done.item_id, args_done.model_extra["name"]) == (done[0].id, call.name)  # as OpenAI's reference
    # the next turn: the call and its result, as an agent sends them back
    follow = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    kw["max_output_tokens"] = 40
    again = client.responses.create(input=follow, tool_choice="none", **kw)
    assert again.output_text == chat_after_call(client, "Weather in Paris?", call, "sunny", max_tokens=40)


def chat_after_call(client, question: str, call, result: str, max_tokens: int) -> str:
    """Chat completions' answer (greedy, no further call) to `question`, then the model's call
    of WEATHER and its `result`: what a Responses turn that sends the call's output must equal."""
    messages = [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": result},
    ]
    tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    return chat_text(client, messages, tools=tools, tool_choice="none", max_tokens=max_tokens)


def test_a_json_schema_text_format_is_enforced(client):
    schema = OK_SCHEMA
    resp = client.responses.create(
        model=MODEL,
        input="Answer in JSON.",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
        temperature=0,
        max_output_tokens=32,
    )
    assert resp.status == "completed" and isinstance(json.loads(resp.output_text)["ok"], bool)


def test_a_prediction_is_lossless_and_accepted(client):
    kw = dict(model=MODEL, input=ASK, temperature=0, max_output_tokens=32)
    base = client.responses.create(**kw, extra_body={"speculation": "none"}).output_text
    resp = client.responses.create(**kw, extra_body={"prediction": {"type": "content", "content": base}})
    assert resp.output_text == base
    pred = resp.model_extra["speculation"]["by_source"]["prediction"]
    assert pred["accepted"] > 0
    # the usage reports them as chat's does (before, only `speculation` did)
    details = resp.usage.output_tokens_details.model_extra
    assert (details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]) == (
        pred["accepted"],
        pred["rejected"],
    )
    assert details["accepted_prediction_tokens"] <= resp.usage.output_tokens
    prediction = {"prediction": {"type": "content", "content": base}}
    events = list(client.responses.create(**kw, stream=True, extra_body=prediction))
    done = events[-1].response
    assert done.output_text == base
    streamed = done.usage.output_tokens_details.model_extra
    assert (
        streamed["accepted_prediction_tokens"] == done.model_extra["speculation"]["by_source"]["prediction"]["accepted"]
    )


def test_previous_response_id_continues_the_conversation_but_not_its_instructions(client):
    kw = dict(model=MODEL, temperature=0, max_output_tokens=12)
    first = client.responses.create(instructions="Be brief.", input="hi", **kw)
    second = client.responses.create(previous_response_id=first.id, input=ASK, **kw)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": ASK},
    ]
    assert second.output_text == chat_text(client, messages, max_tokens=12)
    assert second.previous_response_id == first.id
    third = client.responses.create(previous_response_id=second.id, input="and?", **kw)  # a chain of three
    messages += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "and?"}]
    assert third.output_text == chat_text(client, messages, max_tokens=12)
    assert third.usage.input_tokens_details.cached_tokens > 0  # the turn before it came from the prefix cache


def test_a_function_call_is_continued_with_its_output_by_id(client):
    kw = dict(model=MODEL, tools=[WEATHER], temperature=0)
    call_resp = client.responses.create(input="Weather?", tool_choice="required", max_output_tokens=150, **kw)
    [call] = call_resp.output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    after = client.responses.create(
        previous_response_id=call_resp.id, input=[output], tool_choice="none", max_output_tokens=30, **kw
    )
    assert after.output_text == chat_after_call(client, "Weather?", call, "sunny", max_tokens=30)


def test_an_item_reference_is_the_stored_item_it_names(client):
    """Stateful clients send an earlier answer's items back by id (`{"type": "item_reference",
    "id": "fc_..."}`; the Vercel AI SDK does so with store on, Codex for its calls): each was a 400
    "input item type 'item_reference' is not supported", so an agent's second turn failed."""
    kw = dict(model=MODEL, tools=[WEATHER], temperature=0)
    call_resp = client.responses.create(input="Weather?", tool_choice="required", max_output_tokens=150, **kw)
    [call] = call_resp.output
    follow = [
        {"role": "user", "content": "Weather?"},
        {"type": "item_reference", "id": call.id},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    after = client.responses.create(input=follow, tool_choice="none", max_output_tokens=30, **kw)
    assert after.output_text == chat_after_call(client, "Weather?", call, "sunny", max_tokens=30)
    # a message item, referenced with the type left out (OpenAI's schema makes it optional)
    first = client.responses.create(model=MODEL, input="hi", temperature=0, max_output_tokens=8)
    turn = [{"role": "user", "content": "hi"}, {"id": first.output[0].id}, {"role": "user", "content": ASK}]
    second = client.responses.create(model=MODEL, input=turn, temperature=0, max_output_tokens=12)
    messages = [*turn[:1], {"role": "assistant", "content": first.output_text}, turn[2]]
    assert second.output_text == chat_text(client, messages, max_tokens=12)
    client.responses.delete(first.id)  # its items go with it
    for gone in ({"type": "item_reference", "id": first.output[0].id}, {"type": "item_reference", "id": "msg_nope"}):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input=[turn[0], gone])
        assert (e.value.body["param"], e.value.body["code"]) == ("input[1].id", "item_not_found"), e.value.body


@pytest.mark.parametrize("bad", [{"type": "item_reference"}, {"type": "item_reference", "id": 5}])
def test_an_item_reference_without_a_string_id_is_told_so(client, bad):
    """It was told "no item with id None" (or 5), as if a kept item had been looked for."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}, bad])
    body = e.value.body
    assert body["param"] == "input[1].id" and "no item with id" not in body["message"], body
    assert body["code"] == ("missing_required_parameter" if "id" not in bad else "invalid_type"), body


MISSING = object()  # the field left out of the request
HI = {"role": "user", "content": "hi"}


def _with(key: str, value) -> dict:
    return {} if value is MISSING else {key: value}


STRING_FIELDS = {  # a field that must be a string -> (the request's fields with it set to a value, its param)
    "refusal": (
        lambda v: {"input": [{"role": "assistant", "content": [{"type": "refusal", **_with("refusal", v)}]}, HI]},
        "input[0].content[0].refusal",
    ),
    "text": (
        lambda v: {"input": [{"role": "user", "content": [{"type": "input_text", **_with("text", v)}]}]},
        "input[0].content[0].text",
    ),
    "item id": (lambda v: {"input": [{"type": "item_reference", **_with("id", v)}]}, "input[0].id"),
    "format name": (
        lambda v: {"text": {"format": {"type": "json_schema", "schema": OK_SCHEMA, **_with("name", v)}}, "input": "hi"},
        "text.format.name",
    ),
}


@pytest.mark.parametrize("value", [MISSING, 5], ids=["missing", "not-a-string"])
@pytest.mark.parametrize("field", list(STRING_FIELDS))
def test_a_field_that_must_be_a_string_is_told_it_is_missing_or_not_a_string(client, field, value):
    """Each of these fields is OpenAI's missing_required_parameter when left out and invalid_type
    when not a string, in the same words (errors.not_a_string)."""
    fields, param = STRING_FIELDS[field]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, **fields(value))
    body = e.value.body
    missing = value is MISSING
    assert body["param"] == param, body
    assert body["code"] == ("missing_required_parameter" if missing else "invalid_type"), body
    assert body["message"] == (f"missing required parameter '{param}'" if missing else f"{param} must be a string")


def test_a_chat_refusal_part_without_a_string_refusal_is_told_so(client):
    """Chat's assistant refusal part is read by the same rule (protocol.refusal_text)."""
    for value, code in ((MISSING, "missing_required_parameter"), (5, "invalid_type")):
        part = {"type": "refusal", **_with("refusal", value)}
        messages = [{"role": "assistant", "content": [part]}, HI]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
        assert (e.value.body["param"], e.value.body["code"]) == ("messages[0].content[0].refusal", code), e.value.body


def test_stored_responses_are_read_and_deleted_and_store_false_keeps_nothing(client):
    kw = dict(model=MODEL, input="hi", temperature=0, max_output_tokens=6)
    resp = client.responses.create(**kw)
    assert resp.store is True and client.responses.retrieve(resp.id).output_text == resp.output_text
    streamed = list(client.responses.create(stream=True, **kw))[-1].response  # a streamed one is kept too
    assert client.responses.retrieve(streamed.id).output_text == streamed.output_text
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    unkept = client.responses.create(store=False, **kw)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(previous_response_id=unkept.id, **kw)
    assert e.value.body["param"] == "previous_response_id" and e.value.body["code"] == "previous_response_not_found"


def _room_for_two(put_one) -> int:
    """A store size with room for two entries like the one `put_one(store)` keeps, not three."""
    from specserve.server.responses_api import ResponseStore

    probe = ResponseStore()
    put_one(probe)
    return probe._kept.size * 5 // 2


def test_the_store_drops_the_least_recently_used_beyond_its_size():
    from specserve.server.responses_api import ResponseStore

    store = ResponseStore(
        max_chars=_room_for_two(lambda st: st.put("r0", [{"role": "user", "content": "x" * 100}], {"id": "r0"}))
    )
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": "x" * 100}], {"id": f"r{i}"})
    assert store.messages("r0") is None and store.messages("r2") is not None  # r0 went first
    store.messages("r1")  # used: r2 is now the oldest
    store.put("r3", [{"role": "user", "content": "x" * 100}], {"id": "r3"})
    assert store.messages("r2") is None and store.messages("r1") is not None


def test_the_store_finds_an_item_only_while_its_response_is_kept():
    from specserve.server.responses_api import ResponseStore

    one = {"id": "r0", "output": [{"id": "fc_0"}]}
    store = ResponseStore(
        max_chars=_room_for_two(lambda st: st.put("r0", [{"role": "user", "content": "x" * 100}], one))
    )
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": "x" * 100}], {"id": f"r{i}", "output": [{"id": f"fc_{i}"}]})
    assert store.item("fc_0") is None and store.item("fc_2") == {"id": "fc_2"}  # r0 went, and its item with it
    store.delete("r2")
    assert store.item("fc_2") is None and store.item("fc_1") == {"id": "fc_1"}


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),  # not kept here
        ({"conversation": "conv_1"}, "conversation"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}}, "text.format.schema"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**{"model": MODEL, "input": ASK, **extra})
    assert e.value.body["param"] == param, e.value.body


FN = {"type": "function", "name": "get_weather"}
CHAT_WORDS = ("messages", "max_tokens", "max_completion_tokens", "response_format", ".function", "'function':")


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"input": []}, "input"),
        ({"tools": [{**FN, "name": "a b"}]}, "tools[0].name"),
        ({"tools": [{**FN, "description": 5}]}, "tools[0].description"),
        ({"tools": [{**FN, "parameters": {"type": "array"}}]}, "tools[0].parameters"),
        (
            {"tools": [{**FN, "parameters": {"properties": {"x": {"format": "odd"}}}}], "tool_choice": "required"},
            "tools[0].parameters",
        ),
        ({"tools": [FN], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [FN], "tool_choice": {"type": "function"}}, "tool_choice.name"),  # was "names the function None"
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ],
)
def test_a_400_s_message_names_the_responses_fields(client, extra, param):
    """The param was renamed for a Responses client, but the message still spoke of chat's fields
    (`messages must contain at least one message`, `tools[0].function.name`, the response_format,
    chat's tool_choice shape), which this client never sent."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**{"model": MODEL, "input": ASK, **extra})
    body = e.value.body
    assert body["param"] == param and param in body["message"], body
    assert not any(word in body["message"] for word in CHAT_WORDS), body


def test_a_function_call_output_for_no_call_is_a_400(client):
    """OpenAI refuses a function_call_output whose call_id names no function_call before it; it
    was templated as the result of a call the model never made, and answered."""
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_2", "output": "18"}
    for items, param in (
        ([output], "input[0].call_id"),
        ([{"role": "user", "content": ASK}, call, output], "input[2].call_id"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input=items, tools=[WEATHER])
        assert e.value.body["param"] == param and "call_2" in e.value.body["message"], e.value.body


@pytest.mark.parametrize("bad", [5, None, ["hi"], {"role": "user", "content": "hi"}])
def test_a_malformed_input_is_told_the_shapes_an_input_takes(client, bad):
    """pydantic's own message was "Input should be a valid string", also for an array."""
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=bad)
    body = e.value.body
    assert body["param"] == "input" and "an array of input items" in body["message"], body
    assert "valid string" not in body["message"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chat_request_over_the_context_names_the_maximum_it_sent(client, field):
    """A client that sets max_completion_tokens (the SDK's current name) was told to reduce
    max_tokens, a field it never sent, and the error's param named that field."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], **{field: 10**6})
    body = e.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == field
    assert body["message"].endswith(f"or {field}."), body["message"]


def test_a_response_over_the_context_is_worded_in_the_responses_fields(client):
    """The Responses 400 named the right param but its message spoke of chat's "messages" and
    "max_completion_tokens", which a Responses client never sent."""
    for extra in ({"max_output_tokens": 10**6}, {"input": "word " * 2000}):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(**{"model": MODEL, "input": ASK, **extra})
        message = e.value.body["message"]
        assert e.value.body["code"] == "context_length_exceeded"
        assert "the input" in message and "messages" not in message and "max_completion_tokens" not in message
        assert "max_tokens" not in message, message


def test_output_text_logprobs_are_served_when_included(client):
    """`include: ["message.output_text.logprobs"]` was accepted and ignored: `logprobs` stayed []."""
    kw = {"model": MODEL, "temperature": 0, "max_output_tokens": 12}
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": ASK}],
        logprobs=True,
        top_logprobs=2,
        max_tokens=12,
        **{k: v for k, v in kw.items() if k != "max_output_tokens"},
    )
    want = [e.model_dump() for e in chat.choices[0].logprobs.content]
    resp = client.responses.create(input=ASK, include=["message.output_text.logprobs"], top_logprobs=2, **kw)
    assert resp.top_logprobs == 2  # the response repeats what was asked, as its other request fields
    part = resp.output[0].content[0]
    assert [e.model_dump() for e in part.logprobs] == want and len(want[0]["top_logprobs"]) == 2
    deltas, done = [], None
    for event in client.responses.create(
        input=ASK, include=["message.output_text.logprobs"], top_logprobs=2, stream=True, **kw
    ):
        if event.type == "response.output_text.delta":
            deltas += [e.model_dump() for e in event.logprobs]
        elif event.type == "response.output_text.done":
            done = [e.model_dump() for e in event.logprobs]
    assert deltas == done == want
    plain = client.responses.create(input=ASK, **kw)  # not asked for: none
    assert plain.output[0].content[0].logprobs == []


@pytest.mark.parametrize("extra", [{}, {"include": ["message.output_text.logprobs"], "top_logprobs": 2}])
def test_every_body_and_event_validates_strictly_against_the_sdk_types(client, extra):
    """The openai SDK builds its objects without validating them, so a field it requires and we
    left out (`usage.input_tokens_details.cache_write_tokens`) only failed a strict client, or an
    attribute read. Each body and stream event here is validated in strict mode."""
    import httpx
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    body = {"model": MODEL, "input": "def add(a, b):", "max_output_tokens": 8, **extra}
    url = f"{client.base_url}responses"
    Response.model_validate(httpx.post(url, json=body, timeout=60).json(), strict=True)
    events = TypeAdapter(ResponseStreamEvent)
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data and data[-1] != "[DONE]"  # the Responses API ends with its last event, no [DONE]
    for event in map(json.loads, data):
        events.validate_python(event, strict=True)


def test_the_answer_repeats_the_request_fields_openai_repeats(client):
    """`max_tool_calls`, `safety_identifier` and `prompt_cache_key` were accepted and left out of
    the answer (None to the SDK), and `background` too, which OpenAI answers false."""
    asked = {"max_tool_calls": 3, "safety_identifier": "user-7", "prompt_cache_key": "k1"}
    resp = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, **asked)
    assert {k: getattr(resp, k) for k in asked} == asked and resp.background is False
    assert client.responses.retrieve(resp.id).max_tool_calls == 3
    plain = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    assert (plain.max_tool_calls, plain.safety_identifier, plain.prompt_cache_key) == (None, None, None)
