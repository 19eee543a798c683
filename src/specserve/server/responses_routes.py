"""The Responses API's routes beside `POST /v1/responses` (which app.py serves as every answer is
served), over its store of finished responses (responses_api.ResponseStore):

    POST   /v1/responses/input_tokens            the input tokens a create with these fields bills
    GET    /v1/responses/{response_id}           a stored response's body (not its events: stream=true is a 400)
    GET    /v1/responses/{response_id}/input_items   its input items, a page at a time (input_items.py)
    DELETE /v1/responses/{response_id}           drop it
    POST   /v1/responses/{response_id}/cancel    OpenAI's 400 for a synchronous response
    POST   /v1/responses/compact                 not served: the 404 of any unknown URL (not a 405)

An id that is not kept (sent with store: false, dropped, or made by another process) is a 404.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException

from .errors import APIError, bad_request
from .input_items import page
from .responses_api import ResponseStore, count_input_tokens, looked_up
from .schemas import InputTokensRequest
from .store_calls import store_caller


def no_response(response_id: str) -> APIError:
    return APIError(
        404,
        f"no response with id {response_id!r} (responses are kept in this server's memory only, "
        "and not when sent with store: false)",
        param="response_id",
        code="response_not_found",
    )


def not_cancellable() -> APIError:
    """OpenAI cancels only responses created with `background: true` and refuses any other with
    this 400; this server refuses background responses, so every kept response is synchronous
    (one still being answered is not kept yet: a 404)."""
    return APIError(400, "Cannot cancel a synchronous response.", code=None)


def not_streamable() -> APIError:
    """`GET /v1/responses/{id}?stream=true` streams a background response's events at OpenAI; the
    JSON body it got here held no events, and the SDK's stream ended empty, without an error."""
    return bad_request(
        "stream: only a response created with background: true can be streamed again, and this server does not "
        "run background responses (retrieve it without stream)",
        "stream",
        "unsupported_parameter",
    )


def install_responses_store(app: FastAPI, server, store: ResponseStore, dependencies: list) -> None:
    """The routes, behind the app's `dependencies` (its API key); `server` (app.Server) counts
    input tokens on its prep thread, as /tokenize does."""

    call = store_caller(store)

    @app.post("/v1/responses/input_tokens", dependencies=dependencies)
    async def count_input_tokens_route(request: Request):
        return await server.tokens(request, InputTokensRequest, count_input_tokens, lambda req: looked_up(store, req))

    @app.get("/v1/responses/{response_id}", dependencies=dependencies)
    async def get_response(response_id: str, stream: str | None = None):
        body = await call(store.body, response_id)
        if body is None:
            raise no_response(response_id)
        if stream is not None and stream.lower() not in ("false", "0"):
            raise not_streamable()
        return body

    @app.get("/v1/responses/{response_id}/input_items", dependencies=dependencies)
    async def list_input_items(
        request: Request, response_id: str, limit: str | None = None, order: str | None = None, after: str | None = None
    ):
        """OpenAI's list of a stored response's input items; `include` is accepted and needs nothing
        (the listed items hold all they have), as any other query key is, but `before`, which
        OpenAI's list no longer has, is a 400 (input_items.py)."""
        items = await call(store.input_items, response_id)
        if items is None:
            raise no_response(response_id)
        return page(items, limit, order, after, request.query_params.get("before"))

    @app.delete("/v1/responses/{response_id}", dependencies=dependencies)
    async def delete_response(response_id: str):
        if not await call(store.delete, response_id):
            raise no_response(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @app.post("/v1/responses/compact", dependencies=dependencies, include_in_schema=False)
    async def compact_response():
        """Not served (a compaction item is OpenAI's encrypted summary): the app's 404 for a URL it
        does not serve, where the kept-response path's GET and DELETE made it a 405."""
        raise HTTPException(404)

    @app.post("/v1/responses/{response_id}/cancel", dependencies=dependencies)
    async def cancel_response(response_id: str):
        if await call(store.body, response_id) is None:
            raise no_response(response_id)
        raise not_cancellable()
