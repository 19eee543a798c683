#!/usr/bin/env python
"""A bounded hostile soak of `specserve serve`: a mix of good, bad and rude clients, faults
injected on purpose, and the server's resources before and after.

    python scripts/soak.py --model smollm2-135m-instruct --minutes 30 [--workers 16] [--out soak.json]

The script starts its own server on 127.0.0.1 (a free port) with SPECSERVE_FAULT_INJECT=1
(server/faults.py), so that it can inject faults and read the process's memory, threads and
open files. Then:

1. warm-up: the mix for --warmup seconds, then the engine idles; baseline RSS, threads, open files;
2. soak: --workers threads loop over the mix until --minutes are over, in two halves with the
   engine idle between them, while a fault in a step is injected every --fault-every seconds
   (its requests must fail with a 500 naming the injected fault, and the server must serve on);
3. idle: the engine must empty (active, queued and KV usage back to 0, in /health and /metrics);
   RSS, threads and open files again. The leak check is the second half's RSS growth: a leak
   grows with the requests served, in both halves alike, while bounded memory reaches its
   high-water early (the largest logits buffer, KV pages touched once). The prefix cache's
   host tier is bounded too, and its reported bytes are not counted;
4. worker death (unless --no-worker-death): the worker thread is killed on purpose with requests
   in flight; every one must be answered 503 within seconds, new requests get 503, /health 503.

The mix: plain chats (some stored), completions, long Predicted Outputs, json_schema answers,
forced tool calls, forced calls cut by a small max_tokens and streamed calls, logprobs with
top_logprobs (streamed and not), n=2, full streams, streams hung up mid-way, Responses API
requests (forced tool calls among them) and their typed streams, stored Responses streams hung
up, previous_response_id chains on recently stored responses, GET/POST/DELETE of stored responses
and chat completions while others write and delete them (a 404 is fine), scored prompts (`echo`
with `logprobs`, `logit_bias`), /tokenize, and malformed bodies (bad JSON, wrong types, 50 and
5,000 to 50,000 stop strings, unknown model), which must get a 4xx.

It prints a summary and exits 1 when anything failed: a server error (5xx, or an error event in
a stream) other than an injected one, a transport error, a malformed body not answered 4xx, a
good one answered 4xx, RSS grown over the second half by more than --rss-budget-mb, threads or open
files above their baseline, an engine not idle at the end, a /metrics that does not parse, or a
traceback in the server's log.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specserve.bench.load import SERVED_NAME, bench_server
from specserve.server.faults import ENV as FAULT_ENV

SAMPLES = Path(__file__).resolve().parents[1] / "src" / "specserve" / "bench" / "samples"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
# kind -> weight in the mix
MIX = {
    "plain": 4,
    "completion": 2,
    "prediction": 2,
    "json_schema": 2,
    "tool": 2,
    "n2": 2,
    "stream": 3,
    "hangup": 2,
    "responses": 2,
    "responses_stream": 2,
    "echo": 1,
    "tokenize": 1,
    "malformed": 2,
    "tool_cut": 2,
    "tool_stream": 2,
    "logprobs": 2,
    "responses_hangup": 2,
    "chain": 2,
    "stored_rw": 3,
}
HANGUPS = ("hangup", "responses_hangup")  # kinds whose client leaves a stream mid-way
STORED_ROUTES = (  # (method, path with {id}, which store): reads and deletes while others write
    ("GET", "/v1/responses/{id}", "responses"),
    ("GET", "/v1/responses/{id}/input_items", "responses"),
    ("DELETE", "/v1/responses/{id}", "responses"),
    ("GET", "/v1/chat/completions/{id}", "chat"),
    ("GET", "/v1/chat/completions/{id}/messages", "chat"),
    ("DELETE", "/v1/chat/completions/{id}", "chat"),
    ("POST", "/v1/chat/completions/{id}", "chat"),
    ("GET", "/v1/chat/completions", "chat"),
)


def proc_stats(pid: int) -> dict:
    """RSS (MB), threads and open files of a process, from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return {
        "rss_mb": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": int(fields["Threads"]),
        "open_files": len(os.listdir(f"/proc/{pid}/fd")),
    }


