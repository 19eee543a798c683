"""OpenAI's Responses API (`POST /v1/responses`) over the chat path.

A Responses request is a chat request in other words: `instructions` is the system message,
`input` the conversation (messages, the model's earlier `function_call` items and their
`function_call_output`s), `text.format` the response format, flat function tools the chat
tools. `to_chat` rewrites it so, and everything after that (templating, grammars, tool parsing,
speculation, Predicted Outputs through `prediction` in `extra_body`) is the chat path's.

What comes back is the Responses shape: `output` items (one `message` with `output_text`, then
one `function_call` per call), `status` (`incomplete` with `max_output_tokens` when cut), and
usage as `input_tokens` / `output_tokens`. Streams are typed server-sent events
(`response.created` ... `response.output_text.delta` ... `response.completed`), each with its
`sequence_number`, and no `[DONE]` line.

Finished responses, and a stream's response that failed (as its `response.failed` showed it), are
kept in memory (`ResponseStore`, least recently used first out, bounded in size) unless `store` is
false (a stream its client hung up on is not, nor is it at OpenAI): `previous_response_id`
continues one (its conversation, not its instructions, as OpenAI does), an `item_reference` input
item sends one of its output items back by id, and `GET` / `DELETE /v1/responses/{id}` read or
drop one.
They live in one server process (the Ray replicas share one, ray_serve.SharedResponseStore) and
are gone after a restart; `conversation` objects,
background responses and stored prompt templates (`prompt`) are refused.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import uuid
from dataclasses import dataclass, field

from pydantic import ValidationError

from ..engine.stats import RequestOutput, TokenLogprob
from .errors import APIError, bad_request, engine_error, not_a_string, unsupported
from .input_items import listed
from .lru_store import LruStore, pack
from .protocol import Prepared, prepare_chat, refusal_text
from .responses import ChatDialect, Dialect, ResponseContext
from .schemas import ChatCompletionRequest, InputTokensRequest, ResponsesRequest
from .store_calls import off_loop
from .tools import ToolCall, parse_tool_calls

log = logging.getLogger("specserve.server.responses_api")
TEXT_PARTS = ("input_text", "output_text", "text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the `include` entry that asks for output_text logprobs
# OpenAI's `include` values (the SDK's ResponseIncludable); all but the logprobs name items this server never writes
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    LOGPROBS_INCLUDE,
)
CHAT_PARAMS = (  # (chat field path prefix, what the Responses request calls it), first match wins
    ("messages", "input"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("tool_choice.function", "tool_choice"),
    ("tool_choice.allowed_tools", "tool_choice"),
)
# A chat field path as an error's message writes it (not inside another path, nor quoted)
_CHAT_PATH = re.compile(
    r"(?<![\w.\['\"])(?:messages|max_completion_tokens|max_tokens|response_format|tool_choice\.function"
    r"|tool_choice\.allowed_tools|tools\[\d+\]\.function)"
    r"(?:\[\d+\]|\.\w+)*(?![\w'\"])"
)
CHAT_TOOL_CHOICE = "{'type': 'function', 'function': {'name': ...}}"  # the shape chat's 400 shows


# -- the request --------------------------------------------------------------------------------
def _text(content, param: str, assistant: bool = False) -> str:
    """A string, or the text of an array of text parts (other parts are refused by name); an
    assistant message's `refusal` parts (an output item OpenAI wrote) are their refusal's text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or an array of content parts", param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if assistant and kind == "refusal":
            texts.append(refusal_text(part, f"{param}[{j}]"))
            continue
        if kind not in TEXT_PARTS:
            raise unsupported(f"{param}[{j}]", f"content part type {kind!r}", "send only text parts")
        if not isinstance(part.get("text"), str):  # was "content part type 'input_text' ... is not supported"
            raise not_a_string(part.get("text"), f"{param}[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def _kind(item: dict) -> str:
    """An input item's type: OpenAI's schema lets a message leave it out (it has a role) and an
    item reference too (it has only an id)."""
    if item.get("type") is not None:
        return item["type"]
    return "item_reference" if "role" not in item and "id" in item else "message"


def _resolved(items: list[dict], store: ResponseStore) -> list[dict]:
    """The input with each item reference (`{"type": "item_reference", "id": ...}`, an earlier
    stored answer's item sent back by id, as stateful clients do) replaced by the item it names."""
    out = []
    for i, item in enumerate(items):
        if _kind(item) == "item_reference":
            if not isinstance(item.get("id"), str):  # it was told "no item with id None", as if looked for
                raise not_a_string(item.get("id"), f"input[{i}].id")
            found = store.item(item["id"])
            if found is None:
                raise bad_request(
                    f"input[{i}].id: no item with id {item.get('id')!r} (items are those of responses kept in this "
                    "server's memory, and not of those sent with store: false)",
                    f"input[{i}].id",
                    "item_not_found",
                )
            item = found
        out.append(item)
    return out


def _input(req: ResponsesRequest) -> list[dict]:
    """The request's input as items (a string is one user message)."""
    return [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else req.input


def _messages(items: list[dict], history: list[dict]) -> list[dict]:
    """Chat messages for the input `items` (item references resolved) after `history` (a stored
    conversation's messages); consecutive function_call items join the assistant turn before them,
    as the chat format holds a turn's calls in one message."""
    messages = [dict(m) for m in history]
    for i, item in enumerate(items):
        kind = _kind(item)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"input[{i}].role must be user, assistant, system or developer", f"input[{i}].role")
            text = _text(item.get("content"), f"input[{i}].content", assistant=role == "assistant")
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = _call(item, i)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*last.get("tool_calls", []), call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            _check_output_call_id(item, i, messages)
            output = _text(item.get("output"), f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind != "reasoning":  # a reasoning model's notes: nothing for this model to read
            raise unsupported(f"input[{i}].type", f"input item type {kind!r}")
    return messages


def _listed_input(items: list[dict]) -> list[dict]:
    """The input `items` (checked by `_messages`) as `GET /v1/responses/{id}/input_items` lists them."""
    out = []
    for i, item in enumerate(items):
        kind = _kind(item)
        text = None
        if kind == "message":
            text = _text(item.get("content"), f"input[{i}].content", assistant=item.get("role") == "assistant")
        elif kind == "function_call_output":
            text = _text(item.get("output"), f"input[{i}].output")
        out.append(listed(item, kind, text))
    return out


def _chain(store: ResponseStore, response_id: str) -> list[dict]:
    """What a response continued from `response_id` lists before its own input: that response's
    listed input and its output items (an empty list if it was dropped meanwhile)."""
    body = store.body(response_id)
    return [*(store.input_items(response_id) or ()), *(body or {}).get("output", ())]


def _check_output_call_id(item: dict, i: int, messages: list[dict]) -> None:
    """Input item i, a function_call_output, names a function_call made before it (in the input or
    the stored conversation), as OpenAI requires: chat's own check would name chat's field."""
    call_id, param = item.get("call_id"), f"input[{i}].call_id"
    if not isinstance(call_id, str):
        raise bad_request(f"{param} must be a string", param)
    if not any(c.get("id") == call_id for m in messages for c in m.get("tool_calls") or ()):
        raise bad_request(f"{param}: no function_call with call_id {call_id!r} comes before this output", param)


def _call(item: dict, i: int) -> dict:
    """Input item i, a function_call, checked and in chat's shape."""
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"input[{i}].{key} must be a string", f"input[{i}].{key}")
    return _chat_call(item)


def _chat_call(item: dict) -> dict:
    """A function_call item as chat's tool call."""
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _tools(tools: list[dict] | None) -> list[dict] | None:
    """Flat function tools ({"type": "function", "name", "parameters", ...}) in chat's shape."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise unsupported(f"tools[{i}].type", f"tool type {tool.get('type')!r}", "send only function tools")
        if "name" not in tool and isinstance(tool.get("function"), dict):
            raise _chat_shaped_tool(i)
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def _chat_shaped_tool(i: int) -> APIError:
    """A chat tool (`{"type": "function", "function": {...}}`, what `openai.pydantic_function_tool`
    returns) sent here: OpenAI's missing `name`, and the flat shape that has it. It was told
    "tools[i].name must be 1-64 letters", about a name it had, one level down."""
    return bad_request(
        f"missing required parameter 'tools[{i}].name': Responses function tools are flat, "
        '{"type": "function", "name": ..., "parameters": ...}, where chat nests them under "function"',
        f"tools[{i}].name",
        "missing_required_parameter",
    )


def _tool_choice(choice):
    """A Responses tool_choice in chat's shape: the flat `{"type": "function", "name"}`, and the flat
    `{"type": "allowed_tools", "mode", "tools": [{"type": "function", "name"}]}`, nest as chat's do."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        refs = choice.get("tools")
        if isinstance(refs, list):
            refs = [_tool_choice(ref) if isinstance(ref, dict) and "name" in ref else ref for ref in refs]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": refs}}
    return choice


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", "text.format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        _check_json_schema_format(fmt)
        inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": inner}
    return fmt


def _check_json_schema_format(fmt: dict) -> None:
    """OpenAI requires a json_schema text format's `name` (a string) and `schema` (chat's
    `response_format.json_schema` requires only the name: a missing schema there is any object,
    which a Responses request without one was served as)."""
    if not isinstance(fmt.get("name"), str):
        raise not_a_string(fmt.get("name"), "text.format.name")
    if fmt.get("schema") is None:
        raise bad_request(
            "missing required parameter 'text.format.schema'", "text.format.schema", "missing_required_parameter"
        )


def _check_include(include: list[str] | None) -> None:
    """Each `include` entry is one of OpenAI's values: a misspelt one was accepted, and a client
    that asked for logprobs so got `logprobs: []` without a word."""
    for i, entry in enumerate(include or ()):
        if entry not in INCLUDABLE:
            raise bad_request(
                f"include[{i}]: invalid value {entry!r}; supported values are {', '.join(INCLUDABLE)}",
                f"include[{i}]",
            )


def to_chat(req: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request this Responses request means, its conversation being `messages` (a
    stored conversation's and the input's, `_messages`; 400s name the Responses fields)."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body = {
        "model": req.model,
        "messages": system + messages,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
        "tools": _tools(req.tools),
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req.text),
        "prediction": req.prediction.model_dump() if req.prediction else None,
        "speculation": req.speculation.model_dump() if hasattr(req.speculation, "model_dump") else req.speculation,
        "seed": req.seed,
        "top_k": req.top_k,
    }
    if LOGPROBS_INCLUDE in (req.include or ()) or req.top_logprobs is not None:
        body |= {"logprobs": True, "top_logprobs": req.top_logprobs or 0}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:  # a field of the right JSON type whose content chat refuses
        err = e.errors()[0]
        head = str(err["loc"][0]) if err["loc"] else "input"
        path = head + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][1:])
        raise bad_request(f"{responses_param(path)}: {err['msg']}", responses_param(path)) from None


