"""The OpenAI-compatible HTTP server: FastAPI routes over one `LLM`.

    request ─► auth ─► parse + validate (400) ─► tokenize on the prep thread ─► engine queue (429)
            ─► the engine's worker thread steps every running request together (continuous batching)
            ─► each StepEvent is handed to the event loop (call_soon_threadsafe) ─► SSE chunk / JSON

The event loop never touches the model. A client that disconnects cancels its request (removed
from the queue, or stopped by the worker at the next step); a request past its deadline ends
with a 504 (or an SSE error event); an exception in one request is answered, never fatal.
Faults are told apart by type: a request the engine refuses before queueing is the client's
fault (400); anything raised inside a step is an EngineFault (500); a dead worker is EngineDead
(503, and /health says unavailable).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .. import __version__
from ..engine.client import EngineClient, EngineDead, EngineWorker, QueueFull, ShuttingDown
from ..engine.constrain import PendingGuide
from ..engine.core import EngineFault
from ..engine.tokenizer import warm
from . import faults
from .body_limit import BodyLimitMiddleware, default_max_body_bytes
from .chat_store_api import StoringChatDialect, install_chat_store
from .errors import APIError, engine_error, parse_body
from .fingerprint import system_fingerprint
from .logprobs import TokenNamer
from .metrics import OWNED, CountResponses, Metrics
from .openapi import install_openapi
from .protocol import Prepared
from .request_id import HEADER as REQUEST_ID_HEADER
from .request_id import RequestIdMiddleware, request_id_of
from .responses import COMPLETIONS, Dialect, ResponseContext, usage
from .responses_api import ResponsesDialect
from .responses_routes import install_responses_store
from .schemas import DetokenizeRequest, TokenizeRequest
from .store_calls import off_loop
from .structured import choice_params
from .tokenize import detokenize, tokenize, tokenizer_info

log = logging.getLogger("specserve.server.app")
DRAIN_GRACE_S = 5.0  # on shutdown, how long running requests may go on before they are ended (503)
GRACE_S = 1.0  # how long past its deadline a request waits for the worker before answering 504 itself


@dataclass(frozen=True)
class ServerOptions:
    """api_key: required Bearer token (None: open). max_queue: requests allowed to wait while one
    runs (beyond that: 429). request_timeout: seconds from arrival to the last token (None: none).
    max_body_bytes: bodies over it get a 413 before parsing (None: sized from the context length,
    see body_limit.default_max_body_bytes)."""

    api_key: str | None = None
    max_queue: int = 16
    request_timeout: float | None = 600.0
    max_body_bytes: int | None = None


class ClientGone(Exception):
    """The client disconnected; there is nobody left to answer."""


@dataclass
class StreamState:
    """What a stream's generator learned, for the count made when the stream closes."""

    output: list | None = None  # the finished outputs, once the finish chunks were built (a 200)
    ttft: float | None = None
    opened: set[int] = field(default_factory=set)  # choices whose first event was streamed


