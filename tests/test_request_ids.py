"""Every answer carries an `x-request-id` header, as OpenAI's API documents ("Debugging requests").

The openai SDK reads it into `completion._request_id`, `raw.request_id` and an error's
`APIStatusError.request_id`, for users to log; against this server all three were None.
"""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import Server, ServerOptions, create_app

API_KEY = "k"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}
REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")


def _boom(self):
    raise RuntimeError("a bug")


def test_every_answer_has_its_own_request_id(monkeypatch):
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    monkeypatch.setattr(Server, "models", _boom)  # GET /v1/models: a 500 from the app's own handler
    options = ServerOptions(api_key=API_KEY, max_body_bytes=4096)
    with TestClient(create_app(llm, "tiny", options), raise_server_exceptions=False) as client:
        answers = {
            "ok": client.post("/v1/completions", json=BODY, headers=AUTH),
            "stream": client.post("/v1/completions", json={**BODY, "stream": True}, headers=AUTH),
            "bad request": client.post("/v1/completions", json={**BODY, "n": 0}, headers=AUTH),
            "no such model": client.post("/v1/completions", json={**BODY, "model": "gpt-9"}, headers=AUTH),
            "no key": client.post("/v1/completions", json=BODY),
            "too large": client.post("/v1/completions", json={**BODY, "prompt": "x" * 5000}, headers=AUTH),
            "no route": client.post("/v1/nothing", json=BODY, headers=AUTH),
            "bug": client.get("/v1/models", headers=AUTH),
        }
    statuses = {name: r.status_code for name, r in answers.items()}
    assert statuses == {
        "ok": 200,
        "stream": 200,
        "bad request": 400,
        "no such model": 404,
        "no key": 401,
        "too large": 413,
        "no route": 404,
        "bug": 500,
    }
    ids = {name: r.headers.get("x-request-id") for name, r in answers.items()}
    assert all(rid and REQUEST_ID.fullmatch(rid) for rid in ids.values()), ids
    assert len(set(ids.values())) == len(ids), ids  # one per request
