"""`specserve serve --ray` with every replica's queue full: what a client gets through Ray's proxy.

Requests beyond what the replicas hold (ScaleConfig.max_ongoing_requests each) wait in Ray's
proxy, at most --max-queue x replicas of them; beyond that Ray's proxy answers itself, before any
replica (and so before specserve's app) sees the request. It answered 503 with no Retry-After: the
single server's answer to a full queue is 429 with Retry-After, which the OpenAI SDKs wait out and
retry. It is now 429 with Retry-After; the body is still Ray's one line of text, not OpenAI's JSON
(docs/deploy.md, Limits).

Its own module: it starts its own Ray cluster (one replica, --max-queue 1).
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import httpx
import pytest
from server_proc import ServerProcess
from tiny import tiny_model, tiny_tokenizer

from specserve.server.ray_serve import PROXY_RETRY_AFTER_S, ScaleConfig

MODEL = "tiny"
HELD = ScaleConfig().max_ongoing_requests + 1  # on the one replica, and the one the proxy may queue (--max-queue 1)
SENT = HELD + 3


def _save_slow_tiny(path) -> str:
    """A tiny model deep enough that a long answer takes tens of seconds: the held requests stay."""
    tiny_model(layers=24, hidden=128, max_positions=2048).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def _ask(url: str, i: int) -> httpx.Response:
    """One long request (tens of seconds on the slow model): it holds its place until the stop."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"def add(a, b):  # {i}"}],
        "max_tokens": 1800,
        "temperature": 0,
        "ignore_eos": True,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=180)


def _first_refused(url: str, pool: ThreadPoolExecutor) -> httpx.Response:
    """Send SENT requests at once and return the first answer (the held ones answer only at the stop)."""
    pending = {pool.submit(_ask, url, i) for i in range(SENT)}
    done, _ = wait(pending, timeout=120, return_when=FIRST_COMPLETED)
    assert done, f"none of {SENT} requests was answered though the replica holds {HELD}"
    return next(iter(done)).result()


@pytest.mark.ray
def test_a_request_beyond_every_replicas_queue_gets_a_429_with_retry_after(tmp_path):
    import ray.serve  # noqa: F401 - `-m ray` asks for this test: a missing Ray fails it, never skips it

    model = _save_slow_tiny(tmp_path / "slow")
    flags = ["--ray", "--replicas", "1", "--max-queue", "1", "--max-num-seqs", "1"]
    with (
        ThreadPoolExecutor(SENT) as pool,  # outside: the server's stop ends the held requests, then it joins them
        ServerProcess(model, *flags, "--served-model-name", MODEL, "--speculation", "none") as srv,
    ):
        refused = _first_refused(srv.url, pool)
    assert refused.status_code == 429, (refused.status_code, refused.text)
    assert refused.headers["retry-after"] == str(int(PROXY_RETRY_AFTER_S)), refused.headers
    assert refused.text.startswith("Request dropped due to backpressure"), refused.text  # Ray's own text
