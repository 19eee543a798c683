"""One of the app's Ray actors answers a second call while a first one waits (a local Ray cluster).

The app's actors (metrics hub, Responses store, chat store) are shared by every replica. As plain
actors they ran one call at a time: a slow call queued every other replica's call behind it.
ray_serve.hub_actor makes them threaded actors (max_concurrency); here a store actor made the way
the app makes its stores (ray_serve._store_hub) holds one call until a second one releases it.
Its own module: it starts its own small Ray cluster (marker `ray`, run with `pytest -m ray`).
"""

from __future__ import annotations

import threading

import pytest

from specserve.server import ray_serve

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_cluster():
    import ray  # `-m ray` asks for these tests: a missing Ray fails them, never skips them

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace=ray_serve.HUB_NAMESPACE)
    yield ray
    ray.shutdown()


def test_a_held_store_call_does_not_hold_up_a_second_one(ray_cluster):
    """A call that waits (for the next call's release, up to 60 s) and the call that releases it:
    one at a time, the release queued behind the wait, and the test ends in a GetTimeoutError (or
    the actor ends itself first, its app being absent here: ray_app_owned.py)."""

    class GateStore:  # made here, so Ray ships the class to the actor's process by value
        def __init__(self):
            self.gate = threading.Event()

        def hold(self) -> bool:
            return self.gate.wait(60)

        def release(self) -> bool:
            self.gate.set()
            return True

    ray = ray_cluster
    store = ray_serve._store_hub("gate-app", "gate", GateStore)
    held = store.hold.remote()
    assert ray.get(store.release.remote(), timeout=30) is True
    assert ray.get(held, timeout=30) is True
    ray.kill(store)
