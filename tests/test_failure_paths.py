"""The server's bad days: faults in a step, a dead worker, cancellation in the queue, a failing
admit, streams that fail mid-way, gauges after the engine empties, and the speculation shorthand.

Engine internals are driven in-process on a tiny random model (transformers); the HTTP answers
come from a real `specserve serve` process started with SPECSERVE_FAULT_INJECT=1, whose faults
are armed through POST /debug/fault (server/faults.py).
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_proc import ServerProcess, metric_value
from tiny import save_tiny, tiny_model, tiny_tokenizer

import specserve.engine.request as request_module
from specserve import SamplingParams, SpeculationConfig
from specserve.backends.transformers import TransformersBackend
from specserve.config import EngineLimits
from specserve.engine.client import EngineDead, EngineWorker, QueueFull
from specserve.engine.core import EngineFault
from specserve.errors import InvalidRequestError
from specserve.llm import LLM
from specserve.server import faults
from specserve.server.app import DRAIN_GRACE_S, request_error
from specserve.server.launch import free_port

MODEL = "tiny"
PLAIN = SpeculationConfig(method="none")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 24, "temperature": 0}
WAIT_S = 30.0  # how long a test waits for an answer that must come at once (a hang fails, never blocks)


# -- in-process: the engine core and its worker ----------------------------------------------------
class Counting(faults.FaultyBackend):
    """A faulty backend that also says how many sequences are allocated."""

    @property
    def live(self) -> int:
        return len(self._inner._caches)


def engine_llm(max_num_seqs: int = 2) -> tuple[LLM, Counting]:
    backend = Counting(TransformersBackend(tiny_model("qwen2", 0), max_sequences=max_num_seqs + 1))
    limits = EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=512, min_prefill_chunk=16)
    return LLM.from_backends(backend, tiny_tokenizer(), name=MODEL, speculation="none", limits=limits), backend


def make(llm: LLM, max_tokens: int = 16, cancel: threading.Event | None = None, on_event=None):
    ids = tiny_tokenizer().encode("def add(a, b):")
    return llm.engine.request(
        ids,
        SamplingParams(max_tokens=max_tokens, temperature=0),
        PLAIN,
        should_cancel=cancel.is_set if cancel else None,
        on_event=on_event,
    )


def test_a_fault_in_a_step_is_an_engine_fault_and_only_that_step_fails():
    """A backend raising a ValueError mid-generation: the requests of that pass fail with an
    EngineFault (a 500, not the 400 that validation errors get); the next request runs."""
    llm, backend = engine_llm()
    core = llm.engine.core
    a, b = make(llm), make(llm)
    core.add(a)
    core.add(b)
    core.step()  # both admitted and prefilled
    backend.arm("step")
    core.step()
    for r in (a, b):
        assert r.finished and isinstance(r.error, EngineFault)
        assert isinstance(r.error.__cause__, faults.InjectedFault)
        assert request_error(r.error).status == 500 and request_error(r.error).type == "server_error"
    assert backend.live == 0 and core.num_running == 0 and core.cache_used == 0
    (out,) = llm.engine.run([make(llm, max_tokens=8)])
    assert len(out.token_ids) == 8


def test_a_leak_made_on_purpose_keeps_a_mib_a_pass_and_answers_as_before():
    """The soak's memory check is seen to fail against this (scripts/soak.py --inject-leak-mb):
    armed for N passes, each of them runs as usual and keeps 1 MiB, resident, for good."""
    llm, backend = engine_llm()
    plain = llm.generate(make(llm).prompt_ids, SamplingParams(max_tokens=6, temperature=0))
    backend.arm("leak", 3)
    out = llm.generate(make(llm).prompt_ids, SamplingParams(max_tokens=6, temperature=0))
    assert out.token_ids == plain.token_ids  # the passes ran
    assert [len(b) for b in backend._leaked] == [faults.LEAK_BYTES] * 3 and backend._leaking == 0
    assert all(b[0] == 1 and b[-1] == 1 for b in backend._leaked)  # written, not lazily zero pages


def test_a_validation_error_is_still_a_400():
    assert request_error(ValueError("bad value")).status == 400


def test_the_sequence_of_a_failing_admit_is_freed(monkeypatch):
    """Request.admit fails after the request got its cache sequence: the sequence goes back."""
    llm, backend = engine_llm()

    def broken(*args, **kwargs):
        raise RuntimeError("output builder broke")

    monkeypatch.setattr(request_module, "OutputBuilder", broken)
    r = make(llm)
    llm.engine.core.add(r)
    llm.engine.core.step()
    assert r.finished and isinstance(r.error, EngineFault)
    assert backend.live == 0
    monkeypatch.undo()
    outs = llm.engine.run([make(llm, max_tokens=4) for _ in range(2)])  # every sequence is usable again
    assert [len(o.token_ids) for o in outs] == [4, 4]


def test_a_cancelled_request_leaves_the_queue_from_anywhere_and_frees_its_place():
    """One running, two waiting (the queue is full): the second waiting one is cancelled. It no
    longer counts toward max_queue (a new request is accepted, not a 429), and the next step drops
    it although it is not at the head of the queue."""
    llm, _ = engine_llm(max_num_seqs=1)
    worker = EngineWorker(llm.engine.core, max_queue=2)  # not started: the test steps the core itself
    core = llm.engine.core
    running = make(llm, max_tokens=64)
    worker.submit([running])
    core.step()
    assert core.num_running == 1
    gone = threading.Event()
    head, middle = make(llm), make(llm, cancel=gone)
    worker.submit([head, middle])
    with pytest.raises(QueueFull):
        worker.submit([make(llm)])
    gone.set()
    assert core.num_waiting == 1
    late = make(llm)
    worker.submit([late])  # the cancelled request left a place
    core.step()
    assert middle.finished and middle.output.finish_reason == "abort"
    assert not head.finished and not late.finished and core.num_waiting == 2


def test_prediction_token_ids_out_of_range_are_refused_before_queueing():
    """A bad id used to fail in the backend, and with it every request of that pass."""
    llm, _ = engine_llm()
    ids = tiny_tokenizer().encode("def add(a, b):")
    for bad in ([llm.vocab_size, 5], [-1], [10**7]):
        with pytest.raises(InvalidRequestError, match="prediction token ids"):
            llm.engine.request(ids, SamplingParams(max_tokens=4), SpeculationConfig(method="prediction"), bad)
    good = llm.engine.request(ids, SamplingParams(max_tokens=4), SpeculationConfig(method="prediction"), [5, 6])
    assert llm.engine.run([good])[0].finish_reason == "length"


def test_a_draft_model_with_fewer_sequence_ids_bounds_the_prefix_cache():
    """Each cached entry keeps a draft sequence beside the target's: a draft backend with 4 ids
    under a target with 12 used to run out of ids after a few finished requests."""
    target = TransformersBackend(tiny_model("qwen2", 0), max_sequences=12)
    draft = TransformersBackend(tiny_model("qwen2", 1), max_sequences=4)
    limits = EngineLimits(max_num_seqs=2, max_num_batched_tokens=512, min_prefill_chunk=16)
    llm = LLM.from_backends(target, tiny_tokenizer(), draft, name=MODEL, speculation="draft", limits=limits)
    for i in range(10):  # unrelated prompts: each finished one becomes an entry
        out = llm.generate(f"def f{i}(x{i}):\n    return x{i} * {i}", SamplingParams(max_tokens=6, temperature=0))
        assert out.finish_reason == "length"


def test_a_job_larger_than_queue_and_batch_runs_when_nothing_waits():
    """max_queue 2 + max_num_seqs 1 = 3 places: a 5-choice job (a batch of prompts, n > 1) would
    be refused for ever; it is taken when the queue is empty, and refused while others wait."""
    llm, _ = engine_llm(max_num_seqs=1)
    worker = EngineWorker(llm.engine.core, max_queue=2)
    core = llm.engine.core
    big = [make(llm, max_tokens=2) for _ in range(5)]
    worker.submit(big)
    with pytest.raises(QueueFull):
        worker.submit([make(llm) for _ in range(5)])  # the first still waits
    for _ in range(100):
        if all(r.finished for r in big):
            break
        core.step()
    assert all(r.finished and r.output.finish_reason == "length" for r in big)


def test_while_nothing_waits_a_job_larger_than_the_queue_is_taken_whatever_its_size():
    """max_queue 2, max_num_seqs 2, the batch full and nothing waiting: a 4-choice job was a 429
    ("the server is busy (0 requests waiting)") while a 5-choice one, larger than queue and batch
    together, was taken. Found by the soak's burst with n=5 and n=8 on a full batch. Every job
    larger than the queue is now taken while nothing waits; one that fits the queue still waits in it."""
    llm, _ = engine_llm(max_num_seqs=2)
    core = llm.engine.core
    for size in (3, 4, 5):
        worker = EngineWorker(core, max_queue=2)  # never started: the test steps the core itself
        running = [make(llm, max_tokens=64) for _ in range(2)]
        worker.submit(running)
        core.step()
        assert core.num_running == 2 and core.num_waiting == 0
        job = [make(llm, max_tokens=2) for _ in range(size)]
        worker.submit(job)  # was QueueFull for 3 and 4 choices
        with pytest.raises(QueueFull):
            worker.submit([make(llm)])  # now something waits: the queue is full
        for _ in range(300):
            if all(r.finished for r in running + job):
                break
            core.step()
        assert all(r.finished for r in running + job)


def test_a_dead_worker_fails_everything_in_flight_and_refuses_new_requests():
    """The worker thread dies (a BaseException from the backend escapes every handler): the
    running and the waiting request both end with EngineDead, submit refuses at once, and the
    worker says it is not alive."""
    llm, backend = engine_llm(max_num_seqs=1)
    worker = EngineWorker(llm.engine.core, max_queue=4)
    backend.arm("worker", after=3)
    worker.start()
    try:
        reqs = [make(llm, max_tokens=64) for _ in range(2)]
        worker.submit(reqs)
        deadline = time.monotonic() + WAIT_S
        while not all(r.finished for r in reqs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(r.finished for r in reqs), "requests in flight were left hanging when the worker died"
        assert all(isinstance(r.error, EngineDead) for r in reqs)
        assert request_error(reqs[0].error).status == 503
        assert not worker.alive
        with pytest.raises(EngineDead):
            worker.submit([make(llm)])
        assert backend.live == 0 and llm.engine.core.num_waiting == 0
    finally:
        worker.stop(timeout=5)


def test_a_bug_mid_stream_still_ends_with_an_error_event_and_done_and_is_recorded_500(monkeypatch):
    """Not the engine: the server's own chunk building raises after the first chunk (an app in
    this process, served by uvicorn on a loopback port). The client still gets an error event and
    [DONE], and the request is recorded as a 500, not a 499."""
    import uvicorn

    from specserve.server import responses as protocol
    from specserve.server.app import create_app

    llm, _ = engine_llm()
    app = create_app(llm, MODEL)
    calls = iter(range(1000))
    real = protocol.ChatDialect.delta_chunk

    def buggy(self, *args, **kwargs):
        if next(calls) >= 1:
            raise KeyError("a bug in the chunk builder")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(protocol.ChatDialect, "delta_chunk", buggy)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not uv.started and time.monotonic() < deadline:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=WAIT_S) as r:
            events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["type"] == "server_error"
        text = httpx.get(f"{url}/metrics", timeout=5).text
        assert metric_value(text, "specserve_requests_total", endpoint="chat", status="500") == 1
        assert metric_value(text, "specserve_requests_total", endpoint="chat", status="499") == 0
    finally:
        uv.should_exit = True
        thread.join(10)


# -- a real server process ---------------------------------------------------------------------------
def start_server(path: str, *args: str) -> ServerProcess:
    """A server with fault injection on (the variable is read when the process starts)."""
    old = os.environ.get(faults.ENV)
    os.environ[faults.ENV] = "1"
    try:
        return ServerProcess(path, "--served-model-name", MODEL, "--speculation", "none", *args).start()
    finally:
        if old is None:
            del os.environ[faults.ENV]
        else:
            os.environ[faults.ENV] = old


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("failures") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir):
    srv = start_server(model_dir, "--max-num-seqs", "2", "--request-timeout", "60")
    try:
        yield srv
    finally:
        srv.stop()


def arm(srv: ServerProcess, kind: str, after: int = 1) -> None:
    r = httpx.post(f"{srv.url}/debug/fault", json={"kind": kind, "after": after}, timeout=10)
    assert r.status_code == 200, r.text


def chat(srv: ServerProcess, **fields) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/chat/completions", json={**CHAT, **fields}, timeout=WAIT_S)


def sse_events(srv: ServerProcess, **fields) -> tuple[int, list]:
    """Status and the decoded `data:` payloads of a streamed chat request ("[DONE]" kept as is)."""
    with httpx.stream(
        "POST", f"{srv.base_url}/chat/completions", json={**CHAT, "stream": True, **fields}, timeout=WAIT_S
    ) as r:
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
        return r.status_code, [e if e == "[DONE]" else json.loads(e) for e in events]


def test_server_answers_a_fault_in_a_step_with_500_and_serves_on(server):
    arm(server, "step")
    r = chat(server)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "engine_error" and "injected" in err["message"]
    assert chat(server).status_code == 200


def test_a_stream_that_fails_mid_way_ends_with_an_error_event_and_done_and_is_recorded_500(server):
    before = metric_value(server.metrics(), "specserve_requests_total", endpoint="chat", status="500")
    arm(server, "step", after=4)  # prefill, first token (the stream opens), one more, then the fault
    status, events = sse_events(server)
    assert status == 200
    assert events[-1] == "[DONE]"
    assert any(e != "[DONE]" and e.get("choices") and e["choices"][0]["delta"].get("content") for e in events)
    err = events[-2]["error"]
    assert err["type"] == "server_error" and "injected" in err["message"]
    after = metric_value(server.metrics(), "specserve_requests_total", endpoint="chat", status="500")
    assert after == before + 1
    assert chat(server).status_code == 200


def test_a_responses_stream_that_fails_mid_way_ends_with_response_failed(server):
    """The Responses API's stream: typed events numbered in order, the last `response.failed`
    (OpenAI's lifecycle end for a failed response; until 2026-12-05 a bare `error` event, which
    the SDK's stream helper and agents never took for an end), with the text streamed so far, the
    SDK's own type in strict mode, no [DONE] line (that is chat's), and a 500 on record."""
    from openai.types.responses import ResponseFailedEvent

    before = metric_value(server.metrics(), "specserve_requests_total", endpoint="responses", status="500")
    arm(server, "step", after=4)
    body = {"model": CHAT["model"], "input": "hi", "max_output_tokens": 32, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/responses", json=body, timeout=WAIT_S) as r:
        lines = list(r.iter_lines())
    assert r.status_code == 200 and "data: [DONE]" not in lines
    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    assert names == [e["type"] for e in events] and [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "response.output_text.delta" in names and names[-1] == "response.failed"
    failed = ResponseFailedEvent.model_validate(events[-1], strict=True).response
    assert failed.status == "failed" and failed.error.code == "server_error" and "injected" in failed.error.message
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert failed.output[0].content[0].text == streamed and failed.output[0].status == "incomplete"
    after = metric_value(server.metrics(), "specserve_requests_total", endpoint="responses", status="500")
    assert after == before + 1


def test_gauges_return_to_zero_when_the_engine_is_idle(server):
    with ThreadPoolExecutor(2) as pool:
        assert [r.status_code for r in pool.map(lambda _: chat(server), range(2))] == [200, 200]
    # A response can reach the client before the step that emitted it ends: give the engine a
    # moment to go idle (it must, or this fails), then every gauge must read 0.
    deadline = time.monotonic() + 10
    while server.health()["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    text = server.metrics()
    assert metric_value(text, "specserve_active_requests") == 0
    assert metric_value(text, "specserve_kv_cache_usage") == 0
    assert metric_value(text, "specserve_queue_depth") == 0
    health = server.health()
    assert health["active"] == 0 and health["queued"] == 0 and health["kv_cache_usage"] == 0


def test_a_sequence_the_backend_cannot_free_is_counted_and_the_server_serves_on(server):
    """A backend that fails to free a sequence used to fail the whole step's batch; the engine now
    retires that sequence (engine.core._lose). It must show: `lost_sequences` in /health and the
    `specserve_lost_sequences` gauge count it, and the next request is answered as before."""
    assert server.health()["lost_sequences"] == 0
    arm(server, "free")
    arm(server, "step")  # the failed request's sequence is freed at once (not kept as a cache entry)
    assert chat(server).status_code == 500
    assert server.health()["lost_sequences"] == 1
    assert metric_value(server.metrics(), "specserve_lost_sequences") == 1
    assert chat(server).status_code == 200


def test_speculation_accepts_a_method_name_as_shorthand(server):
    r = chat(server, speculation="ngram", max_tokens=48)  # the server's default is "none"
    assert r.status_code == 200, r.text
    assert set(r.json()["speculation"]["by_source"]) == {"ngram", "none"}  # the tiny model repeats itself
    bad = chat(server, speculation="bogus")
    assert bad.status_code == 400
    err = bad.json()["error"]
    assert err["param"] == "speculation" and "bogus" in err["message"] and "ngram" in err["message"]
    assert chat(server, speculation={"method": "ngram", "num_speculative_tokens": 4}).status_code == 200


def test_a_dead_worker_fails_waiting_requests_and_the_server_answers_503(model_dir):
    """--request-timeout 0 (no deadline) and one sequence: one request runs, one waits; the worker
    dies. Both are answered 503 at once (neither hangs), new requests get 503, /health says unavailable."""
    srv = start_server(model_dir, "--max-num-seqs", "1", "--request-timeout", "0")
    try:
        assert chat(srv, max_tokens=2).status_code == 200
        with ThreadPoolExecutor(2) as pool:
            answers = [pool.submit(chat, srv, max_tokens=400) for _ in range(2)]
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:  # one runs, the other waits for the only sequence
                health = srv.health()
                if health["active"] == 1 and health["queued"] == 1:
                    break
                time.sleep(0.01)
            assert health["active"] == 1 and health["queued"] == 1, health
            arm(srv, "worker")
            answers = [a.result() for a in answers]  # an httpx timeout here means a request hung
        for r in answers:
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["type"] == "server_error" and err["code"] == "unavailable" and "injected" in err["message"]
        t = time.monotonic()
        refused = chat(srv)
        assert refused.status_code == 503 and time.monotonic() - t < 5
        health = httpx.get(f"{srv.url}/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert not health.json()["worker_alive"]
    finally:
        srv.stop()


# -- shutdown ----------------------------------------------------------------------------------------
def long_server(tmp_path) -> ServerProcess:
    """A server on a deep tiny model with a long context: a 4000-token answer takes about a minute."""
    path = tmp_path / "long"
    tiny_model(layers=24, hidden=128, max_positions=8192).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return ServerProcess(str(path), "--served-model-name", MODEL, "--log-level", "info").start()


def _open_stream(srv: ServerProcess, events: list, opened: threading.Event) -> None:
    """Stream a long answer into `events` (decoded payloads, "[DONE]" kept); sets `opened` at the first."""
    body = {**CHAT, "stream": True, "max_tokens": 4000, "ignore_eos": True}
    try:
        with httpx.stream("POST", f"{srv.base_url}/chat/completions", json=body, timeout=WAIT_S) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    payload = line[len("data: ") :]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
                    opened.set()
    except httpx.TransportError:  # the connection was cut
        events.append("cut")


def _wait_until_handled(srv: ServerProcess) -> None:
    """Wait until the server has run its handler for a SIGINT (uvicorn logs "Shutting down" once
    it has). A second SIGINT sent before that merges with the first (the kernel keeps one pending,
    Python runs the handler once): a fixed 0.3 s pause let a loaded machine drain as after one."""
    deadline = time.monotonic() + WAIT_S
    while "Shutting down" not in srv.log_tail(100_000):
        assert srv.proc.poll() is None and time.monotonic() < deadline, srv.log_tail()
        time.sleep(0.05)


def _stream_during_interrupts(tmp_path, interrupts: int) -> tuple[list, int, float, str]:
    """On a fresh server, send SIGINT `interrupts` times while a stream runs: (its events, the
    exit code, seconds to exit, the server's log)."""
    srv = long_server(tmp_path)
    try:
        events: list = []
        opened = threading.Event()
        reader = threading.Thread(target=_open_stream, args=(srv, events, opened), daemon=True)
        reader.start()
        assert opened.wait(WAIT_S), srv.log_tail()
        t = time.monotonic()
        for i in range(interrupts):
            srv.proc.send_signal(2)  # SIGINT, as Ctrl+C sends
            if i < interrupts - 1:
                _wait_until_handled(srv)
        code = srv.proc.wait(60)
        took = time.monotonic() - t
        reader.join(WAIT_S)
        return events, code, took, srv.log_tail(100_000)
    finally:
        srv.stop()


def test_ctrl_c_ends_running_streams_with_an_error_event_and_no_traceback(tmp_path):
    """The first Ctrl+C lets running requests go on for the drain grace, then ends them as a
    503: a stream gets an `unavailable` error event and [DONE], not a cut connection; the
    process exits 130 and logs no traceback (uvicorn alone cancelled the stream's task)."""
    events, code, took, log = _stream_during_interrupts(tmp_path, 1)
    assert code == 130, log
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "unavailable", events[-3:]
    assert "shutting down" in events[-2]["error"]["message"]
    assert any(e["choices"] and e["choices"][0]["delta"].get("content") for e in events[:-2])  # it had begun
    assert DRAIN_GRACE_S - 0.5 < took < DRAIN_GRACE_S + 20, took
    assert "Traceback" not in log and "Application shutdown complete" in log, log


def test_a_second_ctrl_c_exits_at_once_without_a_traceback(tmp_path):
    """Exits without the drain: the stream is cut (a drained one ends with an error event and
    [DONE]), whatever a loaded machine makes the exit take."""
    events, code, _, log = _stream_during_interrupts(tmp_path, 2)
    assert code == 130, (code, log)
    assert events[-1] == "cut", events[-3:]  # forced: no time to answer
    assert "Traceback" not in log and "interrupted again, exiting now" in log, log


def test_a_cache_smaller_than_the_context_is_the_context_the_server_offers(capsys):
    """--kv-cache-tokens below the context: /v1/models advertised the model's whole context and
    a chat request without max_tokens (default: the rest of that context) was always refused,
    "lower max_tokens", though it named none. The cache's size is now the usable context."""
    from fastapi.testclient import TestClient

    from specserve.server.app import create_app

    backend = TransformersBackend(tiny_model("qwen2", 0), max_sequences=3)
    limits = EngineLimits(max_num_seqs=2, kv_cache_tokens=100, max_num_batched_tokens=512, min_prefill_chunk=16)
    llm = LLM.from_backends(backend, tiny_tokenizer(), name=MODEL, speculation="none", limits=limits)
    assert backend.max_context > 100 and llm.max_context == 100
    assert "the KV cache holds 100 tokens, fewer than the context" in capsys.readouterr().err
    with TestClient(create_app(llm, MODEL)) as client:
        assert client.get("/v1/models").json()["data"][0]["max_model_len"] == 100
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] + r.json()["usage"]["completion_tokens"] <= 100
        long = {"model": MODEL, "prompt": list(range(5, 125)), "max_tokens": 1}
        r = client.post("/v1/completions", json=long)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("how", ["close", "with", "drop", "raise"])
