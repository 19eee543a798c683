"""Ray Serve: N replicas of the engine behind one OpenAI-compatible endpoint.

    client ─► Ray Serve HTTP proxy (one port, any node) ─► router ─► replica 1: create_app(LLM) ─► its worker
                                                                 └► replica N: create_app(LLM) ─► its worker

Each replica is the same FastAPI app `specserve serve` runs (server.create_app: auth, body cap,
validation, queue, streaming, metrics) over its own `LLM`; Ray Serve adds the proxy, routing,
autoscaling and replacement of dead replicas. Nothing here parses a request.

- Routing (`AffinityRouter`): without a session header, power of two choices (two random
  replicas, the one with fewer requests in flight), as Ray Serve's default router does; with an
  `X-Session-Id` header (Ray's session header; rename it with RAY_SERVE_SESSION_ID_HEADER_KEY),
  rendezvous hashing sends a session to the same replica while it has room, else to the next one.
- Autoscaling: `--min-replicas` / `--max-replicas` / `--target-ongoing-requests`; a fixed
  `--replicas N` otherwise. Ray Serve's controller restarts a replica that dies.
- Responses: the finished Responses (`GET /v1/responses/{id}`, `previous_response_id`) are kept
  in one `ResponseStore` actor all replicas share; stored chat completions (`store: true` on
  chat) in one `ChatCompletionStore` actor (`SharedChatStore`). Both end with the app.
- Metrics: every replica pushes its Prometheus text to a small `MetricsHub` actor every few
  seconds; `/metrics` on the ingress answers all replicas' series with a `replica` label,
  `/metrics/replica` the answering replica's own.

`specserve serve --ray` starts a local Ray cluster (or joins `--ray-address`) and runs the app;
`serve run specserve.server.ray_serve:build_app model=...` runs the same app from Ray's own CLI or config.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import logging
import math
import os
import random
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..errors import SpecServeError
from . import ray_reaper
from .chat_store import ChatCompletionStore

log = logging.getLogger("specserve.ray")
APP_NAME = "specserve"
DEPLOYMENT = "SpecServe"
HUB_NAMESPACE = "specserve"
PUSH_INTERVAL_S = 2.0
# Calls each of the app's actors (metrics hub, Responses store, chat store) runs at once, on as many
# threads: every replica's store calls come from several threads of its own (store_calls.py).
HUB_CONCURRENCY = 32
STALE_AFTER_S = 15.0  # a replica that stopped pushing (dead) drops out of /metrics
DRAIN_STEP_S = 10.0  # after the drain's grace, how long ending the last requests may take (an engine step)
NO_TIMEOUT_SHUTDOWN_WAIT_S = 3600.0  # with --request-timeout 0, how long a stopped replica's requests may still run
# A request beyond every replica's queue is refused by Ray's proxy, before any replica sees it: with
# the single server's status for a full queue (429) and this Retry-After, which OpenAI's SDKs wait out.
PROXY_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ReplicaConfig:
    """What every replica loads and how its app behaves (the `specserve serve` flags)."""

    model: str | None = None
    draft_model: str | None = None
    backend: str = "auto"
    dtype: str | None = None  # transformers only; None: bfloat16 there, the GGUF as is on llama.cpp
    device: str | None = None
    speculation: str = "auto"
    num_speculative_tokens: int | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    max_queue: int = 16
    request_timeout: float | None = 600.0
    max_body_bytes: int | None = None
    threads: int = 1  # torch / llama.cpp threads per replica (= its CPUs)
    exact: bool = False  # llama.cpp batch-invariant kernels
    gpu_layers: int | None = None  # llama.cpp layers on a GPU build's GPU (None: all)
    # each replica's engine (config.EngineLimits; None: its default)
    max_context: int | None = None
    max_num_seqs: int | None = None
    kv_cache_tokens: int | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool = True
    host_cache_bytes: int | None = None
    host_cache_dir: str | None = None  # one replica per machine holds it; the others keep memory only

    def limits(self):
        """The replica engine's EngineLimits: the fields given here, the rest at their defaults."""
        from ..config import EngineLimits

        names = ("max_num_seqs", "kv_cache_tokens", "max_num_batched_tokens", "host_cache_bytes", "host_cache_dir")
        given = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        return EngineLimits(prefix_caching=self.prefix_caching, **given)


