"""A stored response's input items, as `GET /v1/responses/{id}/input_items` lists them.

`listed` writes one request input item as OpenAI lists it (with an id, a status, content as typed
parts); `page` answers the list query (server/pagination.py), newest first by default; `before`
is refused (OpenAI's list had it until 2025, openai-python 1.101.0, and has it no more). A
response continued with `previous_response_id` lists the whole chain (the earlier turns' input
items and answers, then its own input), as OpenAI lists it.
"""

from __future__ import annotations

import uuid

from .errors import bad_request
from .pagination import page as paginate

ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def listed(item: dict, kind: str, text: str | None = None) -> dict:
    """One input item (its type `kind`, a message's text `text`) with an id (its own, if sent)."""
    out = {"id": item.get("id") if isinstance(item.get("id"), str) else f"{ID_PREFIX[kind]}{uuid.uuid4().hex}"}
    if kind == "message":
        role = item["role"]
        part = {"type": "output_text", "text": text, "annotations": []} if role == "assistant" else None
        part = part or {"type": "input_text", "text": text}
        return {**out, "type": "message", "role": role, "content": [part], "status": "completed"}
    if kind == "function_call":
        fields = {k: item[k] for k in ("call_id", "name", "arguments")}
        return {**out, "type": "function_call", **fields, "status": "completed"}
    if kind == "function_call_output":
        fields = {"call_id": item["call_id"], "output": text}
        return {**out, "type": "function_call_output", **fields, "status": "completed"}
    return {**item, **out, "type": kind}  # a reasoning item, as sent


def _no_before(raw: str | None) -> None:
    """`before` paged backwards in OpenAI's list until its API dropped it (openai-python 1.101.0,
    2025-08); older SDKs still send it. Ignored like other unknown keys, it answered the first page
    where the previous one was asked for, without a word: it is refused by name instead."""
    if raw is not None:
        raise bad_request(
            "before is not a parameter of this list (OpenAI's API no longer has it): page with after", "before"
        )


def page(items: list[dict], limit: str | None, order: str | None, after: str | None, before: str | None = None) -> dict:
    """One page of a response's input items (oldest first), newest first unless `order` says asc."""
    _no_before(before)
    missing = "input item with id {after} in this response"
    return paginate(items, limit, order, after, default_order="desc", missing=missing)
