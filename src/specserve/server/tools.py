"""Tool calling: validating OpenAI tool definitions, the forcing grammar, parsing.

The wire format is Qwen2.5's (also Hermes'): the model writes

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call. Small models do not always write the tags: the default 1.5B pack often
answers a tool request with the call alone, as bare JSON, in a ```json fence, or in the doubled
braces that Qwen2.5's own chat template shows as its example (`{{"name": ..., "arguments": ...}}`).
An answer that is nothing but such calls (one, several in a row, or a list), naming declared tools, is taken
as the calls, as llama.cpp's server takes bare and fenced JSON for this format; anything else
stays content, and so does a tagged block that calls a function the request did not declare
(OpenAI never calls one). How tools and earlier calls reach the prompt (the template's own tools
support, or our fallback system message) is `specserve/chat.py`, shared with `LLM.chat`.
Either way the output is parsed the same way. `tool_choice` "required" or a named function
is enforced by a grammar: exactly one `<tool_call>` block whose JSON matches the function's
parameters schema, then EOS.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

# template_messages / template_supports_tools lived here before chat.py; tests still import them from here.
from ..chat import CLOSE, OPEN, template_messages, template_supports_tools  # noqa: F401
from ..engine.constrain import (
    TOOL_BANNED,
    ConstraintError,
    GrammarSpec,
    check_schema,
    for_xgrammar,
    literal,
    xgrammar,
    xgrammar_message,
)
from .errors import bad_request

if TYPE_CHECKING:
    import xgrammar as xgr

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_AFTER_CALL = re.compile(r"\s*(?:" + re.escape(CLOSE) + r"|$)")  # what may follow a block's JSON
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # what a "\\ud800" escape decodes to: no UTF-8 for it


def _not_json(token: str):
    raise ValueError(f"{token} is not JSON")


def _finite(number: str) -> float:
    """A JSON number as a float; one too large for a float (1e999) is refused, as inf would be
    written back as `Infinity`, which is not JSON."""
    value = float(number)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{number} is out of range")
    return value


# The calls' JSON, strictly: Python's decoder takes NaN and Infinity, and arguments holding them,
# written back, were text that JSON.parse (and every strict client) rejects.
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI returns it
    cut: bool = False  # cut off by the length limit: its arguments are only their beginning

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


# -- validation ------------------------------------------------------------------------------
OPTIONAL_FUNCTION_FIELDS = ("description", "parameters", "strict")


def _without_nulls(fn: dict) -> dict:
    """A function whose optional fields are null, read as if they were left out: OpenAI's types
    make them nullable, and the openai SDK's own `pydantic_function_tool` sends `"description":
    null` for a model without a docstring (`responses.parse(tools=[...])` was a 400 here)."""
    return {k: v for k, v in fn.items() if not (k in OPTIONAL_FUNCTION_FIELDS and v is None)}


def check_tools(tools: list) -> list[dict]:
    """Validate OpenAI tool definitions; returns them normalised (parameters defaulted)."""
    out = []
    for i, tool in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ConstraintError(f"{p} must be {{'type': 'function', 'function': {{...}}}}", p)
        fn = _without_nulls(tool["function"])
        if not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
            raise ConstraintError(f"{p}.function.name must be 1-64 letters, digits, '_' or '-'", f"{p}.function.name")
        if "description" in fn and not isinstance(fn["description"], str):
            raise ConstraintError(f"{p}.function.description must be a string", f"{p}.function.description")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ConstraintError(f"{p}.function.parameters must be a JSON schema object", f"{p}.function.parameters")
        if params.get("type", "object") != "object":  # arguments are a JSON object, as at OpenAI
            raise ConstraintError(
                f"{p}.function.parameters must be a schema of type 'object', got {params.get('type')!r}",
                f"{p}.function.parameters",
            )
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise ConstraintError("tools: function names must be unique", "tools")
    return out


def check_forced_schemas(tools: list[dict], choice: str, offered: set[str] | None = None) -> None:
    """A forced call (tool_choice "required" or a named function) is written under a grammar of
    the functions' parameters: refuse the keywords it would not enforce (check_schema). Under
    "auto" nothing is enforced, and the schemas only describe the tools to the model: agents send
    MCP tools with formats and patterns a grammar cannot honour, and those requests stay served.
    tools: the request's own list, so that a 400 names a tool by its index there; offered: the
    names the model may call (an allowed_tools choice's), all of them when None."""
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if choice in ("required", name) and (offered is None or name in offered):
            param = f"tools[{i}].function.parameters"
            try:
                check_schema(tool["function"]["parameters"], param)
            except ConstraintError as e:
                raise ConstraintError(str(e), param) from None


def check_message_tool_calls(calls: list, param: str) -> list[dict]:
    """An assistant message's earlier tool_calls: [{id, type, function: {name, arguments}}]."""
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments", ""), (str, dict))
        ):
            raise ConstraintError(
                f"{param}[{j}] must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}",
                f"{param}[{j}]",
            )
        out.append(
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": fn.get("arguments", "{}")},
            }
        )
    return out


def check_tool_results(messages: list[dict]) -> None:
    """Each `tool` message answers, by its tool_call_id, a call an earlier assistant message made,
    as OpenAI requires (a 400 there, and here: it was templated as the result of a call the model
    never made). Calls sent without ids (the id is optional in an earlier call here) match any."""
    ids: set | None = set()  # the earlier calls' ids; None once a call came without one
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or ():
            ids = None if ids is None or call.get("id") is None else ids | {call["id"]}
        if m["role"] != "tool":
            continue
        param, call_id = f"messages[{i}].tool_call_id", m.get("tool_call_id")
        if call_id is None:
            raise bad_request(f"missing required parameter '{param}'", param, "missing_required_parameter")
        if ids is not None and call_id not in ids:
            raise bad_request(
                f"{param} {call_id!r} answers no tool call: a tool message must follow an assistant message "
                "whose tool_calls hold that id",
                param,
            )


def allowed_tools(choice, tools: list[dict]) -> tuple[list[dict], str]:
    """OpenAI's `{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}` as the tools the
    model may call (those it names, in their declared order) and the plain choice ("auto" or
    "required") over them. Served by offering only those tools: the model can call no other."""
    allowed = choice.get("allowed_tools")
    p = "tool_choice.allowed_tools"
    if not isinstance(allowed, dict):
        raise ConstraintError(f"{p} must be an object with 'mode' and 'tools'", p)
    if allowed.get("mode") not in ("auto", "required"):
        raise ConstraintError(f"{p}.mode must be 'auto' or 'required'", f"{p}.mode")
    refs = allowed.get("tools")
    if not isinstance(refs, list) or not refs:
        raise ConstraintError(f"{p}.tools must be a non-empty list of tools", f"{p}.tools")
    names = {t["function"]["name"] for t in tools}
    wanted = set()
    for i, ref in enumerate(refs):
        fn = ref.get("function") if isinstance(ref, dict) and ref.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names:
            raise ConstraintError(
                f"{p}.tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}} naming a tool",
                f"{p}.tools[{i}]",
            )
        wanted.add(name)
    return [t for t in tools if t["function"]["name"] in wanted], allowed["mode"]


def resolve_choice(choice, tools: list[dict]) -> str | None:
    """tool_choice -> "none" | "auto" | "required" | a function name (forced)."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise ConstraintError(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):
            raise ConstraintError("tool_choice.function.name must be a string", "tool_choice.function.name")
        if name not in {t["function"]["name"] for t in tools}:
            raise ConstraintError(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
        return name
    raise ConstraintError(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
        "tool_choice",
    )


# -- the forcing grammar -----------------------------------------------------------------------
def call_grammar(tool: dict) -> xgr.Grammar:
    """One call object, `{"name": <this name>, "arguments": <its parameters>}`, written compactly.

    The arguments' grammar is compiled from the parameters schema as its own root, so its local
    `$ref`s ("#/$defs/Cat", what pydantic writes for a nested model) resolve; nested under
    "arguments" in one wrapping schema they pointed at nothing, and every forced call with a
    nested model was a 400. A schema that names no type (`{}`, what a tool without parameters is
    often given) is an object's, as `check_tools` reads it: compiled as it is, it let the model
    write any JSON value (`null`, `false`, a number), and every such forced call came back as
    content, its arguments no object."""
    fn = tool["function"]
    params = fn["parameters"] if "type" in fn["parameters"] else {"type": "object", **fn["parameters"]}
    try:
        arguments = xgrammar().Grammar.from_json_schema(
            json.dumps(for_xgrammar(params)), any_whitespace=False, strict_mode=True
        )
    except Exception as e:  # noqa: BLE001
        message = f"tools: cannot compile the schema of {fn['name']!r}: {xgrammar_message(e)}"
        raise ConstraintError(message, "tools") from None
    opening = literal('{"name": ' + json.dumps(fn["name"]) + ', "arguments": ')
    return xgrammar().Grammar.concat(opening, arguments, literal("}"))


def forced_grammar(tools: list[dict], choice: str) -> GrammarSpec:
    """Exactly one `<tool_call>` block for the named function (or any tool when "required")."""
    chosen = tools if choice == "required" else [t for t in tools if t["function"]["name"] == choice]
    calls = [call_grammar(t) for t in chosen]
    body = calls[0] if len(calls) == 1 else xgrammar().Grammar.union(*calls)
    framed = xgrammar().Grammar.concat(literal(OPEN + "\n"), body, literal("\n" + CLOSE))
    return GrammarSpec("grammar", framed, banned=TOOL_BANNED, param="tools")


# -- parsing -------------------------------------------------------------------------------------
def _blocks(text: str, names: Collection[str]) -> list[tuple[int, int, list[ToolCall]]] | None:
    """Each `<tool_call>` block of the text as (start, end, its calls); None when one does not
    parse, or (names given) calls a function not among them: OpenAI never calls a function the
    request did not declare, and one was returned to a client that has no such function. A block
    holds one call, or several in a row (`_call_run`). Its JSON is decoded before
    its closing tag is looked for: a string argument may itself hold "</tool_call>" (the forcing
    grammar allows it), and cutting the block at it turned a valid forced call into content."""
    blocks, at = [], text.find(OPEN)
    while at >= 0:
        start = at + len(OPEN)
        start += len(text[start:]) - len(text[start:].lstrip())
        run = _call_run(text, start)
        if run is None:
            return None
        tail, calls = _AFTER_CALL.match(text, run[1]), [_call_from_obj(o) for o in run[0]]
        if tail is None or None in calls or (names and any(c.name not in names for c in calls)):
            return None
        blocks.append((at, tail.end(), calls))
        at = text.find(OPEN, tail.end())
    return blocks


_SEPARATOR = re.compile(r"\s*,?\s*")  # between the calls of a run


def _call_run(text: str, at: int) -> tuple[list, int] | None:
    """The JSON values written one after another from `at`, apart by whitespace or a comma, each
    a call object or a list of them: (the objects, where the last value ends); None when there
    is none. Asked for two calls, the default 1.5B pack writes them so (`{...},\n{...}` or
    `{...}\n{...}`, in a fence), and only the first value was looked at: the answer stayed text."""
    objs, end = [], None
    while True:
        try:
            obj, after = _DECODER.raw_decode(text, at)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python decodes (a 500 before)
            break
        objs.extend(obj if isinstance(obj, list) else [obj])
        end = after
        at = _SEPARATOR.match(text, after).end()
    return (objs, end) if objs else None


def _without_blocks(text: str, blocks: list[tuple[int, int, list[ToolCall]]]) -> str:
    """The text with the blocks cut out."""
    out, at = [], 0
    for start, end, _ in blocks:
        out.append(text[at:start])
        at = end
    return "".join(out) + text[at:]


def _call_from_obj(obj) -> ToolCall | None:
    """A parsed call object ({"name", "arguments" or "parameters"}) as a ToolCall. Arguments nested
    deeper than Python's JSON code goes make none (its RecursionError was a 500)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or _LONE_SURROGATE.search(obj["name"]):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    try:
        if isinstance(args, str):  # the arguments written as JSON text: kept as written, if an object
            arguments = args if isinstance(_DECODER.decode(args), dict) else None
        else:  # null, a list, a number: no call a client could decode
            arguments = json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else None
    except (ValueError, RecursionError):
        arguments = None
    return None if arguments is None else ToolCall(_call_id(), obj["name"], _escape_surrogates(arguments))


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _escape_surrogates(arguments: str) -> str:
    """The arguments' JSON with each lone surrogate (decoded from a `\\ud800` escape the model
    wrote; a pair decodes to one character) escaped again: raw, it has no UTF-8, and writing the
    response body failed (a 500, or a stream cut off). Such a character is inside a JSON string,
    where the escape means the same."""
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", arguments)


_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)\n?```", re.DOTALL)