class Tally:
    """Outcomes by kind, and the failures worth reading (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.failures: list[str] = []
        self.injected = 0

    def add(self, kind: str, outcome: str, failure: str | None = None) -> None:
        with self.lock:
            self.counts[kind][outcome] += 1
            if failure is not None:
                self.failures.append(f"{kind}: {failure}")

    def total(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())


class Mix:
    """Request bodies of every kind, sized to the served model's context."""

    def __init__(self, max_model_len: int):
        source = (SAMPLES / "users_controller.py").read_text(encoding="utf-8").splitlines(keepends=True)
        budget = max_model_len * 3 // 8  # characters: about a tenth of the context in tokens, in prompt and prediction
        text, chars = [], 0
        for line in source:
            if chars + len(line) > budget:
                break
            text.append(line)
            chars += len(line)
        self.code = "".join(text)
        self.ids_lock = threading.Lock()
        self.ids = {"responses": collections.deque(maxlen=64), "chat": collections.deque(maxlen=64)}

    def remember(self, store: str, item_id: str | None) -> None:
        """Keep a stored id, for chains and for the reads and deletes of other workers."""
        if item_id:
            with self.ids_lock:
                self.ids[store].append(item_id)

    def recent(self, store: str, rng: random.Random) -> str:
        """One of the ids stored lately (some of them deleted since), or one never stored."""
        with self.ids_lock:
            ids = list(self.ids[store])
        return rng.choice(ids) if ids else f"{'resp' if store == 'responses' else 'chatcmpl'}-none"

    def chat(self, content: str, **extra) -> dict:
        return {"model": SERVED_NAME, "messages": [{"role": "user", "content": content}], **extra}

    def body(self, kind: str, rng: random.Random) -> tuple[str, dict | bytes, bool]:
        """(path, JSON body or raw bytes, whether it must be refused with a 4xx)."""
        temp = rng.choice([0, 0.7])
        if kind == "plain":
            return (
                "chat/completions",
                self.chat(
                    rng.choice(["Say hello.", "Count to ten.", "Name three colors."]),
                    max_tokens=rng.randint(8, 48),
                    temperature=temp,
                    store=rng.random() < 0.5,
                    metadata={"soak": "plain"},
                ),
                False,
            )
        if kind in ("tool_cut", "tool_stream"):
            cut = kind == "tool_cut"
            choice = rng.choice(["required", {"type": "function", "function": {"name": "get_weather"}}])
            body = self.chat(
                "What is the weather in Paris?",
                tools=[TOOL],
                tool_choice=choice,
                max_tokens=rng.randint(1, 14) if cut else 64,
                stream=rng.random() < 0.5 if cut else True,
                temperature=temp,
            )
            return "chat/completions", body, False
        if kind == "logprobs":
            body = self.chat(
                "Name three colors.",
                max_tokens=rng.randint(1, 24),
                logprobs=True,
                top_logprobs=rng.randint(0, 5),
                stream=rng.random() < 0.5,
                temperature=temp,
            )
            return "chat/completions", body, False
        if kind in ("responses_hangup", "chain"):
            body = {
                "model": SERVED_NAME,
                "input": "Go on.",
                "max_output_tokens": 24,
                "store": True,
                "temperature": temp,
            }
            if kind == "responses_hangup":
                body.update(stream=True, input="Tell a short story.", max_output_tokens=64)
            else:
                body.update(previous_response_id=self.recent("responses", rng), stream=rng.random() < 0.5)
            return "responses", body, False
        if kind == "completion":
            return (
                "completions",
                {"model": SERVED_NAME, "prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": temp},
                False,
            )
        if kind == "prediction":
            body = self.chat(
                "Add a docstring to the first function; answer with the whole file.\n\n" + self.code,
                max_tokens=256,
                temperature=0,
                prediction={"type": "content", "content": self.code},
            )
            return "chat/completions", body, False
        if kind == "json_schema":
            fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
            return (
                "chat/completions",
                self.chat("Invent a person as JSON.", max_tokens=64, response_format=fmt, temperature=temp),
                False,
            )
        if kind == "tool":
            return (
                "chat/completions",
                self.chat(
                    "What is the weather in Paris?",
                    tools=[TOOL],
                    max_tokens=64,
                    tool_choice={"type": "function", "function": {"name": "get_weather"}},
                ),
                False,
            )
        if kind == "n2":
            return "chat/completions", self.chat("Write a haiku.", n=2, max_tokens=24, temperature=0.8), False
        if kind in ("stream", "hangup"):
            return (
                "chat/completions",
                self.chat(
                    "Tell a short story.", max_tokens=64, stream=True, temperature=temp, store=rng.random() < 0.5
                ),
                False,
            )
        if kind in ("responses", "responses_stream"):
            body = {"model": SERVED_NAME, "input": "Tell a short story.", "max_output_tokens": 48, "temperature": temp}
            body["store"] = rng.random() < 0.7
            if kind == "responses_stream":
                body["stream"] = True
            elif rng.random() < 0.5:
                flat = {"type": "function", **TOOL["function"]}
                body.update(input="What is the weather in Paris?", tools=[flat], tool_choice="required")
            return "responses", body, False
        if kind == "echo":
            body = {"model": SERVED_NAME, "prompt": self.code[:400], "echo": True, "logprobs": 1, "max_tokens": 1}
            return "completions", {**body, "logit_bias": {"0": -100}} if rng.random() < 0.5 else body, False
        if kind == "tokenize":
            return "/tokenize", {"model": SERVED_NAME, "messages": [{"role": "user", "content": self.code}]}, False
        bad = rng.choice(["json", "type", "stops", "huge_stops", "model", "speculation"])
        if bad == "huge_stops":
            stops = [f"stop-{i}-" + "x" * rng.randint(0, 64) for i in range(rng.choice([5000, 50000]))]
            return "chat/completions", self.chat("hi", max_tokens=4, stop=stops, stream=rng.random() < 0.5), True
        if bad == "json":
            return "chat/completions", b'{"model": "x", "messages": [', True
        if bad == "type":
            return "chat/completions", {"model": SERVED_NAME, "messages": "hello", "max_tokens": 4}, True
        if bad == "stops":
            return "chat/completions", self.chat("hi", max_tokens=4, stop=[f"s{i}" for i in range(50)]), True
        if bad == "speculation":
            return "chat/completions", self.chat("hi", max_tokens=4, speculation="telepathy"), True
        return "chat/completions", {**self.chat("hi", max_tokens=4), "model": "no-such-model"}, True


