"""The stores (stored chat completions, Responses) under calls from many threads at once.

Under Ray Serve each store lives in one actor that answers every replica's calls; as a threaded
actor it runs them at once. Here another call lands in the middle of one at a chosen moment,
and many threads store and delete at once; nothing is lost and a list walk misses nothing.
"""

from __future__ import annotations

import itertools
import threading

from specserve.server.chat_store import ChatCompletionStore

ASK = [{"role": "user", "content": "hi"}]


def chat_body(completion_id: str) -> dict:
    return {"id": completion_id, "object": "chat.completion", "model": "tiny", "choices": []}


class _Midway:
    """A store's creation counter that, the first time it counts, runs `midway` on another thread
    (given half a second to finish: it waits while the counting call holds the store's lock)."""

    def __init__(self, midway):
        self.count, self.midway, self.thread = itertools.count(), midway, None

    def __iter__(self):
        return self

    def __next__(self) -> int:
        made = next(self.count)
        if self.thread is None:
            self.thread = threading.Thread(target=self.midway)
            self.thread.start()
            self.thread.join(0.5)
        return made


def test_a_list_walk_misses_no_completion_stored_at_the_same_time():
    """A stored completion took its place in the list (its creation number) before it was kept, and
    unlocked: a second one stored meanwhile was kept first with a later place, a client listing
    then saw only the second, and its next page (`after` the second) never showed the first."""
    store = ChatCompletionStore()
    seen: list[str] = []

    def other_client():
        store.put(chat_body("chatcmpl-b"), ASK, None)
        seen.extend(b["id"] for b in store.listing())

    store._made = _Midway(other_client)
    store.put(chat_body("chatcmpl-a"), ASK, None)
    store._made.thread.join()
    seen.extend(b["id"] for b in store.listing(after=seen[-1]))
    assert sorted(seen) == ["chatcmpl-a", "chatcmpl-b"]