def test_a_stream_nobody_reads_any_more_frees_its_sequence(how):
    """An abandoned `llm.stream` kept its cells and its place in the batch, and every later
    request stepped it along (10 of them made the next 16 tokens 4x slower)."""
    llm, backend = engine_llm()
    core = llm.engine.core
    for _ in range(3):
        gen = llm.stream(tiny_tokenizer().encode("def add(a, b):"), SamplingParams(max_tokens=200, ignore_eos=True))
        if how == "with":
            with gen:
                next(iter(gen))
        elif how == "raise":
            with pytest.raises(RuntimeError):
                for _event in gen:
                    raise RuntimeError("the caller's own error")
            gen.close()
        else:
            next(iter(gen))
            if how == "close":
                gen.close()
            else:
                del gen  # no reference cycle keeps it: freed at once, no gc.collect() needed
        assert core.num_running == 0 and core.scheduler.reserved == 0 and backend.live == 0
    out = llm.generate(tiny_tokenizer().encode("def add(a, b):"), SamplingParams(max_tokens=4, temperature=0))
    assert len(out.token_ids) == 4 and backend.live == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 2.5},
        {"seed": 1.5},
        {"seed": "7"},
        {"top_k": 2.5},
        {"stop": [5]},
        {"logprobs": True},
        {"temperature": "1"},
        {"temperature": float("nan")},
    ],
)
def test_a_sampling_field_of_the_wrong_type_is_refused_when_built(fields):
    """These failed inside an engine step as an EngineFault (a 500 from the server)."""
    with pytest.raises(ValueError, match="must be"):
        SamplingParams(**fields)