class ClosingStream(StreamingResponse):
    """A StreamingResponse that closes its generator and calls `on_close` when it is over, however
    it ended: finished, the client gone (Starlette stops iterating and leaves the generator to the
    garbage collector, whose finaliser ran its clean-up later, or never for one not yet started)."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self.on_close()


def timeout_error(seconds: float | None) -> APIError:
    return APIError(
        504,
        f"the request did not finish within the server's timeout of {seconds:g} s",
        "timeout_error",
        code="request_timeout",
    )


def unavailable(message: str) -> APIError:
    return APIError(503, message, "server_error", code="unavailable")


def request_error(exc: Exception) -> APIError:
    """The answer to a request that failed in the engine: 503 when the engine is dead, 500 for a
    fault in a step (whatever the type of its cause), else the validation mapping (4xx)."""
    if isinstance(exc, EngineDead):
        return unavailable(str(exc))
    if isinstance(exc, EngineFault):
        return APIError(500, str(exc), "server_error", code="engine_error")
    return engine_error(exc)


# -- between the event loop and the engine ------------------------------------------------------
class Job:
    """One HTTP request: its n choices (of each prompt, for a batch of completions prompts) run as
    engine requests, batched with everyone else's.

    The engine's worker thread posts ("event", (choice index, StepEvent))*, then ("done",
    [RequestOutput per choice]) or ("error", exc) once, through the event loop's queue.
    """

    def __init__(self, prepared: Prepared, loop: asyncio.AbstractEventLoop, deadline: float | None):
        self.prepared, self.loop, self.deadline = prepared, loop, deadline
        self.items: asyncio.Queue = asyncio.Queue()
        self.reason: str | None = None  # why it was cancelled: "client" | "timeout" | "shutdown"
        self.requests: list = []
        self._cancelled = threading.Event()
        self._seen: set[int] = set()  # choices with an event that lists tokens posted
        self._closed = False  # "done" or "error" was posted
        self.status: int | None = None  # the outcome, settled once on the event loop (see settle)
        self.recorded = False  # counted in the metrics (once, whatever path the answer took)

    def settle(self, status: int) -> int:
        """Decide the request's outcome, once: the first of "answered" (200 or an error's status),
        "the client went away" (499) and "timed out" (504) to be settled on the event loop wins,
        and both the answer and the metrics take it from here. Before, a request that timed out
        as its client hung up was answered and counted 504 or 499 depending on which thread saw
        it first (the worker's deadline check or the disconnect watcher)."""
        if self.status is None:
            self.status = status
        return self.status

    def build(self, llm) -> None:
        """The engine requests of every choice (on the prep thread: predictions get tokenized here)."""
        p = self.prepared
        self.requests = [
            llm.request(
                prompt_ids,
                params,
                p.prediction,
                p.speculation,
                should_cancel=self.should_stop,
                guide=p.guide,
                on_event=self._on_event,
            )
            for prompt_ids in p.prompts  # choice index: prompt * n + choice
            for params in choice_params(p.params, p.n)
        ]
        for later in (r for i, r in enumerate(self.requests) if i % p.n):  # they copy choice 0's prefill
            later.counts_reuse = False

    def post(self, kind: str, payload: Any = None) -> None:
        """Hand an item to the event loop; safe from any thread."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: the server is shutting down
            pass

    def _on_event(self, req, event) -> None:
        """Called by the engine's worker for every step of one of this job's requests."""
        if self._closed:
            return
        if req.error is not None:
            self._closed = True
            self.cancel("error")  # the other choices stop too
            if request_error(req.error).status >= 500:
                log.error("generation failed", exc_info=req.error)
            self.post("error", req.error)
            return
        index = self.requests.index(req)
        # non-streaming: a choice's events up to the first that lists tokens (the time to first token);
        # a stop string's held-back text holds its tokens back too, so the first step may list none
        if self.prepared.stream or index not in self._seen:
            if event.token_ids:
                self._seen.add(index)
            self.post("event", (index, event))
        if all(r.finished for r in self.requests):
            self._closed = True
            self.post("done", [r.output for r in self.requests])

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._cancelled.set()

    def should_stop(self) -> bool:
        """Asked by the engine before every step (worker thread)."""
        if not self._cancelled.is_set() and self.deadline is not None and time.monotonic() > self.deadline:
            self.cancel("timeout")
        return self._cancelled.is_set()


# -- the HTTP side ------------------------------------------------------------------------------
class Server:
    """Request handling shared by the routes: validation, queueing, streaming, metrics."""

    def __init__(self, llm, model_name: str, options: ServerOptions):
        self.llm, self.model_name, self.options = llm, model_name, options
        self.metrics = Metrics()
        self.engine: EngineClient = EngineWorker(llm.engine.core, options.max_queue)
        llm.engine.core.on_step = self.metrics.observe_step
        self.mean_request_s = 1.0  # moving average of request time, for Retry-After
        self.jobs: set[Job] = set()  # submitted and not yet answered (told "shutdown" on stop)
        self.prep = ThreadPoolExecutor(1, thread_name_prefix="specserve-prep")
        self.namer = TokenNamer(llm.tokenizer)
        self.fingerprint = system_fingerprint(llm)  # every answer's system_fingerprint
        self.started = time.time()
        self.max_body_bytes = options.max_body_bytes or default_max_body_bytes(llm.max_context)
        self.loop: asyncio.AbstractEventLoop | None = None  # the app's, once started
        self.draining = False  # shutdown has begun (see drain)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()  # called from the app's lifespan
        warm(self.llm.tokenizer, lambda fn: self.prep.submit(fn).result())  # where requests are prepared
        self.engine.start()

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: refuse new requests now, and end the running ones after grace_s.

        Callable from a signal handler. Requests still running at the deadline end as every
        cancelled request does, at the engine's next step: a 503, or for a stream an error
        event and [DONE], so clients see why and can retry elsewhere.
        """
        if self.loop is None or self.draining:
            return
        self.draining = True
        self.loop.call_soon_threadsafe(self.loop.call_later, grace_s, self._end_running)

    def _end_running(self) -> None:
        for job in list(self.jobs):
            self.cancel(job, "shutdown")

    def stop(self) -> None:
        self._end_running()
        self.engine.stop()
        self.prep.shutdown(wait=False, cancel_futures=True)

    def check_room(self) -> None:
        """Refuse at once (429, 503) a request the queue could not take now, before the prep
        thread tokenizes it: under overload every refused request used to be prepared first
        (2378 chat 429s in a 4-minute soak), which backed up the requests that would fit."""
        if self.draining:
            raise unavailable("the server is shutting down")
        if not self.engine.has_room(1):
            raise self._busy(self.engine.num_waiting)

    def _busy(self, waiting: int) -> APIError:
        retry = str(max(1, math.ceil(self.mean_request_s)))
        return APIError(
            429,
            f"the server is busy ({waiting} requests waiting); retry later",
            "rate_limit_error",
            code="queue_full",
            headers={"Retry-After": retry},
        )

    def submit(self, job: Job) -> None:
        """Queue a job's requests, or refuse with 429 (Retry-After) / 503."""
        if self.draining:
            raise unavailable("the server is shutting down")
        try:
            self.engine.submit(job.requests)
        except QueueFull as e:
            raise self._busy(e.waiting) from None
        except ShuttingDown:
            raise unavailable("the server is shutting down") from None
        except EngineDead as e:
            raise unavailable(str(e)) from None
        self.jobs.add(job)

    def cancel(self, job: Job, reason: str) -> None:
        """The engine drops the job's requests at its next step (queued or running)."""
        job.cancel(reason)
        self.engine.wake()

    # -- checks ---------------------------------------------------------------------------------
    async def authorize(self, request: Request) -> None:
        """FastAPI dependency: Bearer token, compared in constant time (async: no threadpool hop)."""
        key = self.options.api_key
        if not key:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        if not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")

    def check_model(self, name: str) -> None:
        if name not in (self.model_name, self.llm.model_name):
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    # -- one request ----------------------------------------------------------------------------
    async def handle(self, request: Request, dialect: Dialect) -> Response:
        """Parse, validate, queue and answer one request (JSON body or SSE stream)."""
        t0 = time.monotonic()
        request.scope.setdefault(OWNED, [False])[0] = True  # counted here (CountResponses counts the rest)
        try:
            req = parse_body(dialect.request_model, await request.body())
            self.check_model(req.model)
            self.check_room()
            prepared = await self._prepare(dialect, req)
            loop = asyncio.get_running_loop()
            timeout = self.options.request_timeout
            job = Job(prepared, loop, t0 + timeout if timeout else None)
            await self._build(job)
            self.submit(job)
        except APIError as e:
            self.metrics.request(dialect.name, e.status)
            e.param, e.message = dialect.param(e.param), dialect.message(e.message)
            raise
        except ClientDisconnect:  # gone while its body was read: nobody to answer
            self.metrics.request(dialect.name, 499)
            return Response(status_code=499)
        except asyncio.CancelledError:  # its host cancelled the handler (Ray Serve: the client left)
            self.metrics.request(dialect.name, 499)
            raise
        except Exception:  # a bug before queueing: the app's handler answers 500
            self.metrics.request(dialect.name, 500)
            raise
        watcher = asyncio.create_task(self._watch_disconnect(request, job))
        ctx = dialect.context(self.model_name, self.namer, prepared)
        ctx.fingerprint = self.fingerprint
        ctx.end_ids = frozenset() if prepared.params.ignore_eos else frozenset(self.llm.engine.eos_token_ids)
        if prepared.stream:
            return await self._start_stream(dialect, ctx, job, watcher, t0)
        return await self._complete(dialect, ctx, job, watcher, t0)

    async def _prepare(self, dialect: Dialect, req) -> Prepared:
        """Tokenize and validate on the prep thread, so long prompts never stall the event loop."""
        try:
            prepare = await dialect.preparer(req)
            prepared = await asyncio.get_running_loop().run_in_executor(self.prep, prepare, req, self.llm)
            if isinstance(prepared.guide, PendingGuide):  # compiling on the grammar threads, time-limited
                prepared.guide = await prepared.guide.wait_async()
            return prepared
        except Exception as e:  # noqa: BLE001
            raise engine_error(e) from None

    async def _build(self, job: Job) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self.prep, job.build, self.llm)
        except Exception as e:  # noqa: BLE001
            raise engine_error(e) from None

    async def _next(self, job: Job) -> tuple[str, Any]:
        """The worker's next item; a 504 when the deadline passes and the worker has not answered."""
        if not job.items.empty():  # what the worker posted is read, even past the deadline (wait_for(0)
            return job.items.get_nowait()  # times out without reading: a request done at its deadline got a 504)
        wait = None if job.deadline is None else max(0.0, job.deadline - time.monotonic()) + GRACE_S
        try:
            return await asyncio.wait_for(job.items.get(), wait)
        except TimeoutError:
            self.cancel(job, "timeout")
            if job.settle(504) == 499:
                raise ClientGone() from None
            raise timeout_error(self.options.request_timeout) from None

    def _finished(self, job: Job, outputs):
        """The RequestOutputs (one per choice) of a job that ended; why it has none when it was cancelled."""
        if outputs and all(o is not None and o.finish_reason != "abort" for o in outputs):
            return outputs
        if job.reason == "timeout":
            raise timeout_error(self.options.request_timeout)
        if job.reason == "shutdown":
            raise unavailable("the server is shutting down")
        raise ClientGone()

    async def _watch_disconnect(self, request: Request, job: Job) -> None:
        """Cancel the job as soon as the client goes away (the worker checks before every step)."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.settle(499)
                self.cancel(job, "client")
                return

    def _abandon(self, job: Job) -> None:
        """The handler's task was cancelled: what a host that does not pass the client's disconnect
        on does when the client goes away (Ray Serve's proxy cancels the replica's handler). The
        engine drops the job, as on a disconnect; it used to run it to its end, unseen."""
        job.settle(499)
        self.cancel(job, "client")

    def _record(self, dialect: Dialect, job: Job, outputs, ttft: float | None, t0: float) -> None:
        """Count a job's request once, with its settled status (499 when nothing was settled:
        the client went away before anything else happened); usage only for a 200."""
        if job.recorded:
            return
        job.recorded = True
        status = job.settle(499)
        outputs = outputs if status == 200 else None
        self.metrics.request(dialect.name, status)
        self.jobs.discard(job)
        self.mean_request_s = 0.8 * self.mean_request_s + 0.2 * (time.monotonic() - t0)
        if outputs:
            self.metrics.observe_usage(usage(outputs, job.prepared.n, job.prepared.scores_only))
            self.metrics.observe_latency(outputs, ttft, time.monotonic() - t0, dialect.name)

    async def _complete(self, dialect: Dialect, ctx: ResponseContext, job: Job, watcher, t0: float) -> Response:
        """Non-streaming: wait for the end, answer one JSON body."""
        ttft, output = None, None
        try:
            while True:
                kind, payload = await self._next(job)
                if kind == "event":
                    ttft = ttft if ttft is not None or not payload[1].token_ids else time.monotonic() - t0
                elif kind == "error":
                    raise request_error(payload)
                else:
                    output = self._finished(job, payload)
                    body = await off_loop(dialect.blocking, dialect.response, ctx, output)  # it may store it
                    if job.settle(200) != 200:
                        raise ClientGone()
                    return JSONResponse(body)
        except APIError as e:
            if job.settle(e.status) == 499:
                return Response(status_code=499)
            raise
        except ClientGone:
            job.settle(499)
            return Response(status_code=499)
        except asyncio.CancelledError:
            self._abandon(job)
            raise
        except Exception:  # a bug building the answer: the app's handler answers 500, recorded as such
            job.settle(500)
            raise
        finally:
            watcher.cancel()
            self._record(dialect, job, output, ttft, t0)

    async def _start_stream(self, dialect: Dialect, ctx: ResponseContext, job: Job, watcher, t0: float) -> Response:
        """Streaming: wait for the first step so early errors still get a proper HTTP status."""
        try:
            first = await self._next(job)
            if first[0] == "error":
                raise request_error(first[1])
            if first[0] == "done":
                self._finished(job, first[1])
        except (APIError, ClientGone) as e:
            watcher.cancel()
            status = job.settle(e.status if isinstance(e, APIError) else 499)
            self._record(dialect, job, None, None, t0)
            if status == 499:
                return Response(status_code=499)
            raise
        except asyncio.CancelledError:
            watcher.cancel()
            self._abandon(job)
            self._record(dialect, job, None, None, t0)
            raise
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        stream = StreamState()

        def closed() -> None:  # the stream is over, however it ended: count it once
            watcher.cancel()
            if job.status is None or job.status == 499:
                self.cancel(job, "client")
            self._record(dialect, job, stream.output, stream.ttft, t0)

        return ClosingStream(
            self._sse(dialect, ctx, job, first, stream, t0), closed, media_type="text/event-stream", headers=headers
        )

    async def _sse(
        self, dialect: Dialect, ctx: ResponseContext, job: Job, item, stream: StreamState, t0: float
    ) -> AsyncIterator[str]:
        """SSE: role chunk, one chunk per step's new text, finish chunk, usage chunk, [DONE]. It
        settles the outcome it sends (an error event's status, or 200 before [DONE]) and stops
        sending once the client is gone (settled 499); ClosingStream counts it when it closes."""
        try:
            for chunk in dialect.opening_chunks(ctx):
                yield dialect.sse(chunk)
            while True:
                kind, payload = item
                if kind == "event":
                    index, event = payload
                    if index not in stream.opened and event.finish_reason != "abort":  # its first step: the
                        stream.opened.add(index)  # prompt is scored (an abort may come before its admission)
                        req = job.requests[index]
                        for chunk in dialect.echo_chunks(ctx, index, req.prompt_ids, req.prompt_logprobs or ()):
                            yield dialect.sse(chunk)
                    lps = ctx.listed(event.logprobs)
                    if event.text or (ctx.logprobs and lps):
                        stream.ttft = stream.ttft if stream.ttft is not None else time.monotonic() - t0
                        for chunk in dialect.delta_chunks(ctx, event.text, lps, index):
                            yield dialect.sse(chunk)
                elif kind == "error":
                    raise request_error(payload)
                else:
                    output = self._finished(job, payload)
                    chunks = await off_loop(dialect.blocking, _last_chunks, dialect, ctx, output)  # it may store it
                    if job.settle(200) != 200:
                        return
                    stream.output = output
                    for chunk in chunks:
                        yield dialect.sse(chunk)
                    break
                item = await self._next(job)
            yield dialect.done_line
        except APIError as e:  # headers are sent: the error travels as an SSE event
            if job.settle(e.status) == 499:
                return
            yield dialect.sse(await off_loop(dialect.blocking, dialect.error_event, ctx, e))  # it may store it
            yield dialect.done_line
        except ClientGone:
            job.settle(499)
        except Exception as e:  # noqa: BLE001 - a bug mid-stream: still an error event, [DONE], and a 500 on record
            log.exception("stream failed")
            self.cancel(job, "error")
            if job.settle(500) == 499:
                return
            bug = APIError(500, f"internal error: {type(e).__name__}", "server_error", code="internal_error")
            yield dialect.sse(await off_loop(dialect.blocking, dialect.error_event, ctx, bug))
            yield dialect.done_line

    # -- small endpoints ------------------------------------------------------------------------
    async def tokens(self, request: Request, model_cls, work, reads=None) -> dict:
        """/tokenize and /detokenize: parsed and checked here, tokenized on the prep thread. `reads`:
        an async function of the request whose answer `work` takes as its third argument (what it
        reads from a store, read before the prep thread runs it: responses_api.looked_up)."""
        req = parse_body(model_cls, await request.body())
        if req.model is not None:
            self.check_model(req.model)
        try:
            args = (req, self.llm) if reads is None else (req, self.llm, await reads(req))
            return await asyncio.get_running_loop().run_in_executor(self.prep, work, *args)
        except Exception as e:  # noqa: BLE001
            raise engine_error(e) from None

    def models(self) -> dict:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "specserve",
            "max_model_len": self.llm.max_context,
            "draft_model": getattr(self.llm, "draft_model_name", None),
        }
        return {"object": "list", "data": [card]}

    def health(self) -> tuple[dict, int]:
        """/health's body and status: 503 "unavailable" once the worker has died or shutdown has
        begun (every new request is refused then; a draining server said 200 "ok" before)."""
        s = self.engine
        serving = s.alive and not self.draining
        body = {
            "status": "ok" if serving else "unavailable",
            "model": self.model_name,
            "queued": s.num_waiting,
            "active": s.num_running,
            "max_queue": s.max_queue,
            "kv_cache_usage": round(self.llm.engine.core.cache_used, 4),
            "prefix_cache": self.llm.engine.core.prefix_stats(),
            "lost_sequences": self.llm.engine.core.lost_sequences,
            **self._exactness(),
            "worker_alive": s.alive,
            "threads": threading.active_count(),
            "thread_names": sorted(t.name for t in threading.enumerate()),
        }
        return body, 200 if serving else 503

    def render_metrics(self) -> tuple[bytes, str]:
        """The Prometheus text, its gauges (queue, running, KV and host cache) and prefix-cache
        reuse counters read from the engine now: every exporter goes through here (the Ray
        replicas pushed `metrics.render()` as is, and their gauges said 0 requests running while 3 ran)."""
        core = self.llm.engine.core
        cached_cells = core.prefix.cells if core.prefix is not None else 0
        host = core.host.stats() if core.host is not None else None
        self.metrics.set_engine_state(
            self.engine.num_waiting, self.engine.num_running, core.cache_used, cached_cells, host
        )
        self.metrics.set_prefix_reuse(core.prefix_stats())
        self.metrics.lost_sequences.set(core.lost_sequences)
        return self.metrics.render()

    def _exactness(self) -> dict:
        """With `--exact` on llama.cpp: passes placed below their sequence's cells since start
        (each may have left its solo answer; docs/design.md, "The order of a sequence's cells")."""
        target = self.llm.engine.core.target
        if not getattr(target, "batch_invariant", False):
            return {}
        return {"exact_cells_out_of_order": target.cells_out_of_order}


def _last_chunks(dialect: Dialect, ctx: ResponseContext, outputs) -> list[dict]:
    """What a stream sends once it has finished: each choice's finish chunks, then usage if asked."""
    chunks = [c for i, choice in enumerate(outputs) for c in dialect.finish_chunks(ctx, choice, i)]
    if ctx.include_usage:
        chunks.append(dialect.usage_chunk(ctx, outputs))
    return chunks


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=e.headers)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error, ours or the framework's, in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return _error_response(e)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):  # FastAPI's 422 -> 400
        err = (e.errors() or [{}])[0]
        param = ".".join(str(p) for p in err.get("loc", ())[1:]) or None
        return _error_response(
            APIError(
                400, f"{param or 'request'}: {err.get('msg', 'invalid request')}", param=param, code="invalid_value"
            )
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        message = str(e.detail)
        if e.status_code in (404, 405):  # no such route or method: OpenAI's words, which name what was asked
            what = "Invalid URL" if e.status_code == 404 else "Method not allowed"
            message = f"{what} ({request.method} {request.url.path})"
        return _error_response(APIError(e.status_code, message, kind, headers=dict(e.headers or {})))

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):
        # answered from outside every middleware (Starlette's outermost layer): the request id's own
        # middleware never sees this answer, so its header is set here, and logged with the error
        rid = request_id_of(request.scope)
        log.exception("unhandled error (request %s)", rid)
        headers = {REQUEST_ID_HEADER: rid} if rid else None
        return _error_response(
            APIError(500, f"internal error: {type(e).__name__}", "server_error", code="internal_error", headers=headers)
        )