@dataclass(frozen=True)
class ScaleConfig:
    """How many replicas, and how much each may hold (Ray Serve deployment options)."""

    replicas: int = 2
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    replica_cpus: float = 1.0
    # Requests a replica holds at once (one runs, the next waits ready); the rest wait in Ray's
    # proxy and go to whichever replica frees up first, so a queue never builds behind a slow or
    # dying replica while another is idle.
    max_ongoing_requests: int = 2

    def __post_init__(self) -> None:
        """Refuse what Ray Serve would refuse only once the cluster had started (`--replicas 0` took
        seconds of Ray start-up and shutdown logs to end in "num_replicas is expected to larger than 0")."""
        if self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.min_replicas is not None and self.min_replicas < 0:
            raise ValueError(f"--min-replicas must be at least 0, got {self.min_replicas}")
        if self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas or 0):
            raise ValueError(f"--max-replicas must be at least 1 and at least --min-replicas, got {self.max_replicas}")
        if not 0 < self.target_ongoing_requests < math.inf:  # nan too
            raise ValueError(f"--target-ongoing-requests must be a number above 0, got {self.target_ongoing_requests}")
        if not 0 <= self.replica_cpus < math.inf:
            raise ValueError(f"--replica-cpus must be a number at least 0, got {self.replica_cpus}")

    def upper(self) -> int:
        """The most replicas this configuration may run."""
        return max(self.replicas, self.min_replicas or 0, self.max_replicas or 0)

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    def initial(self) -> int:
        """The replicas Ray Serve starts with (and waits for before the app serves)."""
        if not self.autoscaled:
            return self.replicas
        low = self.min_replicas if self.min_replicas is not None else 1
        return max(low, min(self.replicas, self.max_replicas or low))

    def check_fits(self, cpus: float) -> str | None:
        """Why the first replicas do not fit in a cluster of `cpus` CPUs (None: they do). Ray Serve
        waits for ever for a replica it cannot place: `serve --ray --replicas 3` on 2 cores never
        said it was ready, nor why (Ray's own warnings go to its logs)."""
        need = self.initial() * self.replica_cpus
        if need <= cpus + 1e-9:
            return None
        return (
            f"{self.initial()} replicas x --replica-cpus {self.replica_cpus:g} need {need:g} CPUs and this Ray "
            f"cluster has {cpus:g}: ask for fewer replicas or a smaller --replica-cpus"
        )

    @staticmethod
    def shutdown_wait_s(replica: ReplicaConfig) -> float:
        """How long Ray Serve lets a replica it stops (scale-down, redeploy) finish its requests
        before killing it: as long as a request may run, and a step more. Ray stops the replica as
        soon as it is idle, so the wait costs nothing then. It was 5 s: on a scale-down, a stream
        longer than that was cut, and its client saw a closed connection and no error."""
        from .app import GRACE_S

        longest = replica.request_timeout or NO_TIMEOUT_SHUTDOWN_WAIT_S
        return longest + GRACE_S + DRAIN_STEP_S

    def deployment_options(self, replica: ReplicaConfig) -> dict:
        """Ray Serve `.options(...)` for the deployment: fixed or autoscaled replicas, the router, and
        a bound on requests waiting in the proxy (--max-queue per replica; beyond it Ray's proxy
        answers 429 with Retry-After, as the single server does for a full queue: it was Ray's
        default, 503 with no Retry-After)."""
        from ray.serve.config import BackpressureConfig, RequestRouterConfig

        opts: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": max(1, replica.max_queue * self.upper()),
            "backpressure_config": BackpressureConfig(status_code=429, retry_after_s=PROXY_RETRY_AFTER_S),
            "ray_actor_options": {"num_cpus": self.replica_cpus},
            "request_router_config": RequestRouterConfig(request_router_class=f"{__name__}.AffinityRouter"),
            "health_check_period_s": 2.0,
            "graceful_shutdown_timeout_s": self.shutdown_wait_s(replica),
        }
        if not self.autoscaled:
            opts["num_replicas"] = self.replicas
        else:
            low = self.min_replicas if self.min_replicas is not None else 1
            opts["autoscaling_config"] = {
                "min_replicas": low,
                "max_replicas": max(low, self.max_replicas or low),
                "initial_replicas": self.initial(),
                "target_ongoing_requests": self.target_ongoing_requests,
            }
        return opts


# -- routing ------------------------------------------------------------------------------------
def _rendezvous_order(session: str, replica_ids: list[str]) -> list[str]:
    """Replicas ordered by rendezvous (highest-random-weight) hashing of the session id: stable
    while the replica set is, and a lost replica moves only its own sessions."""

    def weight(rid: str) -> bytes:
        return hashlib.blake2b(f"{session}\x00{rid}".encode(), digest_size=8).digest()

    return sorted(replica_ids, key=weight, reverse=True)


def _router_class():
    """The request router, built lazily so importing this module does not need Ray."""
    from ray.serve.request_router import (
        FIFOMixin,
        LocalityMixin,
        MultiplexMixin,
        RequestRouter,
    )

    class AffinityRouter(FIFOMixin, LocalityMixin, MultiplexMixin, RequestRouter):
        """Least loaded of two random replicas; a session header pins a session to one replica."""

        async def choose_replicas(self, candidate_replicas, pending_request=None):
            """Ranks of candidates: Ray takes the first rank with a replica that accepts, and among
            a rank the one with the shortest queue."""
            if not candidate_replicas:
                return []
            session = getattr(getattr(pending_request, "metadata", None), "session_id", "") or ""
            if session:
                by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
                return [[by_id[rid]] for rid in _rendezvous_order(session, list(by_id))]
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    AffinityRouter.__module__ = __name__
    AffinityRouter.__qualname__ = "AffinityRouter"
    return AffinityRouter


def __getattr__(name: str):
    """`specserve.server.ray_serve.AffinityRouter` resolves on first use (Ray imports it by path)."""
    if name == "AffinityRouter":
        cls = _router_class()
        globals()["AffinityRouter"] = cls
        return cls
    raise AttributeError(name)


