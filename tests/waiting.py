"""Wait for a condition, not for a fixed time: a test is then as fast as the system it drives.

    replicas = wait_until(lambda: live_replicas() or None, 60, lambda: f"no replica in {srv.metrics()!r}")

A fixed sleep is too long on an idle machine and too short on a busy one; polling a condition
with a deadline costs only what the system needs, and the deadline (a liveness guard, not a
timing assertion) turns a condition that never comes into a failure that says what was awaited
and what was seen last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.1


def wait_until(check: Callable[[], T], timeout: float, seen: Callable[[], str] | str) -> T:
    """`check()`'s first truthy answer, polled every POLL_S; an AssertionError naming `seen` (a
    string, or a function called then for what was last observed) when none comes in `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout:g} s: {seen() if callable(seen) else seen}")
        time.sleep(POLL_S)