def error_of(payload) -> dict | None:
    return payload.get("error") if isinstance(payload, dict) else None


def _response_error(payload: dict) -> dict | None:
    """A Responses API stream's `error` event, as an error object (any of them is the server's)."""
    if payload.get("type") != "error":
        return None
    return {"type": "server_error", "message": payload.get("message", ""), "code": payload.get("code")}


def judge(tally: Tally, kind: str, status: int, error: dict | None, refuse: bool) -> None:
    """Classify one answer (an SSE error event counts with its own status)."""
    message = (error or {}).get("message", "")
    if status >= 500 or (error is not None and error.get("type") == "server_error"):
        if "injected" in message:
            tally.add(kind, "injected")
        else:
            tally.add(kind, f"server_error {status}", f"{status} {message[:200]}")
    elif refuse:
        tally.add(kind, f"refused {status}", None if 400 <= status < 500 else f"malformed body answered {status}")
    elif status == 429:
        tally.add(kind, "busy 429")
    elif status != 200 or error is not None:
        tally.add(kind, f"client_error {status}", f"{status} {message[:200]}")
    else:
        tally.add(kind, "ok")


def stored_id(payload: dict) -> tuple[str, str | None]:
    """(which store, the id) of an answer or stream event that may be kept."""
    if payload.get("type") == "response.created":
        return "responses", (payload.get("response") or {}).get("id")
    if payload.get("object") == "response":
        return "responses", payload.get("id")
    return "chat", payload.get("id") if str(payload.get("object", "")).startswith("chat.completion") else None


def stored_rw(client: httpx.Client, url: str, mix: Mix, rng: random.Random, tally: Tally) -> None:
    """A read, update or delete of a stored response or chat completion, maybe while it is written
    or after another worker deleted it: a 200 or a 404, never a 5xx."""
    method, route, store = rng.choice(STORED_ROUTES)
    kind = f"stored {method} {route.split('{id}')[0].rstrip('/').rsplit('/', 1)[-1]}{route.split('{id}')[-1]}"
    body = {"metadata": {"soak": "updated"}} if method == "POST" else None
    try:
        r = client.request(method, url + route.format(id=mix.recent(store, rng)), json=body)
    except httpx.HTTPError as e:
        tally.add(kind, "transport_error", f"{type(e).__name__}: {e}")
        return
    if r.status_code == 404:
        tally.add(kind, "gone 404")
        return
    judge(tally, kind, r.status_code, error_of(r.json()), False)