def prepare_responses(req: ResponsesRequest, llm, store: ResponseStore, compile_guide: bool = True) -> Prepared:
    """Validate against the model, as chat (the server renames the fields its 400s name);
    compile_guide=False checks the grammar without compiling it (`count_input_tokens`)."""
    if req.conversation is not None:
        raise unsupported("conversation", "the Conversations API", "continue with previous_response_id")
    if req.background:
        raise unsupported("background", "background mode")
    if req.prompt is not None:  # its instructions live at OpenAI: answered without them, an agent had none
        raise unsupported("prompt", "a stored prompt template", "send instructions and input instead")
    _check_include(req.include)
    history = []
    if req.previous_response_id is not None:
        history = store.messages(req.previous_response_id)
        if history is None:
            raise bad_request(
                f"previous response with id {req.previous_response_id!r} not found (responses are kept in "
                "this server's memory only, and not when sent with store: false)",
                "previous_response_id",
                "previous_response_not_found",
            )
    items = _resolved(_input(req), store)
    messages = _messages(items, history)
    prepared = _prepare_fitting(req, messages, llm, compile_guide)
    prepared.include_usage = False  # the usage travels in response.completed
    if req.store is not False:
        prepared.history = messages
        earlier = _chain(store, req.previous_response_id) if req.previous_response_id is not None else []
        prepared.input_items = [*earlier, *_listed_input(items)]
    prepared.request_fields = {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
        "top_logprobs": req.top_logprobs,
        "user": req.user,
        "previous_response_id": req.previous_response_id,
        "store": req.store is not False,
        "truncation": req.truncation or "disabled",
        "background": False,  # true is refused above
        "max_tool_calls": req.max_tool_calls,
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
    }
    return prepared


