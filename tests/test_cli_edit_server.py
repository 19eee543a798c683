"""`specserve edit` when the server it needs is not there, or its URL is not one: the error
says what to do (start a server, point --base-url at one, or end it in /v1)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specserve.cli.main import main


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "f.py"
    path.write_text("def f():\n    return 1\n")
    return path


def test_an_unreachable_server_says_how_to_reach_one(src, capsys):
    """It said "cannot reach the server at http://127.0.0.1:9/v1/: Connection error." and no more."""
    assert main(["edit", str(src), "-i", "x", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the server at http://127.0.0.1:9/v1" in err
    assert "specserve serve" in err and "--base-url" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "notaurl", "ftp://host/v1"])
def test_a_base_url_without_http_is_refused_in_words(url, src, capsys, monkeypatch):
    """`--base-url localhost:8000/v1` was a bare "Connection error." after the client tried it."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["edit", str(src), "-i", "x", "--base-url", url, "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert f"--base-url {url} is not an http:// or https:// URL" in err and len(err.splitlines()) == 1


def test_a_bad_url_in_the_environment_names_the_variable(src, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "localhost:8000")
    assert main(["edit", str(src), "-i", "x", "--model", "m"]) == 2
    assert "$OPENAI_BASE_URL localhost:8000 is not an http:// or https:// URL" in capsys.readouterr().err


class _NotFound(BaseHTTPRequestHandler):
    """Answers every request with the 404 `specserve serve` gives a URL it does not serve, or,
    with `code`, the 404 of a model it does not serve."""

    code: str | None = None

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._not_found()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._not_found()

    def _not_found(self):
        message = "the model 'm' does not exist" if self.code else f"Invalid URL ({self.command} {self.path})"
        data = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": self.code}})
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


@pytest.fixture
def not_found():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_base_url_without_v1_is_told_to_add_it(src, capsys, not_found):
    """`--base-url http://127.0.0.1:8000` (the address `specserve serve` prints) got only "the server
    refused the request (404): Invalid URL (POST /chat/completions)"."""
    assert main(["edit", str(src), "-i", "x", "--base-url", not_found + "/", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "Invalid URL (POST /chat/completions)" in err and len(err.splitlines()) == 1
    assert f"try --base-url {not_found}/v1" in err


def test_a_404_from_a_v1_url_or_for_the_model_gives_no_such_advice(src, capsys, not_found, monkeypatch):
    assert main(["edit", str(src), "-i", "x", "--base-url", not_found + "/v1", "--model", "m"]) == 2
    assert "try --base-url" not in capsys.readouterr().err
    monkeypatch.setattr(_NotFound, "code", "model_not_found")
    assert main(["edit", str(src), "-i", "x", "--base-url", not_found, "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "try --base-url" not in err


class _Unauthorized(_NotFound):
    """Answers every request as `specserve serve --api-key` answers a wrong key."""

    def _not_found(self):
        data = json.dumps({"error": {"message": "incorrect API key provided", "code": "invalid_api_key"}})
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


def test_a_401_without_a_key_says_how_to_give_one(src, capsys, monkeypatch):
    """With no --api-key and no $OPENAI_API_KEY the tool sends a placeholder key, which a server
    with a key answered "incorrect API key provided": as if the user had given a wrong one."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Unauthorized)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        assert main(["edit", str(src), "-i", "x", "--base-url", url, "--model", "m"]) == 2
        err = capsys.readouterr().err
        assert "(401): incorrect API key provided; no key was given: pass the server's key with --api-key" in err
        assert main(["edit", str(src), "-i", "x", "--base-url", url, "--model", "m", "--api-key", "wrong"]) == 2
        err = capsys.readouterr().err
        assert "incorrect API key provided" in err and "no key was given" not in err
    finally:
        httpd.shutdown()