def test_numpy_values_and_the_shape_of_generate_s_arguments():
    """numpy token ids were read as a batch of prompts (TypeError), floats as ids were truncated,
    and a params list of the wrong length or a dict failed with AttributeError."""
    import numpy as np

    llm, _ = engine_llm()
    ids = tiny_tokenizer().encode("def add(a, b):")
    q = SamplingParams(max_tokens=np.int64(4), seed=np.int32(3), temperature=np.float32(0.0))
    assert type(q.max_tokens) is int and type(q.temperature) is float
    assert llm.generate(list(np.array(ids)), q).token_ids == llm.generate(ids, q).token_ids
    for args, message in [
        (([1.5, 2], q), "token ids must be integers"),
        ((["a", "b"], [q]), "a list of 1 for 2 prompts"),
        (("def add", {"max_tokens": 4}), "params must be a SamplingParams"),
        (("def add", q, 5), "prediction must be text or token ids"),
        (("def add", q, [True, 5]), "prediction token ids must be integers"),  # was read as token 1
        (("def add", q, [1.5]), "prediction token ids must be integers"),
    ]:
        with pytest.raises(InvalidRequestError, match=message):
            llm.generate(*args)
    assert len(llm.generate(["def add", "class A"], [q, q])) == 2
    # numpy token ids as a prediction, as a prompt takes them (they were refused as not integers)
    pred = llm.generate(ids, SamplingParams(max_tokens=8), prediction=list(np.array(ids[:4])))
    assert pred.token_ids == llm.generate(ids, SamplingParams(max_tokens=8)).token_ids