def _bare_calls(text: str, names: Collection[str]) -> list[ToolCall]:
    """The calls of an answer that is only calls without the tags (one, several in a row, or a
    JSON list of them): bare, fenced, or opened with Qwen2.5's doubled brace. [] when it is
    anything else."""
    body = text.strip()
    if fence := _FENCE.fullmatch(body):
        body = fence.group(1).strip()
    if body.startswith("{{"):
        body = body[1:]  # the template's example doubles the braces; the model may close one or both
    run = _call_run(body, 0)
    if run is None or body[run[1] :].strip() not in ("", "}"):
        return []
    objs = run[0]
    named = [
        o for o in objs if isinstance(o, dict) and o.get("name") in names and ("arguments" in o or "parameters" in o)
    ]
    if len(named) < len(objs):
        return []
    calls = [_call_from_obj(o) for o in objs]
    return [] if None in calls else calls


def parse_tool_calls(text: str, names: Collection[str] = (), cut: bool = False) -> tuple[str | None, list[ToolCall]]:
    """Split model output into (content, tool calls). A block that does not parse, or calls a
    function not in `names`, leaves the whole text as content, so nothing the model wrote is lost.
    names: the declared tools (empty: tagged calls of any name, and no untagged ones); an answer
    that is only a call to one of them, written without the tags, is a call too. cut: the output
    stopped at its length limit, where a last block left open is a call cut off (`cut_call`)."""
    if cut and (split := cut_call(text, names)) is not None:
        return split
    if OPEN not in text:
        calls = _bare_calls(text, names) if names else []
        return (None, calls) if calls else (text, [])
    blocks = _blocks(text, names)
    if not blocks:
        return text, []
    content = _without_blocks(text, blocks)
    # the whitespace at the ends goes, but the answer's leading whitespace stays when text follows it
    # before the first block: a stream has sent it by then (ToolStreamSplitter), and stripping it
    # here made the streamed content differ from this one ("  Sure." streamed, "Sure." answered)
    content = content.rstrip() if text[: blocks[0][0]].strip() else content.strip()
    return (content or None), [call for _, _, calls in blocks for call in calls]


