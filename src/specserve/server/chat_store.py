"""Stored chat completions: what `store: true` on `POST /v1/chat/completions` keeps.

A stored completion is its answer's body (a stream's as the body it adds up to) with the request's
`metadata`, and the request's messages as `GET /v1/chat/completions/{id}/messages` lists them
(each with an id, `<completion id>-<index>`). They live in this server's memory (lru_store.py:
least recently used first out beyond `max_bytes` of JSON, 64 MB by default; under Ray Serve, in
one actor the replicas share, ray_serve.SharedChatStore) and are gone after a restart;
completions sent without `store: true` are never kept, so never listed.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict

from .lru_store import LruStore, Packed, pack

REMEMBERED_CURSORS = 1 << 16  # dropped ids whose place a list cursor may still name (about 12 MB at most)


def stored_message(completion_id: str, index: int, message: dict) -> dict:
    """One request message (as sent, nulls left out) as OpenAI lists it: its text as `content`,
    its parts (when sent as parts) as `content_parts`, and whatever else it carried."""
    content = message.get("content")
    parts = content if isinstance(content, list) else None
    text = "".join(p.get("text") or "" for p in parts) if parts is not None else content
    rest = {k: v for k, v in message.items() if k not in ("role", "content", "name")}
    return {
        "id": f"{completion_id}-{index}",
        "role": message["role"],
        "content": text,
        "name": message.get("name"),
        "content_parts": parts,
        **rest,
    }


class ChatCompletionStore:
    """Stored chat completions by id, in the order they were made (`listing`), bounded in size."""

    blocking = False  # in memory: the app calls it from its event loop (store_calls.py)

    def __init__(self, max_bytes: int = 64 << 20):
        self._kept = LruStore(max_bytes, on_drop=self._dropped)
        self._made = itertools.count()  # creation order, for listing
        self._places: OrderedDict[str, int] = OrderedDict()  # dropped ids' creation order, newest last

    @property
    def max_bytes(self) -> int:
        return self._kept.max_size

    def put(self, body: dict, messages: list[dict], metadata: dict | None) -> None:
        """Keep a finished completion (its body, the request's messages as sent, its metadata)."""
        listed = [stored_message(body["id"], i, m) for i, m in enumerate(messages)]
        body = {**body, "metadata": metadata or {}}
        packed, size = pack((body, listed), body.get("model"), body["metadata"])  # before the lock
        with self._kept.lock:  # numbered as it is kept: a list walk cannot pass it while it is not there yet
            self._keep(next(self._made), body, packed, size)

    def _keep(self, made: int, body: dict, packed: Packed, size: int) -> None:
        """Keep an entry of `size` bytes (lru_store.pack's count), the lock held: what a list query
        filters on as it is, the body and messages packed."""
        kept = (made, body.get("model"), body["metadata"], packed)
        self._kept.put(body["id"], kept, size)
        self._places.pop(body["id"], None)  # kept (an update replaces it): not a dropped one to remember

    def get(self, completion_id: str) -> dict | None:
        kept = self._kept.get(completion_id)
        return None if kept is None else kept[3].unpack()[0]

    def messages(self, completion_id: str) -> list[dict] | None:
        kept = self._kept.get(completion_id)
        return None if kept is None else kept[3].unpack()[1]

    def update(self, completion_id: str, metadata: dict | None) -> dict | None:
        """Replace a kept completion's metadata (the one thing OpenAI lets change); its new body.
        Sized without the lock, and kept only if the completion did not change meanwhile (else
        read again): a delete in between stays a delete."""
        while True:
            kept = self._kept.get(completion_id)
            if kept is None:
                return None
            made, body, listed = kept[0], *kept[3].unpack()
            body = {**body, "metadata": metadata or {}}
            packed, size = pack((body, listed), body.get("model"), body["metadata"])
            with self._kept.lock:
                if self._kept.peek(completion_id) is kept:  # else updated or dropped since it was read
                    self._keep(made, body, packed, size)
                    return body

    def delete(self, completion_id: str) -> bool:
        return self._kept.pop(completion_id)

    def _dropped(self, completion_id: str, kept: tuple) -> None:
        """Remember where a dropped (deleted, evicted or replaced) completion was made, so a list
        cursor naming it still finds its place; the oldest memories go beyond a bound."""
        self._places[completion_id] = kept[0]
        self._places.move_to_end(completion_id)
        while len(self._places) > REMEMBERED_CURSORS:
            self._places.popitem(last=False)

    def place(self, completion_id: str) -> int | None:
        """Where a completion stands in the list (its creation order), kept or dropped since: a
        page after it starts there even when another client deleted it or changed its metadata
        in between. None: never made here, or dropped too long ago."""
        with self._kept.lock:
            kept = self._kept.peek(completion_id)
            return kept[0] if kept is not None else self._places.get(completion_id)

    def listing(
        self,
        model: str | None = None,
        metadata: dict | None = None,
        after: str | None = None,
        count: int = 20,
        desc: bool = False,
    ) -> list[dict] | None:
        """The first `count` kept completions of a list query: oldest first (newest first when `desc`),
        of `model` (any when None), whose metadata holds every pair of `metadata`, listed after the
        completion `after` names (kept or dropped since: its `place`). None: `after` names none known
        here. A page asks for its `limit` + 1, so under Ray only those cross from the store's actor to
        the replica (it used to move every match, and the replica paged them)."""
        want = (metadata or {}).items()
        with self._kept.lock:
            start = None if after is None else self.place(after)
            if after is not None and start is None:
                return None
            kept = self._kept.values()
        matches = (
            (made, packed)
            for made, kept_model, kept_metadata, packed in kept
            if (model is None or kept_model == model)
            and want <= kept_metadata.items()
            and (start is None or (made < start if desc else made > start))
        )
        first = heapq.nlargest if desc else heapq.nsmallest
        return [packed.unpack()[0] for _, packed in first(count, matches, key=lambda m: m[0])]
