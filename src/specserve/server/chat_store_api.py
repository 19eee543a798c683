"""OpenAI's stored chat completions: `store: true` keeps an answer, five routes read it back.

`StoringChatDialect` is chat's dialect with a `ChatCompletionStore` (chat_store.py): a request
with `store: true` keeps its finished answer (a stream's too, as the body its chunks add up to,
with the tool call ids it streamed) with its `metadata` and messages. `install_chat_store` adds

    GET    /v1/chat/completions                   the stored ones, oldest first (`after`, `limit`,
                                                  `order`, `model`, `metadata[key]=value` filters)
    GET    /v1/chat/completions/{id}              one
    POST   /v1/chat/completions/{id}              replace its `metadata` (nothing else changes)
    DELETE /v1/chat/completions/{id}              drop it
    GET    /v1/chat/completions/{id}/messages     its request's messages (`after`, `limit`, `order`)

An id that is not kept (never stored, dropped, or made by another process) is a 404.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from fastapi import FastAPI, Request

from ..engine.stats import RequestOutput
from .chat_store import ChatCompletionStore
from .errors import APIError, parse_body
from .pagination import list_object, page, query, unknown_after
from .protocol import Prepared, prepare_chat
from .responses import ChatDialect, ResponseContext
from .schemas import ChatCompletionUpdateRequest
from .store_calls import store_caller


@dataclass
class StoredChatContext(ResponseContext):
    """A chat answer's context, with what `store: true` keeps beside its body."""

    messages: list[dict] | None = None  # the request's messages as sent (None: not stored)
    metadata: dict = field(default_factory=dict)
    finished: dict = field(default_factory=dict)  # a stream's: choice index -> (output, streamed tool call ids)


def _streamed_call_ids(chunks: list[dict]) -> list[str]:
    """The ids of the tool calls a choice's finish chunks streamed, in order."""
    deltas = (c["choices"][0]["delta"] for c in chunks if c["choices"])
    return [call["id"] for d in deltas for call in d.get("tool_calls", ()) if "id" in call]


class StoringChatDialect(ChatDialect):
    """Chat completions that keep their answer when asked to (`store: true`)."""

    def __init__(self, store: ChatCompletionStore | None = None):
        self.store = store if store is not None else ChatCompletionStore()
        self.blocking = self.store.blocking  # response() and finish_chunks() put a stored answer there

    def prepare(self, req, llm) -> Prepared:
        prepared = prepare_chat(req, llm)
        if req.store:
            prepared.history = [m.model_dump(exclude_none=True) for m in req.messages]
            prepared.request_fields = {"metadata": req.metadata or {}}
        return prepared

    def context(self, model, namer, prepared: Prepared) -> StoredChatContext:
        base = super().context(model, namer, prepared)
        kept = {"messages": prepared.history, "metadata": prepared.request_fields.get("metadata") or {}}
        return StoredChatContext(**{f.name: getattr(base, f.name) for f in fields(base)}, **kept)

    def response(self, ctx: StoredChatContext, outputs) -> dict:
        body = super().response(ctx, outputs)
        if ctx.messages is not None:
            self.store.put(body, ctx.messages, ctx.metadata)
        return body

    def finish_chunks(self, ctx: StoredChatContext, output: RequestOutput, index: int = 0) -> list[dict]:
        """A choice's last chunks; once every choice has finished, a stored stream keeps its body."""
        chunks = super().finish_chunks(ctx, output, index)
        if ctx.messages is not None:
            ctx.finished[index] = (output, _streamed_call_ids(chunks))
            if len(ctx.finished) == ctx.n:
                self._keep_stream(ctx)
        return chunks

    def _keep_stream(self, ctx: StoredChatContext) -> None:
        """Keep the body a stream adds up to: the answer's body, with the ids its calls were streamed with."""
        done = [ctx.finished[i] for i in range(ctx.n)]
        body = ChatDialect.response(self, ctx, [output for output, _ in done])
        for choice, (_, ids) in zip(body["choices"], done):
            for call, call_id in zip(choice["message"].get("tool_calls", ()), ids):
                call["id"] = call_id
        self.store.put(body, ctx.messages, ctx.metadata)


def not_found(completion_id: str) -> APIError:
    return APIError(
        404,
        f"no stored chat completion with id {completion_id!r} (chat completions are kept in this server's "
        "memory, and only when created with store: true)",
        param="completion_id",
        code="not_found",
    )


def _metadata_filter(request: Request) -> dict[str, str]:
    """The list query's `metadata[key]=value` pairs."""
    pairs = request.query_params.multi_items()
    return {k[len("metadata[") : -1]: v for k, v in pairs if k.startswith("metadata[") and k.endswith("]")}


def install_chat_store(app: FastAPI, store: ChatCompletionStore, dependencies: list) -> None:
    """The stored chat completions' routes, behind the app's `dependencies` (its API key)."""

    call = store_caller(store)

    @app.get("/v1/chat/completions", dependencies=dependencies)
    async def list_chat_completions(
        request: Request,
        after: str | None = None,
        limit: str | None = None,
        order: str | None = None,
        model: str | None = None,
    ):
        count, order = query(limit, order, default_order="asc")
        rows = await call(store.listing, model, _metadata_filter(request), after, count + 1, order == "desc")
        if rows is None:
            raise unknown_after("stored chat completion with id {after} in this list", after)
        return list_object(rows, count)

    @app.get("/v1/chat/completions/{completion_id}", dependencies=dependencies)
    async def get_chat_completion(completion_id: str):
        body = await call(store.get, completion_id)
        if body is None:
            raise not_found(completion_id)
        return body

    @app.post("/v1/chat/completions/{completion_id}", dependencies=dependencies)
    async def update_chat_completion(completion_id: str, request: Request):
        update = parse_body(ChatCompletionUpdateRequest, await request.body())
        body = await call(store.update, completion_id, update.metadata)
        if body is None:
            raise not_found(completion_id)
        return body

    @app.delete("/v1/chat/completions/{completion_id}", dependencies=dependencies)
    async def delete_chat_completion(completion_id: str):
        if not await call(store.delete, completion_id):
            raise not_found(completion_id)
        return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True}

    @app.get("/v1/chat/completions/{completion_id}/messages", dependencies=dependencies)
    async def list_chat_completion_messages(
        completion_id: str, after: str | None = None, limit: str | None = None, order: str | None = None
    ):
        messages = await call(store.messages, completion_id)
        if messages is None:
            raise not_found(completion_id)
        missing = "message with id {after} in this completion"
        return page(messages, limit, order, after, default_order="asc", missing=missing)