_CUT_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]+)"')  # a cut block's written name
# What may follow a cut call's whole arguments: its object's brace, then the closing tag or fence
# (the length limit fell there), the brace of a doubled {{...}}, or a list's bracket
_AFTER_ARGUMENTS = ["}" + CLOSE, "}```", "}}", "}]"]
_CUT_ARGUMENTS = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*(.*)', re.DOTALL)  # and its arguments' start


def cut_call(text: str, names: Collection[str]) -> tuple[str | None, list[ToolCall]] | None:
    """(content, calls) of an output cut by its length limit inside its last `<tool_call>` block,
    as OpenAI answers one: the call, once its name is written, with its arguments as far as they
    got (`finish_reason` stays "length"). A block cut before its name is whole, or an answer cut
    inside the opening tag, is no call and no content: it was the server's markup, which came back
    as the content (agents showed '<tool_call>\\n{"name": "f", "arg' as the answer, or sent it
    back in the history). An answer that is only a call without the tags (`_bare_calls`), cut once
    its name is whole, is that call. None when the output ends in no such call."""
    at = text.rfind(OPEN)
    if at < 0:
        if text.strip() and OPEN.startswith(text.strip()):
            return None, []
        call = _cut_named(_bare_body(text), names) if names and _may_be_bare_call(text) else None
        return (None, [call]) if call else None
    tail = text[at + len(OPEN) :]
    content, calls = parse_tool_calls(text[:at], names) if text[:at].strip() else (None, [])
    if CLOSE in tail or (OPEN in text[:at] and not calls):
        return None  # a closed block, or blocks before it that are no calls: parsed as ever
    head = ((content or "").rstrip() or None, calls)  # as parse_tool_calls strips the text before a block
    if (call := _cut_named(tail, names)) is not None:
        return head[0], [*head[1], call]
    return head if _squeezed_prefix(tail, [f'{{"name":"{name}' for name in names]) else None  # the name not yet whole