def previous_gone(kind: str, status: int, payload, tally: Tally) -> bool:
    """A chain whose previous response another worker deleted, or that was never kept (a hung-up
    stream): OpenAI's 400 previous_response_not_found, counted apart."""
    if kind == "chain" and status in (400, 404) and "previous_response" in str(error_of(payload)):
        tally.add(kind, "previous gone")
        return True
    return False


def one_request(client: httpx.Client, url: str, mix: Mix, kind: str, rng: random.Random, tally: Tally) -> None:
    if kind == "stored_rw":
        stored_rw(client, url, mix, rng, tally)
        return
    path, body, refuse = mix.body(kind, rng)
    keep = isinstance(body, dict) and body.get("store", path == "responses")
    raw = isinstance(body, bytes)
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} if raw else {"json": body}
    target = f"{url}{path}" if path.startswith("/") else f"{url}/v1/{path}"  # /tokenize is not under /v1
    try:
        if isinstance(body, dict) and body.get("stream"):
            with client.stream("POST", target, **kw) as r:
                if r.status_code != 200:
                    r.read()
                    if previous_gone(kind, r.status_code, r.json(), tally):
                        return
                    judge(tally, kind, r.status_code, error_of(r.json()), refuse)
                    return
                error, done, chunks = None, False, 0
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        done = True
                        break
                    payload = json.loads(data)
                    if keep and chunks == 0:
                        mix.remember(*stored_id(payload))
                    error = error_of(payload) or _response_error(payload) or error
                    if payload.get("type") in ("response.completed", "response.incomplete"):
                        done = True  # the Responses API's last event (it sends no [DONE])
                    chunks += 1
                    if kind in HANGUPS and chunks >= rng.randint(2, 6):
                        tally.add(kind, "hung up")
                        return  # leaving the `with` closes the connection mid-stream
                if error is not None:
                    judge(tally, kind, 500 if error.get("type") == "server_error" else 400, error, refuse)
                elif not done:
                    tally.add(kind, "truncated stream", "the stream ended without [DONE]")
                else:
                    judge(tally, kind, 200, None, refuse)
            return
        r = client.post(target, **kw)
        try:
            payload = r.json()
        except ValueError:
            payload = None
        if keep and r.status_code == 200 and isinstance(payload, dict):
            mix.remember(*stored_id(payload))
        if previous_gone(kind, r.status_code, payload, tally):
            return
        judge(tally, kind, r.status_code, error_of(payload), refuse)
    except httpx.HTTPError as e:
        tally.add(kind, "transport_error", f"{type(e).__name__}: {e}")


