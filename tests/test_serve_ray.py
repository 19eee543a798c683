"""Ray Serve: `specserve serve --ray` with 2 replicas of the tiny model behind one endpoint.

The tests that need Ray (marker `ray`, excluded by default; `make test-ray`, which CI runs,
installs `specserve[ray]` and runs them with `pytest -m ray`; a missing Ray fails them) start
the real command in a child process, which starts a local Ray cluster. They check that outputs
equal a single server's, session affinity, per-replica metrics, and that 16 concurrent streams
survive a replica killed mid-load (each completes or fails with an error a client retries),
after which the service is back to 2 replicas.
The pure helpers (metrics merging, rendezvous order, flag parsing) are tested without Ray.
"""

from __future__ import annotations

import functools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from server_proc import ServerProcess, metric_value
from tiny import save_tiny
from waiting import wait_until

from specserve.server import faults, ray_serve
from specserve.server.ray_serve import (
    ReplicaConfig,
    ScaleConfig,
    _rendezvous_order,
    config_from_args,
    merge_metrics,
)

MODEL = "tiny"
CLIENTS, MAX_TOKENS = 16, 300
PROMPTS = ["def add(a, b):", "class UserController:", "import os\nimport", "function getUser(req, res) {"]
REPLICA_PROC = "ServeReplica:specserve:SpecServe"  # the replica processes' title


# -- without Ray --------------------------------------------------------------------------------
def test_merge_metrics_labels_every_sample_with_its_replica():
    text = (
        "# HELP specserve_queue_depth q\n# TYPE specserve_queue_depth gauge\nspecserve_queue_depth 2.0\n"
        "# HELP specserve_requests_total r\n# TYPE specserve_requests_total counter\n"
        'specserve_requests_total{endpoint="chat",status="200"} 3.0\n'
    )
    merged = merge_metrics({"a": text, "b": text.replace("3.0", "5.0")})
    assert metric_value(merged, "specserve_queue_depth", replica="a") == 2.0
    assert metric_value(merged, "specserve_requests_total", replica="b", status="200") == 5.0
    assert metric_value(merged, "specserve_requests_total") == 8.0
    assert merged.count("# TYPE specserve_requests_total counter") == 1  # one family, both replicas


def test_rendezvous_order_is_stable_and_moves_only_lost_sessions():
    replicas = ["r1", "r2", "r3"]
    sessions = [f"user-{i}" for i in range(200)]
    first = {s: _rendezvous_order(s, replicas)[0] for s in sessions}
    assert first == {s: _rendezvous_order(s, list(reversed(replicas)))[0] for s in sessions}
    assert len(set(first.values())) == 3  # sessions spread over all replicas
    after = {s: _rendezvous_order(s, ["r1", "r3"])[0] for s in sessions}
    assert all(after[s] == first[s] for s in sessions if first[s] != "r2")


@pytest.mark.ray
def test_scale_flags_become_ray_deployment_options():
    fixed = ScaleConfig(replicas=3).deployment_options(ReplicaConfig(max_queue=4))
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["max_ongoing_requests"] == 2 and fixed["max_queued_requests"] == 12
    assert fixed["request_router_config"].request_router_class == "specserve.server.ray_serve.AffinityRouter"
    # a full queue answers as on a single server (test_serve_ray_queue_full checks it through the proxy)
    assert fixed["backpressure_config"].status_code == 429 and fixed["backpressure_config"].retry_after_s == 1
    # a replica Ray stops (scale-down, redeploy) may finish its longest request: it was 5 s, and
    # longer streams were cut with no error
    assert fixed["graceful_shutdown_timeout_s"] > ReplicaConfig(max_queue=4).request_timeout == 600.0
    no_limit = ScaleConfig().deployment_options(ReplicaConfig(request_timeout=None))
    assert no_limit["graceful_shutdown_timeout_s"] >= 3600.0
    auto = ScaleConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=3).deployment_options(ReplicaConfig())
    assert "num_replicas" not in auto and auto["max_queued_requests"] == 16 * 4
    assert auto["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 2,
        "target_ongoing_requests": 3,
    }


