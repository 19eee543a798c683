"""What GET /health says about the server: a load balancer's probe reads its status code."""

from __future__ import annotations

from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

BODY = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}


def test_health_says_unavailable_once_the_server_is_draining():
    """Once shutdown has begun the server refuses every new request with a 503, and /health must
    say so (docs/server.md: 503 "once the engine's worker has died or the server is stopping"), so
    a balancer sends no more. It said 200 "ok" for the whole drain, as its worker still ran
    (found comparing /health with a request sent after Server.drain; behind Ray Serve a replica
    drains for 5 s with its port open)."""
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as client:
        assert client.get("/health").status_code == 200
        client.app.state.server.drain(60.0)
        assert client.post("/v1/completions", json=BODY).status_code == 503
        health = client.get("/health")
        assert (health.status_code, health.json()["status"]) == (503, "unavailable")
        assert health.json()["worker_alive"]  # the worker is fine: the server is what is stopping
