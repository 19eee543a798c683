"""Store calls made from the event loop: where they run.

A store in this process's memory (chat_store.ChatCompletionStore, responses_api.ResponseStore)
answers at once, so it is called in place. A store that waits on another process (the Ray
replicas' shared stores, ray_serve._HubClient: up to a 15 s wait on the store actor) says so with
`blocking = True`, and its calls run on a worker thread: called in place, one slow call stalled
every request of the replica's event loop, streams included. (What preparing a Responses request
reads from its store is read the same way before the prep thread prepares it: responses_api.LookedUp.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def off_loop(blocking: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`: on a worker thread when `blocking` (it may wait on another process), else here."""
    if blocking:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


def store_caller(store) -> Callable[..., Awaitable[Any]]:
    """`call(method, *args)` for the routes over `store` (a stored response's, a stored chat
    completion's): `method(*args)` where the store's calls run, in place or on a worker thread
    when the store waits on another process (`store.blocking`: the Ray replicas' store actor)."""

    async def call(method: Callable[..., Any], *args: Any) -> Any:
        return await off_loop(store.blocking, method, *args)

    return call
