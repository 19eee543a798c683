"""Stopping `specserve serve --ray` while streams run: they end as on a single server.

Ray Serve's own stop waits graceful_shutdown_timeout_s for a replica's requests, then kills it;
its user hook (`__del__`) runs only after that wait. Streams longer than the wait were cut, and
a client saw a closed connection with no error and no [DONE] (the openai SDK then returns the
text so far as if it were the whole answer). `specserve serve --ray` now tells the replicas to
drain first (ray_serve.drain_replicas): each stream gets DRAIN_GRACE_S, then an error event
and [DONE].

Its own module: it starts its own Ray cluster, which must not overlap test_serve_ray's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_proc import ServerProcess
from tiny import save_tiny, tiny_model, tiny_tokenizer
from waiting import wait_until

from specserve.server.app import DRAIN_GRACE_S
from specserve.server.launch import free_port

MODEL = "tiny"
STREAMS = 2  # Ray Serve's max_ongoing_requests per replica (ScaleConfig): both run at once
# Ctrl-C to exit, beyond the drain's grace: the drain's last pushes and step (drain_wait_s), removing
# the app, stopping Serve and the cluster; ~20 s on a loaded 2-core machine. A command started with
# SIGINT ignored (a background job) never stopped on its Ctrl-C and ran on until the test's SIGTERM.
STOP_MARGIN_S = 60.0
MAX_TOKENS = 1800  # x 2 streams of a deep tiny model, one pass each: tens of seconds, far past the drain's grace


def save_long_slow_tiny(path) -> str:
    """server_proc's slow model with room for long answers: a stream outlives the drain's grace
    on any machine, so the stop always finds streams running."""
    tiny_model(layers=24, hidden=128, max_positions=2048).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def _stream(url: str, i: int, events: dict, started: threading.Event, **extra) -> None:
    """One streaming client: every SSE data line it got, in order."""
    body = extra | {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"def add(a, b):  # {i}"}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    got = events.setdefault(i, [])
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(line.removeprefix("data: "))
                    if len(got) >= 3:
                        started.set()
    except httpx.HTTPError as e:
        got.append(f"transport error: {e!r}")


@pytest.mark.ray
def test_stopping_the_server_ends_running_streams_with_an_error_event(tmp_path):
    import ray.serve  # noqa: F401 - `-m ray` asks for this test: a missing Ray fails it, never skips it

    model = save_long_slow_tiny(tmp_path / "slow")
    srv = ServerProcess(
        model,
        "--ray",
        "--replicas",
        "1",
        "--replica-cpus",
        "1",
        "--served-model-name",
        MODEL,
        "--speculation",
        "none",
        "--max-num-seqs",
        str(STREAMS),
    )
    with srv:
        events: dict[int, list[str]] = {}
        started = [threading.Event() for _ in range(STREAMS)]
        threads = [
            threading.Thread(target=_stream, args=(srv.url, i, events, started[i]), daemon=True) for i in range(STREAMS)
        ]
        for t in threads:
            t.start()
        assert all(s.wait(120) for s in started), events
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGINT)
        for t in threads:
            t.join(120)
        ended = time.monotonic() - t0
        try:  # the whole stop, Ctrl-C to exit, within the grace and a fixed margin
            code = srv.proc.wait(max(1.0, DRAIN_GRACE_S + STOP_MARGIN_S - ended))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {DRAIN_GRACE_S + STOP_MARGIN_S:g} s after its Ctrl-C: {srv.log_tail()}")
        assert code == 0, srv.log_tail()
    assert not [t for t in threads if t.is_alive()], "a stream hung"
    ended_by_stop = 0
    for i, got in events.items():
        assert got[-1] == "[DONE]", (i, got[-3:])  # not a cut connection
        last = json.loads(got[-2])
        if "error" in last:
            assert "shutting down" in last["error"]["message"], (i, last)
            ended_by_stop += 1
        else:  # it finished within the grace: its finish chunk came before the usage chunk
            assert any('"finish_reason":"length"' in g for g in got), (i, got[-3:])
    assert ended_by_stop, "every stream finished before the stop: nothing was tested"
    assert ended >= DRAIN_GRACE_S - 1  # the streams had their grace


@pytest.mark.ray
def test_a_model_that_fails_to_load_in_the_replicas_ends_the_command_with_one_line(tmp_path):
    """A replica whose model did not load ended `serve --ray` in Ray's traceback ("Failed to update
    the deployments ['SpecServe']") and a warning that the replicas were still busy."""
    import ray.serve  # noqa: F401 - `-m ray` asks for this test: a missing Ray fails it, never skips it

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # a folder that passes the CLI's path check, then fails to load
    port = str(free_port())
    cmd = [
        sys.executable,
        "-m",
        "specserve.cli",
        "serve",
        "--ray",
        "--replicas",
        "1",
        "--port",
        port,
        "--model",
        str(broken),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "still busy" not in done.stderr, done.stderr[-3000:]
    assert errors[-1].startswith("specserve: error: the replicas failed to start: cannot load the tokenizer"), errors


@pytest.mark.ray
def test_more_replicas_than_the_cluster_holds_end_the_command_with_one_line(tmp_path):
    """Ray Serve waits for ever for a replica it cannot place: `serve --ray --replicas 3` on 2
    cores hung with no word (its warnings go to Ray's logs) until Ctrl-C."""
    cpus = os.cpu_count() or 1
    model = save_tiny(tmp_path / "tiny")  # one replica would load it: only the room is wrong
    flags = ["--ray", "--replicas", "2", "--replica-cpus", str(cpus), "--port", str(free_port()), "--model", model]
    done = subprocess.run(
        [sys.executable, "-m", "specserve.cli", "serve", *flags, "--dtype", "float32"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1].startswith(f"specserve: error: 2 replicas x --replica-cpus {cpus} need "), (
        done.stderr[-3000:]
    )


RAY_PROCESS = r"ray::|raylet|gcs_server|ray/dashboard|ray/_private|ray/autoscaler"


def _ray_processes() -> set[int]:
    """Ray's running processes (zombies, which have ended and wait for their parent, left out)."""
    out = subprocess.run(["pgrep", "-f", RAY_PROCESS], capture_output=True, text=True).stdout
    states = {int(p): Path(f"/proc/{p}/stat").read_text().split(") ")[-1][:1] for p in out.split() if _exists(p)}
    return {pid for pid, state in states.items() if state != "Z"}


def _exists(pid: str) -> bool:
    return Path(f"/proc/{pid}/stat").exists()


@pytest.mark.ray
def test_a_sigterm_while_the_cluster_starts_leaves_no_ray_process(tmp_path):
    """SIGTERM arriving during ray.init (the handler that turns it into a clean stop was installed
    after it) killed the command and left Ray's dashboard and runtime-env agents running for good."""
    before = _ray_processes()
    flags = ["--ray", "--replicas", "1", "--port", str(free_port()), "--model", save_tiny(tmp_path / "tiny")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "specserve.cli", "serve", *flags, "--dtype", "float32"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not subprocess.run(["pgrep", "-P", str(proc.pid), "raylet"], capture_output=True).stdout:
            assert time.monotonic() < deadline and proc.poll() is None, "no raylet started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # the cluster is starting: ray.init has not returned
        proc.wait(60)
    finally:
        proc.kill()
    deadline = time.monotonic() + 20  # a stopped cluster's processes end within seconds
    while (left := _ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # not to leave them to the next test
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left, subprocess.run(
        ["ps", "-o", "pid,cmd", "-p", ",".join(map(str, left))], capture_output=True, text=True
    ).stdout


# The command with its early check of --port skipped: the port taken after that check (or on a
# cluster joined with --ray-address, which has no such check) is found by Ray Serve's proxy.
WITHOUT_PORT_CHECK = """
import sys
import specserve.cli.serve
from specserve.cli.main import main
specserve.cli.serve.check_address = lambda host, port: None
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.ray
def test_a_ray_serve_that_fails_to_start_ends_the_command_with_one_line_and_no_process(tmp_path):
    """serve.start raising (here Ray Serve's proxy finding its port taken: RayTaskError(RuntimeError)
    "Failed to bind", as ActorDiedError under load) ended `serve --ray` in a Python traceback. It is
    now one line naming the step, Ray's reason and what to do, exit status 2, and the cluster the
    command started is gone."""
    before = _ray_processes()
    port = free_port()
    flags = ["--ray", "--replicas", "1", "--port", str(port), "--model", save_tiny(tmp_path / "tiny")]
    with socket.create_server(("127.0.0.1", port)):
        done = subprocess.run(
            [sys.executable, "-c", WITHOUT_PORT_CHECK, "serve", *flags, "--dtype", "float32"],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    _no_ray_process_left(before)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        "specserve: error: Ray Serve (its controller and HTTP proxy) failed to start (serve.start: RuntimeError: "
        f"Failed to bind to address '127.0.0.1:{port}'.); this command stopped the cluster it started: see the "
        "Ray logs (/tmp/ray/session_latest/logs), then try again"
    ), done.stderr[-3000:]


def _no_ray_process_left(before: set[int]) -> None:
    """Wait (a stopped cluster's processes end within seconds) until no Ray process but those running
    `before` runs; else fail, listing them. Those left are killed, not to be left to the next test."""

    def listing() -> str:
        return subprocess.run(
            ["ps", "-o", "pid,cmd", "-p", ",".join(map(str, left_now())) or "0"], capture_output=True, text=True
        ).stdout

    def left_now() -> set[int]:
        return {pid for pid in _ray_processes() - before if _exists(str(pid))}

    try:
        wait_until(lambda: not left_now(), 20, listing)
    finally:
        for pid in left_now():
            subprocess.run(["kill", "-9", str(pid)], check=False)


@pytest.mark.ray
def test_a_sigterm_once_serving_stops_the_command_and_its_cluster(tmp_path):
    """ray.init puts in its own SIGTERM handler, which ends the process at once: the command's own
    must be put back after it, or a SIGTERM skips the drain and leaves Ray's agents running."""
    before = _ray_processes()
    with ServerProcess(save_tiny(tmp_path / "tiny"), "--ray", "--replicas", "1") as srv:
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.log_path.read_text()[-3000:]
    deadline = time.monotonic() + 20
    while (left := _ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left


def _redeploy(model: str) -> None:
    """Deploy the running app again with another config, as `serve deploy` of a new version does:
    Ray Serve starts a new replica and stops the old one (graceful_shutdown_timeout_s)."""
    import ray
    from ray import serve

    from specserve.server.ray_serve import APP_NAME, ReplicaConfig, ScaleConfig, deployment

    ray.init(address="auto", namespace="specserve-test", log_to_driver=False)
    try:
        config = ReplicaConfig(model=model, dtype="float32", served_model_name=MODEL, speculation="none", max_queue=15)
        serve.run(deployment(config, ScaleConfig(replicas=1)), name=APP_NAME, route_prefix="/")
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_a_stream_outlives_a_redeploy_that_stops_its_replica(tmp_path):
    """Ray Serve's own stop of a replica (redeploy, scale-down) waits for its requests up to
    graceful_shutdown_timeout_s; it was 5 s, and longer streams were cut with no error. Checked
    end to end: a stream of tens of seconds runs to its end on the replica being replaced."""
    import ray.serve  # noqa: F401 - `-m ray` asks for this test: a missing Ray fails it, never skips it

    model = save_long_slow_tiny(tmp_path / "slow")
    with ServerProcess(model, "--ray", "--replicas", "1", "--served-model-name", MODEL, "--speculation", "none") as srv:
        events: dict[int, list[str]] = {}
        started = threading.Event()
        old = httpx.get(f"{srv.url}/health", timeout=30).headers["x-specserve-replica"]
        usage = {"stream_options": {"include_usage": True}}
        stream = threading.Thread(target=_stream, args=(srv.url, 0, events, started), kwargs=usage, daemon=True)
        stream.start()
        assert started.wait(120), events
        _redeploy(model)  # returns once the new replica serves and the old one stopped
        stream.join(120)
        new = httpx.get(f"{srv.url}/health", timeout=30).headers["x-specserve-replica"]
    assert new != old and not stream.is_alive()
    got = events[0]
    assert got[-1] == "[DONE]" and '"finish_reason":"length"' in "".join(got[-3:]), got[-3:]
    assert json.loads(got[-2])["usage"]["completion_tokens"] == MAX_TOKENS  # every token, none cut


def _started(pid: int) -> str | None:
    """pid's start time (/proc/PID/stat field 22), None when it is gone or a zombie: with the pid,
    it names one process, not a later one that reuses the pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _tree(pid: int) -> dict[int, str]:
    """The running processes under pid (its local Ray cluster), with their start times."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(") ", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and (started := _started(child)) is not None:
                found[child] = started
                todo.append(child)
    return found


@pytest.mark.ray
def test_a_sigkill_of_the_command_leaves_no_process_of_its_cluster(tmp_path):
    """Ray ends its GCS and raylet with the command that started them, but a SIGKILLed
    `serve --ray` left the raylet's dashboard and runtime-env agents hanging in their exit for about
    a minute, holding ~230 MB and their ports (the next cluster's dashboard agent found 52365 taken
    and ran without its HTTP service). Every process of the cluster now ends with the command."""
    with ServerProcess(save_tiny(tmp_path / "tiny"), "--ray", "--replicas", "1") as srv:
        cluster = _tree(srv.proc.pid)
        names = " ".join(Path(f"/proc/{pid}/cmdline").read_text() for pid in cluster)
        assert "raylet" in names and "DashboardAgent" in names, names
        srv.proc.kill()
        srv.proc.wait(10)
    deadline = time.monotonic() + 20  # the agents hung for about 60 s
    while (left := {p for p, t in cluster.items() if _started(p) == t}) and time.monotonic() < deadline:
        time.sleep(0.1)
    listing = subprocess.run(["ps", "-o", "pid,cmd", "-p", ",".join(map(str, left))], capture_output=True, text=True)
    for pid in left:  # not to leave them to the next test
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left, listing.stdout


# `serve run` (a local cluster, the app deployed by its builder), a Responses request, a stored chat
# completion and /metrics (which create the app's two stores and metrics hub), then what `serve
# shutdown` does: each hub's name is printed once the app runs and again once Serve is shut down
# (or 30 s later).
SERVE_RUN_THEN_SHUTDOWN = r"""
import json, sys, time
import httpx, ray
from ray import serve
from specserve.server.ray_serve import APP_NAME, HUB_NAMESPACE, build_app

model, port = sys.argv[1], int(sys.argv[2])
url, hubs = f"http://127.0.0.1:{port}", [f"{APP_NAME}-{k}" for k in ("metrics", "responses", "chat")]


def alive():
    found = []
    for name in hubs:
        try:
            ray.get_actor(name, namespace=HUB_NAMESPACE)
            found.append(name)
        except ValueError:
            pass
    return found


ray.init(namespace="specserve-test", log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": port})
args = {"model": model, "dtype": "float32", "replicas": "1", "served_model_name": "tiny", "speculation": "none"}
serve.run(build_app(args), name=APP_NAME, route_prefix="/")
body = {"model": "tiny", "input": "def add(a, b):", "max_output_tokens": 2}
httpx.post(f"{url}/v1/responses", json=body, timeout=120).raise_for_status()
chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "store": True}
httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120).raise_for_status()
httpx.get(f"{url}/metrics", timeout=60).raise_for_status()
time.sleep(6)  # a few of the hubs' checks of their app: a running app keeps them
running = alive()
serve.shutdown()
deadline = time.monotonic() + 30
while (left := alive()) and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"running": running, "after_shutdown": left}))
"""


@pytest.mark.ray
def test_serve_shutdown_removes_the_actors_the_app_created(tmp_path):
    """The metrics hub and the Responses and chat stores are detached actors (a replica that dies
    must not take them along), and `serve shutdown` after `serve run` left them running for as long
    as the cluster ran, the stores with what they kept. They now end themselves once their app is gone."""
    import ray.serve  # noqa: F401 - `-m ray` asks for this test: a missing Ray fails it, never skips it

    model = save_tiny(tmp_path / "tiny")
    done = subprocess.run(
        [sys.executable, "-c", SERVE_RUN_THEN_SHUTDOWN, model, str(free_port())],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    hubs = json.loads(done.stdout.strip().splitlines()[-1])
    assert hubs["running"] == ["specserve-metrics", "specserve-responses", "specserve-chat"], hubs
    assert hubs["after_shutdown"] == [], hubs