# -- metrics ------------------------------------------------------------------------------------
def merge_metrics(texts: dict[str, str]) -> str:
    """Several replicas' Prometheus texts as one, each sample labelled with its `replica`."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            merged = families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type, fam.unit))
            for s in fam.samples:
                merged.add_sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp, s.exemplar)

    class _Merged:
        def collect(self):
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return generate_latest(registry).decode()


class MetricsHub:
    """A Ray actor holding the latest metrics text of every live replica; on shutdown, also what
    tells the replicas to drain (Ray Serve's own stop gives a user hook only after its drain, and
    kills a replica whose streams outlast graceful_shutdown_timeout_s: their clients saw a cut
    connection, not the error event and [DONE] a single server sends).

    Every replica calls it at once (a threaded actor, hub_actor), so each method holds
    `_lock`: collect rebuilt `latest` while a push wrote to it, losing that replica's push or
    failing with "dictionary changed size during iteration"."""

    def __init__(self, app_name: str = APP_NAME):
        from .ray_app_owned import end_with_app

        self._lock = threading.Lock()
        self.latest: dict[str, tuple[float, str]] = {}
        self.busy: dict[str, int] = {}  # requests each replica had in flight at its last push
        self.draining_since: float | None = None
        end_with_app(app_name)  # detached, yet gone with its app (`serve shutdown` left it running)

    def push(self, replica: str, text: str, busy: int = 0) -> bool:
        """Record a replica's metrics and load; answer whether it should drain."""
        with self._lock:
            self.latest[replica] = (time.time(), text)
            self.busy[replica] = busy
            return self.draining_since is not None

    def drain(self) -> None:
        """Shutdown has begun: every replica's next push is told to drain (server.drain)."""
        with self._lock:
            if self.draining_since is None:
                self.draining_since = time.time()
                self.busy = {}  # only pushes from now on say a replica is idle

    def drained(self) -> bool:
        """Whether every live replica has pushed since the drain began, with nothing in flight."""
        with self._lock:
            live = self._live()
            return self.draining_since is not None and all(self.busy.get(r, 1) == 0 for r in live)

    def collect(self) -> dict[str, str]:
        """Texts of replicas heard from in the last STALE_AFTER_S seconds."""
        with self._lock:
            return self._live()

    def _live(self) -> dict[str, str]:
        """collect's answer, the lock held: stale replicas dropped."""
        now = time.time()
        self.latest = {r: (t, x) for r, (t, x) in self.latest.items() if now - t < STALE_AFTER_S}
        return {r: x for r, (_, x) in self.latest.items()}


def hub_actor(cls: type):
    """`cls` as one of the app's actors: no CPU reserved, and a threaded actor running up to
    HUB_CONCURRENCY calls at once. A plain actor ran one call at a time, so one slow call (a large
    chat list, a big response stored, a push) queued every other replica's call behind it, each
    waiting up to STALE_AFTER_S. Threads, not an async actor: the hubs' methods are plain Python
    that never awaits, so on an event loop a slow one would still hold up the rest; a thread gives
    way to the others (the GIL switches every few ms). Each hub keeps its data consistent under its
    own lock (MetricsHub._lock, lru_store.LruStore.lock), held only for short reads and writes; the
    calls of one caller still run in its order, since each waits for its answer (_HubClient._call)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=HUB_CONCURRENCY)(cls)


def metrics_hub(app_name: str = APP_NAME):
    """The app's hub actor, created by whoever asks first (detached: it outlives any replica, and
    ends itself once the app is gone)."""
    return (
        hub_actor(MetricsHub)
        .options(name=f"{app_name}-metrics", namespace=HUB_NAMESPACE, lifetime="detached", get_if_exists=True)
        .remote(app_name)
    )


def _push_forever(server, replica: str, app_name: str) -> None:
    """Replica thread: push this replica's metrics and load to the hub, and drain the server when
    the hub says shutdown has begun; find the hub again if it went away."""
    import ray

    from .app import DRAIN_GRACE_S

    hub = None
    while True:
        try:
            hub = hub or metrics_hub(app_name)
            push = hub.push.remote(replica, server.render_metrics()[0].decode(), len(server.jobs))
            if ray.get(push, timeout=STALE_AFTER_S):
                server.drain(DRAIN_GRACE_S)  # idempotent: refuse new requests, end the rest after the grace
        except Exception:  # noqa: BLE001 - metrics must never take a replica down
            hub = None
        time.sleep(PUSH_INTERVAL_S)


def drain_wait_s() -> float:
    """The longest drain_replicas waits: the drain's grace, two pushes (the replicas hear of the
    drain, then say they are idle) and an engine step to end the last requests."""
    from .app import DRAIN_GRACE_S

    return DRAIN_GRACE_S + 2 * PUSH_INTERVAL_S + DRAIN_STEP_S


def drain_replicas(app_name: str = APP_NAME) -> bool:
    """Tell every replica to drain and wait until none has a request in flight: running requests
    get DRAIN_GRACE_S, then end as on a single server (a 503, or an error event and [DONE]).
    False when the replicas did not all say so in time (the caller stops them anyway). Never
    longer than drain_wait_s(): each call to the hub gets only what is left of it."""
    import ray

    deadline = time.monotonic() + drain_wait_s()
    try:
        hub = ray.get_actor(f"{app_name}-metrics", namespace=HUB_NAMESPACE)
        ray.get(hub.drain.remote(), timeout=_left(deadline))
        while time.monotonic() < deadline:
            if ray.get(hub.drained.remote(), timeout=_left(deadline)):
                return True
            time.sleep(min(PUSH_INTERVAL_S / 4, _left(deadline)))
    except Exception:  # noqa: BLE001 - best effort on the way out: no hub, Ray already gone, or out of time
        log.debug("draining the replicas failed", exc_info=True)
    return False


def _left(deadline: float) -> float:
    """Seconds until deadline (time.monotonic), at most STALE_AFTER_S and never negative."""
    return max(0.0, min(STALE_AFTER_S, deadline - time.monotonic()))


def _serve_cluster_metrics(app, server, replica: str, app_name: str) -> None:
    """Replace the app's /metrics with all replicas' series; keep the own one at /metrics/replica."""
    from fastapi.responses import Response
    from prometheus_client import CONTENT_TYPE_LATEST

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/metrics"]

    @app.get("/metrics")
    async def cluster_metrics():
        hub = await asyncio.to_thread(metrics_hub, app_name)  # found by name: a blocking call to Ray's GCS
        texts = await hub.collect.remote()
        texts[replica] = server.render_metrics()[0].decode()  # this one, fresh
        return Response(merge_metrics(texts), media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics/replica")
    async def replica_metrics():
        content, content_type = server.render_metrics()
        return Response(content, media_type=content_type)


# -- the app's stores (Responses, stored chat completions) ---------------------------------------
def responses_hub(app_name: str = APP_NAME):
    """The app's store of finished Responses, one detached actor all replicas share (it ends
    itself once the app is gone)."""
    from .responses_api import ResponseStore

    return _store_hub(app_name, "responses", ResponseStore)


def chat_hub(app_name: str = APP_NAME):
    """The app's stored chat completions (`store: true`), one detached actor all replicas share
    (it ends itself once the app is gone)."""
    return _store_hub(app_name, "chat", ChatCompletionStore)


def _store_hub(app_name: str, kind: str, store_class: type):
    """The app's actor `<app>-<kind>` running `store_class`, created by whoever asks first."""
    return (
        hub_actor(_app_owned(store_class))
        .options(name=f"{app_name}-{kind}", namespace=HUB_NAMESPACE, lifetime="detached", get_if_exists=True)
        .remote(app_name)
    )


