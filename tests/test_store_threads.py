"""The stores (stored chat completions, Responses) under calls from many threads at once.

Under Ray Serve each store lives in one actor that answers every replica's calls; as a threaded
actor it runs them at once. Here another call lands in the middle of one at a chosen moment,
and many threads store and delete at once; nothing is lost and a list walk misses nothing.
"""

from __future__ import annotations

import itertools
import threading

from specserve.server import chat_store, responses_api
from specserve.server.chat_store import ChatCompletionStore
from specserve.server.responses_api import ResponseStore

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


def _sizing_checked(monkeypatch, module, store) -> list[bool]:
    """Patch `module.pack` to record, each time it packs and sizes an entry, whether another thread
    could take `store`'s lock at that moment (a non-blocking try: True when it is free)."""
    free, size = [], module.pack

    def try_lock():
        got = store._kept.lock.acquire(blocking=False)
        if got:
            store._kept.lock.release()
        free.append(got)

    def checked(*objects):
        other = threading.Thread(target=try_lock)
        other.start()
        other.join()
        return size(*objects)

    monkeypatch.setattr(module, "pack", checked)
    return free


def test_an_entry_is_sized_without_the_store_s_lock(monkeypatch):
    """Sizing an entry (its JSON encoded, to bound the store; now its pickle) ran with the store's lock
    held: a big response or completion being stored held up every other call on its store meanwhile."""
    chats = ChatCompletionStore()
    chats_free = _sizing_checked(monkeypatch, chat_store, chats)
    chats.put(chat_body("chatcmpl-a"), ASK, None)
    chats.update("chatcmpl-a", {"k": "v"})
    responses = ResponseStore()
    responses_free = _sizing_checked(monkeypatch, responses_api, responses)
    responses.put("resp_a", ASK, {"id": "resp_a", "output": []})
    assert chats_free == [True, True] and responses_free == [True]
    assert chats.get("chatcmpl-a")["metadata"] == {"k": "v"} and responses.body("resp_a")["id"] == "resp_a"


def test_an_update_while_another_client_deletes_or_updates_keeps_the_store_s_order(monkeypatch):
    """update sizes the new body without the lock, so another call may land meanwhile: a delete
    stays a delete (the update answers None, not a completion brought back), and an update that
    landed first is replaced by this one, as if the two had run one after the other."""
    store = ChatCompletionStore()
    store.put(chat_body("chatcmpl-a"), ASK, None)
    store.put(chat_body("chatcmpl-b"), ASK, None)
    midway = {"chatcmpl-a": lambda: store.delete("chatcmpl-a"), "chatcmpl-b": lambda: store.update("chatcmpl-b", {})}
    size = chat_store.pack

    def other_call_first(value, *as_is):
        other = midway.pop(value[0]["id"], None)
        if other is not None:
            other()
        return size(value, *as_is)

    monkeypatch.setattr(chat_store, "pack", other_call_first)
    assert store.update("chatcmpl-a", {"k": "v"}) is None
    assert store.get("chatcmpl-a") is None
    assert store.update("chatcmpl-b", {"k": "v"})["metadata"] == {"k": "v"}
    assert store.get("chatcmpl-b")["metadata"] == {"k": "v"}
    assert [b["id"] for b in store.listing()] == ["chatcmpl-b"]


def test_many_threads_storing_and_deleting_at_once_lose_nothing():
    """8 threads each store 100 completions and 100 responses and delete every other one, at once:
    the stores then hold exactly the other halves (by count, by listing and by id), and their
    sizes add up to what they hold."""
    chats, responses = ChatCompletionStore(), ResponseStore()

    def work(k: int):
        for i in range(100):
            chats.put(chat_body(f"chatcmpl-{k}-{i}"), ASK, {"k": str(k)})
            responses.put(f"resp_{k}_{i}", ASK, {"id": f"resp_{k}_{i}", "output": [{"id": f"msg_{k}_{i}"}]})
            if i % 2:
                assert chats.delete(f"chatcmpl-{k}-{i}") and responses.delete(f"resp_{k}_{i}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = {f"{k}-{i}" for k in range(8) for i in range(0, 100, 2)}
    assert {b["id"].removeprefix("chatcmpl-") for b in chats.listing(count=10_000)} == kept
    assert all(responses.item(f"msg_{key.replace('-', '_')}") is not None for key in kept)
    assert len(chats._kept._entries) == len(responses._kept._entries) == len(kept) == 400
    for store in (chats, responses):
        assert store._kept.size == sum(size for _, size in store._kept._entries.values())