def _prepare_fitting(req: ResponsesRequest, messages: list[dict], llm, compile_guide: bool) -> Prepared:
    """The chat job for `messages`. With truncation "auto", an input over the context (with room
    for max_output_tokens) loses its oldest turns until it fits, as OpenAI's "auto" drops items
    from the conversation's beginning ("auto" was accepted and changed nothing, the same 400 as
    "disabled"). The conversation kept for previous_response_id stays whole."""
    try:
        return prepare_chat(to_chat(req, messages), llm, compile_guide)
    except APIError as e:
        if req.truncation != "auto" or e.code != "context_length_exceeded":
            raise
        dropped = _turns_to_drop(req, messages, llm, e)
    return prepare_chat(to_chat(req, _without_turns(messages, dropped)), llm, compile_guide)


def _turns_to_drop(req: ResponsesRequest, messages: list[dict], llm, error: APIError) -> int:
    """The fewest oldest turns whose dropping makes `messages` fit, found by bisection (dropping
    one at a time templated the whole conversation once per turn); grammars are not compiled
    while looking. Raises `error` (the input over the context) when even the last turn alone does not fit."""
    fits, lo, hi = None, 1, len(_turn_starts(messages)) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            prepare_chat(to_chat(req, _without_turns(messages, mid)), llm, False)
            fits, hi = mid, mid - 1
        except APIError as e:
            if e.code != "context_length_exceeded":
                raise
            error, lo = e, mid + 1
    if fits is None:
        raise error
    return fits