@pytest.mark.parametrize(
    "messages, message",
    [
        ([{"content": "hi"}], r"messages\[0\] must be a dict with a string 'role'"),
        ([{"role": "user"}], r"messages\[0\] needs 'content'"),
        ([{"role": "user", "content": None}], r"messages\[0\] needs 'content'"),
        ("hello", "messages must be a list of dicts"),
    ],
)
def test_malformed_chat_messages_are_a_clear_error(messages, message):
    """A KeyError, a jinja UndefinedError or an AttributeError from inside the template before."""
    llm, _ = engine_llm()
    with pytest.raises(InvalidRequestError, match=message):
        llm.chat(messages, SamplingParams(max_tokens=2))


def test_a_hung_up_request_s_drafts_count_per_source():
    """The per-source speculation counters were fed from answers, so a stream whose client hung
    up counted its drafts in the step counter but never in its source's counters."""
    from specserve.server.metrics import Metrics

    llm, _ = engine_llm()
    metrics = Metrics()
    llm.engine.core.on_step = metrics.observe_step
    plain = llm.generate(tiny_tokenizer().encode("def add(a, b):"), SamplingParams(max_tokens=40, temperature=0))
    with llm.stream(
        tiny_tokenizer().encode("def add(a, b):"),
        SamplingParams(max_tokens=40, temperature=0),
        prediction=plain.text,
        speculation="prediction",
    ) as gen:
        for _, event in zip(range(2), gen):  # a client that reads two steps and hangs up
            assert event.token_ids
    text = metrics.render()[0].decode()
    drafted = metric_value(text, "specserve_step_draft_tokens_total")
    assert drafted > 0
    assert metric_value(text, "specserve_spec_proposed_tokens_total", source="prediction") == drafted
    assert metric_value(text, "specserve_spec_steps_total", source="prediction") >= 1
    assert 0 < metric_value(text, "specserve_spec_accepted_tokens_total", source="prediction") <= drafted


