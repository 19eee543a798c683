"""Chat messages as a model's chat template wants them, tool calls and tool results included.

The tool-call wire format is Qwen2.5's (also Hermes'): the model writes

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call. Templates that know tools (their Jinja mentions `tools`) get the OpenAI
tool list through `apply_chat_template(tools=...)` and render assistant `tool_calls` and
`role: "tool"` messages themselves. For templates without tools support (the *fallback*) we
describe the tools and this format in a system message, write earlier assistant tool calls as
`<tool_call>` blocks, and pass tool results as user messages wrapped in `<tool_response>` (the
results of one turn's calls in one user message).

This sits below both `llm.py` (which templates a chat) and `server/` (whose `tools.py` parses
and forces the same blocks), so neither reaches into the other.
"""

from __future__ import annotations

import json

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def template_supports_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def _arguments_dict(arguments) -> dict | str:
    """Templates render arguments with `tojson`: give them the object, not the JSON string."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to decode: the text as sent
            return arguments
    return arguments


def _block(name: str, arguments) -> str:
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': _arguments_dict(arguments)}, ensure_ascii=False)}\n{CLOSE}"


def fallback_system_prompt(tools: list[dict]) -> str:
    """What the fallback tells a model whose template has no tools support."""
    sigs = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return (
        "You may call functions. Available functions:\n" + sigs + "\nTo call one, answer with\n"
        f'{OPEN}\n{{"name": <function name>, "arguments": <arguments object>}}\n{CLOSE}'
    )


def _native_call(call: dict) -> dict:
    """An earlier tool call as a template with tools support wants it (arguments as an object)."""
    fn = call["function"]
    return {
        "type": "function",
        "id": call.get("id"),
        "function": {"name": fn["name"], "arguments": _arguments_dict(fn["arguments"])},
    }


def template_messages(messages: list[dict], tools: list[dict] | None, template: str | None) -> list[dict]:
    """Messages ready for the template: native tools support, or the documented fallback."""
    native = template_supports_tools(template)
    out, results_turn = [], False  # results_turn: the last message out holds tool results (fallback)
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        is_result = not native and m["role"] == "tool"
        if native:
            if calls:
                m["tool_calls"] = [_native_call(c) for c in calls]
        elif calls:
            blocks = "\n".join(_block(c["function"]["name"], c["function"]["arguments"]) for c in calls)
            m["content"] = ((m.get("content") or "") + "\n" + blocks).strip()
        elif is_result:
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        if m.get("content") is None:
            m["content"] = ""
        if is_result and results_turn:
            # the results of one turn's calls are one user turn, as Qwen2.5's template writes them: as
            # user turns of their own, a template that wants roles to alternate (Gemma's) refused them
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + m["content"]}
        else:
            out.append(m)
        results_turn = is_result
    if tools and not native:
        prompt = fallback_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