def _turn_starts(messages: list[dict]) -> list[int]:
    """Where each turn of the conversation begins: at each user message, and at its first message
    when it opens with something else (an assistant's greeting, a tool call and its output), which
    is then its oldest turn (in no turn, it was never dropped). System and developer messages are
    in none: they stay."""
    starts = [i for i, m in enumerate(messages) if m["role"] == "user"]
    opening = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")), None)
    return [opening, *starts] if opening is not None and opening not in starts[:1] else starts


def _without_turns(messages: list[dict], k: int) -> list[dict]:
    """`messages` without their first k turns (`_turn_starts`), the system and developer messages
    kept (a turn's tool calls and results go with it, so no result is left without its call)."""
    start = _turn_starts(messages)[k]
    return [m for i, m in enumerate(messages) if i >= start or m["role"] in ("system", "developer")]


def count_input_tokens(req: InputTokensRequest, llm, store: ResponseStore) -> dict:
    """`POST /v1/responses/input_tokens`'s work (run on the prep thread): the prompt tokens that a
    Responses request with these fields would bill as `usage.input_tokens`, prepared as one is
    (so its 400s are a create's, in the Responses fields); `store` as `looked_up` gives it. Its
    grammar (a `text.format` schema, a forced tool call) is checked, not compiled: it constrains the
    answer, not the prompt, and a compilation started here held one of the grammar threads that
    creates wait for, for nothing."""
    try:
        prepared = prepare_responses(req.model_copy(update={"model": req.model or ""}), llm, store, False)
    except Exception as e:  # noqa: BLE001
        err = engine_error(e)
        err.param, err.message = responses_param(err.param), responses_message(err.message)
        raise err from None
    return {"object": "response.input_tokens", "input_tokens": len(prepared.prompt_ids)}