@pytest.mark.parametrize("template", [True, False])
def test_chat_text_parts_are_their_text(template):
    """Content given as text parts (which the server and _check_messages accept) reached the
    template, and the plain transcript of a model without one (gemma-3-270m), as the list's Python
    repr: "user: [{'type': 'text', 'text': 'hi'}]"."""
    tok = copy.deepcopy(tiny_tokenizer())
    if not template:
        tok.chat_template = None
    llm = LLM.from_backends(TransformersBackend(tiny_model("qwen2", 0)), tok, speculation="none")
    parts = [{"type": "text", "text": "def add"}, {"type": "text", "text": "(a, b):"}]
    want = llm.apply_chat_template([{"role": "user", "content": "def add(a, b):"}])
    assert llm.apply_chat_template([{"role": "user", "content": parts}]) == want
    with pytest.raises(InvalidRequestError, match="only text parts"):
        llm.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}])


def test_a_failed_pass_s_drafts_are_not_counted_as_verified():
    """A pass that raised verified nothing, but its drafts counted in specserve_step_draft_tokens
    and in no source (the soak's books would drift by them)."""
    from specserve.server.metrics import Metrics

    llm, backend = engine_llm()
    metrics = Metrics()
    llm.engine.core.on_step = metrics.observe_step
    ids = tiny_tokenizer().encode("def add(a, b):")
    plain = llm.generate(ids, SamplingParams(max_tokens=40, temperature=0))
    req = llm.request(ids, SamplingParams(max_tokens=40, temperature=0), plain.text, "prediction")
    llm.engine.core.add(req)
    llm.engine.core.step()  # admitted and prefilled: the next pass verifies the prediction
    backend.arm("step")
    llm.engine.core.step()
    assert isinstance(req.error, EngineFault)
    text = metrics.render()[0].decode()
    assert metric_value(text, "specserve_step_draft_tokens_total") == 0
    assert metric_value(text, "specserve_spec_proposed_tokens_total") == 0


