"""tools.py: parsing <tool_call> blocks, streaming hold-back, templating (native and fallback), forcing."""

import json

import jsonschema
import pytest
from tiny import CHAT_TEMPLATE, tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.engine.constrain import ConstraintError
from specserve.llm import LLM
from specserve.server.structured import choice_params, tool_guide, tool_setup
from specserve.server.tools import (
    ToolStreamSplitter,
    check_tools,
    parse_tool_calls,
    template_messages,
)

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {
                "key": {"type": "string", "maxLength": 5},
                "n": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["key", "n"],
            "additionalProperties": False,
        },
    },
}
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "ab", "n": 3}}\n</tool_call>'


def test_parse_tool_calls():
    content, calls = parse_tool_calls("Let me check.\n" + CALL + "\n" + CALL.replace("3", "4"))
    assert content == "Let me check."
    assert [c.name for c in calls] == ["lookup", "lookup"]
    assert json.loads(calls[1].arguments) == {"key": "ab", "n": 4} and calls[0].id != calls[1].id
    assert parse_tool_calls("no calls here") == ("no calls here", [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_tool_calls(broken) == (broken, [])  # nothing the model wrote is lost
    assert parse_tool_calls(CALL[: -len("</tool_call>")])[1][0].name == "lookup"  # EOS before the close tag


def test_a_closing_tag_inside_an_argument_does_not_cut_the_call():
    """The forcing grammar lets a string argument hold "</tool_call>" (a soak's forced call wrote
    the city "]}</tool_call> #TODO"); the block was cut at it, the JSON no longer parsed, and the
    `tool_choice: "required"` answer came back as content with finish_reason "stop"."""
    call = CALL.replace('"ab"', '"]}</tool_call> #x"')
    for text in (call, "Sure.\n" + call + "\nafter"):
        content, calls = parse_tool_calls(text, {"lookup"})
        assert [json.loads(c.arguments) for c in calls] == [{"key": "]}</tool_call> #x", "n": 3}]
        assert content == (None if text == call else "Sure.\n\nafter")
        s = ToolStreamSplitter({"lookup"})
        sent = "".join(s.feed(ch) for ch in text)
        rest, streamed = s.finish()
        assert (sent + rest).strip() == (content or "") and len(streamed) == 1


BARE = '{"name": "lookup", "arguments": {"key": "ab", "n": 3}}'
UNTAGGED = [  # how the 1.5B pack writes a call when it leaves out the tags
    BARE,
    "```json\n" + BARE + "\n```",
    "{" + BARE + "}",  # the doubled braces of Qwen2.5's template example
    "{" + BARE,  # ... closed once only
    "[" + BARE + ", " + BARE.replace("3", "4") + "]",
]


@pytest.mark.parametrize("text", UNTAGGED)
def test_an_answer_that_is_only_an_untagged_call_to_a_declared_tool_is_a_call(text):
    content, calls = parse_tool_calls(text, {"lookup"})
    assert content is None and calls and all(c.name == "lookup" for c in calls)
    assert json.loads(calls[0].arguments) == {"key": "ab", "n": 3}
    assert parse_tool_calls(text) == (text, [])  # no tools declared: content


# Asked "Call get_weather for Tokyo and get_time for Paris, both at once." (temperature 0.8, n=4),
# the default 1.5B pack wrote 3 of its 4 answers as calls in a row in one fence, these two ways.
PAIR_1 = '{\n  "name": "lookup",\n  "arguments": {\n    "key": "ab", "n": 3\n  }\n}'
PAIR_2 = PAIR_1.replace("ab", "cd").replace("3", "4")
CALLS_IN_A_ROW = [
    "```json\n" + PAIR_1 + ",\n" + PAIR_2 + "\n```",
    "```json\n" + PAIR_1 + "\n" + PAIR_2 + "\n```",
    PAIR_1 + "\n\n" + PAIR_2,
    "<tool_call>\n" + PAIR_1 + "\n" + PAIR_2 + "\n</tool_call>",
    "<tool_call>\n[" + PAIR_1 + ", " + PAIR_2 + "]\n</tool_call>",
]


UNDECLARED = CALL.replace("lookup", "run_shell")
WITH_UNDECLARED = [
    UNDECLARED,
    "Sure. " + UNDECLARED,
    CALL + "\n" + UNDECLARED,
    "<tool_call>\n[" + PAIR_1 + ", " + PAIR_2.replace("lookup", "rm") + "]\n</tool_call>",
]


@pytest.mark.parametrize("text", WITH_UNDECLARED)
def test_a_tagged_call_to_a_function_not_declared_is_content(text):
    """OpenAI never calls a function the request did not declare, and a client dispatching on the
    name has no such function: a block naming one is no call, and, as a block that does not parse,
    leaves the whole answer as content (a tagged call was taken whatever its name; an untagged one
    already had to name a declared tool)."""
    assert parse_tool_calls(text, {"lookup"}) == (text, [])
    s = ToolStreamSplitter({"lookup"})
    sent = "".join(s.feed(ch) for ch in text)
    rest, calls = s.finish()
    assert (sent + rest, calls) == (text, [])


@pytest.mark.parametrize("text", CALLS_IN_A_ROW)
@pytest.mark.parametrize("step", [1, 5, 1000])
def test_calls_written_one_after_another_are_each_a_call(text, step):
    """Several calls in a row (apart by whitespace or a comma, or in a list), in one block or
    untagged: only the first value was looked at, and the whole answer came back as text."""
    content, calls = parse_tool_calls(text, {"lookup"})
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("lookup", {"key": "ab", "n": 3}),
        ("lookup", {"key": "cd", "n": 4}),
    ]
    s = ToolStreamSplitter({"lookup"})
    sent = "".join(s.feed(text[i : i + step]) for i in range(0, len(text), step))
    rest, streamed = s.finish()
    assert sent + rest == "" and [c.arguments for c in streamed] == [c.arguments for c in calls]


@pytest.mark.parametrize(
    "text",
    [
        PAIR_1 + "\n" + PAIR_2.replace("lookup", "other"),  # one of them not a declared tool
        PAIR_1 + "\n" + '{"key": "cd"}',  # data after the call
        PAIR_1 + ",\n" + PAIR_2 + ",",  # a dangling comma
        "<tool_call>\n" + PAIR_1 + "\n" + '{"key": "cd"}' + "\n</tool_call>",
        "<tool_call>\n" + PAIR_1 + "\nand then\n" + PAIR_2 + "\n</tool_call>",
    ],
)
def test_a_run_with_anything_but_calls_stays_content(text):
    assert parse_tool_calls(text, {"lookup"}) == (text, [])


@pytest.mark.parametrize(
    "text",
    [
        BARE.replace("lookup", "other"),  # not a declared tool
        "Here it is: " + BARE,  # prose around it: an answer, not a call
        BARE + " and more",
        '```json\n{"name": "lookup", "value": 1}\n```',  # no arguments: data that has a name
        '{"name": "lookup", "arguments": null}',  # arguments no client could decode as an object
        '{"name": "lookup", "arguments": "f"}',
        "```python\nprint(1)\n```",
    ],
)
def test_anything_else_stays_content(text):
    assert parse_tool_calls(text, {"lookup"}) == (text, [])


@pytest.mark.parametrize("text", UNTAGGED)
def test_an_untagged_call_is_never_streamed_as_content(text):
    s = ToolStreamSplitter({"lookup"})
    sent = "".join(s.feed(ch) for ch in text)
    rest, calls = s.finish()
    assert sent == "" and rest == "" and calls


def test_an_answer_that_cannot_be_an_untagged_call_streams_at_once():
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    s = ToolStreamSplitter({"lookup"})
    sent = [s.feed(ch) for ch in code]
    assert "".join(sent[: code.index("def") + 3])  # released once "def" shows it is code
    assert "".join(sent) + s.finish()[0] == code
    data = '{"name": "Bob", "arguments": 1}'  # held while it may be a call, released at the end
    s = ToolStreamSplitter({"lookup"})
    assert "".join(s.feed(ch) for ch in data) == "" and s.finish() == (data, [])


@pytest.mark.parametrize("step", [1, 3, 7])
def test_stream_splitter_holds_back_only_the_call(step):
    text = "Sure <tool maybe> then " + CALL
    s, sent = ToolStreamSplitter(), ""
    for i in range(0, len(text), step):
        sent += s.feed(text[i : i + step])
    rest, calls = s.finish()
    assert sent + rest == "Sure <tool maybe> then" and len(calls) == 1  # stripped, as parse_tool_calls does
    s = ToolStreamSplitter()
    sent = "".join(s.feed(ch) for ch in "plain <tool")
    assert sent + s.finish()[0] == "plain <tool"


@pytest.mark.parametrize(
    "text",
    [
        CALL + "\nI have called it.",
        "Sure. " + CALL + " and then some more text",
        "A " + CALL + " B " + CALL + " C",
        CALL + "\n" + CALL,
        "Before only. " + CALL,
        " " + CALL,  # whitespace alone: the content is null, and the stream sent " "
        "Sure.\n\n" + CALL,
        "  Sure. " + CALL,  # leading whitespace is streamed once text follows: the parsed content keeps it too
        "\n\nSure.\n" + CALL + "\n  after  ",
        " \n" + CALL + "  tail",  # whitespace alone before the block: stripped on both sides
        # held while it might be an untagged call, then a block: "{...}" was streamed, "  {...}" answered
        "  " + BARE + CALL,
        "\t" + BARE + " text " + CALL,
        # a fence line with a space after its language: streamed as text, then returned as the call too
        "```json \n" + BARE + "\n```",
        "```json\t\n" + BARE + "\n```",
    ],
)
@pytest.mark.parametrize("step", [1, 5])
def test_streamed_content_joins_to_the_parsed_content(text, step):
    """Text after a `<tool_call>` block is content too: a stream used to drop it, where the
    non-streamed answer (parse_tool_calls) kept it."""
    content, calls = parse_tool_calls(text, {"lookup"})
    s, sent = ToolStreamSplitter({"lookup"}), ""
    for i in range(0, len(text), step):
        sent += s.feed(text[i : i + step])
    rest, streamed_calls = s.finish()
    assert sent + rest == (content or "") and len(streamed_calls) == len(calls) >= 1


def test_a_tagged_call_whose_arguments_are_not_an_object_stays_content():
    for args in ("null", "[1]", '"f"', "3"):
        text = '<tool_call>\n{"name": "lookup", "arguments": ' + args + "}\n</tool_call>"
        assert parse_tool_calls(text, {"lookup"}) == (text, [])
    text = '<tool_call>\n{"name": "lookup", "arguments": "{\\"key\\": \\"ab\\"}"}\n</tool_call>'
    assert json.loads(parse_tool_calls(text, {"lookup"})[1][0].arguments) == {"key": "ab"}  # JSON text: kept


@pytest.mark.parametrize(
    "arguments",
    ['{"key": "a\\ud800"}', '"{\\"key\\": \\"a\\ud800\\"}"', '{"key": "\\udfff", "n": 1}'],
)
def test_a_lone_surrogate_escape_in_the_arguments_is_kept_escaped(arguments):
    """A model may write a "\\ud800" escape (a forced call's grammar allows any \\u escape):
    decoded and written back raw it has no UTF-8, and the answer's body failed to encode (a
    500, or a stream cut short). It stays an escape, meaning the same string."""
    from fastapi.responses import JSONResponse

    from specserve.server.responses import CHAT

    text = '<tool_call>\n{"name": "lookup", "arguments": ' + arguments + "}\n</tool_call>"
    [call] = parse_tool_calls(text, {"lookup"})[1]
    assert call.arguments.isascii()
    decoded = json.loads(arguments)
    assert json.loads(call.arguments) == (json.loads(decoded) if isinstance(decoded, str) else decoded)
    body = CHAT.response(_chat_context(CHAT), _scripted(text, "stop"))
    assert json.loads(JSONResponse(body).body)["choices"][0]["message"]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": call.arguments,
    }
    ctx = _chat_context(CHAT)
    chunks = CHAT.delta_chunks(ctx, text, None) + CHAT.finish_chunks(ctx, _scripted(text, "stop"))
    assert all(CHAT.sse(c).encode() for c in chunks)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_arguments_that_are_not_json_stay_content(value):
    """Python's decoder takes NaN and Infinity (and reads 1e999 as inf, written back as
    Infinity): such arguments came back as a call whose arguments JSON.parse rejects."""
    for text in (
        '<tool_call>\n{"name": "lookup", "arguments": {"n": ' + value + "}}\n</tool_call>",
        '{"name": "lookup", "arguments": {"n": ' + value + "}}",
        '<tool_call>\n{"name": "lookup", "arguments": "{\\"n\\": ' + value + '}"}\n</tool_call>',
    ):
        assert parse_tool_calls(text, {"lookup"}) == (text, [])