def responses_param(param: str | None) -> str | None:
    """The Responses field that a chat field path (named by a 400) came from."""
    if param is None:
        return None
    for chat, ours in CHAT_PARAMS:
        if param == chat or param.startswith((chat + ".", chat + "[")):
            return ours + param[len(chat) :]
    if param.startswith("tools[") and ".function" in param:  # tools[i].function.x -> tools[i].x
        return param.replace(".function", "", 1)
    return param


def responses_message(text: str) -> str:
    """A chat 400's message in the Responses fields: `messages[0]` is `input[0]`, `max_tokens`
    `max_output_tokens`, `tools[0].function.name` `tools[0].name`, and tool_choice's shape is the
    flat one. The param was renamed, but the message spoke of fields a Responses client never sent.
    "the messages have N tokens" becomes "the input has N tokens" (it read "the input have")."""
    text = _CHAT_PATH.sub(lambda m: responses_param(m.group()), text)
    text = text.replace("the input have ", "the input has ")
    return text.replace(CHAT_TOOL_CHOICE, "{'type': 'function', 'name': ...}")


# -- what is kept -------------------------------------------------------------------------------
class ResponseStore:
    """Finished responses in memory: each one's conversation (chat messages, its answer last)
    and its body, dropped least recently used first beyond `max_chars` of JSON (lru_store.py);
    its output items can be found by their ids (`item`) while it is kept."""

    blocking = False  # in memory: the app calls it from its event loop (store_calls.py)

    def __init__(self, max_chars: int = 64 << 20):
        self._owners: dict[str, str] = {}  # output item id -> the id of the response it is in
        self._kept = LruStore(max_chars, self._forget_items)

    @property
    def max_chars(self) -> int:
        return self._kept.max_size

    def put(self, response_id: str, messages: list[dict], body: dict, input_items: list[dict] | None = None) -> None:
        """Keep a response: its conversation, its body and its listed input items."""
        input_items = input_items or []
        outputs = tuple(item["id"] for item in body.get("output", ()) if item.get("id"))
        # the item ids twice: in the entry and in the owners' index
        packed, size = pack((messages, body, input_items), outputs, outputs)  # before the lock
        with self._kept.lock:
            self._kept.put(response_id, (outputs, packed), size)
            self._owners |= {item["id"]: response_id for item in body.get("output", ()) if item.get("id")}

    def _forget_items(self, response_id: str, kept: tuple) -> None:
        """A response left: its output items' ids no longer find it (the lock held)."""
        for output_id in kept[0]:
            if self._owners.get(output_id) == response_id:
                del self._owners[output_id]

    def _unpacked(self, response_id: str) -> tuple | None:
        """(messages, body, input items) of a kept response, a fresh copy; None if not kept."""
        kept = self._kept.get(response_id)
        return None if kept is None else kept[1].unpack()

    def messages(self, response_id: str) -> list[dict] | None:
        item = self._unpacked(response_id)
        return None if item is None else item[0]

    def body(self, response_id: str) -> dict | None:
        item = self._unpacked(response_id)
        return None if item is None else item[1]

    def input_items(self, response_id: str) -> list[dict] | None:
        """A response's input items as listed (the earlier turns' first, when it continued one)."""
        item = self._unpacked(response_id)
        return None if item is None else item[2]

    def item(self, item_id: str) -> dict | None:
        """The output item with this id, of a response still kept (an item reference's target)."""
        with self._kept.lock:
            owner = self._owners.get(item_id)
        body = self.body(owner) if owner is not None else None
        return next((i for i in body["output"] if i.get("id") == item_id), None) if body else None

    def delete(self, response_id: str) -> bool:
        return self._kept.pop(response_id)


