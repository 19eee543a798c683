"""Faults injected on purpose: how tests and `scripts/soak.py` reach the failure paths of a real server.

Off unless the server process starts with SPECSERVE_FAULT_INJECT=1 in its environment; the
server reads the variable in one place only (`create_app`). When on:

- the engine's target backend is wrapped in a `FaultyBackend`;
- `POST /debug/fault {"kind": "step" | "worker" | "leak" | "free", "after": N}` arms one fault: the
  N-th target pass from now (N >= 1, default 1) raises instead of running (a leak and a free: see below).

    step    an `InjectedFault` (a ValueError, on purpose: a backend fault whose type validation
            errors also use must still be a 500). The requests of that pass fail with a 500;
            the engine serves on.
    worker  an `InjectedWorkerDeath` (a BaseException): it escapes every handler in the step and
            kills the engine's worker thread. Requests in flight fail with a 503, new ones get a
            503, /health says unavailable (the server must be restarted).
    leak    each of the next N passes runs, and keeps 1 MiB of memory for good: a leak made on
            purpose, so that a soak's memory check is seen to fail once.
    free    the N-th freeing of a target sequence from now raises and frees nothing, as a backend
            that cannot free one: the engine retires that sequence (`lost_sequences` in /health,
            `specserve_lost_sequences` in /metrics); every request is answered as before.

Every injected error's message contains "injected", so a soak can tell them from real faults.
Never set the variable on a server that serves users: anyone who can reach it can break it.
"""

from __future__ import annotations

import os
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

ENV = "SPECSERVE_FAULT_INJECT"
KINDS = ("step", "worker", "leak", "free")
LEAK_BYTES = 2**20  # kept per pass by the "leak" fault


def enabled() -> bool:
    return os.environ.get(ENV, "") == "1"


class InjectedFault(ValueError):
    """A fault in a target pass, injected on purpose."""


class InjectedWorkerDeath(BaseException):
    """Kills the engine's worker thread, injected on purpose."""


class FaultyBackend:
    """A target backend whose next passes can be told to fail; everything else is the wrapped backend's."""

    def __init__(self, inner):
        self._inner = inner
        self._lock = threading.Lock()
        self._armed: list[tuple[int, str]] = []  # (passes left before it fires, kind)
        self._frees: list[int] = []  # sequence frees left before each armed "free" fires
        self._leaking = 0  # passes left that each keep LEAK_BYTES
        self._leaked: list[bytearray] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def arm(self, kind: str, after: int = 1) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; choose one of {', '.join(KINDS)}")
        with self._lock:
            if kind == "leak":
                self._leaking += max(1, after)
            elif kind == "free":
                self._frees.append(max(1, after))
            else:
                self._armed.append((max(1, after), kind))

    def forward(self, inputs):
        fire = None
        with self._lock:
            armed = []
            for left, kind in self._armed:
                if left <= 1 and fire is None:
                    fire = kind
                else:
                    armed.append((left - 1, kind))
            self._armed = armed
            if self._leaking:
                self._leaking -= 1
                self._leaked.append(bytearray(b"\x01") * LEAK_BYTES)  # written: resident
        if fire == "worker":
            raise InjectedWorkerDeath("injected worker death (SPECSERVE_FAULT_INJECT)")
        if fire == "step":
            raise InjectedFault("injected fault in a target pass (SPECSERVE_FAULT_INJECT)")
        return self._inner.forward(inputs)

    def free_sequence(self, seq: int) -> None:
        with self._lock:
            fire = any(left <= 1 for left in self._frees)
            self._frees = [left - 1 for left in self._frees if left > 1]
        if fire:
            raise InjectedFault(f"injected failure to free sequence {seq} (SPECSERVE_FAULT_INJECT)")
        self._inner.free_sequence(seq)


def install(app: FastAPI, core) -> FaultyBackend:
    """Wrap the engine core's target backend and add the POST /debug/fault route."""
    backend = core.target if isinstance(core.target, FaultyBackend) else FaultyBackend(core.target)
    core.target = backend

    @app.post("/debug/fault", include_in_schema=False)
    async def arm_fault(request: Request):
        try:
            body = await request.json()
            kind, after = str(body.get("kind")), int(body.get("after", 1))
            backend.arm(kind, after)
        except (ValueError, TypeError, AttributeError) as e:  # not JSON, not an object, a bad kind or count
            return JSONResponse(
                {"error": {"message": f"bad fault: {e}", "type": "invalid_request_error", "param": None, "code": None}},
                400,
            )
        return {"armed": kind, "after": after}

    return backend
