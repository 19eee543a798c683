"""A request-body size cap, enforced in ASGI before any route reads, parses or tokenizes a body.

    request ─► Content-Length over the cap? ─► 413 (no byte of the body is parsed)
            ─► else read the body counting bytes (chunked bodies too) ─► over the cap? ─► 413
            ─► else hand the buffered body to the app, then pass later messages through

Why before the routes: without a cap a 20 MB body was tokenized in full (28 s of CPU) before
the context check refused it. The refused body is drained (read and thrown away, up to
`DRAIN_LIMIT_BYTES` / `DRAIN_LIMIT_S`) before the 413 is sent, so an HTTP/1.1 client that is
still uploading gets to read the answer instead of a reset connection; past those limits the
answer is sent at once with `Connection: close`.
"""

from __future__ import annotations

import asyncio
import json
import time

MIB = 1 << 20
BYTES_PER_TOKEN = 64  # generous: ~4 bytes per token in plain text, \uXXXX escapes and whitespace runs need more
OVERHEAD_BYTES = 1 * MIB  # JSON keys, roles, sampling fields, stop strings, metadata
DRAIN_LIMIT_BYTES = 128 * MIB
DRAIN_LIMIT_S = 10.0


def default_max_body_bytes(max_context: int) -> int:
    """The default cap: the prompt and the prediction may each fill the context, at 64 bytes a token.

    2 x 64 B x max_context + 1 MiB: 1.06 MiB for a 512-token model, 2 MiB for 8k (SmolLM2),
    5 MiB for 32k (Qwen2.5-Coder). Anything larger cannot be a request the model could serve.
    """
    return 2 * BYTES_PER_TOKEN * max_context + OVERHEAD_BYTES


def too_large_body(limit: int) -> dict:
    """OpenAI's error shape for a refused body."""
    return {
        "error": {
            "message": f"the request body is larger than this server's limit of {limit} bytes (see --max-body-bytes)",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }


class BodyLimitMiddleware:
    """Pure ASGI middleware: refuse HTTP bodies over `max_bytes` with an OpenAI-shaped 413.

    Pure ASGI (not BaseHTTPMiddleware) so streaming responses and the disconnect watcher keep
    talking to the server's own `receive` once the body has been handed over.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            drained = declared <= DRAIN_LIMIT_BYTES and await _drain(receive, 0)
            return await self._refuse(send, close=not drained)
        body, more, over = await self._read(receive)
        if body is None:  # the client went away mid-upload: nobody to answer (counted 499, not a 400 for a cut body)
            return
        if over:
            drained = not more or await _drain(receive, self.max_bytes)
            return await self._refuse(send, close=not drained)
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive) -> tuple[bytes | None, bool, bool]:
        """Read the body up to the cap: (bytes so far, more to come, over the cap); None for the
        bytes when the client disconnected before the body was complete."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnect
                return None, False, False
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return b"", more, True
            parts.append(chunk)
            if not more:
                return b"".join(parts), False, False

    async def _refuse(self, send, close: bool) -> None:
        body = json.dumps(too_large_body(self.max_bytes)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope) -> int | None:
    """The declared Content-Length, or None (chunked, absent or malformed: counted while reading)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive, already: int) -> bool:
    """Read and discard the rest of a refused body; False when it ran past the drain limits."""
    size, deadline = already, time.monotonic() + DRAIN_LIMIT_S
    while size <= DRAIN_LIMIT_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return False
        if message["type"] != "http.request":
            return False
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


def _replay(body: bytes, receive):
    """A `receive` that first returns the buffered body, then defers to the server's own."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