class LookedUp:
    """What preparing one request reads from a store, read before it is prepared: the previous
    response's messages, body and input items, and each item the input references by id. A request
    is prepared on its replica's one prep thread, and under Ray each store read waits on the store's
    actor (up to 15 s): read there, one slow read held up every request prepared after it."""

    def __init__(self, store: ResponseStore, req: ResponsesRequest):
        self.previous = previous = req.previous_response_id
        chained = previous is not None and req.store is not False  # its answer lists the previous one's items
        self._messages = None if previous is None else store.messages(previous)
        self._body = store.body(previous) if chained else None
        self._input_items = store.input_items(previous) if chained else None
        refs = [item.get("id") for item in _input(req) if _kind(item) == "item_reference"]
        self._items = {ref: store.item(ref) for ref in refs if isinstance(ref, str)}

    def messages(self, response_id: str) -> list[dict] | None:
        return self._messages if response_id == self.previous else None

    def body(self, response_id: str) -> dict | None:
        return self._body if response_id == self.previous else None

    def input_items(self, response_id: str) -> list[dict] | None:
        return self._input_items if response_id == self.previous else None

    def item(self, item_id: str) -> dict | None:
        return self._items.get(item_id)


async def looked_up(store: ResponseStore, req: ResponsesRequest) -> ResponseStore | LookedUp:
    """The store that preparing `req` reads: `store` itself when it is in memory, else what it holds
    for `req`, read now on a worker thread (LookedUp)."""
    if not store.blocking:
        return store
    return await off_loop(True, LookedUp, store, req)


def _answer_message(items: list[dict]) -> dict:
    """The answer's output items as the chat message that continues the conversation."""
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    message = {"role": "assistant", "content": text or None}
    calls = [_chat_call(i) for i in items if i["type"] == "function_call"]
    if calls:
        message["tool_calls"] = calls
    return message


# -- the response -------------------------------------------------------------------------------
@dataclass
class ResponsesContext(ResponseContext):
    """One response's ids and what its stream has sent so far."""

    request_fields: dict = field(default_factory=dict)
    history: list[dict] | None = None  # the conversation so far, kept with the answer (None: store false)
    input_items: list[dict] | None = None  # the input as GET .../input_items lists it, kept with the answer
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    sequence: int = 0
    opened: bool = False  # the message item (and its output_text part) was announced
    text: str = ""  # output text streamed so far
    logprobs_sent: list[dict] = field(default_factory=list)  # with text deltas sent so far
    logprobs_held: list[dict] = field(default_factory=list)  # of tokens whose text is not sent yet

    def event(self, kind: str, **fields) -> dict:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return body


def _usage(output: RequestOutput) -> dict:
    """OpenAI's Responses usage, with chat's Predicted Outputs counts in `output_tokens_details`
    (draft tokens from the `prediction` the target accepted / rejected): a prediction is served
    here, and its counts were reported only in `speculation` before."""
    s = output.stats
    pred = s.by_source["prediction"]
    return {
        "input_tokens": s.prompt_tokens,
        # cache_write_tokens: OpenAI's count of tokens written for prompt caching it bills apart
        # (the openai SDK's ResponseUsage requires it); writing our prefix cache costs nothing extra.
        "input_tokens_details": {"cached_tokens": s.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": s.output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": pred.accepted,
            "rejected_prediction_tokens": pred.rejected,
        },
        "total_tokens": s.prompt_tokens + s.output_tokens,
    }


def _logprobs(ctx: ResponsesContext, lps: list[TokenLogprob] | None) -> list[dict]:
    """An output_text's `logprobs`: chat's entries (token, logprob, bytes, top_logprobs), asked
    for with include ["message.output_text.logprobs"] (or top_logprobs); [] when not asked."""
    return [ChatDialect.entry(ctx, lp) for lp in lps] if ctx.logprobs and lps else []


