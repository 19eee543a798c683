"""A Ray replica's shared stores wait on an actor: the app calls them off its event loop.

Under Ray each replica's app keeps stored chat completions and Responses in the app's store actors
(ray_serve.SharedChatStore, SharedResponseStore), and each call waited on the actor with a blocking
`ray.get` (up to 15 s) from the async route or while the answer was built. One slow call stalled
every request of that replica's event loop, streams included. Here the shared stores' calls reach a
store in this process instead of an actor, and the one call under test waits until it is let go;
meanwhile another request on the same app (a stream) must be answered in full. Until today it was
answered only once the held call had given up (the gate's wait ran out: `released` False). That
holds for the reads of a Responses request's `previous_response_id` too: they ran on the replica's
one prep thread, where the stream waited to be prepared.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app
from specserve.server.chat_store import ChatCompletionStore
from specserve.server.ray_serve import SharedChatStore, SharedResponseStore
from specserve.server.responses_api import ResponseStore

MODEL = "tiny"
HELD_S = 20.0  # how long a held call waits to be let go (a stalled loop never lets it go before)
STREAM = {"model": MODEL, "messages": [{"role": "user", "content": "def f():"}], "max_tokens": 2, "stream": True}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 2, "store": True}
RESPONSE = {"model": MODEL, "input": "def add(a, b):", "max_output_tokens": 2}


class Gate:
    """Holds the first call of one store method until `go` is set (at most HELD_S)."""

    def __init__(self, method: str):
        self.method, self.entered, self.go = method, threading.Event(), threading.Event()
        self.released: bool | None = None  # whether the held call was let go (not timed out)

    def pass_through(self, method: str) -> None:
        if method == self.method and not self.entered.is_set():
            self.entered.set()
            self.released = self.go.wait(HELD_S)


def _held(shared_class: type, store_class: type):
    """`shared_class` (a replica's client of a store actor) over a store here, one call held at its gate."""

    class Held(shared_class):
        def __init__(self, gate: Gate):
            super().__init__()
            self.store, self.gate = store_class(), gate

        def _call(self, method, *args):
            self.gate.pass_through(method)
            return getattr(self.store, method)(*args)

    return Held


HeldChatStore = _held(SharedChatStore, ChatCompletionStore)
HeldResponseStore = _held(SharedResponseStore, ResponseStore)


@pytest.fixture(scope="module")
def llm():
    return LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")


def _answered_meanwhile(client: TestClient, gate: Gate, held_request):
    """Run `held_request` until its store call is held, stream another request, then let the call go:
    the stream's answer, and the held request's."""
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(held_request)
        assert gate.entered.wait(60), "the held request never reached its store call"
        stream = client.post("/v1/chat/completions", json=STREAM)
        gate.go.set()
        answer = held.result(60)
    assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n"), stream.text
    assert gate.released, "the stream was answered only after the held store call gave up"
    return answer


def _chat_cases(c: TestClient) -> dict:
    """The chat store's routes and stored answers, each a request that calls the store (by method)."""
    made = c.post("/v1/chat/completions", json=CHAT).json()["id"]
    return {
        "put": lambda: c.post("/v1/chat/completions", json=CHAT),
        "put (stream)": lambda: c.post("/v1/chat/completions", json={**CHAT, "stream": True}),
        "get": lambda: c.get(f"/v1/chat/completions/{made}"),
        "listing": lambda: c.get("/v1/chat/completions"),
        "update": lambda: c.post(f"/v1/chat/completions/{made}", json={"metadata": {"k": "v"}}),
        "messages": lambda: c.get(f"/v1/chat/completions/{made}/messages"),
        "delete": lambda: c.delete(f"/v1/chat/completions/{made}"),
    }


@pytest.mark.parametrize("case", ["put", "put (stream)", "get", "listing", "update", "messages", "delete"])
def test_a_held_chat_store_call_stalls_no_other_request(llm, case):
    gate = Gate("none yet")  # what _chat_cases stores first is not held
    with TestClient(create_app(llm, MODEL, chat_store=HeldChatStore(gate))) as c:
        cases = _chat_cases(c)
        gate.method = case.split()[0]
        answer = _answered_meanwhile(c, gate, cases[case])
    assert answer.status_code == 200, answer.text


def _responses_cases(c: TestClient) -> dict:
    made = c.post("/v1/responses", json=RESPONSE).json()["id"]
    return {
        "put": lambda: c.post("/v1/responses", json=RESPONSE),
        "put (stream)": lambda: c.post("/v1/responses", json={**RESPONSE, "stream": True}),
        "messages (previous_response_id)": lambda: c.post(
            "/v1/responses", json={**RESPONSE, "previous_response_id": made}
        ),
        "messages (input_tokens)": lambda: c.post("/v1/responses/input_tokens", json={"previous_response_id": made}),
        "body": lambda: c.get(f"/v1/responses/{made}"),
        "input_items": lambda: c.get(f"/v1/responses/{made}/input_items"),
        "delete": lambda: c.delete(f"/v1/responses/{made}"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "put",
        "put (stream)",
        "messages (previous_response_id)",
        "messages (input_tokens)",
        "body",
        "input_items",
        "delete",
    ],
)
def test_a_held_responses_store_call_stalls_no_other_request(llm, case):
    gate = Gate("none yet")  # what _responses_cases stores first is not held
    with TestClient(create_app(llm, MODEL, response_store=HeldResponseStore(gate))) as c:
        cases = _responses_cases(c)
        gate.method = case.split()[0]
        answer = _answered_meanwhile(c, gate, cases[case])
    assert answer.status_code == 200, answer.text


def test_the_in_memory_stores_are_called_in_place():
    """Only a store that waits on another process pays for a worker thread."""
    assert not ChatCompletionStore.blocking and not ResponseStore.blocking
    assert SharedChatStore.blocking and SharedResponseStore.blocking


def _chained(c: TestClient) -> dict:
    """A second turn by previous_response_id that sends the first's output item back by reference,
    what it lists as input, and what input_tokens counts for a third: ids left out (each app's own)."""
    greedy = {**RESPONSE, "temperature": 0}
    first = c.post("/v1/responses", json=greedy).json()
    refs = [{"type": "item_reference", "id": item["id"]} for item in first["output"]]
    turn = {**greedy, "previous_response_id": first["id"], "input": [*refs, {"role": "user", "content": "and?"}]}
    second = c.post("/v1/responses", json=turn).json()
    listed = c.get(f"/v1/responses/{second['id']}/input_items", params={"order": "asc"}).json()["data"]
    count = c.post("/v1/responses/input_tokens", json={"previous_response_id": second["id"], "input": "so?"}).json()
    unknown = c.post("/v1/responses", json={**RESPONSE, "previous_response_id": "resp_none"}).json()["error"]
    no_item = c.post("/v1/responses", json={**RESPONSE, "input": [{"type": "item_reference", "id": "msg_none"}]})
    return {
        "refs": len(refs),
        "usage": (second["usage"]["input_tokens"], second["usage"]["output_tokens"]),  # cached ones: the llm's own
        "listed": [{k: v for k, v in item.items() if k != "id"} for item in listed],
        "count": count,
        "errors": [(unknown["param"], unknown["code"]), (no_item.status_code, no_item.json()["error"]["param"])],
    }


def test_a_blocking_store_is_read_before_preparing_with_the_same_answers(llm):
    """Under Ray a Responses request's reads of the store (previous_response_id, item references)
    are made before it is prepared (responses_api.LookedUp); the answers are those of a store in memory."""
    with TestClient(create_app(llm, MODEL)) as c:
        in_memory = _chained(c)
    with TestClient(create_app(llm, MODEL, response_store=HeldResponseStore(Gate("none")))) as c:
        shared = _chained(c)
    assert in_memory["refs"] >= 1 and in_memory["count"]["input_tokens"] > in_memory["usage"][0]
    assert shared == in_memory