def test_a_replica_that_failed_to_start_is_named_by_its_own_exception():
    """Serve's status holds the replica's traceback; the command printed Ray's own instead."""
    from specserve.server.ray_serve import last_exception

    status = (
        "Failed to update the deployments.\nTraceback (most recent call last):\n"
        '  File "loader.py", line 128, in load_tokenizer\n    raise ModelLoadError(f"...") from e\n'
        "specserve.errors.ModelLoadError: cannot load the tokenizer of 'broken': Couldn't instantiate"
    )
    assert last_exception(status) == "cannot load the tokenizer of 'broken': Couldn't instantiate (ModelLoadError)"
    assert last_exception("the replica died\n") == "the replica died"


def test_replicas_that_do_not_fit_the_cluster_are_named():
    assert ScaleConfig(replicas=2).check_fits(2.0) is None
    assert ScaleConfig(replicas=3).check_fits(2.0) == (
        "3 replicas x --replica-cpus 1 need 3 CPUs and this Ray cluster has 2: "
        "ask for fewer replicas or a smaller --replica-cpus"
    )
    assert ScaleConfig(replicas=3, replica_cpus=0.5).check_fits(2.0) is None
    assert ScaleConfig(replicas=1, replica_cpus=0).check_fits(0.0) is None
    assert ScaleConfig(min_replicas=1, max_replicas=8).check_fits(2.0) is None  # starts with 1, may grow
    assert ScaleConfig(min_replicas=3, max_replicas=8).check_fits(2.0) is not None


def test_builder_args_convert_numbers_only_where_the_field_is_a_number():
    replica = config_from_args(
        ReplicaConfig, {"model": "m", "api_key": "12345", "max_queue": "4", "request_timeout": "30", "dtype": "float32"}
    )
    assert replica == ReplicaConfig(model="m", api_key="12345", max_queue=4, request_timeout=30.0, dtype="float32")
    scale = config_from_args(ScaleConfig, {"replicas": "3", "target_ongoing_requests": "1.5", "unknown": "x"})
    assert scale == ScaleConfig(replicas=3, target_ongoing_requests=1.5)


def test_a_config_files_replica_cpus_are_its_threads_as_with_the_flag():
    """`specserve serve --ray --replica-cpus 4` runs 4 threads per replica, but build_app (`serve run`,
    docs/deploy.md's serve.yaml with `replica_cpus: 4`) reserved 4 CPUs and ran 1 thread on them."""
    from specserve.server.ray_serve import builder_configs

    replica, scale = builder_configs({"model": "m", "replica_cpus": "4"})
    assert (replica.threads, scale.replica_cpus) == (4, 4.0)
    assert builder_configs({"replica_cpus": "4", "threads": "2"})[0].threads == 2  # given: kept
    assert builder_configs({"replica_cpus": "0.5"})[0].threads == 1
    assert builder_configs({})[0].threads == 1


def test_every_engine_flag_reaches_the_replicas():
    """--max-context, --max-num-seqs, --kv-cache-tokens, ... were dropped silently with --ray."""
    from specserve.cli.generate import engine_limits
    from specserve.cli.main import build_parser
    from specserve.config import EngineLimits
    from specserve.server.ray_serve import configs_from_args

    flags = "--max-context 1024 --max-num-seqs 3 --kv-cache-tokens 4096 --max-num-batched-tokens 512"
    args = build_parser().parse_args(["serve", "--ray", *flags.split(), "--no-prefix-cache"])
    replica, _ = configs_from_args(args, engine_limits(args))
    assert replica.max_context == 1024
    assert replica.limits() == EngineLimits(
        max_num_seqs=3, kv_cache_tokens=4096, max_num_batched_tokens=512, prefix_caching=False
    )
    assert ReplicaConfig().limits() == EngineLimits()
    built = config_from_args(ReplicaConfig, {"prefix_caching": "false", "max_num_seqs": "2", "host_cache_dir": "kv"})
    assert built.limits() == EngineLimits(max_num_seqs=2, prefix_caching=False, host_cache_dir="kv")


def test_a_replicas_metrics_read_the_engine_when_asked():
    """The replicas pushed (and /metrics/replica answered) `metrics.render()` as it stood: its
    gauges are set only by the single server's /metrics route, so through Ray every replica said
    0 requests running and an empty KV cache while 3 requests ran (seen with /health beside it)."""
    from fastapi.testclient import TestClient
    from tiny import tiny_model, tiny_tokenizer

    from specserve.llm import LLM
    from specserve.server.app import create_app
    from specserve.server.ray_serve import _serve_cluster_metrics

    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    app = create_app(llm, MODEL)
    server = app.state.server
    _serve_cluster_metrics(app, server, "r1", "test")
    server.engine.submit([llm.request("def add(a, b):") for _ in range(3)])  # no worker (no lifespan): they wait
    own = TestClient(app).get("/metrics/replica").text
    assert metric_value(own, "specserve_queue_depth") == 3
    assert metric_value(server.render_metrics()[0].decode(), "specserve_queue_depth") == 3  # what a replica pushes