def create_app(
    llm, model_name: str | None = None, options: ServerOptions | None = None, response_store=None, chat_store=None
) -> FastAPI:
    """An OpenAI-compatible app over one loaded LLM; the worker runs for the app's lifespan.
    response_store: where finished Responses are kept (None: this process's memory; the Ray
    replicas share one, ray_serve.SharedResponseStore). chat_store: where chat completions sent
    with store: true are kept (None: this process's memory; the Ray replicas share one, ray_serve.SharedChatStore)."""
    server = Server(llm, model_name or llm.model_name, options or ServerOptions())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.start()
        try:
            yield
        finally:
            server.stop()

    app = FastAPI(title="specserve", version=__version__, lifespan=lifespan)
    app.state.server = server
    _add_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=server.max_body_bytes)
    app.add_middleware(CountResponses, metrics=server.metrics)  # sees the body cap's 413s too
    app.add_middleware(RequestIdMiddleware)  # outermost: every answer gets its x-request-id
    install_openapi(app)
    if faults.enabled():  # tests and scripts/soak.py only: see server/faults.py
        log.warning("%s=1: faults can be injected through POST /debug/fault", faults.ENV)
        faults.install(app, llm.engine.core)
    auth = Depends(server.authorize)

    chat = StoringChatDialect(chat_store)  # its store keeps the answers sent with store: true

    @app.post("/v1/chat/completions", dependencies=[auth])
    async def chat_completions(request: Request):
        return await server.handle(request, chat)

    install_chat_store(app, chat.store, [auth])

    @app.post("/v1/completions", dependencies=[auth])
    async def completions(request: Request):
        return await server.handle(request, COMPLETIONS)

    responses = ResponsesDialect(response_store)  # its store keeps the finished responses

    @app.post("/v1/responses", dependencies=[auth])
    async def create_response(request: Request):
        return await server.handle(request, responses)

    install_responses_store(app, server, responses.store, [auth])

    @app.post("/tokenize", dependencies=[auth])
    async def tokenize_route(request: Request):
        return await server.tokens(request, TokenizeRequest, tokenize)

    @app.post("/detokenize", dependencies=[auth])
    async def detokenize_route(request: Request):
        return await server.tokens(request, DetokenizeRequest, detokenize)

    @app.get("/tokenizer_info", dependencies=[auth])
    async def tokenizer_info_route():  # on the prep thread, which holds a tokenizer copy already
        return await asyncio.get_running_loop().run_in_executor(server.prep, tokenizer_info, server.llm)

    @app.get("/v1/models", dependencies=[auth])
    async def models():
        return server.models()

    @app.get("/v1/models/{model_id:path}", dependencies=[auth])
    async def model(model_id: str):
        server.check_model(model_id)
        return server.models()["data"][0]

    @app.get("/health")
    async def health():
        body, status = server.health()
        return JSONResponse(body, status)

    @app.get("/metrics")
    async def metrics():
        content, content_type = server.render_metrics()
        return Response(content, media_type=content_type)

    return app