@functools.cache
def _app_owned(store_class: type) -> type:
    """`store_class` as an actor of the app: it ends with the app (`serve shutdown` left the
    Responses store running, with up to 64 MB of responses). The store's own logic, not a copy."""
    from .ray_app_owned import end_with_app

    def __init__(self, app_name: str = APP_NAME):
        store_class.__init__(self)
        end_with_app(app_name)

    name = store_class.__name__.replace("Store", "Hub")  # its name in Ray's actor list
    return type(name, (store_class,), {"__init__": __init__, "__qualname__": name, "__module__": __name__})


class _HubClient:
    """A replica's handle on one of the app's store actors: calls run there, so every replica
    sees what any of them kept."""

    blocking = True  # each call waits on the actor: the app makes it off its event loop (store_calls.py)

    def __init__(self, app_name: str = APP_NAME):
        self.app_name, self._hub = app_name, None

    def _find(self):
        """The actor this client calls, found (or created) by its name."""
        raise NotImplementedError

    # Calls that change nothing, so running one twice is harmless. The rest (put, update, delete)
    # are run again only when the first try cannot have counted (_may_repeat).
    READS = frozenset({"get", "messages", "body", "input_items", "item", "listing"})

    def _call(self, method: str, *args):
        """The hub's answer; the hub is looked up again once when the call fails (it was replaced).
        A write is not sent twice when the first may have run: a DELETE whose answer timed out had
        deleted, and its second run answered 404 (a put took a second place in the chat list).
        Calls run on many threads at once (store_calls.py): each uses the handle it found, which
        another call's failure may drop from `_hub` meanwhile."""
        import ray

        for attempt in (1, 2):
            sent = False
            try:
                hub = self._hub = self._hub or self._find()
                ref = getattr(hub, method).remote(*args)
                sent = True
                return ray.get(ref, timeout=STALE_AFTER_S)
            except Exception as e:
                self._hub = None
                if attempt == 2 or not self._may_repeat(method, sent, e):
                    raise
        return None

    def _may_repeat(self, method: str, sent: bool, error: Exception) -> bool:
        """Whether `method` may be sent again after `error`: a read always; a write when it was never
        sent, or when the actor died (what it did went with it; the hub found again is a new one)."""
        if method in self.READS or not sent:
            return True
        from ray.exceptions import ActorDiedError  # only where a write failed: a read needs no Ray type

        return isinstance(error, ActorDiedError)