def _response_error(e: APIError) -> dict:
    """A response's `error`: OpenAI's codes for it are few ("rate_limit_exceeded", "server_error",
    ...), so anything but a 429 is a server error; the message keeps what happened."""
    return {"code": "rate_limit_exceeded" if e.status == 429 else "server_error", "message": e.message}


def _message(ctx: ResponsesContext, text: str, status: str, logprobs: list[dict] | None = None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {"id": ctx.message_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def _status(call: ToolCall) -> str:
    """A function_call item's status: "incomplete" for a call the length limit cut off, as OpenAI's."""
    return "incomplete" if call.cut else "completed"


def _function_call(call: ToolCall, status: str, arguments: str | None = None) -> dict:
    return {
        "id": f"fc_{call.id.removeprefix('call_')}",
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if arguments is None else arguments,
    }


class ResponsesDialect(Dialect):
    name = "responses"
    request_model = ResponsesRequest
    id_prefix = "resp_"

    def __init__(self, store: ResponseStore | None = None):
        self.store = store or ResponseStore()
        self.blocking = self.store.blocking  # response(), finish_chunks() and error_event() put the answer there

    async def preparer(self, req):
        """`prepare_responses`, over what it reads from the store read first when the store blocks
        (`looked_up`); there is no `prepare` here, as every store read goes through this."""
        return functools.partial(prepare_responses, store=await looked_up(self.store, req))

    def param(self, name: str | None) -> str | None:
        return responses_param(name)

    def message(self, text: str) -> str:
        return responses_message(text)

    def context(self, model, namer, prepared) -> ResponsesContext:
        return ResponsesContext(
            f"{self.id_prefix}{uuid.uuid4().hex}",
            model,
            namer,
            logprobs=prepared.params.logprobs is not None,
            tools=prepared.tools,
            request_fields=prepared.request_fields,
            history=prepared.history,
            input_items=prepared.input_items,
        )

    def body(self, ctx: ResponsesContext, output: RequestOutput | None, items: list[dict]) -> dict:
        """The response object: in progress (no output yet) or finished with its items."""
        cut = output is not None and output.finish_reason == "length"
        status = "in_progress" if output is None else "incomplete" if cut else "completed"
        body = {
            "id": ctx.id,
            "object": "response",
            "created_at": ctx.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "model": ctx.model,
            "output": items,
            **ctx.request_fields,
            "reasoning": None,
            "usage": _usage(output) if output is not None else None,
        }
        if output is not None:
            body["speculation"] = output.stats.to_dict()
        return body

    def _calls(self, ctx: ResponsesContext, output: RequestOutput) -> tuple[str, list[ToolCall]]:
        if ctx.tools is None:
            return output.text, []
        content, calls = parse_tool_calls(output.text, ctx.tools.names, cut=output.finish_reason == "length")
        return content or "", ctx.tools.kept(calls)

    def response(self, ctx, outputs) -> dict:
        output = outputs[0] if isinstance(outputs, list) else outputs
        content, calls = self._calls(ctx, output)
        done = "incomplete" if output.finish_reason == "length" else "completed"
        items = [_message(ctx, content, done, _logprobs(ctx, ctx.listed(output.logprobs)))] if content else []
        items += [_function_call(c, _status(c)) for c in calls]
        return self._remember(ctx, self.body(ctx, output, items))

    def _remember(self, ctx: ResponsesContext, body: dict) -> dict:
        """Keep a finished response (unless sent with store: false); returns its body."""
        if ctx.history is not None:
            self.store.put(ctx.id, [*ctx.history, _answer_message(body["output"])], body, ctx.input_items)
        return body

    # -- streaming ----------------------------------------------------------------------------
    def sse(self, event: dict) -> str:
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"

    done_line = ""

    def error_event(self, ctx: ResponsesContext, e: APIError) -> dict:
        """A failure after the first event: `response.failed`, the response with status "failed",
        its `error` and the text streamed so far, as OpenAI ends a stream whose response failed
        (the SDK's stream helper and agents wait for that lifecycle event, not a bare `error`).
        That response is kept as sent (unless store is false), as OpenAI keeps a failed one: the
        client saw its id in `response.created`, and GET or previous_response_id find it."""
        items = [_message(ctx, ctx.text, "incomplete", ctx.logprobs_sent)] if ctx.opened else []  # those of its text
        body = {**self.body(ctx, None, items), "status": "failed", "error": _response_error(e)}
        try:
            self._remember(ctx, body)
        except Exception:  # noqa: BLE001 - a store that fails too (a Ray actor gone) must not lose this event
            log.exception("the failed response %s could not be kept", ctx.id)
        return ctx.event("response.failed", response=body)

    def opening_chunks(self, ctx) -> list[dict]:
        skeleton = self.body(ctx, None, [])
        return [ctx.event("response.created", response=skeleton), ctx.event("response.in_progress", response=skeleton)]

    def _text_events(self, ctx: ResponsesContext, text: str) -> list[dict]:
        """A text delta (the message and its part announced first), with the logprobs of the
        tokens since the last one (held back with the text a tool-call splitter held)."""
        if not text:
            return []
        events = []
        where = {"item_id": ctx.message_id, "output_index": 0}
        if not ctx.opened:
            ctx.opened = True
            item = {**_message(ctx, "", "in_progress"), "content": []}
            events.append(ctx.event("response.output_item.added", output_index=0, item=item))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(ctx.event("response.content_part.added", **where, content_index=0, part=part))
        ctx.text += text
        lps, ctx.logprobs_held = ctx.logprobs_held, []
        ctx.logprobs_sent += lps
        events.append(ctx.event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=lps))
        return events

    def delta_chunks(self, ctx, text: str, lps, index: int = 0) -> list[dict]:
        ctx.logprobs_held += _logprobs(ctx, lps)
        if ctx.tools is not None:  # hold back what may be a <tool_call> block
            text = ctx.splitter(index).feed(text)
        return self._text_events(ctx, text)

    def finish_chunks(self, ctx, output: RequestOutput, index: int = 0) -> list[dict]:
        """The rest of the text, the message closed, each call as an item, then the whole response."""
        events, calls = [], []
        if ctx.tools is not None:
            rest, calls = ctx.splitter(index).finish(cut=output.finish_reason == "length")
            calls = ctx.tools.kept(calls)
            events += self._text_events(ctx, rest)
        done = "incomplete" if output.finish_reason == "length" else "completed"
        items = []
        if ctx.opened:
            where = {"item_id": ctx.message_id, "output_index": 0}
            lps = ctx.logprobs_sent + ctx.logprobs_held
            message = _message(ctx, ctx.text, done, lps)
            events.append(ctx.event("response.output_text.done", **where, content_index=0, text=ctx.text, logprobs=lps))
            events.append(ctx.event("response.content_part.done", **where, content_index=0, part=message["content"][0]))
            events.append(ctx.event("response.output_item.done", output_index=0, item=message))
            items.append(message)
        for call in calls:
            k, item = len(items), _function_call(call, _status(call))
            where = {"item_id": item["id"], "output_index": k}
            events.append(
                ctx.event("response.output_item.added", output_index=k, item=_function_call(call, "in_progress", ""))
            )
            events.append(ctx.event("response.function_call_arguments.delta", **where, delta=call.arguments))
            events.append(  # name: OpenAI's API reference sends it (the Python SDK's type has no field for it)
                ctx.event("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments)
            )
            events.append(ctx.event("response.output_item.done", output_index=k, item=item))
            items.append(item)
        final = self._remember(ctx, self.body(ctx, output, items))
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        events.append(ctx.event(kind, response=final))
        return events