def _cut_named(body: str, names: Collection[str]) -> ToolCall | None:
    """The cut call the body begins ('{"name": "f", "arguments": {"a": 1'), once its name is whole
    and (names given) declared; None otherwise. Arguments that are whole (the limit fell in the
    closing tag or fence) are just that JSON, and the call is not cut: '{"a": 1}}\n</tool' was
    taken whole as its arguments."""
    named = _CUT_NAME.match(body)
    if named is None or (names and named.group(1) not in names):
        return None
    arguments = _CUT_ARGUMENTS.fullmatch(body, named.end())
    if not (arguments or _squeezed_prefix(body[named.end() :], [',"arguments":'])):
        return None
    written = arguments.group(1) if arguments else ""
    try:
        end = json.JSONDecoder().raw_decode(written)[1]
    except ValueError:  # the arguments themselves were cut: as far as they got
        return ToolCall(_call_id(), named.group(1), _escape_surrogates(written.rstrip()), cut=True)
    if not _squeezed_prefix(written[end:], _AFTER_ARGUMENTS):
        return None  # more than the call's end follows them (prose, a second call): parsed as ever
    return ToolCall(_call_id(), named.group(1), _escape_surrogates(written[:end]))


def _bare_body(text: str) -> str:
    """An answer that may be a call without the tags, from its (first) call object's brace: the
    fence line, a list's bracket and a doubled brace cut off, as `_bare_calls` reads them."""
    body = text.lstrip()
    if body.startswith("```"):
        body = body.partition("\n")[2].lstrip()
    body = body[1:].lstrip() if body.startswith("[") else body
    return body[1:] if body.startswith("{{") else body