class SharedResponseStore(_HubClient):
    """A replica's view of the shared Responses store (ResponseStore's methods, run in the hub
    actor), so `GET /v1/responses/{id}` and `previous_response_id` find a response whichever
    replica made it. Each replica kept its own: through 2 replicas about half of the lookups of a
    response just made got a 404 (GET) or a 400 previous_response_not_found (a chained turn)."""

    def _find(self):
        return responses_hub(self.app_name)

    def put(self, response_id: str, messages: list[dict], body: dict, input_items: list[dict] | None = None) -> None:
        self._call("put", response_id, messages, body, input_items)

    def messages(self, response_id: str) -> list[dict] | None:
        return self._call("messages", response_id)

    def body(self, response_id: str) -> dict | None:
        return self._call("body", response_id)

    def input_items(self, response_id: str) -> list[dict] | None:
        return self._call("input_items", response_id)

    def item(self, item_id: str) -> dict | None:
        return self._call("item", item_id)

    def delete(self, response_id: str) -> bool:
        return self._call("delete", response_id)


class SharedChatStore(_HubClient):
    """A replica's view of the shared stored chat completions (ChatCompletionStore's methods, run
    in the chat hub actor), so a completion stored through one replica is listed, read, updated
    and deleted through any. Each replica's own store would have missed the reads the proxy
    routes elsewhere, so `store: true` was refused under Ray until this was shared."""

    def _find(self):
        return chat_hub(self.app_name)

    def put(self, body: dict, messages: list[dict], metadata: dict | None) -> None:
        self._call("put", body, messages, metadata)

    def get(self, completion_id: str) -> dict | None:
        return self._call("get", completion_id)

    def messages(self, completion_id: str) -> list[dict] | None:
        return self._call("messages", completion_id)

    def update(self, completion_id: str, metadata: dict | None) -> dict | None:
        return self._call("update", completion_id, metadata)

    def delete(self, completion_id: str) -> bool:
        return self._call("delete", completion_id)

    def listing(
        self,
        model: str | None = None,
        metadata: dict | None = None,
        after: str | None = None,
        count: int = 20,
        desc: bool = False,
    ) -> list[dict] | None:
        return self._call("listing", model, metadata, after, count, desc)  # paged in the actor: `count` cross


class ReplicaHeader:
    """Pure ASGI middleware: name the answering replica in an `X-Specserve-Replica` header, so a
    client (or a test) can see where its request ran and check session affinity."""

    def __init__(self, app, replica: str):
        self.app, self.header = app, (b"x-specserve-replica", replica.encode())

    async def __call__(self, scope, receive, send):
        async def send_named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named if scope["type"] == "http" else send)


# -- the deployment -----------------------------------------------------------------------------
class SpecServeReplica:
    """One replica: its own LLM and the ordinary specserve FastAPI app over it."""

    def __init__(self, config: ReplicaConfig, app_name: str = APP_NAME):
        import torch
        from ray import serve

        from ..config import LoadOptions, SpeculationConfig
        from ..llm import LLM

        torch.set_num_threads(max(1, config.threads))
        self.config, self.app_name = config, app_name
        self.server = None  # the app's Server, once built
        self.replica = serve.get_replica_context().replica_tag
        speculation = SpeculationConfig(method=config.speculation, num_speculative_tokens=config.num_speculative_tokens)
        options = LoadOptions(
            backend=config.backend,
            dtype=config.dtype,
            device=config.device,
            threads=config.threads,
            exact=config.exact,
            gpu_layers=config.gpu_layers,
            max_context=config.max_context,
        )
        self.llm = LLM(
            model=config.model,
            draft_model=config.draft_model,
            speculation=speculation,
            options=options,
            limits=config.limits(),
        )

    def __serve_build_asgi_app__(self):
        """Ray Serve calls this after __init__: the app every HTTP request of this replica goes to."""
        from .app import ServerOptions, create_app

        c = self.config
        options = ServerOptions(
            api_key=c.api_key, max_queue=c.max_queue, request_timeout=c.request_timeout, max_body_bytes=c.max_body_bytes
        )
        app = create_app(
            self.llm, c.served_model_name, options, SharedResponseStore(self.app_name), SharedChatStore(self.app_name)
        )
        server = self.server = app.state.server
        _serve_cluster_metrics(app, server, self.replica, self.app_name)
        app.add_middleware(ReplicaHeader, replica=self.replica)
        threading.Thread(
            target=_push_forever, args=(server, self.replica, self.app_name), name="specserve-metrics-push", daemon=True
        ).start()
        return app

    def check_health(self) -> None:
        """Ray Serve's health check (every health_check_period_s): raising makes it replace this
        replica. A replica whose engine worker died answered 503 to every request for good, and
        the least-loaded routing sent it more of them (it answered fastest)."""
        server = self.server
        if server is not None and server.loop is not None and not server.engine.alive:
            raise RuntimeError(f"replica {self.replica}: its engine's worker thread died")


def deployment(config: ReplicaConfig, scale: ScaleConfig, app_name: str = APP_NAME):
    """The bound Ray Serve application: `serve.run(deployment(...))`."""
    from ray import serve

    cls = serve.deployment(name=DEPLOYMENT)(serve.ingress()(SpecServeReplica))
    return cls.options(**scale.deployment_options(config)).bind(config, app_name)


