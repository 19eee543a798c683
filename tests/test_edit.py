"""`specserve edit` and `refactor_with_predicted_outputs` through the official openai SDK.

Most tests talk to a fake OpenAI-compatible endpoint (a tiny local HTTP server streaming
scripted answers); one talks to the real `specserve serve` on a tiny random model.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specserve.cli.main import main
from specserve.edit import (
    EditError,
    build_messages,
    make_client,
    refactor_with_predicted_outputs,
    strip_fence,
)

ORIGINAL = "def greet(name):\n    return 'hi ' + name\n\n\ndef main():\n    print(greet('bob'))\n"
EDITED = "def greet(name: str) -> str:\n    return 'hi ' + name\n\n\ndef main():\n    print(greet('bob'))\n"


class FakeServer:
    """Streams `answer` in small chunks, then finish_reason and a usage chunk; records requests."""

    def __init__(self):
        self.answer, self.finish = "```python\n" + EDITED + "```", "stop"
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._json({"object": "list", "data": [{"id": "fake-coder", "object": "model", "created": 0,
                                                         "owned_by": "test"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in fake.chunks(body):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def _json(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def chunks(self, body):
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        pieces = [self.answer[i : i + 7] for i in range(0, len(self.answer), 7)]
        for p in pieces:
            yield {**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish}]}
        usage = {"prompt_tokens": 50, "completion_tokens": 40, "total_tokens": 90,
                 "completion_tokens_details": {"accepted_prediction_tokens": 30, "rejected_prediction_tokens": 4}}
        yield {**base, "choices": [], "usage": usage, "speculation": {"tokens_per_step": 5.0, "acceptance_rate": 0.88}}

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)
    return path


def edit_cli(server, path, *extra) -> int:
    return main(["edit", str(path), "--instruction", "Add type hints to greet", "--base-url", server.base_url, *extra])


@pytest.mark.parametrize("answer, expected", [
    ("```python\nx = 1\n```", "x = 1\n"),
    ("```\nx = 1\n```\n", "x = 1\n"),
    ("\n```ts\nconst a = 1;\n\nconst b = 2;\n```  \n", "const a = 1;\n\nconst b = 2;\n"),
    ("x = 1\n", "x = 1\n"),  # no fence: unchanged
    ("x = 1", "x = 1\n"),  # trailing newline matched to the original
    ("```md\na\n```\nb\n```", "a\n```\nb\n"),  # inner fences kept: only the outermost pair goes
    ("Here you go:\n```python\nx = 1\n```", "Here you go:\n```python\nx = 1\n```\n"),  # not a surrounding fence
])
def test_strip_fence(answer, expected):
    assert strip_fence(answer, "y = 0\n") == expected


def test_refactor_function(server):
    client = make_client(server.base_url, "k")
    deltas = []
    r = refactor_with_predicted_outputs(ORIGINAL, "Add type hints to greet", client, on_delta=deltas.append,
                                        language="python")
    assert r.complete and r.code == EDITED and "".join(deltas) == r.raw
    assert r.model == "fake-coder"  # the first model the server lists
    assert (r.accepted_prediction_tokens, r.rejected_prediction_tokens, r.completion_tokens) == (30, 4, 40)
    assert r.speculation == {"tokens_per_step": 5.0, "acceptance_rate": 0.88}
    assert r.time_to_first_token is not None and r.tokens_per_second > 0
    body = server.requests[-1]
    assert body["prediction"] == {"type": "content", "content": ORIGINAL}
    assert body["temperature"] == 0 and body["stream"] is True and body["stream_options"]["include_usage"]
    assert body["messages"] == build_messages(ORIGINAL, "Add type hints to greet", "python")
    assert body["messages"][1]["content"].endswith(f"```python\n{ORIGINAL}\n```")


def test_in_place_writes_file_and_backup(server, src, capsys):
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED
    assert (src.parent / "greet.py.bak").read_text() == ORIGINAL
    out, err = capsys.readouterr()
    assert "+def greet(name: str) -> str:" in out and "-def greet(name):" in out
    assert "accepted prediction tokens" in err and "30" in err and "tokens/s" in err


def test_truncated_answer_is_refused(server, src, capsys):
    server.answer, server.finish = "```python\ndef greet(name: str) -> str:\n", "length"
    assert edit_cli(server, src, "--in-place") != 0
    assert src.read_text() == ORIGINAL
    assert not (src.parent / "greet.py.bak").exists()
    assert "incomplete" in capsys.readouterr().err


def test_dry_run_writes_nothing(server, src, tmp_path, capsys):
    before = sorted(p.name for p in tmp_path.iterdir())
    assert edit_cli(server, src, "--dry-run") == 0
    assert src.read_text() == ORIGINAL and sorted(p.name for p in tmp_path.iterdir()) == before
    assert "+def greet(name: str) -> str:" in capsys.readouterr().out
    assert edit_cli(server, src) == 0  # no destination: same as a dry run
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_output_and_html(server, src, tmp_path):
    out, html = tmp_path / "new.py", tmp_path / "edit.html"
    assert edit_cli(server, src, "--output", str(out), "--html", str(html)) == 0
    assert out.read_text() == EDITED and src.read_text() == ORIGINAL
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "s-target" in page and "s-prediction" in page
    assert "accepted prediction tokens" in page


def test_unreachable_server(src, capsys):
    rc = main(["edit", str(src), "-i", "x", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert rc == 2 and "cannot reach the server" in capsys.readouterr().err
    with pytest.raises(EditError):
        refactor_with_predicted_outputs(ORIGINAL, "x", make_client("http://127.0.0.1:9/v1"), model="m")


def test_against_specserve_serve(tmp_path):
    """The real server on a tiny random model: usage and speculation come back; a cut answer is refused."""
    from server_proc import ServerProcess
    from tiny import save_tiny

    model = save_tiny(tmp_path / "model")
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)
    with ServerProcess(model) as srv:
        r = refactor_with_predicted_outputs(ORIGINAL, "Add type hints", make_client(srv.base_url), max_tokens=12)
        assert r.finish_reason in ("length", "stop") and r.completion_tokens <= 12
        assert r.accepted_prediction_tokens + r.rejected_prediction_tokens >= 0 and r.speculation is not None
        if r.finish_reason == "length":
            rc = main(["edit", str(path), "-i", "Add type hints", "--base-url", srv.base_url, "--in-place",
                       "--max-tokens", "12"])
            assert rc != 0 and path.read_text() == ORIGINAL