def _squeezed_prefix(text: str, wholes: list[str]) -> bool:
    """Whether the text, without its whitespace, is empty or begins one of `wholes`."""
    squeezed = re.sub(r"\s+", "", text)
    return not squeezed or any(whole.startswith(squeezed) for whole in wholes)


def _may_be_bare_call(text: str) -> bool:
    """Whether an answer that begins so may still be a call without the tags (an optional fence
    line, an optional "[", one or two braces, then the "name" key): such a start is held back
    from the stream."""
    s = text.lstrip()
    if s.startswith("```") or "```".startswith(s):
        head, newline, s = s.partition("\n")
        if not newline:  # still in the fence's first line
            return re.fullmatch(r"`{0,3}[A-Za-z]*[ \t]*", head) is not None  # as _FENCE's first line
        s = s.lstrip()
    s = s[1:].lstrip() if s.startswith("[") else s  # a list of calls
    if not s:
        return True
    if s[0] != "{":
        return False
    s = s[1:].lstrip()
    s = s[1:].lstrip() if s.startswith("{") else s
    return '"name"'.startswith(s) if len(s) < len('"name"') else s.startswith('"name"')


class ToolStreamSplitter:
    """Streams content deltas while holding back text that may open a `<tool_call>` block, or
    an answer that may be a call written without the tags (see `_bare_calls`).

    feed(text) -> content safe to send now. Once a block opens, everything after it is held
    for `parse_tool_calls` at the end (arguments are sent whole, in one delta per call).
    Whitespace is held until text follows it: before a call, `parse_tool_calls` strips it, and a
    stream that sent it gave a whitespace-only content delta (a whitespace-only message item in
    the Responses API) where the answer's content is null."""

    def __init__(self, names: Collection[str] = ()):
        self.names = names  # the declared tools ((): tagged blocks only)
        self.text = ""  # everything generated
        self.sent = 0  # chars of content already released
        self.in_call = False
        self.bare = bool(names)  # the answer so far may be a call without the tags

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.bare:
            self.bare = _may_be_bare_call(self.text)
            if self.bare:
                return ""
        if self.in_call:
            return ""
        at = self.text.find(OPEN, self.sent)
        if at >= 0:
            self.in_call = True
            return self._release(at)
        hold = next(
            (k for k in range(min(len(OPEN) - 1, len(self.text) - self.sent), 0, -1) if self.text.endswith(OPEN[:k])), 0
        )
        return self._release(len(self.text) - hold)

    def _release(self, end: int) -> str:
        end = self.sent + len(self.text[self.sent : end].rstrip())  # trailing whitespace waits
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def finish(self, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """(content not yet sent, tool calls) at the end of the output: what the stream still owes
        so that its content joins to `parse_tool_calls`' content (text after a block included).
        cut: the output stopped at its length limit (see `cut_call`)."""
        content, calls = parse_tool_calls(self.text, self.names, cut)
        if not calls and content == self.text:  # no (parsable) call: the held text was content after all
            return self.text[self.sent :], []
        # What was sent is where the content begins (no call's text is sent, and whitespace waits for
        # text), so the rest is the content after it: cutting the held text anew stripped the answer's
        # leading whitespace that the whole answer keeps ("  {...}<tool_call>...": "{...}" streamed).
        content, sent = content or "", self.text[: self.sent]
        return (content[len(sent) :] if content.startswith(sent) else ""), calls