def build_app(args: dict) -> Any:
    """Ray Serve application builder: `serve run specserve.server.ray_serve:build_app model=... replicas=2`.

    Every ReplicaConfig and ScaleConfig field can be given as `key=value` (strings are converted).
    """
    return deployment(*builder_configs(args), args.get("app_name", APP_NAME))


def builder_configs(args: dict) -> tuple[ReplicaConfig, ScaleConfig]:
    """The builder's two configs. Without `threads`, a replica runs one thread per CPU it reserves,
    as `specserve serve --ray` does (a config file's `replica_cpus: 4` ran 1 thread on 4 CPUs)."""
    scale = config_from_args(ScaleConfig, args)
    replica = config_from_args(ReplicaConfig, args)
    if args.get("threads") in (None, ""):
        replica = replace(replica, threads=max(1, int(scale.replica_cpus)))
    return replica, scale


def config_from_args(cls, args: dict):
    """A ReplicaConfig / ScaleConfig from builder args: '2' becomes 2 only where the field is a number
    (an API key of digits stays a string)."""
    values = {}
    for f in fields(cls):
        value = args.get(f.name)
        if value in (None, ""):
            continue
        if isinstance(value, str) and "bool" in str(f.type):
            value = value.strip().lower() in ("1", "true", "yes", "on")
        elif isinstance(value, str) and "float" in str(f.type):
            value = float(value)
        elif isinstance(value, str) and "int" in str(f.type):
            value = int(value)
        values[f.name] = value
    return cls(**values)


