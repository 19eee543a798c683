"""`specserve serve` says, as it starts listening, what to give a client: the OpenAI base URL with
its /v1 and the model id to send.

Found as a newcomer: the only address printed was uvicorn's "Uvicorn running on
http://127.0.0.1:8000", and that address given to the openai SDK (or `specserve edit --base-url`)
got 404s, since the SDK adds no /v1. The model is not loaded here: `run` is given a stand-in.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tiny import save_tiny

import specserve.llm
import specserve.server.app
from specserve.cli.main import main
from specserve.cli.serve import base_url_line


@pytest.mark.parametrize(
    "host,url",
    [
        ("127.0.0.1", "http://127.0.0.1:8000/v1;"),
        ("0.0.0.0", "http://127.0.0.1:8000/v1 (listening on every address);"),
        ("::", "http://[::1]:8000/v1 (listening on every address);"),
        ("::1", "http://[::1]:8000/v1;"),
        ("example.org", "http://example.org:8000/v1;"),
    ],
)
def test_the_line_gives_a_url_a_client_can_use(host, url):
    assert base_url_line(host, 8000, "m", False) == f"OpenAI base URL: {url} model 'm'"


def test_the_line_says_when_an_api_key_is_needed():
    assert base_url_line("127.0.0.1", 8000, "m", True).endswith("model 'm', with the API key as the bearer token")


@pytest.fixture
def started(tmp_path, monkeypatch):
    """main(["serve", ...]) with the model load and uvicorn replaced: what serve() was given."""
    core = SimpleNamespace(host=None, host_store=None)
    llm = SimpleNamespace(model_name="tiny-model", backend_name="transformers", engine=SimpleNamespace(core=core))
    monkeypatch.setattr(specserve.llm.LLM, "from_options", staticmethod(lambda *a, **k: llm))
    calls = []
    monkeypatch.setattr(specserve.server.app, "serve", lambda *a, **k: calls.append(a))
    model = str(save_tiny(tmp_path / "model"))
    monkeypatch.delenv("SPECSERVE_API_KEY", raising=False)
    return lambda *flags: (main(["serve", "--model", model, "--host", "127.0.0.1", "--port", "0", *flags]), calls)


def test_serve_prints_the_base_url_and_model_before_it_listens(started, capsys):
    rc, calls = started()
    assert rc == 0 and len(calls) == 1
    err = capsys.readouterr().err
    assert "OpenAI base URL: http://127.0.0.1:0/v1; model 'tiny-model'" in err.splitlines()


def test_the_served_model_name_is_the_one_printed(started, capsys):
    rc, _ = started("--served-model-name", "coder", "--api-key", "k")
    assert rc == 0
    assert "OpenAI base URL: http://127.0.0.1:0/v1; model 'coder', with the API key" in capsys.readouterr().err