DEEP = 3000  # brackets: past the depth Python's JSON decoder goes (its recursion limit)


@pytest.mark.parametrize(
    "text",
    [
        "[" * DEEP,
        "<tool_call>\n" + "[" * DEEP,
        "```json\n" + "[" * DEEP + "\n```",
        '{"name": "lookup", "arguments": ' + '{"a": ' * DEEP,
        '<tool_call>\n{"name": "lookup", "arguments": "' + "[" * DEEP + '"}\n</tool_call>',
    ],
)
def test_an_answer_nested_too_deep_to_decode_stays_content(text):
    """Tools and `structured_outputs: {"regex": "\\[{1200}"}` on the 0.5B pack: the answer's
    brackets raised RecursionError in the JSON decoder, a 500 (and an error event ending the
    stream). Too deep to decode is not a call: the text stays content."""
    from specserve.server.responses import CHAT

    assert parse_tool_calls(text, {"lookup"}) == (text, [])
    assert CHAT.response(_chat_context(CHAT), _scripted(text, "stop"))["choices"][0]["message"]["content"] == text
    s = ToolStreamSplitter({"lookup"})
    sent = "".join(s.feed(text[i : i + 7]) for i in range(0, len(text), 7))
    assert sent + s.finish()[0] == text
    history = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[" * DEEP}}]}]
    assert template_messages(history, None, "{{ tools }}")[0]["tool_calls"][0]["function"]["arguments"] == "[" * DEEP


def test_refusals_name_the_param():
    bad = [
        (  # OpenAI's arguments are a JSON object; a string schema gave the bare string 'f'
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "tools[0].function.parameters",
        ),
        ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name"),
        ([{"type": "function"}], "tools[0]"),
        ([TOOL, TOOL], "tools"),
    ]
    for tools, param in bad:
        with pytest.raises(ConstraintError) as e:
            check_tools(tools)
        assert e.value.param == param
    # a keyword the grammar cannot enforce: refused where a call is forced, served under "auto"
    unenforceable = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        with pytest.raises(ConstraintError) as e:
            tool_setup([TOOL, unenforceable], choice, None)
        assert e.value.param == "tools[1].function.parameters"
    assert tool_setup([TOOL, unenforceable], "auto", None).choice == "auto"
    assert tool_setup([TOOL, unenforceable], {"type": "function", "function": {"name": "lookup"}}, None).tools
    for choice in ("always", {"type": "function", "function": {"name": "nope"}}, {"name": "lookup"}):
        with pytest.raises(ConstraintError) as e:
            tool_setup([TOOL], choice, None)
        assert e.value.param == "tool_choice"
    for choice in ({"type": "function", "function": {}}, {"type": "function", "function": {"name": 5}}):
        with pytest.raises(ConstraintError, match="tool_choice.function.name must be a string") as e:
            tool_setup([TOOL], choice, None)  # it said "names the function None, which is not in tools"
        assert e.value.param == "tool_choice.function.name"


def test_fallback_template_describes_tools_and_round_trips():
    """The tiny template has no tools support: tools go in a system message, calls and results as text."""
    tok = tiny_tokenizer()
    llm = LLM.from_models(tiny_model(max_positions=2048), tok, name="t")
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "ab", "n": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    text = tok.decode(llm.apply_chat_template(msgs, [TOOL]))
    assert text.startswith("<|im_start|>system\nYou may call functions")
    assert '"name": "lookup"' in text and CALL in text
    assert "<tool_response>\nfound\n</tool_response>" in text
    assert template_messages(msgs, None, "{{ tools }}")[1]["tool_calls"][0]["function"]["arguments"] == {
        "key": "ab",
        "n": 3,
    }  # native templates get the arguments object (they render it with tojson)


# Gemma's rule (its chat template raises the same way): after an optional system message, user
# and assistant turns alternate. The template has no tools support, so the fallback applies.
ALTERNATING_TEMPLATE = (
    "{% set turns = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% for m in turns %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_results_of_parallel_calls_are_one_user_turn_in_the_fallback():
    """Two calls in one turn, then their two results: the fallback wrote each result as a user
    turn of its own, and a template that wants roles to alternate refused the conversation (a 400
    "the model's chat template rejected them"), where Qwen2.5's template joins them in one turn."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": '{"key": "ab", "n": 3}'}}
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", **call}, {"id": "c2", **call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    tok = tiny_tokenizer()
    tok.chat_template = ALTERNATING_TEMPLATE  # cached and shared: restored below (the LLM copies it)
    try:
        llm = LLM.from_models(tiny_model(max_positions=2048), tok, name="t")
        text = tok.decode(llm.apply_chat_template(msgs, [TOOL]))
    finally:
        tok.chat_template = CHAT_TEMPLATE
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # a result after a new call (not the same turn's) is a turn of its own
    later = msgs + [{"role": "assistant", "content": None, "tool_calls": [{"id": "c3", **call}]}, msgs[2]]
    assert [m["role"] for m in template_messages(later, None, None)] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


@pytest.fixture(scope="module")
def llm():
    return LLM.from_models(
        tiny_model(seed=0, max_positions=2048), tiny_tokenizer(), tiny_model(seed=1, max_positions=2048), name="t"
    )


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup"}}])
def test_forced_call_parses_and_is_identical_across_drafters(llm, choice):
    setup = tool_setup([TOOL], choice, None)
    guide = llm.compile_guide(tool_guide(setup))
    msgs = [{"role": "user", "content": "def add(a, b):"}]
    prompt = llm.apply_chat_template(msgs, setup.tools)
    base = llm.generate(prompt, SamplingParams(max_tokens=96), speculation="none", guide=guide)
    _, calls = parse_tool_calls(base.text)
    assert base.finish_reason == "stop" and len(calls) == 1, base.text
    jsonschema.validate(json.loads(calls[0].arguments), TOOL["function"]["parameters"])
    for method in ("draft", "ngram", "prediction"):
        out = llm.generate(prompt, SamplingParams(max_tokens=96), prediction=base.text, speculation=method, guide=guide)
        assert out.token_ids == base.token_ids, method
    exact = llm.generate(
        prompt, SamplingParams(max_tokens=96), prediction=base.token_ids, speculation="prediction", guide=guide
    )  # the call itself, as token ids: accepted in bulk (K = 8, 16, 32, 64)
    assert exact.token_ids == base.token_ids and exact.stats.steps <= 5, exact.steps
    assert exact.stats.by_source["prediction"].rejected == 0


def test_a_forced_call_to_a_tool_whose_schema_names_no_type_has_object_arguments():
    """A parameters schema without a type (`{}`, often sent for a tool without parameters) let the
    forcing grammar take any JSON value: under tool_choice "required" the tiny model wrote
    `"arguments": null`, `false` or a number for each of 8 seeds (temperature 1), and every forced
    call came back as content with no tool call. Now any object, and nothing else."""
    import xgrammar as xgr

    tools = [{"type": "function", "function": {"name": "ping", "parameters": {}}}]
    guide = tool_guide(tool_setup(tools, "required", None))
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tiny_tokenizer())).compile_grammar(guide.source)
    for arguments, allowed in [("{}", True), ('{"a": [1]}', True), ("null", False), ("false", False), ("3", False)]:
        text = '<tool_call>\n{"name": "ping", "arguments": ' + arguments + "}\n</tool_call>"
        assert xgr.GrammarMatcher(compiled).accept_string(text) is allowed, arguments


def test_choice_seeds_are_derived_and_distinct():
    ps = choice_params(SamplingParams(temperature=1.0, seed=5), 3)
    assert len({p.seed for p in ps}) == 3 and ps == choice_params(SamplingParams(temperature=1.0, seed=5), 3)
    assert choice_params(SamplingParams(seed=5), 1)[0].seed == 5


def test_native_template_gets_tools_and_tool_messages():
    """A template that uses `tools` renders them itself: no fallback system prompt."""
    import copy

    from test_server_tools import TOOLS_TEMPLATE

    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = TOOLS_TEMPLATE
    llm = LLM.from_models(tiny_model(max_positions=2048), tok, name="t")
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "ab"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    text = tok.decode(llm.apply_chat_template(msgs, [TOOL]))
    assert text.startswith("<|im_start|>system\nYou can call these tools:\n{") and "You may call" not in text
    assert '"name": "lookup"' in text and '{"name": "lookup", "arguments": {"key": "ab"}}' in text
    assert "<tool_response>\nfound\n</tool_response>" in text


def test_forced_call_never_writes_raw_control_characters(llm):
    """xgrammar's maxLength string rule admits them; the tool grammar bans them (JSON must escape them)."""
    from specserve.server.tools import forced_grammar

    spec = forced_grammar(check_tools([TOOL]), "lookup")
    assert "\n" not in spec.banned and "\x0c" in spec.banned and "\t" in spec.banned
    prompt = llm.apply_chat_template([{"role": "user", "content": "Le café coûte 3 €."}], [TOOL])
    for seed in range(4):
        out = llm.generate(
            prompt,
            SamplingParams(max_tokens=96, temperature=1.0, seed=seed),
            speculation="draft",
            guide=llm.compile_guide(spec),
        )
        assert out.finish_reason == "stop"
        _, calls = parse_tool_calls(out.text)
        jsonschema.validate(json.loads(calls[0].arguments), TOOL["function"]["parameters"])


def test_forced_call_with_a_nested_pydantic_model_is_served_and_validates(llm):
    """pydantic writes a nested model as a `$ref` into the parameters' own `$defs`. Nested under
    "arguments" in one wrapping schema the reference pointed at nothing, so every forced call
    with a nested model (langchain's `with_structured_output(method="function_calling")`, say)
    was a 400 "cannot compile". Its discriminated union (oneOf) is served too."""
    from typing import Literal

    from pydantic import BaseModel, Field

    from specserve.server.tools import forced_grammar

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int = Field(ge=1, le=9)

    class Dog(BaseModel):
        kind: Literal["dog"]
        name: str = Field(max_length=6)

    class Adopt(BaseModel):
        pet: Cat | Dog = Field(discriminator="kind")
        owner: Dog

    tool = {"type": "function", "function": {"name": "adopt", "parameters": Adopt.model_json_schema()}}
    spec = forced_grammar(check_tools([tool]), "adopt")
    prompt = llm.apply_chat_template([{"role": "user", "content": "adopt"}], [tool])
    for seed in range(3):
        params = SamplingParams(max_tokens=160, temperature=1.0, seed=seed)
        out = llm.generate(prompt, params, speculation="none", guide=llm.compile_guide(spec))
        assert out.finish_reason == "stop", out.text
        _, calls = parse_tool_calls(out.text)
        assert calls[0].name == "adopt"
        Adopt.model_validate_json(calls[0].arguments)


# -- the chat dialect's stream against its whole answer -------------------------------------------
def _scripted(text: str, reason: str):
    """A finished engine output of `text` (what the dialects build answers from)."""
    from specserve.engine.stats import RequestOutput, SpecStats

    return RequestOutput([1], [2], text, reason, SpecStats())


def _chat_context(dialect):
    from specserve.config import SpeculationConfig
    from specserve.server.protocol import Prepared

    setup = tool_setup(
        [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}], "auto", True
    )
    prepared = Prepared([1], SamplingParams(max_tokens=8), SpeculationConfig(), None, True, False, tools=setup)
    return dialect.context("m", lambda tid: (str(tid), [65]), prepared)


@pytest.mark.parametrize(
    "text", ["", "Hello", "  Sure. " + CALL, CALL, "A " + CALL + " B", "  \n", *CALLS_IN_A_ROW, *WITH_UNDECLARED]
)
@pytest.mark.parametrize("reason", ["stop", "length"])
def test_a_streamed_chat_answer_with_tools_joins_to_the_whole_answer(text, reason):
    """Content, calls and finish of the chunks, joined as the openai SDK joins them (a null
    content stays null until text comes), equal the answer without stream; every chunk and body
    validates strictly against the SDK's types. An empty answer was "" whole and null streamed."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    from specserve.server.responses import CHAT

    ctx = _chat_context(CHAT)
    chunks = CHAT.opening_chunks(ctx) + [c for ch in text for c in CHAT.delta_chunks(ctx, ch, None)]
    chunks += CHAT.finish_chunks(ctx, _scripted(text, reason))
    content, calls = None, []
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk, strict=True)
        delta = chunk["choices"][0]["delta"]
        if delta.get("content") is not None:
            content = (content or "") + delta["content"]
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                calls.append([call["function"]["name"], ""])
            calls[call["index"]][1] += call["function"]["arguments"]
    body = CHAT.response(_chat_context(CHAT), _scripted(text, reason))
    ChatCompletion.model_validate(body, strict=True)
    [choice] = body["choices"]
    whole = [[c["function"]["name"], c["function"]["arguments"]] for c in choice["message"].get("tool_calls", [])]
    assert (content, calls) == (choice["message"]["content"], whole)
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert choice["finish_reason"] == ("length" if reason == "length" else "tool_calls" if whole else "stop")
    assert text not in WITH_UNDECLARED or (content, whole) == (text, [])  # a call nobody declared is content


CUT = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1'


def test_a_block_cut_by_the_length_limit_is_a_cut_call_after_the_content():
    content, [call] = parse_tool_calls(CUT, {"f"}, cut=True)
    assert (content, call.name, call.arguments, call.cut) == ("Sure.", "f", '{"a": 1', True)


@pytest.mark.parametrize(
    "text, names, cut",
    [
        (CUT, {"f"}, False),  # not cut: an unclosed, unparsable block stays text
        (CUT, {"g"}, True),  # a function the request did not declare
        ("a < b", {"f"}, True),  # no block
        ('<tool_call>\n{"nom": "f"', {"f"}, True),  # not a call's beginning
    ],
)
def test_text_that_is_no_cut_call_stays_content(text, names, cut):
    assert parse_tool_calls(text, names, cut=cut) == (text, [])


FENCED_CUT = '```json\n{\n  "name": "f",\n  "arguments": {"a": 1'


@pytest.mark.parametrize(
    "text, arguments", [(FENCED_CUT, '{"a": 1'), ('{{"name": "f", "argu', ""), ('[{"name": "f"', "")]
)
def test_a_call_without_tags_cut_by_the_length_limit_is_a_cut_call(text, arguments):
    """The default 1.5B pack writes its calls in a ```json fence (taken as calls when whole); cut by
    max_tokens, '```json\\n{\\n  "name": "add",\\n  "arguments' came back as the content."""
    content, [call] = parse_tool_calls(text, {"f"}, cut=True)
    assert (content, call.name, call.arguments, call.cut) == (None, "f", arguments, True)
    splitter = ToolStreamSplitter({"f"})
    assert "".join(splitter.feed(text[i : i + 3]) for i in range(0, len(text), 3)) == ""
    rest, [streamed] = splitter.finish(cut=True)
    assert (rest, streamed.name, streamed.arguments) == ("", "f", arguments)


@pytest.mark.parametrize("text", ['```json\n{\n  "', "```python\n", '{"name": "g", "arguments": {', "{'name': 'f'"])
def test_a_cut_answer_without_a_whole_declared_name_stays_content(text):
    assert parse_tool_calls(text, {"f"}, cut=True) == (text, [])


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool',  # cut inside the closing tag
        '```json\n{"name": "f", "arguments": {"a": 1}}\n``',  # inside the closing fence
        '{"name": "f", "arguments": {"a": 1}',  # before the call object's own brace
    ],
)
def test_a_whole_call_cut_after_its_arguments_returns_just_them(text):
    """The length limit fell after the arguments were whole (in the closing tag, where the tags are
    text, or the fence): the call came back with what followed them as its arguments, such as
    '{"a": 1}}\\n</tool', which no client parses. Now its arguments are the whole object, and the
    call is not cut (a Responses function_call item is "completed")."""
    content, [call] = parse_tool_calls(text, {"f"}, cut=True)
    assert (content, call.name, call.arguments, call.cut) == (None, "f", '{"a": 1}', False)
    splitter = ToolStreamSplitter({"f"})
    assert "".join(splitter.feed(text[i : i + 3]) for i in range(0, len(text), 3)) == ""
    rest, [streamed] = splitter.finish(cut=True)
    assert (rest, streamed.arguments) == ("", '{"a": 1}')


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "f", "arguments": {"a": 1}}\nThis calls f with',  # prose after a whole call
        '[{"name": "f", "arguments": {}}, {"name": "f", "arguments": {"a',  # a second call, cut
    ],
)
def test_a_cut_answer_with_more_after_a_whole_call_s_arguments_stays_content(text):
    """As without the cut, an answer that is more than one call without the tags is content (the
    cut call took all that followed its name as its arguments: '{}}, {"name": "f", ...')."""
    assert parse_tool_calls(text, {"f"}, cut=True) == (text, [])