# -- `specserve serve --ray` ---------------------------------------------------------------------
FLAG_DEFAULTS = {  # the Ray flags' defaults (serve refuses a flag set away from them without --ray)
    "ray_address": None,
    "replicas": 2,
    "min_replicas": None,
    "max_replicas": None,
    "target_ongoing_requests": 2.0,
    "replica_cpus": 1.0,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The Ray flags of `specserve serve` (used only with --ray)."""
    g = p.add_argument_group("Ray Serve (with --ray; needs pip install 'specserve[ray]')")
    g.add_argument("--ray", action="store_true", help="serve N replicas behind one endpoint with Ray Serve")
    g.add_argument(
        "--ray-address",
        default=FLAG_DEFAULTS["ray_address"],
        help="join this Ray cluster ('auto' or ray://host:10001); default: start a local one",
    )
    g.add_argument("--replicas", type=int, default=None, help="number of replicas (fixed; default 2)")
    g.add_argument("--min-replicas", type=int, default=None, help="autoscale: at least this many replicas")
    g.add_argument("--max-replicas", type=int, default=None, help="autoscale: at most this many replicas")
    g.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=None,
        help="autoscale: requests in flight per replica to aim for (default 2)",
    )
    g.add_argument(
        "--replica-cpus",
        type=float,
        default=None,
        help="CPUs reserved per replica (default 1)",
    )


def ray_flag(args: argparse.Namespace, name: str):
    """A Ray flag's value, or its default when not given: the parser leaves them None so that
    `serve` can tell a flag given at its default's value (`--replicas 2` without --ray) from none."""
    value = getattr(args, name)
    return FLAG_DEFAULTS[name] if value is None else value


def configs_from_args(args: argparse.Namespace, limits) -> tuple[ReplicaConfig, ScaleConfig]:
    """The `specserve serve` flags as the replica and scale configurations; `limits` (the engine
    flags as config.EngineLimits) reach each replica (they used to be dropped silently)."""
    scale = ScaleConfig(
        replicas=ray_flag(args, "replicas"),
        min_replicas=ray_flag(args, "min_replicas"),
        max_replicas=ray_flag(args, "max_replicas"),
        target_ongoing_requests=ray_flag(args, "target_ongoing_requests"),
        replica_cpus=ray_flag(args, "replica_cpus"),
    )  # first: it checks --replica-cpus, which threads reads
    replica = ReplicaConfig(
        model=args.model,
        draft_model=args.draft_model,
        backend=args.backend,
        dtype=args.dtype,
        device=args.device,
        speculation=args.speculation,
        num_speculative_tokens=args.num_speculative_tokens,
        served_model_name=args.served_model_name,
        api_key=args.api_key or os.environ.get("SPECSERVE_API_KEY") or None,
        max_queue=args.max_queue,
        request_timeout=args.request_timeout or None,
        max_body_bytes=args.max_body_bytes,
        threads=args.threads or max(1, int(scale.replica_cpus)),
        exact=args.exact,
        gpu_layers=args.gpu_layers,
        max_context=args.max_context,
        max_num_seqs=limits.max_num_seqs,
        kv_cache_tokens=limits.kv_cache_tokens,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        prefix_caching=limits.prefix_caching,
        host_cache_bytes=limits.host_cache_bytes,
        host_cache_dir=limits.host_cache_dir,
    )
    return replica, scale


def run(args: argparse.Namespace, limits) -> int:
    """Start (or join) a Ray cluster, run the app on --host:--port, block until interrupted. A start
    that fails ends in one line (SpecServeError) after the stop: the cluster this command started
    is stopped, one it joined is left running."""
    replica, scale = configs_from_args(args, limits)  # bad flags first, Ray installed or not
    try:
        from ray import serve
    except ImportError:
        raise SystemExit("specserve serve --ray needs Ray Serve: pip install 'specserve[ray]'") from None
    local = args.ray_address is None
    serving = False  # whether replicas may be serving (then the stop drains them)
    if local:  # the cluster this command starts ends with it, SIGKILL included
        ray_reaper.start()
    try:  # from here on: the app may serve before serve.run returns, and a Ctrl-C then must clean up too
        _start_step("ray.init", local, _init_ray, args)
        _start_step("ray.init", local, _check_cluster_fits, scale, local)  # asks the cluster: may raise Ray's errors
        _start_step("serve.start", local, serve.start, http_options={"host": args.host, "port": args.port})
        serving = True
        try:
            _deploy(replica, scale, local)
        except SpecServeError:  # it never served: nothing to drain
            serving = False
            raise
        print(f"specserve on Ray Serve: http://{args.host}:{args.port}/v1 ({_replica_summary(scale)})", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        shutdown(local=local, drain=serving)
    return 0


def _deploy(replica: ReplicaConfig, scale: ScaleConfig, local: bool) -> None:
    """serve.run of the app; a replica whose constructor raised is named by its own exception."""
    from ray import serve

    try:
        _start_step("serve.run", local, serve.run, deployment(replica, scale), name=APP_NAME, route_prefix="/")
    except SpecServeError as e:
        if type(e.__cause__) is not RuntimeError:  # Ray's own errors (RayTaskError(RuntimeError) too): as raised
            raise
        # Serve gave up deploying ("Deploying application specserve failed"): the replicas' constructor raised
        raise SpecServeError(f"the replicas failed to start: {_deploy_failure()}") from None


# What failed, for the one line a failed start ends in (keyed by the step that raised).
START_STEPS = {
    "ray.init": "the Ray cluster",
    "serve.start": "Ray Serve (its controller and HTTP proxy)",
    "serve.run": "the specserve app on Ray Serve",
}
RAY_LOGS = "/tmp/ray/session_latest/logs"


def _start_step(step: str, local: bool, fn, *args, **kwargs):
    """fn(*args, **kwargs), its errors (but ours and an interrupt) turned into one line naming the
    step and what to do. Ray's own (ActorDiedError under load, a proxy that cannot bind, a GCS or
    dashboard that did not start) ended `serve --ray` in a Python traceback."""
    try:
        return fn(*args, **kwargs)
    except SpecServeError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure to start is said in one line
        raise SpecServeError(start_failure(step, e, local)) from e


def start_failure(step: str, error: BaseException, local: bool) -> str:
    """The line a failed start ends in: what failed, Ray's reason (its first line), what to do. An
    error raised in one of Ray's actors (RayTaskError, whose text opens with the actor's name and
    pid) is named by the exception the actor raised: "RuntimeError: Failed to bind to address"."""
    cause = getattr(error, "cause", None)
    error = cause if isinstance(cause, BaseException) else error
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__
    where = f"the Ray logs ({RAY_LOGS})" if local else "the cluster's Ray logs (on its head node)"
    todo = "this command stopped the cluster it started" if local else "the cluster was left running"
    return f"{START_STEPS[step]} failed to start ({step}: {reason}); {todo}: see {where}, then try again"


def _init_ray(args: argparse.Namespace) -> None:
    """ray.init, then SIGTERM and SIGINT turned into KeyboardInterrupt (the clean stop). ray.init puts in
    SIGTERM handlers of its own: at first one that exits (SystemExit, taken here for an interrupt:
    the stop then ends what the cluster had started), then one that ends the process without the
    drain. A SIGTERM during ray.init used to leave Ray's dashboard and runtime-env agents running.
    SIGINT too: a background job of a shell without job control starts with SIGINT ignored, and
    Ctrl-C or `kill -INT` then did nothing (uvicorn, on a single server, sets its own handler)."""
    import ray

    try:
        ray.init(address=args.ray_address, namespace=HUB_NAMESPACE, log_to_driver=args.log_level == "debug")
    except SystemExit:
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _check_cluster_fits(scale: ScaleConfig, local: bool) -> None:
    """Refuse replicas the cluster this command started cannot place; on a cluster it joined (which
    may add nodes) say so and wait, as Ray Serve does."""
    import ray

    problem = scale.check_fits(ray.cluster_resources().get("CPU", 0.0))
    if problem and local:
        raise SpecServeError(problem)
    if problem:
        print(f"warning: {problem}; Ray Serve waits until the cluster has room", file=sys.stderr, flush=True)


def _deploy_failure(app_name: str = APP_NAME) -> str:
    """Why the replicas failed to start, in one line: the exception their constructor raised, the
    last `Type: message` line of the traceback in Serve's status (a model that did not load
    ended the command in Ray's own traceback, "Failed to update the deployments ['SpecServe']")."""
    from ray import serve

    try:
        status = serve.status().applications[app_name]
        text = status.deployments[DEPLOYMENT].message or status.message
    except Exception:  # noqa: BLE001 - no status to read: say where to look
        return "see the Ray logs (/tmp/ray/session_latest/logs)"
    return last_exception(text)


def last_exception(traceback_text: str) -> str:
    """`message (Type)` of the last exception a traceback's text names, else its last line."""
    raised = list(re.finditer(r"^([A-Za-z_][\w.]*): (.+)$", traceback_text, re.MULTILINE))
    if not raised:
        return traceback_text.strip().splitlines()[-1] if traceback_text.strip() else "no reason given by Ray Serve"
    name, message = raised[-1].groups()
    return f"{message} ({name.rsplit('.', 1)[-1]})"


def _replica_summary(scale: ScaleConfig) -> str:
    if not scale.autoscaled:
        return f"{scale.replicas} replicas"
    return f"autoscaling {scale.min_replicas or 1}..{scale.upper()} replicas"


# Each step of the stop is given at most this long (seconds), then left behind: Ray's own waits are
# 60 s (serve.delete), 30 s (serve.shutdown) and none at all (ray.shutdown), and one that hung held
# the Ctrl-C of `serve --ray` as long. Each normally takes a few seconds.
STOP_STEP_S = {"serve.delete": 20.0, "ray.kill": 5.0, "serve.shutdown": 15.0, "ray.shutdown": 15.0}
SETTLE_S = 3.0  # after an interrupted ray.init: how long the stop looks for the processes it still starts
END_WAIT_S = 5.0  # how long the cluster's processes get to end, after ray.shutdown and again after SIGTERM


def stop_bound_s() -> float:
    """The longest the stop of `serve --ray` takes, Ctrl-C to exit: the drain, every step at its
    deadline, and the cluster's last processes given SIGTERM, then SIGKILL."""
    return drain_wait_s() + SETTLE_S + sum(STOP_STEP_S.values()) + 2 * END_WAIT_S


def shutdown(local: bool, app_name: str = APP_NAME, drain: bool = True) -> None:
    """Drain the replicas (when they may be serving), remove the app and its hubs; stop Serve and
    Ray too when we started the cluster. Never longer than stop_bound_s(): a step that hangs is
    left behind with a warning naming it, and the next one runs."""
    import ray
    from ray import serve

    # what ray.shutdown may leave behind: a raylet stopped while it started its agents left them
    cluster = _cluster_processes(settle_s=0.0 if ray.is_initialized() else SETTLE_S) if local else set()
    if ray.is_initialized():
        _remove_app(app_name, drain)
    if local:
        if ray.is_initialized():
            _bounded("serve.shutdown", serve.shutdown)
        if not _bounded("ray.shutdown", ray.shutdown):  # also what an interrupted ray.init had started
            _skip_exit_shutdown(ray)
        _end_processes(cluster, END_WAIT_S)
    elif not _bounded("ray.shutdown", ray.shutdown):  # a joined cluster: only this driver disconnects
        _skip_exit_shutdown(ray)  # else Ray's exit hook disconnected, with no deadline


def _remove_app(app_name: str, drain: bool) -> None:
    """Drain the replicas (when they may be serving), then remove the app and its hubs."""
    from ray import serve

    if drain and not drain_replicas(app_name):
        log.warning("replicas still busy after the drain: stopping them anyway")
    _bounded("serve.delete", serve.delete, app_name)
    _bounded("ray.kill", _kill_hubs, app_name)


def _kill_hubs(app_name: str) -> None:
    """Kill the app's detached actors by name (those never created are not found)."""
    import ray

    for hub in ("metrics", "responses", "chat"):
        try:
            ray.kill(ray.get_actor(f"{app_name}-{hub}", namespace=HUB_NAMESPACE))
        except Exception:  # noqa: BLE001 - best effort on the way out (never created, or Ray gone)
            pass


def _bounded(step: str, fn, *args) -> bool:
    """Run one step of the stop on a thread of its own for at most STOP_STEP_S[step] seconds; False,
    and a warning naming it, when it was cut short (it is left running; the process ends anyway).
    Its errors are logged at debug level only: best effort on the way out."""
    done = threading.Event()

    def call() -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - Ray already gone, or the app never deployed
            log.debug("stopping: %s failed", step, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=call, name=f"specserve-stop-{step}", daemon=True).start()
    if done.wait(STOP_STEP_S[step]):
        return True
    log.warning("stopping: %s did not finish within %g s; going on without it", step, STOP_STEP_S[step])
    return False


def _skip_exit_shutdown(ray) -> None:
    """Drop Ray's own ray.shutdown at interpreter exit: after one that hung, a second would hang the
    exit the same way."""
    import atexit

    atexit.unregister(ray.shutdown)


def _cluster_processes(settle_s: float) -> set[int]:
    """This process's descendants (the local cluster's processes), and those that appear in the
    next settle_s seconds (a cluster interrupted while it started is still starting some); not
    the reaper, which sweeps once this process is gone (it ignores SIGTERM: the stop waited 5 s)."""
    seen = ray_reaper.descendants(os.getpid())
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        seen |= ray_reaper.descendants(os.getpid())
    return seen - {ray_reaper.reaper_pid}


def _end_processes(pids: set[int], wait_s: float = 5.0) -> None:
    """Kill those of `pids` still running after wait_s. ray.shutdown soon after the cluster started
    left its dashboard and runtime-env agents (started by the raylet) running for good."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + wait_s
        while (running := {p for p in pids if _running(p)}) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in running:
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def _running(pid: int) -> bool:
    """Whether pid is a live process (not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return False