class _FakeRay:
    """What ray_serve asks of `ray` to create the app's actors and to remove them, recorded: actors
    by name and namespace, and the names killed. An actor never created is not found (as in Ray)."""

    def __init__(self):
        self.created: dict[str, str] = {}  # name -> namespace
        self.killed: list[str] = []
        self.actor_options: list[dict] = []  # ray.remote's options, one per actor class made
        self.serve = types.SimpleNamespace(delete=lambda name: None)

    def remote(self, **options):
        self.actor_options.append(options)
        return lambda cls: self

    def options(self, name: str, namespace: str, **kw):
        self.created[name] = namespace
        return types.SimpleNamespace(remote=lambda *args: name)

    def get_actor(self, name: str, namespace: str) -> str:
        if self.created.get(name) != namespace:
            raise ValueError(f"Failed to look up actor {name!r}")
        return name

    def kill(self, actor: str) -> None:
        self.killed.append(actor)


def test_removing_the_app_kills_every_actor_it_created(monkeypatch):
    """The stop of `specserve serve --ray` (shutdown -> _remove_app) kills the app's detached actors by
    name: the metrics hub and both stores, the chat store (`<app>-chat`) included, which had no test
    of its own. The names are those the hubs are created with. (Ray tests cannot see this kill: the
    actors also end themselves a few seconds after their app is gone, ray_app_owned.py.)"""
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    for make in (ray_serve.metrics_hub, ray_serve.responses_hub, ray_serve.chat_hub):
        make("app")
    assert sorted(fake.created) == ["app-chat", "app-metrics", "app-responses"]
    ray_serve._remove_app("app", drain=False)
    assert sorted(fake.killed) == sorted(fake.created)


def test_ctrl_c_stops_the_command_though_it_started_with_sigint_ignored(monkeypatch):
    """A shell without job control starts a background job (`specserve serve --ray &` in a script,
    or a test run put in the background) with SIGINT ignored, and Python then leaves it ignored:
    Ctrl-C or `kill -INT` did nothing to `serve --ray`, which ran on until a SIGTERM (a stopped test
    server exited 0 more than 120 s after its SIGINT). The single server (uvicorn) sets its own
    handler; the --ray command now sets SIGINT, like SIGTERM, to the clean stop (KeyboardInterrupt)."""
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=lambda **kw: None))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the background job inherits it
    try:
        ray_serve._init_ray(types.SimpleNamespace(ray_address=None, log_level="warning"))
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert handlers == {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.default_int_handler}


def test_the_drain_ends_within_its_bound_though_the_hub_answers_slowly(monkeypatch):
    """drain_replicas waits DRAIN_GRACE_S + 2 push intervals + a step for the replicas to go idle,
    but each call to the metrics hub had STALE_AFTER_S of its own on top: a hub slow to answer (a
    loaded machine) stretched the Ctrl-C of `serve --ray` to about 2.5 times the bound. Every call
    is now given only what is left of it. A fake clock: each hub call takes STALE_AFTER_S - 1 s
    unless its timeout ends it first, and the replicas never say they are idle."""
    clock = [0.0]
    hub = types.SimpleNamespace(drain=types.SimpleNamespace(remote=lambda: False))
    hub.drained = hub.drain

    def get(ref, timeout):
        took = ray_serve.STALE_AFTER_S - 1
        clock[0] += min(took, timeout)
        if timeout < took:
            raise TimeoutError("the hub did not answer in time")
        return ref

    fake = types.SimpleNamespace(get_actor=lambda name, namespace: hub, get=get)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_serve.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ray_serve.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    assert ray_serve.drain_replicas("app") is False
    assert clock[0] <= ray_serve.drain_wait_s()


