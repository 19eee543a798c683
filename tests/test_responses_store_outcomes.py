"""What the Responses store keeps of a response that did not complete, as OpenAI keeps it.

A stream whose response fails after `response.created` (an engine fault here) ends with
`response.failed`, and with `store` on that response is kept as its last event showed it: status
`failed`, its `error` and the text streamed so far, so that the id the client saw is found by
`GET /v1/responses/{id}` (it was a 404) and can be continued. With `store: false` nothing is kept.

A stream its client hung up on is stopped (the engine drops it) and not kept, as at OpenAI, where
closing a stream that is not `background` ends its generation and a later GET of its id is a 404
(community.openai.com/t/responses-api-reconnect-to-a-streaming-response/1362217); only a
`background` response survives its client, and this server refuses those.
In-process on a tiny model whose target backend can be made to fail (server/faults.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from fastapi.testclient import TestClient
from openai.types.responses import Response
from server_proc import metric_value
from starlette.requests import ClientDisconnect
from tiny import tiny_model, tiny_tokenizer

from specserve.backends.transformers import TransformersBackend
from specserve.llm import LLM
from specserve.server.app import create_app
from specserve.server.faults import FaultyBackend
from specserve.server.responses_api import ResponseStore

MODEL = "tiny"
# 32 tokens, greedy: the fault armed after 4 passes comes with text already streamed
STREAM = {"model": MODEL, "input": "def add(a, b):", "max_output_tokens": 32, "temperature": 0, "stream": True}


class RemoteStore(ResponseStore):
    """A store that says it waits on another process (as the Ray replicas' shared one does), and
    records whether each put ran on the event loop; `broken`: every put fails (its actor gone)."""

    blocking = True

    def __init__(self, broken: bool = False):
        super().__init__()
        self.broken, self.puts_on_loop = broken, []

    def put(self, *args) -> None:
        try:
            asyncio.get_running_loop()
            self.puts_on_loop.append(True)
        except RuntimeError:  # no loop runs on this thread: a worker thread
            self.puts_on_loop.append(False)
        if self.broken:
            raise ConnectionError("the store's actor is gone")
        super().put(*args)


@contextlib.contextmanager
def serving(store: ResponseStore | None = None):
    """The app's client and the backend whose passes can be told to fail."""
    backend = FaultyBackend(TransformersBackend(tiny_model("qwen2", 0), max_sequences=3))
    llm = LLM.from_backends(backend, tiny_tokenizer(), name=MODEL, speculation="none")
    with TestClient(create_app(llm, MODEL, response_store=store)) as client:
        yield client, backend


@pytest.fixture(scope="module")
def served():
    with serving() as both:
        yield both


def failed_stream(client: TestClient, backend: FaultyBackend, **fields) -> list[dict]:
    """A Responses stream whose 4th target pass fails (after its first text): its events."""
    backend.arm("step", after=4)
    with client.stream("POST", "/v1/responses", json={**STREAM, **fields}) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert events[-1]["type"] == "response.failed" and "response.output_text.delta" in {e["type"] for e in events}
    return events


def test_a_stream_that_failed_is_kept_as_failed(served):
    """It was not kept: the id of `response.created` was a 404 on GET, and a 400 as previous_response_id."""
    client, backend = served
    events = failed_stream(client, backend)
    failed = events[-1]["response"]
    r = client.get(f"/v1/responses/{failed['id']}")
    assert r.status_code == 200, r.text
    kept = Response.model_validate(r.json())
    assert r.json() == failed
    assert kept.status == "failed" and kept.error.code == "server_error" and "injected" in kept.error.message
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert streamed and kept.output_text == streamed and kept.output[0].status == "incomplete"


def test_a_failed_stream_sent_with_store_false_is_not_kept(served):
    client, backend = served
    failed = failed_stream(client, backend, store=False)[-1]["response"]
    assert failed["store"] is False
    r = client.get(f"/v1/responses/{failed['id']}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"


def test_a_finished_stream_sent_with_store_false_is_not_kept(served):
    """Nor can it be continued: previous_response_id on it is the 400 of an unknown id."""
    client, _ = served
    with client.stream("POST", "/v1/responses", json={**STREAM, "max_output_tokens": 4, "store": False}) as r:
        lines = list(r.iter_lines())
    done = json.loads(next(line for line in reversed(lines) if line.startswith("data: "))[len("data: ") :])
    assert done["type"] in ("response.completed", "response.incomplete") and done["response"]["store"] is False
    assert client.get(f"/v1/responses/{done['response']['id']}").status_code == 404
    more = {"model": MODEL, "input": "go on", "previous_response_id": done["response"]["id"]}
    r = client.post("/v1/responses", json=more)
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"


def test_a_failed_response_is_continued_with_what_it_had_written(served):
    """previous_response_id names it: the conversation goes on from the text it had streamed,
    and its input items list that text as its answer."""
    client, backend = served
    failed = failed_stream(client, backend)[-1]["response"]
    more = {"model": MODEL, "input": "go on", "max_output_tokens": 2, "previous_response_id": failed["id"]}
    r = client.post("/v1/responses", json=more)
    assert r.status_code == 200, r.text
    items = client.get(f"/v1/responses/{r.json()['id']}/input_items", params={"order": "asc"}).json()["data"]
    texts = [part["text"] for item in items for part in item["content"]]
    assert texts == [STREAM["input"], failed["output"][0]["content"][0]["text"], "go on"]


def test_a_failed_response_is_kept_off_the_event_loop_when_the_store_waits():
    """A store that waits on another process (Ray) is called on a worker thread, as for a finished answer."""
    store = RemoteStore()
    with serving(store) as (client, backend):
        failed = failed_stream(client, backend)[-1]["response"]
        assert store.body(failed["id"]) == failed and store.puts_on_loop == [False]


def test_a_store_that_fails_too_still_lets_the_stream_end_with_response_failed():
    store = RemoteStore(broken=True)
    with serving(store) as (client, backend):
        failed = failed_stream(client, backend)[-1]["response"]
        assert failed["status"] == "failed" and "injected" in failed["error"]["message"]
        assert store.puts_on_loop == [False]


async def _asgi(app, method: str, path: str, body: dict | None, hang_up: asyncio.Event | None = None) -> list[dict]:
    """One request through the app's ASGI interface: what it sent. `hang_up`: the client leaves
    once that is set (and nothing it is sent from then on reaches it)."""
    sent, request = [], [{"type": "http.request", "body": json.dumps(body).encode() if body else b""}]

    async def receive() -> dict:
        if request:
            return request.pop()
        await (hang_up.wait() if hang_up else asyncio.Event().wait())
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if hang_up is not None and hang_up.is_set():
            raise OSError("the client is gone")
        sent.append(message)
        if hang_up is not None and b"response.output_text.delta" in message.get("body", b""):
            hang_up.set()  # it read the first text, then hung up

    headers = [(b"content-type", b"application/json")]
    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": method, "path": path}
    with contextlib.suppress(OSError, ClientDisconnect):  # what Starlette raises when a send fails
        await app({**scope, "headers": headers, "query_string": b""}, receive, send)
    return sent


def test_a_stream_its_client_hung_up_on_is_not_kept():
    backend = FaultyBackend(TransformersBackend(tiny_model("qwen2", 0), max_sequences=3))
    app = create_app(LLM.from_backends(backend, tiny_tokenizer(), name=MODEL, speculation="none"), MODEL)

    async def run() -> tuple[str, int]:
        app.state.server.start()  # what the app's lifespan does
        try:
            body = {**STREAM, "max_output_tokens": 400, "ignore_eos": True}
            sent = await _asgi(app, "POST", "/v1/responses", body, asyncio.Event())
            created = json.loads(sent[1]["body"].split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]
            got = await _asgi(app, "GET", f"/v1/responses/{created['id']}", None)
            return created["status"], got[0]["status"]
        finally:
            app.state.server.stop()

    assert asyncio.run(run()) == ("in_progress", 404)
    text = app.state.server.metrics.render()[0].decode()
    assert metric_value(text, "specserve_requests_total", endpoint="responses", status="499") == 1  # it hung up


def test_a_failed_stream_keeps_the_logprobs_it_streamed(served):
    """With `include` asking for output_text logprobs, the deltas carried them, but the failed
    response (its `response.failed` event, and so what GET returns) listed none for its text."""
    client, backend = served
    events = failed_stream(client, backend, include=["message.output_text.logprobs"])
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    part = events[-1]["response"]["output"][0]["content"][0]
    assert streamed and part["logprobs"] == streamed
    assert client.get(f"/v1/responses/{events[-1]['response']['id']}").json()["output"][0]["content"][0] == part