def test_a_request_the_queue_cannot_take_is_refused_before_it_is_prepared(monkeypatch):
    """Under overload every request later refused with a 429 was first tokenized and built on the
    shared prep thread (2378 chat 429s in a 4-minute soak), which backed up those that fit."""
    from fastapi.testclient import TestClient

    from specserve.server.app import ServerOptions, create_app
    from specserve.server.chat_store_api import StoringChatDialect  # the chat dialect create_app serves

    llm, _ = engine_llm(max_num_seqs=1)
    worker = EngineWorker(llm.engine.core, max_queue=1)  # never started: what is added stays put
    assert worker.has_room(1) and worker.has_room(2)  # 1 slot + 1 queued (and, while nothing waits, any one job)
    worker.submit([make(llm), make(llm)])
    assert not worker.has_room(1)
    with pytest.raises(QueueFull):
        worker.submit([make(llm)])

    prepared = []
    real = StoringChatDialect.prepare
    counted = lambda self, req, llm: prepared.append(1) or real(self, req, llm)  # noqa: E731
    monkeypatch.setattr(StoringChatDialect, "prepare", counted)
    served, _ = engine_llm(max_num_seqs=1)
    with TestClient(create_app(served, MODEL, ServerOptions(max_queue=1))) as client:
        server = client.app.state.server
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200 and prepared == [1]
        monkeypatch.setattr(server.engine, "has_room", lambda n=1: False)
        r = client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full" and r.headers["Retry-After"]
        assert prepared == [1]  # not prepared