def run_mix(url: str, mix: Mix, workers: int, seconds: float, tally: Tally, seed: int) -> None:
    kinds, weights = list(MIX), list(MIX.values())
    stop_at = time.monotonic() + seconds

    def work(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
            while time.monotonic() < stop_at:
                one_request(client, url, mix, rng.choices(kinds, weights)[0], rng, tally)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def inject_step_faults(url: str, every: float, stop: threading.Event, tally: Tally) -> None:
    while not stop.wait(every):
        r = httpx.post(f"{url}/debug/fault", json={"kind": "step"}, timeout=10)
        if r.status_code == 200:
            with tally.lock:
                tally.injected += 1


KEEP_ALIVE_S = 5  # uvicorn's timeout_keep_alive: an idle connection is closed after it


def idle_stats(url: str, pid: int) -> tuple[dict, float]:
    """Once the engine is idle: the process's stats, and the MB its prefix cache's host tier
    holds (a bounded cache, not a leak; 0 without one). Sampled past uvicorn's keep-alive
    timeout (5 s), so that connections the clients left open are closed by then."""
    wait_idle(url)
    time.sleep(KEEP_ALIVE_S + 1)
    stats = proc_stats(pid)  # before the request below opens a connection of its own
    return stats, host_tier_mb(url)


def host_tier_mb(url: str) -> float:
    """The MB the prefix cache's host tier holds, as /health reports it (0 without one)."""
    cache = (httpx.get(f"{url}/health", timeout=10).json().get("prefix_cache") or {}).get("host") or {}
    return cache.get("bytes", 0) / 2**20


def half(requests: int, start: dict, start_cache: float, end: dict, end_cache: float) -> dict:
    """One half of the soak: its requests and RSS growth, in all and beyond the host tier's own.
    A leak grows with the requests served, alike in both halves; the high-water of bounded
    memory grows in the first half only."""
    grown = end["rss_mb"] - start["rss_mb"]
    return {
        "requests": requests,
        "rss_growth_mb": round(grown, 1),
        "host_tier_growth_mb": round(end_cache - start_cache, 1),
        "beyond_host_tier_mb": round(grown - (end_cache - start_cache), 1),
    }


def wait_idle(url: str, timeout: float = 60.0) -> dict:
    """/health once the engine holds nothing (or the last answer at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(f"{url}/health", timeout=10).json()
        if (health["active"] == 0 and health["queued"] == 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def metrics_parse(text: str) -> bool:
    """Whether /metrics is valid Prometheus text (what a scraper reads)."""
    try:
        return bool(list(text_string_to_metric_families(text)))
    except ValueError:
        return False


def log_tracebacks(path: Path) -> int:
    """Tracebacks in the server's log: each is a fault the server did not answer for."""
    return path.read_text(encoding="utf-8", errors="replace").count("Traceback") if path.exists() else 0


def kill_worker(url: str, mix: Mix) -> dict:
    """Kill the worker with requests in flight; every answer must be a prompt 503."""
    httpx.post(f"{url}/debug/fault", json={"kind": "worker", "after": 3}, timeout=10).raise_for_status()
    tally = Tally()
    t0 = time.monotonic()
    threads = []
    for i in range(4):
        kind = "stream" if i % 2 else "plain"

        def go(kind=kind, i=i):
            with httpx.Client(timeout=60.0) as client:
                one_request(client, url, mix, kind, random.Random(i), tally)

        threads.append(threading.Thread(target=go, daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(90)
    answered_s = time.monotonic() - t0
    refused = httpx.post(f"{url}/v1/chat/completions", json=mix.chat("hi", max_tokens=4), timeout=30)
    health = httpx.get(f"{url}/health", timeout=10)
    outcomes = {k: dict(v) for k, v in tally.counts.items()}
    ok = (
        all(t.is_alive() is False for t in threads)
        and refused.status_code == 503
        and health.status_code == 503
        and not any("transport" in o or "truncated" in o for v in outcomes.values() for o in v)
    )
    return {
        "in_flight": outcomes,
        "answered_s": round(answered_s, 2),
        "new_request_status": refused.status_code,
        "health_status": health.status_code,
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model spec for `specserve serve --model` (a pack name or a path)")
    p.add_argument("--minutes", type=float, default=30.0, help="length of the soak phase (default 30)")
    p.add_argument("--workers", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument(
        "--warmup",
        type=float,
        default=None,
        metavar="SECONDS",
        help="warm-up before the baseline (default: 10%% of the soak, 20 to 120 s)",
    )
    p.add_argument(
        "--fault-every",
        type=float,
        default=90.0,
        metavar="SECONDS",
        help="inject a fault in a step this often (0: never; default 90). Each one fails every request "
        "of that step, up to --max-num-seqs of them: keep it rare enough that most requests finish",
    )
    p.add_argument("--no-worker-death", action="store_true", help="skip the final worker-death phase")
    p.add_argument(
        "--rss-budget-mb",
        type=float,
        default=64.0,
        help="allowed RSS growth over the soak's second half, beyond the host tier's reported bytes (default 64)",
    )
    p.add_argument(
        "--inject-leak-mb",
        type=int,
        default=0,
        metavar="MB",
        help="leak this many MiB on purpose in the second half (1 MiB a pass), to see the memory check fail",
    )
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the summary as JSON here")
    p.add_argument(
        "--log", type=Path, default=Path("soak-server.log"), help="the server's log (default ./soak-server.log)"
    )
    p.add_argument("serve_args", nargs="*", help="more `specserve serve` flags, after --")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.workers < 1:
        p.error("--minutes must be > 0 and --workers >= 1")
    soak_s = args.minutes * 60
    warmup_s = args.warmup if args.warmup is not None else min(120.0, max(20.0, soak_s / 10))

    os.environ[FAULT_ENV] = "1"  # read by the server process at start
    engine_args = ["--max-queue", str(4 * args.workers), "--request-timeout", "300", *args.serve_args]
    with bench_server(["--model", args.model], args.max_num_seqs, args.log, engine_args) as server:
        url, pid = server.url, server.proc.pid
        card = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
        mix = Mix(card.get("max_model_len") or 2048)
        print(
            f"server pid {pid} on {url}; model {args.model} ({card.get('max_model_len')} tokens); "
            f"{args.workers} workers; warm-up {warmup_s:.0f} s, soak {soak_s:.0f} s",
            flush=True,
        )

        warm = Tally()
        run_mix(url, mix, args.workers, warmup_s, warm, args.seed)
        wait_idle(url)
        time.sleep(2)
        base, base_cache = proc_stats(pid), host_tier_mb(url)
        print(f"warm-up: {warm.total()} requests; baseline {base}", flush=True)

        tally, stop = Tally(), threading.Event()
        injector = threading.Thread(target=inject_step_faults, args=(url, args.fault_every, stop, tally), daemon=True)
        if args.fault_every > 0:
            injector.start()
        t0 = time.monotonic()
        run_mix(url, mix, args.workers, soak_s / 2, tally, args.seed + 1)
        mid, mid_cache = idle_stats(url, pid)
        mid_requests = tally.total()
        print(f"half-way: {tally.total()} requests; {mid}", flush=True)
        if args.inject_leak_mb:  # the memory check, seen to fail: each pass keeps 1 MiB until it has leaked this much
            httpx.post(f"{url}/debug/fault", json={"kind": "leak", "after": args.inject_leak_mb}, timeout=10)
        run_mix(url, mix, args.workers, soak_s / 2, tally, args.seed + 2)
        stop.set()
        elapsed = time.monotonic() - t0
        end, end_cache = idle_stats(url, pid)
        health = httpx.get(f"{url}/health", timeout=10).json()
        text = httpx.get(f"{url}/metrics", timeout=10).text
        gauges = {
            name: metric(text, name)
            for name in ("specserve_active_requests", "specserve_queue_depth", "specserve_kv_cache_usage")
        }
        parsed = metrics_parse(text)
        tracebacks = log_tracebacks(args.log)  # before the worker is killed on purpose
        death = None if args.no_worker_death else kill_worker(url, mix)

    outcomes = {k: dict(v) for k, v in sorted(tally.counts.items())}
    server_errors = sum(n for v in outcomes.values() for o, n in v.items() if o.startswith("server_error"))
    injected_failures = sum(v.get("injected", 0) for v in outcomes.values())
    # a leak grows with the requests served, so the second half grows as much as the first; what
    # only the first half grows is the high-water of bounded memory (the largest logits buffer,
    # cache pages touched once), and the host tier is a bounded cache that reports its bytes
    leak_mb = end["rss_mb"] - mid["rss_mb"] - (end_cache - mid_cache)
    checks = {
        "no server errors but injected ones": server_errors == 0,
        "no other failures": not tally.failures,
        f"RSS within +{args.rss_budget_mb:g} MB over the second half": leak_mb <= args.rss_budget_mb,
        "threads back to baseline": end["threads"] <= base["threads"],
        "open files back to baseline": end["open_files"] <= base["open_files"],
        "/metrics parses": parsed,
        "no traceback in the server log": tracebacks == 0,
        "engine idle (health and gauges)": health["active"] == 0
        and health["queued"] == 0
        and health["kv_cache_usage"] == 0
        and all(v == 0 for v in gauges.values()),
    }
    if args.fault_every > 0:
        checks["injected faults failed requests"] = tally.injected == 0 or injected_failures > 0
    if death is not None:
        checks["a dead worker answers 503 to every request, at once"] = death["ok"]
    summary = {
        "model": args.model,
        "workers": args.workers,
        "soak_s": round(elapsed, 1),
        "requests": tally.total(),
        "requests_per_s": round(tally.total() / elapsed, 2),
        "outcomes": outcomes,
        "faults_injected": tally.injected,
        "requests_failed_by_injected_faults": injected_failures,
        "server_errors_not_injected": server_errors,
        "baseline": base,
        "end": end,
        "half_way": mid,
        "rss_growth_mb": round(end["rss_mb"] - base["rss_mb"], 1),
        "host_tier_mb": round(end_cache, 1),
        "rss_growth_second_half_mb": round(leak_mb, 1),
        "halves": [
            half(mid_requests, base, base_cache, mid, mid_cache),
            half(tally.total() - mid_requests, mid, mid_cache, end, end_cache),
        ],
        "health_end": {k: health[k] for k in ("status", "active", "queued", "kv_cache_usage")},
        "gauges_end": gauges,
        "worker_death": death,
        "failures": tally.failures[:50],
        "checks": checks,
        "ok": all(checks.values()),
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
