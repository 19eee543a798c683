"""The stop of `specserve serve --ray` ends within a known bound though one of Ray's calls hangs,
and a start that fails is said in one line: without Ray (a fake `ray` module).

serve.delete waits up to 60 s by Ray's default, serve.shutdown 30 s and ray.shutdown has no limit;
one that hung held the command's Ctrl-C for as long. Each step now runs with a deadline of its own
(ray_serve.STOP_STEP_S, shortened here), is named in a warning when cut short, and the next one runs.
"""

from __future__ import annotations

import logging
import sys
import threading
import types

import pytest

from specserve.server import ray_serve


class _HangingRay:
    """What ray_serve's stop asks of `ray` and `ray.serve`: every call records its name, and those
    named in `hang` block until the test releases them (as a Ray call that never returns)."""

    def __init__(self, hang: set[str]):
        self.hang, self.calls, self.release = hang, [], threading.Event()
        self.serve = types.SimpleNamespace(delete=self._step("serve.delete"), shutdown=self._step("serve.shutdown"))
        self.shutdown = self._step("ray.shutdown")
        self.kill = self._step("ray.kill")  # one call per actor of the app

    def get_actor(self, name: str, namespace: str) -> str:
        return name

    def _step(self, name: str):
        def call(*args, **kwargs):
            self.calls.append(name)
            if name in self.hang:
                self.release.wait()

        return call

    def is_initialized(self) -> bool:
        return True


@pytest.fixture
def hanging_ray(monkeypatch):
    """A fake `ray` whose every stop step hangs, deadlines of 0.05 s, and no processes to end."""
    fake = _HangingRay(hang=set(ray_serve.STOP_STEP_S))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.serve", fake.serve)
    monkeypatch.setattr(ray_serve, "STOP_STEP_S", dict.fromkeys(ray_serve.STOP_STEP_S, 0.05))
    monkeypatch.setattr(ray_serve, "_cluster_processes", lambda settle_s: {12345})
    ended = []
    monkeypatch.setattr(ray_serve, "_end_processes", lambda pids, wait_s: ended.append(pids))
    unregistered = []
    monkeypatch.setattr("atexit.unregister", unregistered.append)
    yield types.SimpleNamespace(ray=fake, ended=ended, unregistered=unregistered)
    fake.release.set()  # the steps left behind end with the test


def test_every_stop_step_that_hangs_is_cut_short_and_the_stop_goes_on(hanging_ray, caplog):
    caplog.set_level(logging.WARNING, logger="specserve.ray")
    stop = threading.Thread(target=ray_serve.shutdown, kwargs={"local": True, "drain": False}, daemon=True)
    stop.start()
    stop.join(30)  # the steps hang until the test ends: only their deadlines end the stop
    assert not stop.is_alive(), f"the stop hung in {hanging_ray.ray.calls[-1]}"
    steps = ["serve.delete", "ray.kill", "serve.shutdown", "ray.shutdown"]
    assert hanging_ray.ray.calls == steps  # each ran, in order, though the one before it hung
    cut = [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]
    assert cut == [f"stopping: {step} did not finish within 0.05 s; going on without it" for step in steps]
    assert hanging_ray.ended == [{12345}]  # the cluster's processes are still ended
    assert hanging_ray.unregistered == [hanging_ray.ray.shutdown]  # no second hang at interpreter exit


def test_a_stop_whose_steps_return_says_nothing_and_keeps_rays_exit_hook(hanging_ray, caplog):
    hanging_ray.ray.hang.clear()
    caplog.set_level(logging.WARNING, logger="specserve.ray")
    ray_serve.shutdown(local=True, drain=False)
    assert hanging_ray.ray.calls == ["serve.delete", *["ray.kill"] * 3, "serve.shutdown", "ray.shutdown"]
    assert not caplog.records and hanging_ray.unregistered == []


def test_leaving_a_joined_cluster_disconnects_within_its_deadline_and_stops_nothing(hanging_ray, caplog):
    """With --ray-address the cluster is not ours: the stop removes the app and disconnects, and
    serve.shutdown (which would stop Serve for every app there) never runs. The disconnect was left
    to Ray's exit hook, with no deadline."""
    caplog.set_level(logging.WARNING, logger="specserve.ray")
    stop = threading.Thread(target=ray_serve.shutdown, kwargs={"local": False, "drain": False}, daemon=True)
    stop.start()
    stop.join(30)
    assert not stop.is_alive(), f"the stop hung in {hanging_ray.ray.calls[-1]}"
    assert hanging_ray.ray.calls == ["serve.delete", "ray.kill", "ray.shutdown"]
    assert hanging_ray.ended == [] and hanging_ray.unregistered == [hanging_ray.ray.shutdown]


def test_the_stop_bound_counts_the_drain_every_step_and_the_last_kills():
    """stop_bound_s is what docs/deploy.md promises: the drain, each step at its deadline, the
    settle after an interrupted start, and SIGTERM then SIGKILL of the cluster's last processes."""
    expected = ray_serve.drain_wait_s() + ray_serve.SETTLE_S + 2 * ray_serve.END_WAIT_S
    assert ray_serve.stop_bound_s() == expected + sum(ray_serve.STOP_STEP_S.values())
    assert ray_serve.stop_bound_s() < 120  # Ray's own waits alone came to 90 s, and ray.shutdown had none


class _RayTaskError(RuntimeError):
    """Ray's error for an exception raised in an actor: its text opens with the actor, `cause` is
    the exception the actor raised."""

    def __init__(self, cause: BaseException):
        super().__init__(f"ray::ProxyActor.ready() (pid=6729, ip=10.0.0.1)\n  File ...\n{cause!r}")
        self.cause = cause


@pytest.mark.parametrize(
    ("step", "error", "local", "reason", "todo"),
    [
        (
            "serve.start",
            _RayTaskError(RuntimeError("Failed to bind to address '127.0.0.1:8000'.")),
            True,
            "RuntimeError: Failed to bind to address '127.0.0.1:8000'.",
            "this command stopped the cluster it started: see the Ray logs (/tmp/ray/session_latest/logs)",
        ),
        (
            "serve.run",
            type("ActorDiedError", (Exception,), {})("The actor died unexpectedly.\n\tclass_name: ServeController"),
            False,
            "ActorDiedError: The actor died unexpectedly.",
            "the cluster was left running: see the cluster's Ray logs (on its head node)",
        ),
    ],
)
def test_a_failed_start_is_one_line_naming_the_step_rays_reason_and_what_to_do(step, error, local, reason, todo):
    line = ray_serve.start_failure(step, error, local)
    assert "\n" not in line
    assert line == f"{ray_serve.START_STEPS[step]} failed to start ({step}: {reason}); {todo}, then try again"


def test_a_ray_error_while_starting_becomes_one_line_for_the_cli():
    """Any error of Ray's while starting reaches the CLI as a SpecServeError (its one line and exit
    status 2); an ActorDiedError under load ended the command in a Python traceback."""

    def start():
        raise type("ActorDiedError", (Exception,), {})("The actor died unexpectedly before finishing this task.")

    with pytest.raises(ray_serve.SpecServeError, match=r"^Ray Serve .* failed to start \(serve.start: ActorDied"):
        ray_serve._start_step("serve.start", True, start)
