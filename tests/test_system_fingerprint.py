"""`system_fingerprint` on chat completions and completions (and each streamed chunk): OpenAI's
`fp_` + hex, the same for every answer of one configuration, and another one when what decides the
outputs changes (specserve's version, the backend, the model, its dtype, exact mode). It was null.
In-process on a tiny model."""

from __future__ import annotations

import json
import re

import pytest
import torch
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

import specserve.server.fingerprint as fingerprint
from specserve.llm import LLM
from specserve.server.app import create_app
from specserve.server.fingerprint import system_fingerprint

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "def f(", "max_tokens": 3, "temperature": 0}
FP = re.compile(r"^fp_[0-9a-f]{10}$")


def _llm(model=None) -> LLM:
    return LLM.from_models(model if model is not None else tiny_model(), tiny_tokenizer(), speculation="none")


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(_llm(), "tiny")) as c:
        yield c


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
def test_answers_and_every_chunk_carry_one_fingerprint(client, path, body):
    answer = client.post(path, json=body).json()
    assert FP.match(answer["system_fingerprint"] or ""), answer["system_fingerprint"]
    stream = client.post(path, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    assert len(chunks) > 2 and {c["system_fingerprint"] for c in chunks} == {answer["system_fingerprint"]}
    assert client.post(path, json=body).json()["system_fingerprint"] == answer["system_fingerprint"]


def test_the_same_configuration_gives_the_same_fingerprint():
    assert system_fingerprint(_llm()) == system_fingerprint(_llm())


def test_the_dtype_changes_it():
    assert system_fingerprint(_llm(tiny_model().to(torch.float64))) != system_fingerprint(_llm())


def test_the_version_changes_it(monkeypatch):
    before = system_fingerprint(_llm())
    monkeypatch.setattr(fingerprint, "__version__", "0.0.0-other")
    assert system_fingerprint(_llm()) != before


def test_the_model_file_and_exact_mode_change_it(tmp_path):
    """The identity of a backend loaded from a file: its path, size and mtime, and exact mode."""

    class Gguf:
        name, batch_invariant = "llama.cpp", False

        def __init__(self, path, exact=False):
            self.path, self.batch_invariant = path, exact

    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"x" * 11)
    ident = fingerprint.backend_identity
    assert ident(Gguf(a)) == ident(Gguf(a))
    assert ident(Gguf(a)) != ident(Gguf(b)) and ident(Gguf(a)) != ident(Gguf(a, exact=True))
