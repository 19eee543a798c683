"""The Ray hubs' own state under concurrent calls, without a cluster.

The app's actors (ray_serve.MetricsHub, the Responses and chat stores) answer calls from every
replica; run as threaded actors, they answer them at once, so each call's reads and writes must
hold the hub's lock: here another caller lands in the middle of one, at a chosen moment.
"""

from __future__ import annotations

import sys
import threading
import types

import pytest

from specserve.server import ray_serve


@pytest.fixture
def no_ray(monkeypatch):
    """A `ray` that says no cluster runs: the hubs' __init__ then watches no app."""
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False))


@pytest.fixture
def fast_switching():
    """Threads switched every microsecond (not every 5 ms), so unlocked races show more often."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


class _PushMidway(dict):
    """A hub's `latest` whose reading lets another replica push midway (on its own thread, given
    half a second to finish: it waits while the reader holds the hub's lock)."""

    def __init__(self, hub, *args):
        super().__init__(*args)
        self.hub, self.push = hub, None

    def items(self):
        entries = list(super().items())
        for n, entry in enumerate(entries):
            if n == 1 and self.push is None:
                self.push = threading.Thread(target=self.hub.push, args=("replica-late", "late", 1))
                self.push.start()
                self.push.join(0.5)
            yield entry


def test_a_push_while_the_hub_collects_is_kept(no_ray):
    """MetricsHub.collect rebuilt `latest` from what it read; a push that landed meanwhile wrote
    into the dict being replaced, and the replica was missing from /metrics (and from `drained`)
    until its next push, or collect failed with "dictionary changed size during iteration"."""
    hub = ray_serve.MetricsHub("app")
    for r in ("replica-1", "replica-2", "replica-3"):
        hub.push(r, r)
    midway = hub.latest = _PushMidway(hub, hub.latest)
    hub.collect()
    midway.push.join()  # it waited for the lock, or pushed midway
    assert hub.collect()["replica-late"] == "late"
    assert hub.busy["replica-late"] == 1


def test_many_replicas_pushing_at_once_are_all_kept(no_ray, fast_switching):
    """Counts match, and no collect failed, after 8 threads push 200 replicas each while a ninth collects."""
    hub = ray_serve.MetricsHub("app")
    stop, failed = threading.Event(), []

    def collect():
        while not stop.is_set():
            try:
                hub.collect()
            except RuntimeError as e:  # "dictionary changed size during iteration"
                failed.append(e)

    def push(k: int):
        for i in range(200):
            hub.push(f"r{k}-{i}", "text", i)

    reader = threading.Thread(target=collect)
    reader.start()
    writers = [threading.Thread(target=push, args=(k,)) for k in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert failed == []
    assert len(hub.collect()) == 8 * 200
    assert sum(hub.busy.values()) == 8 * sum(range(200))
