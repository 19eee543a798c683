"""A stored response's input items, as `GET /v1/responses/{id}/input_items` lists them.

`listed` writes one request input item as OpenAI lists it (with an id, a status, content as typed
parts); `page` answers the list query: OpenAI's `object: "list"` with `first_id`, `last_id` and
`has_more`, `limit` 1..100 (20 by default), `order` asc or desc (desc by default: newest first),
`after` the id of the item the page starts after. A response continued with
`previous_response_id` lists the whole chain (the earlier turns' input items and answers, then its
own input), as OpenAI lists it.
"""

from __future__ import annotations

import uuid

from .errors import bad_request

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
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


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise bad_request(f"limit must be an integer, got {raw!r}", "limit", "invalid_type") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise bad_request(f"limit must be between 1 and {MAX_LIMIT}, got {limit}", "limit")
    return limit


def _order(raw: str | None) -> str:
    if raw not in (None, "asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc', got {raw!r}", "order")
    return raw or "desc"


def page(items: list[dict], limit: str | None, order: str | None, after: str | None) -> dict:
    """The list object of one page of `items` (oldest first) for the query's raw values."""
    limit, order = _limit(limit), _order(order)
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        start = next((i + 1 for i, item in enumerate(ordered) if item["id"] == after), None)
        if start is None:
            raise bad_request(f"after: no input item with id {after!r} in this response", "after")
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
