"""Structured outputs, tool calls and n > 1 through the official openai SDK, against a real server.

The tiny random model is saved with a chat template that knows tools (written here in the
shape of Qwen2.5's: tools listed in the system turn, calls as <tool_call> JSON, results as
<tool_response>), so the native path is the one exercised; the fallback for templates without
tools support is covered in test_tools.py.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from server_proc import ServerProcess
from tiny import CHAT_TEMPLATE, save_tiny, tiny_model, tiny_tokenizer

MODEL = "tiny"
MSGS = [{"role": "user", "content": "def get_user(self, user_id):"}]
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou can call these tools:\n{% for t in tools %}{{ t | tojson }}\n"
    '{% endfor %}Answer with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\n{% endif %}'
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "integer", "minimum": -12, "maximum": 12}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=120)


def save_tools_tiny(path) -> str:
    """The tiny model (a longer context: tool lists are long in a character-level vocabulary)
    saved with TOOLS_TEMPLATE."""
    tiny_model(max_positions=2048).save_pretrained(path)
    tok = tiny_tokenizer()  # cached and shared: restore its template after saving
    tok.chat_template = TOOLS_TEMPLATE
    try:
        tok.save_pretrained(path)
    finally:
        tok.chat_template = CHAT_TEMPLATE
    return str(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target, draft = save_tools_tiny(root / "target"), save_tiny(root / "draft", seed=1)
    with ServerProcess(target, "--draft-model", draft, "--served-model-name", MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)


def test_parse_with_pydantic_model_same_across_drafters(client):
    outs = []
    for method in ("none", "draft", "ngram"):
        resp = client.chat.completions.parse(
            model=MODEL,
            messages=MSGS,
            response_format=Person,
            temperature=0,
            max_tokens=96,
            extra_body={"speculation": {"method": method}},
        )
        msg = resp.choices[0].message
        assert isinstance(msg.parsed, Person), msg.content
        outs.append(msg.content)
    assert outs[0] == outs[1] == outs[2]


def test_json_object_and_regex_extension(client):
    # json_object bounds nothing (the tiny model loops on whitespace after most messages); after
    # this one its greedy output closes the object in 71 tokens
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "def add(a, b):"}],
        temperature=0,
        max_tokens=96,
        response_format={"type": "json_object"},
    )
    text = resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict), text
    for body in ({"structured_outputs": {"regex": "[a-c]{3}-[0-9]{2}"}}, {"guided_regex": "[a-c]{3}-[0-9]{2}"}):
        resp = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=16, extra_body=body)
        text = resp.choices[0].message.content
        assert len(text) == 6 and text[3] == "-" and set(text[:3]) <= set("abc") and text[4:].isdigit(), text
    resp = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=16, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert resp.choices[0].message.content in ("yes", "no")


def _check_call(call, tool):
    assert call.type == "function" and call.id and call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_named_tool_choice_streamed_deltas_reassembled_by_sdk(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    with client.chat.completions.stream(
        model=MODEL, messages=MSGS, tools=[WEATHER, CLOCK], tool_choice=choice, temperature=0, max_tokens=96
    ) as stream:
        final = stream.get_final_completion()
    c = final.choices[0]
    assert c.finish_reason == "stop" and len(c.message.tool_calls) == 1  # OpenAI's reason for a named call
    _check_call(c.message.tool_calls[0], WEATHER)
    plain = client.chat.completions.create(
        model=MODEL, messages=MSGS, tools=[WEATHER, CLOCK], tool_choice=choice, temperature=0, max_tokens=96
    )
    assert plain.choices[0].finish_reason == "stop"
    assert plain.choices[0].message.tool_calls[0].function.arguments == c.message.tool_calls[0].function.arguments
    assert c.message.content is None and plain.choices[0].message.content is None  # the stream's role chunk had ""


def test_required_tool_choice_at_temperature_one(client):
    for seed in range(3):
        resp = client.chat.completions.create(
            model=MODEL,
            messages=MSGS,
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=96,
            extra_body={"speculation": {"method": "draft"}},
        )
        c = resp.choices[0]
        assert c.finish_reason == "tool_calls", c.message
        call = c.message.tool_calls[0]
        _check_call(call, WEATHER if call.function.name == "get_weather" else CLOCK)


def test_tool_results_flow_back_and_auto_streams_content(client):
    history = MSGS + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
    ]
    resp = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0, max_tokens=32)
    c = resp.choices[0]
    assert c.finish_reason in ("stop", "length") and c.message.content  # a random model writes no call
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=history, tools=[WEATHER], temperature=0, max_tokens=32, stream=True
        )
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == c.message.content


CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
}


@pytest.mark.parametrize(
    "messages,param",
    [
        (MSGS + [{"role": "tool", "tool_call_id": "call_1", "content": "18"}], "messages[1].tool_call_id"),
        (MSGS + [CALLED, {"role": "tool", "tool_call_id": "call_2", "content": "18"}], "messages[2].tool_call_id"),
        (MSGS + [CALLED, {"role": "tool", "content": "18"}], "messages[2].tool_call_id"),
    ],
)
def test_a_tool_result_that_answers_no_call_is_a_400(client, messages, param):
    """OpenAI answers a tool message whose tool_call_id names no earlier call (or that has none)
    with a 400; it was templated as a result of a call the model never made, and answered."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=4)
    assert e.value.body["param"] == param, e.value.body


def test_n_choices_seeded_and_usage_summed(client):
    kw = dict(model=MODEL, messages=MSGS, n=2, temperature=1.0, seed=7, max_tokens=24)
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1]
    assert texts == [c.message.content for c in b.choices]
    assert texts[0] != texts[1]
    spec = a.model_extra["speculation"]
    assert a.usage.completion_tokens == sum(s["output_tokens"] for s in spec)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [
        "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices and ch.choices[0].index == i)
        for i in range(2)
    ]
    assert streamed == texts


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server, method):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(base_url=server.base_url, api_key="x", model=MODEL, temperature=0, max_tokens=96, max_retries=0)
    person = llm.with_structured_output(Person, method=method).invoke("def get_user(self, user_id):")
    assert isinstance(person, Person)


def test_litellm_tools_call(server, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list at import
    litellm = pytest.importorskip("litellm")
    resp = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=server.base_url,
        api_key="x",
        messages=MSGS,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=96,
    )
    c = resp.choices[0]
    assert c.finish_reason == "tool_calls"
    _check_call(c.message.tool_calls[0], WEATHER)


def test_completions_n_and_regex(client):
    kw = dict(
        model=MODEL,
        prompt="def add(a, b):",
        n=3,
        temperature=1.0,
        seed=3,
        max_tokens=12,
        extra_body={"structured_outputs": {"regex": "[a-f]{4}"}, "speculation": {"method": "ngram"}},
    )
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    texts = [c.text for c in a.choices]
    assert texts == [c.text for c in b.choices] and len(set(texts)) > 1
    assert all(len(t) == 4 and set(t) <= set("abcdef") for t in texts)
    assert a.usage.completion_tokens == sum(s["output_tokens"] for s in a.model_extra["speculation"])