def serve(
    llm,
    host: str = "127.0.0.1",
    port: int = 8000,
    options: ServerOptions | None = None,
    model_name: str | None = None,
    log_level: str = "info",
) -> None:
    """Run the server until interrupted (SIGINT/SIGTERM)."""
    import uvicorn

    app = create_app(llm, model_name, options)
    server = app.state.server

    class Uvicorn(uvicorn.Server):
        """uvicorn's server, with our order of shutdown.

        The first Ctrl+C (or SIGTERM) stops new requests at once, gives running ones
        DRAIN_GRACE_S to finish, then ends the rest with a 503 (streams: an error event and
        [DONE]); the application's shutdown then writes the host tier's files. uvicorn alone
        waited 5 s and cancelled the streams' tasks, which logged a traceback each and left
        clients with a cut connection.

        A second Ctrl+C leaves at once. uvicorn's own forced exit skipped the shutdown too, but
        tore the open streams down with a KeyboardInterrupt inside asyncio's loop (more
        tracebacks); nothing is left to save by then (the host tier's files are replaced whole).
        """

        def handle_exit(self, sig, frame) -> None:
            if self.should_exit and sig == signal.SIGINT:
                print("specserve: interrupted again, exiting now", file=sys.stderr, flush=True)
                os._exit(130)
            server.drain(DRAIN_GRACE_S)
            super().handle_exit(sig, frame)

    # uvicorn's own limit only backs ours up: ending a request waits for the engine's step, which
    # can take seconds on a CPU.
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=int(DRAIN_GRACE_S) + 25
    )
    Uvicorn(config).run()
