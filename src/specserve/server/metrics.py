"""Prometheus metrics for the server, in a registry of their own so tests can build many apps.

Acceptance rate per source = rate(specserve_spec_accepted_tokens_total) /
rate(specserve_spec_proposed_tokens_total); mean accepted length per step =
rate(accepted) / rate(specserve_spec_steps_total); tokens per step = that + 1.
Prefix cache hit rate (in tokens, as vLLM's) = rate(specserve_prompt_tokens_cached_total) /
rate(specserve_prefix_cache_queried_tokens_total), per prompt = rate(specserve_prefix_cache_hit_requests_total)
/ rate(specserve_prefix_cache_lookups_total): all four are the prefix cache's own counts of the
prompts admitted (/health's `prefix_cache`), so a request hung up, timed out or failed after its
admission is in both terms. specserve_prompt_tokens_total is the answers' usage and leaves those
out: against it the cached tokens read high.
"""

from __future__ import annotations

import threading

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ..engine.stats import SOURCES, RequestOutput

REUSE = ("lookups", "hits", "tokens_queried", "tokens_saved")  # the prefix cache's totals that /metrics counts
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Metrics:
    """Every series the server exports; `observe_usage` records one answer's token counts and
    `observe_latency` its latencies, once per answer however many choices it has."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._totals_lock = threading.Lock()
        self._totals_seen: dict[str, int] = {}  # the engine's running totals, as last counted
        self.requests = Counter(
            "specserve_requests",
            "Requests by endpoint and outcome status (499: client went away, 504: timed out)",
            ["endpoint", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "specserve_time_to_first_token_seconds",
            "Arrival to first output token (queue wait included)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "specserve_time_per_output_token_seconds",
            "Mean time per output token after the first",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "specserve_e2e_request_latency_seconds",
            "Arrival to last byte",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "specserve_prompt_tokens",
            "Prompt tokens of the answers sent (their usage; not a hit rate's base)",
            registry=r,
        )
        self.cached_tokens = Counter(
            "specserve_prompt_tokens_cached",
            "Prompt tokens reused from the prefix cache instead of prefilled, of every admitted prompt",
            registry=r,
        )
        self.queried_tokens = Counter(
            "specserve_prefix_cache_queried_tokens",
            "Prompt tokens of every admitted prompt, answered or not (the token hit rate's base)",
            registry=r,
        )
        self.prefix_lookups = Counter(
            "specserve_prefix_cache_lookups",
            "Prompts admitted, answered or not (each prompt of an answer once, whatever its n)",
            registry=r,
        )
        self.prefix_hits = Counter(
            "specserve_prefix_cache_hit_requests",
            "Admitted prompts that started from a cached prefix (each prompt of an answer once, whatever its n)",
            registry=r,
        )
        self.prefix_cells = Gauge(
            "specserve_prefix_cache_cells",
            "KV cache cells held by cached prefixes of finished requests (evicted first when a request needs room)",
            registry=r,
        )
        self.host_bytes = Gauge(
            "specserve_prefix_cache_host_bytes",
            "Host memory held by cached prefixes saved out of the KV cache (restored when a prompt starts like one)",
            registry=r,
        )
        self.host_restored = Counter(
            "specserve_prefix_cache_host_restored_tokens",
            "Prompt tokens restored from host memory instead of prefilled",
            registry=r,
        )
        self.lost_sequences = Gauge(
            "specserve_lost_sequences",
            "Sequences the backend failed to free, retired for good with their cells (0 unless the backend is failing)",
            registry=r,
        )
        self.completion_tokens = Counter("specserve_completion_tokens", "Output tokens generated", registry=r)
        self.queue_depth = Gauge(
            "specserve_queue_depth", "Requests waiting for a place in the running batch", registry=r
        )
        self.active = Gauge(
            "specserve_active_requests", "Requests in the running batch (prefilling or decoding)", registry=r
        )
        self.batch_size = Histogram(
            "specserve_batch_size", "Requests decoding in one engine step", buckets=BATCH_BUCKETS, registry=r
        )
        self.step_tokens = Histogram(
            "specserve_scheduled_tokens",
            "Tokens one engine step fed the target (pending + draft + prefill)",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.step_draft_tokens = Counter(
            "specserve_step_draft_tokens", "Draft tokens verified, summed over steps", registry=r
        )
        self.step_seconds = Histogram(
            "specserve_step_seconds",
            "Wall time of one engine step's target pass",
            buckets=TPOT_BUCKETS + (5.0, 10.0),
            registry=r,
        )
        self.kv_usage = Gauge(
            "specserve_kv_cache_usage", "Share of the KV cache reserved by running requests", registry=r
        )
        self.proposed = Counter(
            "specserve_spec_proposed_tokens", "Draft tokens sent to the target", ["source"], registry=r
        )
        self.accepted = Counter(
            "specserve_spec_accepted_tokens", "Draft tokens the target accepted", ["source"], registry=r
        )
        self.steps = Counter(
            "specserve_spec_steps", "Target verification passes (source 'none': no draft)", ["source"], registry=r
        )
        for s in SOURCES:  # export zeros from the start so rates are defined
            for c in (self.proposed, self.accepted, self.steps):
                c.labels(source=s)

    def observe_step(self, info) -> None:
        """One engine step (engine.core.StepInfo); called on the engine's worker thread."""
        self.batch_size.observe(info.decoding)
        self.step_tokens.observe(info.tokens)
        self.step_draft_tokens.inc(info.draft_tokens)
        self.step_seconds.observe(info.seconds)
        for source, (proposed, accepted, steps) in info.speculation.items():
            self.proposed.labels(source=source).inc(proposed)
            self.accepted.labels(source=source).inc(accepted)
            self.steps.labels(source=source).inc(steps)

    def set_engine_state(
        self, waiting: int, running: int, cache_used: float, cached_cells: int, host: dict | None = None
    ) -> None:
        """The gauges, read from the engine when /metrics is scraped (not from the last step: after
        it the engine may have emptied, failed or died, and the gauges must say so). host: the
        prefix cache's host tier stats (engine/host_cache.py), if it has one."""
        self.queue_depth.set(waiting)
        self.active.set(running)
        self.kv_usage.set(cache_used)
        self.prefix_cells.set(cached_cells)
        self.host_bytes.set(host["bytes"] if host else 0)
        if host:
            self._count_total(self.host_restored, "host_tokens_restored", host["tokens_restored"])

    def request(self, endpoint: str, status: int | str) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def observe_usage(self, usage: dict) -> None:
        """One answer's token counts, as its `usage` reports them: a prompt counts once however
        many choices it has, and a scored prompt (completions `max_tokens: 0`) has no completion
        tokens (counted per choice before, the counters drifted from the answers' usage)."""
        self.prompt_tokens.inc(usage["prompt_tokens"])
        self.completion_tokens.inc(usage["completion_tokens"])

    def set_prefix_reuse(self, stats: dict | None) -> None:
        """The prefix cache's running totals (engine/prefix_cache.py: `lookups`, `hits`,
        `tokens_queried`, `tokens_saved`), read from the engine when /metrics is scraped, so the
        counters equal /health's `prefix_cache` by construction: a prompt is looked up when it is
        admitted, whether or not its answer is ever sent (counted from the answers sent in full
        before, a stream hung up after its prefix hit left /health ahead for good). Each prompt
        counts once; the choices of n > 1 that copy choice 0's prefill are not lookups of their
        own. stats: None when off."""
        if stats is None:
            return
        for key, counter in zip(REUSE, self._reuse_counters(), strict=True):
            self._count_total(counter, key, stats[key])

    def _count_total(self, counter: Counter, key: str, total: int) -> None:
        """Advance `counter` to the engine's running total `total` (named `key`): by what it grew
        since last read, never back. Scrapes and Ray's push thread may read at once: each delta once."""
        with self._totals_lock:
            seen = self._totals_seen.get(key, 0)
            counter.inc(max(0, total - seen))
            self._totals_seen[key] = max(total, seen)

    def _reuse_counters(self) -> tuple[Counter, ...]:
        """The counters of the prefix cache's totals, in REUSE's order."""
        return self.prefix_lookups, self.prefix_hits, self.queried_tokens, self.cached_tokens

    def observe_latency(self, outputs: list[RequestOutput], ttft: float | None, e2e: float, endpoint: str) -> None:
        """Latencies of one answer, observed once however many choices (n) or prompts it has, as
        specserve_requests_total counts it (each choice was a sample before, so n = 3 counted 3).
        Its choices decode side by side: the time per token after the first is that of the
        longest one."""
        self.e2e.labels(endpoint=endpoint).observe(e2e)
        tokens = max((o.stats.output_tokens for o in outputs), default=0)
        if ttft is not None:
            self.ttft.observe(ttft)
            if tokens > 1:
                self.tpot.observe((e2e - ttft) / (tokens - 1))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses"}
PROBES = frozenset({"/health", "/metrics"})  # monitoring, not API requests: not counted
OWNED = "specserve.counted"  # scope key: a one-item list the route sets to True when it counts the request itself


def endpoint_label(scope) -> str:
    """The `endpoint` label of a request: its generation route's name, or "other"."""
    return ENDPOINTS.get(scope.get("path", ""), "other") if scope.get("method") == "POST" else "other"


class CountResponses:
    """Pure ASGI middleware, outermost: counts in specserve_requests_total every answer that the
    route did not count itself (the generation routes count theirs, with the status a stream's
    error event carried or 499): a 401 from the API key check, a 413 from the body cap, a 404 or
    405, a route's 400, a 500 from a bug. Nothing sent at all (the client went away) is a 499.
    Before, only what the generation handler saw was counted: 401s and 413s never were."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") in PROBES:
            return await self.app(scope, receive, send)
        owned, status = scope.setdefault(OWNED, [False]), None

        async def watch(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            status = status or 500  # the app's error handler answers it
            raise
        finally:
            if not owned[0]:
                self.metrics.request(endpoint_label(scope), status or 499)
