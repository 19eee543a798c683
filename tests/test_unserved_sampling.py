"""vLLM's sampling fields this server does not implement are refused, not ignored.

`repetition_penalty`, `min_p`, `min_tokens`, `stop_token_ids`, `bad_words` and `allowed_token_ids`
travel in `extra_body` from vLLM clients. Unknown fields are otherwise ignored, so each of these
was dropped and the answer sampled from another distribution than the one asked for, with a 200
(the Python API refuses them as unknown arguments). A value that changes nothing (vLLM's
default) is still served, since clients send the defaults.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

COMPLETION = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
PATHS = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT}
CHANGING = [
    ("repetition_penalty", 1.3),
    ("min_p", 0.1),
    ("min_tokens", 2),
    ("stop_token_ids", [5]),
    ("bad_words", ["add"]),
    ("allowed_token_ids", [5, 6]),
]
DEFAULTS = [
    ("repetition_penalty", 1.0),
    ("min_p", 0.0),
    ("min_tokens", 0),
    ("stop_token_ids", []),
    ("bad_words", []),
    ("allowed_token_ids", None),
]


@pytest.fixture(scope="module")
def client():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,value", CHANGING, ids=[c[0] for c in CHANGING])
def test_an_unserved_sampling_field_is_a_400_naming_it(client, path, name, value):
    r = client.post(path, json={**PATHS[path], name: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == name and error["code"] == "unsupported_parameter"
    assert "\n" not in error["message"] and name in error["message"]


@pytest.mark.parametrize("path", PATHS)
def test_the_fields_at_their_defaults_are_served(client, path):
    r = client.post(path, json={**PATHS[path], **dict(DEFAULTS)})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path", PATHS)
def test_a_wrong_type_is_a_400_too(client, path):
    r = client.post(path, json={**PATHS[path], "min_tokens": "2"})
    assert r.status_code == 400, r.text
