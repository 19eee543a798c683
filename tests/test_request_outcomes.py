"""Each request is counted once in specserve_requests_total, with the status its client saw.

The race at the deadline is driven step by step on the event loop, no sleeps: the worker's
deadline check, the client's disconnect and the engine's last item are injected in each order.
The rule: the first outcome settled on the event loop (answered, client gone, timed out) is the
answer and the count; a client already gone is a 499, whatever ended its request afterwards.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from fastapi.testclient import TestClient
from server_proc import metric_value
from tiny import tiny_model, tiny_tokenizer

import specserve.server.app as app_module
from specserve.engine.stats import RequestOutput, SpecStats
from specserve.llm import LLM
from specserve.server.app import Job, ServerOptions, create_app
from specserve.server.errors import APIError
from specserve.server.protocol import prepare_completion
from specserve.server.responses import COMPLETIONS
from specserve.server.schemas import CompletionRequest

API_KEY = "k"
BODY = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}


def tiny_llm() -> LLM:
    return LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")


def counts(server) -> dict[str, float]:
    """The request counts by status (every endpoint), leaving out statuses never counted."""
    text = server.metrics.render()[0].decode()
    seen = {s: metric_value(text, "specserve_requests_total", status=s) for s in ("200", "499", "500", "504")}
    return {s: n for s, n in seen.items() if n}


# -- every answer is counted --------------------------------------------------------------------
def test_auth_failures_and_bodies_over_the_cap_are_counted_with_their_status():
    """401s (raised by the API key check, before the route) and 413s (the body cap, before the
    app) never reached the code that counted requests: specserve_requests_total had no 401 or 413."""
    options = ServerOptions(api_key=API_KEY, max_body_bytes=4096)
    with TestClient(create_app(tiny_llm(), "tiny", options)) as client:
        server = client.app.state.server
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert client.post("/v1/completions", json=BODY).status_code == 401
        assert (
            client.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        )
        big = {**BODY, "prompt": "x" * 5000}
        assert client.post("/v1/completions", json=big, headers=auth).status_code == 413
        assert client.post("/v1/completions", json=BODY, headers=auth).status_code == 200
        assert client.post("/v1/completions", json={**BODY, "n": 0}, headers=auth).status_code == 400
        streamed = client.post("/v1/completions", json={**BODY, "stream": True}, headers=auth)
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
        assert client.post("/v1/nothing", json=BODY, headers=auth).status_code == 404
        assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200  # probes
        text = server.metrics.render()[0].decode()

        def count(endpoint: str, status: int) -> float:
            return metric_value(text, "specserve_requests_total", endpoint=endpoint, status=str(status))

        assert count("completions", 401) == 1 and count("chat", 401) == 1 and count("completions", 413) == 1
        assert count("completions", 200) == 2 and count("completions", 400) == 1 and count("other", 404) == 1
        assert metric_value(text, "specserve_requests_total") == 7  # each once, probes not at all


# -- the deadline race --------------------------------------------------------------------------
class Gone:
    """A request whose client has disconnected (what the disconnect watcher reads)."""

    async def receive(self) -> dict:
        return {"type": "http.disconnect"}


def _setup(llm, deadline: float):
    server = create_app(llm, "tiny").state.server
    prepared = prepare_completion(CompletionRequest(**BODY), llm)
    job = Job(prepared, asyncio.get_running_loop(), deadline)
    ctx = COMPLETIONS.context("tiny", server.namer, prepared)
    return server, job, ctx


def _output(job: Job, finish: str) -> RequestOutput:
    ids = job.prepared.prompt_ids
    return RequestOutput(
        ids, [] if finish == "abort" else [5, 6, 7], "" if finish == "abort" else "abc", finish, SpecStats(len(ids))
    )


async def _answer(server, job, ctx) -> int:
    watcher = asyncio.create_task(asyncio.sleep(3600))
    try:
        return (await server._complete(COMPLETIONS, ctx, job, watcher, time.monotonic())).status_code
    except APIError as e:
        return e.status


@pytest.mark.parametrize(
    "order,answered,counted",
    [
        # the worker sees the deadline, then the client hangs up before the aborted request's item is read
        (("deadline", "gone", "aborted"), 499, "499"),
        # the client hangs up, then the worker sees the deadline
        (("gone", "deadline", "aborted"), 499, "499"),
        # the deadline ends it and its 504 is answered; a hang-up after that changes nothing
        (("deadline", "aborted", "answer", "gone"), 504, "504"),
        # the last token landed as the deadline passed: the answer is complete, a 200
        (("deadline", "finished"), 200, "200"),
        # the worker never answers: the server's own deadline (+ grace) passes after the client left
        (("gone", "silence"), 499, "499"),
        (("silence",), 504, "504"),
    ],
)
def test_a_request_ending_at_its_deadline_is_answered_and_counted_once_as_its_client_saw_it(
    order, answered, counted, monkeypatch
):
    monkeypatch.setattr(app_module, "GRACE_S", 0.0)
    llm = tiny_llm()

    async def run() -> tuple[int, dict]:
        server, job, ctx = _setup(llm, time.monotonic() - 1.0)  # the deadline has passed
        status = None
        for step in order:
            if step == "deadline":
                assert job.should_stop()  # the worker's check before a step
            elif step == "gone":
                await server._watch_disconnect(Gone(), job)
            elif step in ("aborted", "finished"):
                job.items.put_nowait(("done", [_output(job, "abort" if step == "aborted" else "length")]))
            if step in ("answer", "silence") or step == order[-1]:
                status = status or await _answer(server, job, ctx)
        return status, counts(server)

    status, seen = asyncio.run(run())
    assert status == answered and seen == {counted: 1}


def test_a_stream_its_client_left_before_it_began_is_counted_once():
    """Starlette stops a stream whose client is gone without closing its generator: one that had
    not started was never counted (and its job stayed in the server's set)."""
    llm = tiny_llm()

    async def run() -> dict:
        server, job, ctx = _setup(llm, None)
        job.prepared.stream = True
        job.items.put_nowait(("event", (0, None)))  # the first step arrived: the response is made
        watcher = asyncio.create_task(asyncio.sleep(3600))
        job.items.put_nowait(("done", [_output(job, "length")]))
        response = await server._start_stream(COMPLETIONS, ctx, job, watcher, time.monotonic())

        async def send(message):
            raise OSError("the client is gone")

        async def receive():
            return {"type": "http.disconnect"}

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        with pytest.raises(Exception):  # noqa: B017 - Starlette's ClientDisconnect
            await response(scope, receive, send)
        await asyncio.sleep(0)
        assert job not in server.jobs
        return counts(server)

    assert asyncio.run(run()) == {"499": 1}


def test_a_client_gone_mid_upload_is_not_answered_and_is_counted_499():
    """The body cap used to hand the app the part of a body that arrived before the client hung up:
    it was parsed, refused as invalid JSON and counted a 400 that nobody read."""
    app = create_app(tiny_llm(), "tiny")
    messages = iter([{"type": "http.request", "body": b'{"model": "tiny", "pro', "more_body": True}])
    sent = []

    async def receive():
        return next(messages, {"type": "http.disconnect"})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    assert sent == [] and counts(app.state.server) == {"499": 1}


def test_a_stream_that_times_out_before_its_first_step_ends_with_the_timeout_event():
    """A streamed request that timed out while it waited in the queue is aborted before admission:
    reading its prompt's scores (never made) for the echo chunk raised, and the stream ended with
    an internal_error event counted 500 instead of the request_timeout event and a 504."""
    from specserve.engine.stats import StepEvent

    llm = tiny_llm()

    async def run() -> tuple[str, dict]:
        server, job, ctx = _setup(llm, time.monotonic() - 1.0)
        job.prepared.stream = True
        job.build(llm)  # the engine requests, never admitted
        assert job.should_stop()  # the worker sees the deadline and aborts the waiting request
        job.items.put_nowait(("event", (0, StepEvent([], [], "", None, "abort"))))
        job.items.put_nowait(("done", [_output(job, "abort")]))
        watcher = asyncio.create_task(asyncio.sleep(3600))
        response = await server._start_stream(COMPLETIONS, ctx, job, watcher, time.monotonic())
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            await asyncio.sleep(3600)

        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
        return b"".join(m.get("body", b"") for m in sent).decode(), counts(server)

    body, seen = asyncio.run(run())
    assert '"code":"request_timeout"' in body and body.endswith("data: [DONE]\n\n") and seen == {"504": 1}


# -- a handler cancelled by its host (Ray Serve) ------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_handler_is_cancelled_is_cancelled_in_the_engine(stream):
    """Ray Serve's proxy does not pass a client's disconnect on: it cancels the replica's handler
    task. The handler counted a 499 and returned while the engine ran the request to its end
    (its replica's /health said active 3 for 10 s after the client left), and a stream still
    waiting for its first step stayed in the server's jobs for good (its replica never drained)."""
    llm = tiny_llm()

    async def run() -> tuple[Job, set, dict]:
        server, job, ctx = _setup(llm, None)
        job.prepared.stream = stream
        server.jobs.add(job)  # what submit does
        watcher = asyncio.create_task(asyncio.sleep(3600))
        answer = server._start_stream if stream else server._complete
        handler = asyncio.create_task(answer(COMPLETIONS, ctx, job, watcher, time.monotonic()))
        await asyncio.sleep(0.05)  # waiting for the engine's first item
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        await asyncio.sleep(0.01)
        assert watcher.cancelled()
        return job, set(server.jobs), counts(server)

    job, jobs, seen = asyncio.run(run())
    assert job.should_stop() and job.reason == "client"  # the engine drops it at its next step
    assert jobs == set() and seen == {"499": 1}
