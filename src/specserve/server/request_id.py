"""An `x-request-id` header on every answer, as OpenAI's API sends one ("Debugging requests").

The openai SDK reads it into `completion._request_id`, a raw response's `request_id` and an
error's `APIStatusError.request_id`, for users to log and quote; the server logs it with any
unhandled error, so the two can be matched. Each request gets a fresh `req_<32 hex>` id, kept in
the ASGI scope under `SCOPE_KEY`: the app's 500 handler runs outside every middleware (Starlette
answers an unhandled error from its outermost layer) and sets the header from there.
"""

from __future__ import annotations

import uuid

HEADER = "x-request-id"
SCOPE_KEY = "specserve.request_id"


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id_of(scope) -> str | None:
    """The id given to this request (None when it came in before the middleware saw it)."""
    return scope.get(SCOPE_KEY)


class RequestIdMiddleware:
    """Pure ASGI middleware: gives each HTTP request an id and adds it to the answer's headers
    (streams included: the header goes out with the status, before the first event)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = scope.setdefault(SCOPE_KEY, new_request_id())

        async def with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER.encode()]
                message = {**message, "headers": [*headers, (HEADER.encode(), rid.encode())]}
            await send(message)

        await self.app(scope, receive, with_id)
