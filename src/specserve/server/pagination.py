"""OpenAI's cursor pages over a list of stored objects, shared by every list endpoint.

`page` answers a list query: OpenAI's `object: "list"` with `data`, `first_id`, `last_id` and
`has_more`, `limit` 1..100 (20 by default), `order` asc or desc (each endpoint's own default:
newest first for a response's input items, oldest first for stored chat completions and their
messages), `after` the id of the object the page starts after (the SDK's cursor: the last id of
the page before). A query value that is not one of these is a 400 naming it.
"""

from __future__ import annotations

from .errors import bad_request

DEFAULT_LIMIT, MAX_LIMIT = 20, 100


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


def _order(raw: str | None, default: str) -> str:
    if raw not in (None, "asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc', got {raw!r}", "order")
    return raw or default


def query(limit: str | None, order: str | None, default_order: str) -> tuple[int, str]:
    """A list query's `limit` (1..100) and `order` ("asc" or "desc") from their raw values; a 400 naming a bad one."""
    return _limit(limit), _order(order, default_order)


def unknown_after(missing: str, after: str):
    """The 400 for an `after` that names no item; `missing` says what it failed to find."""
    return bad_request(f"after: no {missing.format(after=repr(after))}", "after")


def list_object(rows: list[dict], limit: int) -> dict:
    """OpenAI's list object for a page read as up to `limit` + 1 rows (an extra row: there are more)."""
    data = rows[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit,
    }


def page(
    items: list[dict],
    limit: str | None,
    order: str | None,
    after: str | None,
    *,
    default_order: str,
    missing: str,
) -> dict:
    """The list object of one page of `items` (oldest first) for the query's raw values; `missing`
    says what an `after` that names no item failed to find ("input item ... in this response")."""
    limit, order = query(limit, order, default_order)
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        start = next((i + 1 for i, item in enumerate(ordered) if item["id"] == after), None)
        if start is None:
            raise unknown_after(missing, after)
    return list_object(ordered[start : start + limit + 1], limit)
