"""The Ray replicas' store client (ray_serve._HubClient) repeats only what is safe to repeat.

It called a store actor again whenever a call failed, a timed-out one included, though a call
that timed out may have run: a DELETE that had succeeded answered 404 on its second run, and a
stored chat completion put twice took a second place in the list. Here Ray and the client's
handle are fakes (no cluster): each call runs on a store in this process, and the wait can be made
to fail after the call ran (its answer lost, or the actor dead), or the call can fail before it is sent."""

from __future__ import annotations

import sys
import types

import pytest

from specserve.server.chat_store import ChatCompletionStore
from specserve.server.ray_serve import SharedChatStore


class LostAnswer(Exception):
    """The answer did not come back in time (as Ray's GetTimeoutError): the call ran all the same."""


class _Method:
    def __init__(self, hub: FakeHub, name: str):
        self.hub, self.name = hub, name

    def remote(self, *args):
        if self.hub.refuse_sends:
            self.hub.refuse_sends -= 1
            raise ConnectionError("the handle is stale: nothing was sent")
        self.hub.runs.append(self.name)
        return getattr(self.hub.store, self.name)(*args)  # the "reference" is the answer itself


class FakeHub:
    """An actor handle whose methods run on one ChatCompletionStore, counting the runs."""

    def __init__(self, store: ChatCompletionStore):
        self.store, self.runs, self.refuse_sends = store, [], 0

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


class ActorDiedError(Exception):
    """As Ray's: the actor is gone, and what it held with it."""


class FakeRay(types.ModuleType):
    """`ray` as the client uses it: get() hands the answer back, or raises `failures` first."""

    def __init__(self):
        super().__init__("ray")
        self.failures: list[Exception] = []
        self.exceptions = types.ModuleType("ray.exceptions")
        self.exceptions.ActorDiedError = ActorDiedError

    def get(self, ref, timeout=None):
        if self.failures:
            raise self.failures.pop(0)
        return ref


@pytest.fixture(autouse=True)
def ray(monkeypatch):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.exceptions", fake.exceptions)
    return fake


class FakeClient(SharedChatStore):
    """SharedChatStore over FakeHub, counting the times it looked the hub up."""

    def __init__(self):
        super().__init__()
        self.store, self.found = ChatCompletionStore(), 0
        self.hub = FakeHub(self.store)

    def _find(self):
        self.found += 1
        return self.hub


BODY = {"id": "chatcmpl-1", "model": "m", "created": 1}


def test_a_delete_whose_answer_was_lost_is_not_run_again(ray):
    client = FakeClient()
    client.put(BODY, [{"role": "user", "content": "hi"}], None)
    ray.failures = [LostAnswer()]
    with pytest.raises(LostAnswer):  # the route answers its error: not a 404 for a completion it deleted
        client.delete("chatcmpl-1")
    assert client.hub.runs == ["put", "delete"]
    assert client.store.get("chatcmpl-1") is None


def test_a_put_whose_answer_was_lost_is_not_run_again(ray):
    client = FakeClient()
    client.put(BODY, [], None)
    ray.failures = [LostAnswer()]
    with pytest.raises(LostAnswer):
        client.put({**BODY, "id": "chatcmpl-2"}, [], None)
    assert client.hub.runs == ["put", "put"]
    assert [b["id"] for b in client.store.listing()] == ["chatcmpl-1", "chatcmpl-2"]


def test_a_write_that_was_never_sent_is_sent_once_more_to_a_hub_found_again():
    client = FakeClient()
    client.hub.refuse_sends = 1
    client.put(BODY, [], None)
    assert client.hub.runs == ["put"] and client.found == 2
    assert [b["id"] for b in client.store.listing()] == ["chatcmpl-1"]


@pytest.mark.parametrize("method,args", [("get", ("chatcmpl-1",)), ("listing", ()), ("messages", ("chatcmpl-1",))])
def test_a_read_whose_answer_was_lost_is_asked_again(ray, method, args):
    client = FakeClient()
    client.put(BODY, [{"role": "user", "content": "hi"}], None)
    ray.failures = [LostAnswer()]
    assert getattr(client, method)(*args)
    assert client.hub.runs == ["put", method, method] and client.found == 2


def test_a_write_to_an_actor_that_died_is_run_on_the_one_found_again(ray):
    """A dead actor's store went with it: the write runs again on the new one (it was lost, not doubled)."""
    client = FakeClient()
    ray.failures = [ActorDiedError()]
    client.put(BODY, [], None)
    assert client.hub.runs == ["put", "put"] and client.found == 2


def test_a_second_failure_is_raised(ray):
    client = FakeClient()
    ray.failures = [LostAnswer(), LostAnswer()]
    with pytest.raises(LostAnswer):
        client.listing()