def test_every_actor_of_the_app_runs_calls_from_many_replicas_at_once(monkeypatch):
    """The metrics hub and both stores were plain actors: one call at a time, so one slow call (a
    large chat list, a big response stored) queued every other replica's store call behind it.
    Each is now a threaded actor with room for HUB_CONCURRENCY calls, and reserves no CPU.
    (test_ray_hub_concurrency shows two calls overlapping in a real actor.)"""
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    for make in (ray_serve.metrics_hub, ray_serve.responses_hub, ray_serve.chat_hub):
        make("app")
    assert fake.actor_options == [{"num_cpus": 0, "max_concurrency": ray_serve.HUB_CONCURRENCY}] * 3
    assert ray_serve.HUB_CONCURRENCY > 1


def test_the_cluster_metrics_route_finds_its_hub_off_the_event_loop(monkeypatch):
    """GET /metrics on a replica looks its app's metrics hub up by name (metrics_hub: a blocking
    call to Ray's GCS, which also creates the hub when it is missing) before it awaits the hub's
    answer. The lookup ran on the event loop: a slow GCS stalled every request of the replica. Here
    the lookup waits at a gate while another request on the same app must be answered."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    entered, go, released = threading.Event(), threading.Event(), []

    async def collect():
        return {}

    def looked_up(*args):
        entered.set()
        released.append(go.wait(20))
        return types.SimpleNamespace(collect=types.SimpleNamespace(remote=collect))

    fake = _FakeRay()
    fake.options = lambda **kw: types.SimpleNamespace(remote=looked_up)
    monkeypatch.setitem(sys.modules, "ray", fake)
    app = FastAPI()
    server = types.SimpleNamespace(render_metrics=lambda: (b"", "text/plain"))
    ray_serve._serve_cluster_metrics(app, server, "replica-1", "app")
    app.get("/other")(lambda: {"ok": True})
    with TestClient(app) as c, ThreadPoolExecutor(1) as pool:
        metrics = pool.submit(c.get, "/metrics")
        assert entered.wait(60)
        assert c.get("/other").json() == {"ok": True}
        go.set()
        assert metrics.result(60).status_code == 200
    assert released == [True], "the other request was answered only after the hub lookup gave up"


class _Hub:
    """A store actor's handle for a fake `ray.get`: each call answers (method, args), or raises
    when the actor is dead."""

    def __init__(self, alive: bool):
        self.alive = alive

    def __getattr__(self, method: str):
        def ref(*args):
            if not self.alive:
                raise RuntimeError("the actor died")
            return method, args

        return types.SimpleNamespace(remote=lambda *args: functools.partial(ref, *args))


def test_a_store_call_retries_on_the_hub_it_found_though_another_call_drops_it(monkeypatch):
    """A replica's shared store is called from many threads at once (store_calls.off_loop), and a
    call that fails drops the client's handle (`_hub = None`) so the next call finds the actor
    again. A call on its retry found the new actor, and another thread's failed call dropped the
    handle before it was used: the retry read `_hub` again, called a method of None, and the
    request got a 500 where the actor was there. Here the drop lands at that moment."""

    class Racing(ray_serve.SharedChatStore):
        def _find(self):
            return _Hub(alive=True)

        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            if name == "_hub" and value is not None and value.alive:  # another thread's failed call, now
                super().__setattr__("_hub", None)

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(get=lambda ref, timeout: ref()))
    store = Racing()
    store._hub = _Hub(alive=False)  # the actor this replica knew has died
    assert store._call("get", "chatcmpl-1") == ("get", ("chatcmpl-1",))


# -- a local Ray cluster ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("ray") / "tiny")


@pytest.fixture(scope="module")
def ray_server(models):
    import ray.serve  # noqa: F401 - `-m ray` asks for these tests: a missing Ray fails them, never skips them

    server = ServerProcess(
        models,
        "--ray",
        "--replicas",
        "2",
        "--replica-cpus",
        "1",
        "--served-model-name",
        MODEL,
        "--max-queue",
        "16",
        "--request-timeout",
        "120",
        "--max-context",
        "500",  # below the tiny model's 512: the replicas must serve it
    )
    server.env[faults.ENV] = "1"  # POST /debug/fault: a replica's engine worker can be killed
    with server as srv:
        _wait_replicas(srv, 2, timeout=120)
        yield srv


def _replica_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", REPLICA_PROC], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _replicas_in_metrics(srv) -> set[str]:
    """Replica labels on the always-present queue gauge of the aggregated /metrics."""
    text = srv.metrics()
    return {
        line.split('replica="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("specserve_queue_depth{")
    }


def _wait_replicas(srv, n: int, timeout: float, changed_from: set[str] | None = None) -> set[str]:
    """Wait until /metrics shows exactly n live replicas (a set other than `changed_from`, when
    given) and n replica processes run; returns their ids."""
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while time.monotonic() < deadline:
        try:
            seen = _replicas_in_metrics(srv)
        except (httpx.HTTPError, ValueError):
            seen = set()
        if len(seen) == n and seen != changed_from and len(_replica_pids()) == n:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"wanted {n} live replicas, /metrics shows {seen}, processes {_replica_pids()}")


def _client(srv, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=retries, timeout=120)


def _outputs(client) -> dict:
    """Greedy chat (plain and streamed) and completions outputs, to compare across servers."""
    kw = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "def get_user(self, user_id):"}],
        "temperature": 0,
        "max_tokens": 48,
    }
    chat = client.chat.completions.create(**kw).choices[0].message.content
    stream = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices
    )
    comp = client.completions.create(model=MODEL, prompt="import os\nimport", temperature=0, max_tokens=40)
    pred = client.chat.completions.create(**kw, prediction={"type": "content", "content": chat})
    return {
        "chat": chat,
        "stream": stream,
        "completion": comp.choices[0].text,
        "prediction": pred.choices[0].message.content,
    }


@pytest.mark.ray
def test_outputs_equal_a_single_server(ray_server, models):
    through_ray = _outputs(_client(ray_server))
    with ServerProcess(models, "--served-model-name", MODEL) as single:
        alone = _outputs(_client(single))
    assert through_ray == alone and through_ray["chat"]
    assert through_ray["stream"] == through_ray["chat"] == through_ray["prediction"]


@pytest.mark.ray
def test_the_replicas_run_with_the_engine_flags(ray_server):
    """--max-context reaches each replica (it was dropped: the model's 512 was served)."""
    assert httpx.get(f"{ray_server.base_url}/models", timeout=30).json()["data"][0]["max_model_len"] == 500


@pytest.mark.ray
def test_session_affinity_and_least_loaded_spread(ray_server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"{ray_server.base_url}/chat/completions"
    for session in ("alice", "bob"):
        seen = {
            httpx.post(url, json=body, headers={"X-Session-Id": session}, timeout=60).headers["x-specserve-replica"]
            for _ in range(6)
        }
        assert len(seen) == 1, (session, seen)
    free = {httpx.post(url, json=body, timeout=60).headers["x-specserve-replica"] for _ in range(16)}
    assert len(free) == 2


def _two_turns(url: str, topic: str, headers: dict) -> tuple[str, str, int]:
    """A two-turn conversation: (replica of turn 1, replica of turn 2, the tokens turn 2 reused
    beyond what turn 1 itself reused, e.g. the template's system prompt cached by others)."""
    messages = [{"role": "user", "content": f"Tell me about {topic}. " + "Please be thorough. " * 20}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    r1 = httpx.post(url, json=body, headers=headers, timeout=60)
    messages += [r1.json()["choices"][0]["message"], {"role": "user", "content": "And then?"}]
    r2 = httpx.post(url, json=body | {"messages": messages}, headers=headers, timeout=60)
    turn1 = r1.json()["usage"]
    cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return r1.headers["x-specserve-replica"], r2.headers["x-specserve-replica"], cached - turn1["prompt_tokens"]


@pytest.mark.ray
def test_session_affinity_pays_off_in_cached_tokens(ray_server):
    """With X-Session-Id a conversation's turn 2 lands where turn 1 ran and reuses its prefix;
    without it, the least-loaded spread sends some turn 2s to the replica that never saw turn 1."""
    url = f"{ray_server.base_url}/chat/completions"
    pinned = [_two_turns(url, f"topic {i}", {"X-Session-Id": f"conv-{i}"}) for i in range(6)]
    assert all(a == b and extra >= 0 for a, b, extra in pinned), pinned  # turn 1's whole prompt, and more
    free = [_two_turns(url, f"free topic {i}", {}) for i in range(12)]
    moved = [(a, b, extra) for a, b, extra in free if a != b]
    assert moved and all(extra < 0 for _, _, extra in moved), free  # not even turn 1's prompt


def _completions_counted(text: str, **labels: str) -> float:
    return metric_value(text, "specserve_requests_total", endpoint="completions", status="200", **labels)


def _own_metrics(srv, session: str) -> str:
    """/metrics/replica of the replica `session` routes to: its own series, unlabelled."""
    return httpx.get(f"{srv.url}/metrics/replica", headers={"X-Session-Id": session}, timeout=10).text


@pytest.mark.ray
def test_metrics_have_a_replica_label(ray_server):
    """/metrics answers every live replica's series with a `replica` label, as each last pushed
    them (every PUSH_INTERVAL_S); /metrics/replica the answering replica's own, unlabelled. Waits
    for the pushes, not a fixed time: each replica's count in /metrics must come to equal the
    count that replica gives of itself (a fixed 3 s sleep, and a total that earlier tests had
    already half made)."""
    client = _client(ray_server)
    own = {}
    for replica, session in _session_per_replica(ray_server).items():
        before = _completions_counted(_own_metrics(ray_server, session))
        for _ in range(3):
            client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_headers={"X-Session-Id": session})
        text = _own_metrics(ray_server, session)
        assert "replica=" not in text and "specserve_queue_depth" in text, text[:2000]
        own[replica] = _completions_counted(text)
        assert own[replica] - before == 3, (replica, before, own[replica])

    def merged_matches() -> bool:
        text = ray_server.metrics()
        return _replicas_in_metrics(ray_server) == set(own) and all(
            _completions_counted(text, replica=r) == n for r, n in own.items()
        )

    wait_until(merged_matches, 30, lambda: f"each replica's own counts {own}, /metrics:\n{ray_server.metrics()}")


def _session_per_replica(srv) -> dict[str, str]:
    """A session id (X-Session-Id) that routes to each replica."""
    found: dict[str, str] = {}
    for i in range(40):
        r = httpx.get(f"{srv.url}/health", headers={"X-Session-Id": f"probe-{i}"}, timeout=30)
        found.setdefault(r.headers["x-specserve-replica"], f"probe-{i}")
        if len(found) == 2:  # a session maps to the same replica every time: more probes find no more
            break
    assert len(found) == 2, found
    return found


# a non-streamed completion of 8 x 450 tokens: seconds of decoding on the tiny model, 450 engine steps
LONG = {"model": MODEL, "prompt": "x", "max_tokens": 450, "n": 8, "temperature": 0.8, "seed": 0}
LONG |= {"ignore_eos": True, "speculation": "none"}


def _replica_health(srv, session: str) -> dict:
    return httpx.get(f"{srv.url}/health", headers={"X-Session-Id": session}, timeout=30).json()


def _hold_long_request(srv, session: str) -> socket.socket:
    """LONG, pinned to the replica `session` routes to, sent on a raw socket the caller closes
    (leaving the request) or keeps open; returns once that replica's engine runs it."""
    body = json.dumps(LONG).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {srv.host}\r\nContent-Type: application/json\r\n"
    head += f"X-Session-Id: {session}\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = socket.create_connection((srv.host, srv.port), timeout=30)
    sock.sendall(head.encode() + body)
    wait_until(lambda: _replica_health(srv, session)["active"] >= 1, 60, lambda: _replica_health(srv, session))
    return sock


@pytest.mark.ray
def test_a_request_without_a_session_goes_to_the_less_loaded_replica(ray_server):
    """README: requests go to the less loaded of two random replicas (power of two choices). The
    spread test only saw both replicas used, which any random pick does too. Here one replica runs
    a long request and every request without a session goes to the other: a router that picked
    one replica at random would send each there half the time."""
    busy, session = next(iter(_session_per_replica(ray_server).items()))
    with _hold_long_request(ray_server, session):
        seen = [httpx.get(f"{ray_server.url}/health", timeout=30).headers["x-specserve-replica"] for _ in range(10)]
        still = _replica_health(ray_server, session)["active"]
    assert still >= 1, "the long request ended during the probes: nothing was tested"
    assert busy not in seen, (busy, seen)


@pytest.mark.ray
def test_a_client_that_leaves_is_cancelled_in_its_replicas_engine(ray_server):
    """docs/deploy.md: a client that disconnects is cancelled in its replica's engine, as on a single
    server (a non-streamed request ran to its end). Here a long request's client leaves while it
    runs: its replica goes idle well before the 450 steps it would take, and counts a 499. (Either
    of the app's two ways does it: the handler's cancellation, and the disconnect its watcher reads.)"""
    session = next(iter(_session_per_replica(ray_server).values()))

    def counts() -> tuple[float, float]:
        text = _own_metrics(ray_server, session)
        gone = metric_value(text, "specserve_requests_total", endpoint="completions", status="499")
        return metric_value(text, "specserve_batch_size_count"), gone

    steps, gone = counts()
    _hold_long_request(ray_server, session).close()
    idle = lambda: (h := _replica_health(ray_server, session))["active"] == h["queued"] == 0  # noqa: E731
    wait_until(idle, 60, lambda: _replica_health(ray_server, session))
    steps_after, gone_after = counts()
    assert steps_after - steps < LONG["max_tokens"], "the request ran to its end after its client left"
    assert gone_after - gone == 1


@pytest.mark.ray
def test_a_stored_response_is_found_through_any_replica(ray_server):
    """Each replica kept its own Responses: GET /v1/responses/{id} and previous_response_id found
    a response only when the request happened to land on the replica that made it (about half)."""
    url = f"{ray_server.base_url}/responses"
    for replica, session in _session_per_replica(ray_server).items():
        pinned = openai.OpenAI(base_url=ray_server.base_url, api_key="x", default_headers={"X-Session-Id": session})
        first = pinned.responses.create(model=MODEL, input=f"made on {replica}", max_output_tokens=3)
        for there in _session_per_replica(ray_server).values():
            seen = httpx.get(f"{url}/{first.id}", headers={"X-Session-Id": there}, timeout=30)
            assert seen.status_code == 200 and seen.json()["id"] == first.id, seen.text
            turn2 = {"model": MODEL, "input": "and then?", "previous_response_id": first.id, "max_output_tokens": 3}
            chained = httpx.post(url, json=turn2, headers={"X-Session-Id": there}, timeout=60)
            assert chained.status_code == 200, chained.text
            assert chained.json()["usage"]["input_tokens"] > first.usage.input_tokens  # turn 1 came along
        pinned.responses.delete(first.id)
        assert httpx.get(f"{url}/{first.id}", timeout=30).status_code == 404


@pytest.mark.ray
def test_a_stored_chat_completion_is_found_through_any_replica(ray_server):
    """Under Ray, store: true on chat was a 400 (each replica's own store would miss the reads the
    proxy routes elsewhere). Now one actor keeps them: a completion stored through one replica is
    listed, read, updated, its messages listed and deleted through the other. The actor pages a list
    itself (a page after a cursor, or a 400 for a cursor it never made)."""
    url = f"{ray_server.base_url}/chat/completions"
    sessions = _session_per_replica(ray_server)
    for replica, session in sessions.items():
        ask = [{"role": "user", "content": f"made on {replica}"}]
        body = {"model": MODEL, "messages": ask, "max_tokens": 2, "store": True, "metadata": {"on": replica}}
        made = httpx.post(url, json=body, headers={"X-Session-Id": session}, timeout=60)
        assert made.status_code == 200 and made.headers["x-specserve-replica"] == replica, made.text
        cid = made.json()["id"]
        for there, other in sessions.items():
            pin = {"X-Session-Id": other}
            seen = httpx.get(f"{url}/{cid}", headers=pin, timeout=30)
            assert seen.status_code == 200 and seen.headers["x-specserve-replica"] == there, seen.text
            assert seen.json()["metadata"] == {"on": replica}
            listed = httpx.get(url, params={"metadata[on]": replica}, headers=pin, timeout=30).json()["data"]
            assert [c["id"] for c in listed] == [cid]
            past = httpx.get(url, params={"after": cid, "order": "desc", "limit": 1}, headers=pin, timeout=30)
            assert past.status_code == 200 and cid not in [c["id"] for c in past.json()["data"]], past.text
            unknown = httpx.get(url, params={"after": "chatcmpl-never"}, headers=pin, timeout=30)
            assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "after", unknown.text
            messages = httpx.get(f"{url}/{cid}/messages", headers=pin, timeout=30).json()["data"]
            assert [m["content"] for m in messages] == [ask[0]["content"]]
        other = sessions[next(r for r in sessions if r != replica)]
        updated = httpx.post(f"{url}/{cid}", json={"metadata": {"by": "other"}}, headers={"X-Session-Id": other})
        assert updated.status_code == 200 and updated.json()["metadata"] == {"by": "other"}, updated.text
        assert httpx.get(f"{url}/{cid}", headers={"X-Session-Id": session}).json()["metadata"] == {"by": "other"}
        assert httpx.delete(f"{url}/{cid}", headers={"X-Session-Id": other}, timeout=30).status_code == 200
        assert httpx.get(f"{url}/{cid}", headers={"X-Session-Id": session}, timeout=30).status_code == 404


@pytest.mark.ray
def test_a_replica_whose_engine_died_is_replaced(ray_server):
    """Ray Serve replaced only a replica whose process died: one whose engine worker thread died
    answered 503 to every request for good (and, answering fastest, got more of them)."""
    before = _wait_replicas(ray_server, 2, timeout=60)
    pin = {"X-Session-Id": next(iter(_session_per_replica(ray_server).values()))}
    victim = httpx.post(f"{ray_server.url}/debug/fault", json={"kind": "worker"}, headers=pin, timeout=30)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    dead = httpx.post(f"{ray_server.base_url}/completions", json=body, headers=pin, timeout=60)
    assert dead.status_code == 503 and dead.headers["x-specserve-replica"] == victim.headers["x-specserve-replica"]
    after = _wait_replicas(ray_server, 2, timeout=90, changed_from=before)
    assert victim.headers["x-specserve-replica"] not in after
    assert all(
        httpx.post(f"{ray_server.base_url}/completions", json=body, timeout=60).status_code == 200 for _ in range(8)
    )


RETRYABLE = (openai.APIConnectionError, openai.InternalServerError, httpx.TransportError)


class Load:
    """16 streaming clients; remembers which replica serves each and which are mid-stream."""

    def __init__(self, client):
        self.client, self.results, self.replica_of, self.streaming = client, {}, {}, set()
        self.lock = threading.Lock()

    def stream_one(self, i: int) -> None:
        """One streaming client: ('done', finish, text) or ('error', exception, None)."""
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": PROMPTS[i % 4]}],
                temperature=0,
                max_tokens=MAX_TOKENS,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            self.replica_of[i] = raw.headers.get("x-specserve-replica")
            text, finish = "", None
            for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                    with self.lock:
                        self.streaming.add(i)
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            self.results[i] = ("done", finish, text)
        except Exception as e:  # noqa: BLE001 - judged by the test
            self.results[i] = ("error", e, None)
        finally:
            with self.lock:
                self.streaming.discard(i)

    def busy_replica(self, timeout: float) -> tuple[str, int]:
        """A replica with a stream in progress, and that stream."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for i in self.streaming:
                    if self.replica_of.get(i):
                        return self.replica_of[i], i
            time.sleep(0.01)
        raise AssertionError("no stream in progress")


def _kill_replica(replica: str) -> None:
    """Kill a replica's actor as a crash would (no graceful shutdown); Ray Serve must replace it."""
    import ray

    ray.init(address="auto", namespace="specserve-test", log_to_driver=False)
    try:
        ray.kill(ray.get_actor(f"SERVE_REPLICA::specserve#SpecServe#{replica}", namespace="serve"), no_restart=True)
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_replica_killed_mid_load(ray_server):
    before = _wait_replicas(ray_server, 2, timeout=60)
    load = Load(_client(ray_server))
    threads = [threading.Thread(target=load.stream_one, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    victim, cut = load.busy_replica(timeout=60)
    _kill_replica(victim)
    for t in threads:
        t.join(180)
    assert not [t for t in threads if t.is_alive()], "a client hung"
    assert len(load.results) == CLIENTS
    done = [r for r in load.results.values() if r[0] == "done"]
    errors = [r[1] for r in load.results.values() if r[0] == "error"]
    assert all(finish == "length" and text for _, finish, text in done), done
    assert load.results[cut][0] == "error"  # the stream the crash cut short says so
    assert all(isinstance(e, RETRYABLE) for e in errors), [repr(e) for e in errors]
    after = _wait_replicas(ray_server, 2, timeout=120, changed_from=before)
    assert victim not in after and len(after - before) == 1  # a new replica replaced the dead one
    retry = _client(ray_server, retries=2)
    for _ in errors:  # what failed succeeds when the client retries, as the SDK would
        assert (
            retry.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            .choices[0]
            .message.content
            is not None
        )
    print(
        f"\nkilled replica {victim}: {len(done)} streams completed, {len(errors)} retryable errors "
        f"({sorted({type(e).__name__ for e in errors})}); replicas {sorted(before)} -> {sorted(after)}"
    )
