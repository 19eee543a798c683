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
    DEFAULT_PROMPT,
    PROMPTS,
    RETRY_PROMPT,
    EditError,
    EditResult,
    ask_for,
    blocks_ask,
    build_messages,
    check_answer,
    judge_answer,
    language_for,
    make_client,
    read_source,
    refactor_with_predicted_outputs,
    strip_fence,
)

ORIGINAL = "def greet(name):\n    return 'hi ' + name\n\n\ndef main():\n    print(greet('bob'))\n"
EDITED = "def greet(name: str) -> str:\n    return 'hi ' + name\n\n\ndef main():\n    print(greet('bob'))\n"


class FakeServer:
    """Streams `answer` in small chunks, then finish_reason and a usage chunk; records requests."""

    def __init__(self):
        self.answer, self.finish = "```python\n" + EDITED + "```", "stop"
        self.queue: list[str] = []  # answers for the next requests, in order; then `answer`
        self.requests: list[dict] = []
        self.on_request = None  # called with each request body before the answer is sent
        self.refuse_continuing = False  # answer continue_final_message with a 400, as OpenAI does
        self.error_mid_stream: str | None = None  # an SSE error event after the first piece, as a server stopping sends
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._json(
                    {
                        "object": "list",
                        "data": [{"id": "fake-coder", "object": "model", "created": 0, "owned_by": "test"}],
                    }
                )

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                if fake.on_request:
                    fake.on_request(body)
                if fake.refuse_continuing and "continue_final_message" in body:  # as OpenAI's own API does
                    message = "Unrecognized request argument supplied: continue_final_message"
                    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
                    return self._json({"error": error}, 400)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in fake.chunks(body):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def _json(self, obj, status=200):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def chunks(self, body):
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        answer = self.queue.pop(0) if self.queue else self.answer
        opening = body["messages"][-1]["content"] if body.get("continue_final_message") else ""
        if opening and answer.startswith(opening):  # the model goes on from the answer begun for it
            answer = answer[len(opening) :]
        pieces = [answer[i : i + 7] for i in range(0, len(answer), 7)]
        for p in pieces:
            yield {**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
            if self.error_mid_stream:
                yield {"error": {"message": self.error_mid_stream, "type": "server_error", "param": None, "code": None}}
                return
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish}]}
        usage = {
            "prompt_tokens": 50,
            "completion_tokens": 40,
            "total_tokens": 90,
            "completion_tokens_details": {"accepted_prediction_tokens": 30, "rejected_prediction_tokens": 4},
        }
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


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("```python\nx = 1\n```", "x = 1\n"),
        ("```\nx = 1\n```\n", "x = 1\n"),
        ("\n```ts\nconst a = 1;\n\nconst b = 2;\n```  \n", "const a = 1;\n\nconst b = 2;\n"),
        ("x = 1\n", "x = 1\n"),  # no fence: unchanged
        ("x = 1", "x = 1\n"),  # trailing newline matched to the original
        ("```md\na\n```\nb\n```", "a\n```\nb\n"),  # inner fences kept: only the outermost pair goes
        ("Here you go:\n```python\nx = 1\n```", "Here you go:\n```python\nx = 1\n```\n"),  # not a surrounding fence
    ],
)
def test_strip_fence(answer, expected):
    assert strip_fence(answer, "y = 0\n") == expected


# A 20-line module: the rules below are checked against it (they scale with the file's size).
MODULE = """import math


def area(radius):
    \"\"\"The area of a circle.\"\"\"
    return math.pi * radius ** 2


def perimeter(radius):
    return 2 * math.pi * radius


class Circle:
    def __init__(self, radius):
        self.radius = radius

    def area(self):
        return area(self.radius)

    def perimeter(self):
        return perimeter(self.radius)
"""
RENAMED = MODULE.replace("perimeter", "circumference")
LATER = MODULE.split("class Circle:")[1]


def test_check_answer_accepts_real_edits():
    assert check_answer(MODULE, RENAMED, "Rename perimeter to circumference.", "python") == []
    hinted = MODULE.replace("def area(radius):", "def area(radius: float) -> float:")
    assert check_answer(MODULE, hinted, "Add type hints to area.", "python") == []
    assert check_answer(MODULE, MODULE, "Add a docstring to area.", "python") == []  # no-op: not broken
    assert check_answer(MODULE, MODULE, "Rename perimeter to circumference.", "python") == [
        "the rename is not done: `circumference` appears nowhere in the answer's code"
    ]
    # A removal asked for: a much shorter answer is what was wanted.
    only_area = MODULE.split("def perimeter")[0]
    assert check_answer(MODULE, only_area, "Delete perimeter and the Circle class.", "python") == []
    assert check_answer(MODULE, only_area, "Simplify the module to area only.") == []
    # A Python body `...` and a comment the original already had are not elisions.
    stub = MODULE.replace("        return perimeter(self.radius)", "        ...")
    assert check_answer(MODULE, stub, "Make Circle.perimeter a stub.", "python") == []
    kept = "# ... rest of the file ...\n" + MODULE
    assert check_answer(kept, kept.replace("area", "surface"), "Rename area to surface.") == []
    # Markdown: a fence or a sentence is content, not chatter.
    doc = "# Circles\n\nArea and perimeter.\n"
    answer = "Here is how to use it:\n\n```python\narea(1.0)\n```\n\n# Circles\n\nArea and perimeter.\n"
    assert check_answer(doc, answer, "Add a usage example.", "markdown") == []


@pytest.mark.parametrize(
    "answer, instruction, expected",
    [
        ("", "Rename perimeter to circumference.", "empty"),
        ("obj['updated_code']\n", "Rename perimeter to circumference.", "placeholder"),
        ("obj['updated_code']\n", "Remove the Circle class.", "placeholder"),  # a removal does not excuse it
        ("updated_code\n", "Remove the Circle class.", "placeholder"),
        (MODULE.split("class Circle:")[0], "Add type hints to area.", "far shorter"),  # 9 of 15 lines
        ("import math\n\n\ndef area(radius):\n    return math.pi * radius ** 2\n", "Add a docstring.", "far shorter"),
        (
            "Here is the updated file with perimeter renamed to circumference as requested.\n" * 20,
            "Rename perimeter to circumference.",
            "prose",
        ),
        ("Sure! Here it is:\n```python\n" + RENAMED + "```\n", "Rename perimeter to circumference.", "prose"),
        ("The code:\n```python\n" + RENAMED + "```\nDone.\n", "Rename perimeter to circumference.", "fenced"),
        ("x = 1\ny = 2\nz = 3\nw = 4\n" * 6, "Remove the comments.", "none of the original's lines"),
        (
            MODULE.split("class Circle:")[0] + "# ... rest of the file ...\n",
            "Remove unused imports.",
            "leaves code out",
        ),
        (
            MODULE.split("class Circle:")[0] + "class Circle:\n    # existing code\n",
            "Delete perimeter.",
            "leaves code out",
        ),
        (MODULE.split("class Circle:")[0] + "// ... unchanged\n", "Drop area.", "leaves code out"),
        (MODULE.split("class Circle:")[0] + "<rest of code>\n", "Shorten it.", "leaves code out"),
        (MODULE.split("class Circle:")[0] + "class Circle:\n    ...\n\n...\n", "Trim it.", "leaves code out"),
        (MODULE.replace("return 2 * math.pi * radius", "return 2 * math.pi * radius +"), "Fix it.", "not valid Python"),
    ],
)
def test_check_answer_refuses(answer, instruction, expected):
    problems = check_answer(MODULE, answer, instruction, "python")
    assert problems and any(expected in p for p in problems), problems


def test_check_answer_rules_are_separate():
    """Each rule fires on its own: a removal instruction silences only the length rule."""
    short = MODULE.split("class Circle:")[0]
    assert check_answer(MODULE, short, "Add type hints.") and not check_answer(MODULE, short, "Remove Circle.")
    # A rewrite instruction silences only the keeps-nothing rule.
    other = "import cmath\n\n\ndef disc(r):\n    return cmath.pi * r * r\n" * 3
    assert any("none of" in p for p in check_answer(MODULE, other, "Make it shorter."))
    assert not check_answer(MODULE, other, "Rewrite it from scratch, shorter.")
    # Syntax is checked for Python only, and only when the original itself compiles.
    broken = MODULE + "def oops(:\n"
    assert check_answer(MODULE, broken, "Add oops.", "") == []
    assert check_answer(broken, broken + "x = 1\n", "Add x.", "python") == []


def test_a_name_in_the_instruction_is_not_a_request_to_remove_code():
    """Asked to "add type hints to the function split" in a 60-line file, the 1.5B pack answered
    with the one function: `split` read as a removal verb, and the tool would have written 12
    lines over the file. A word that names code (after "function", called, in backticks, or
    defined by the file) is not a verb; a real removal still is."""
    code = MODULE + "\n\ndef split(p):\n    return p.split('/')\n\n\ndef remove_all(xs):\n    xs.clear()\n"
    one_function = "def split(p: str) -> list[str]:\n    return p.split('/')\n"
    for instruction in (
        "Add type hints to the function split.",
        "Add type hints to split.",
        "Add a docstring to `split`.",
        "Fix split() for bytes.",
        "Rename remove_all to clear_all.",
    ):
        assert any("far shorter" in p for p in check_answer(code, one_function, instruction, "python")), instruction
    for instruction in ("Delete the function area and the Circle class.", "Remove everything but split.", "Strip it."):
        assert not any("far shorter" in p for p in check_answer(code, one_function, instruction, "python")), instruction


def test_prompts_share_one_layout():
    for p in PROMPTS.values():
        msgs = build_messages(ORIGINAL, "Rename greet to hello.", "python", p.name)
        shots = ["user", "assistant"] * len(p.examples)  # worked examples come before the request
        assert [m["role"] for m in msgs] == ["system", *shots, "user"]
        assert f"```python\n{ORIGINAL}" in msgs[-1]["content"] and "Rename greet to hello." in msgs[-1]["content"]


def test_refactor_function(server):
    client = make_client(server.base_url, "k")
    deltas = []
    r = refactor_with_predicted_outputs(
        ORIGINAL, "Add type hints to greet", client, on_delta=deltas.append, language="python"
    )
    assert r.complete and r.code == EDITED and "".join(deltas) == r.raw
    assert r.model == "fake-coder"  # the first model the server lists
    assert (r.accepted_prediction_tokens, r.rejected_prediction_tokens, r.completion_tokens) == (30, 4, 40)
    assert r.speculation == {"tokens_per_step": 5.0, "acceptance_rate": 0.88}
    assert r.time_to_first_token is not None and r.tokens_per_second > 0
    body = server.requests[-1]
    assert body["prediction"] == {"type": "content", "content": ORIGINAL}
    assert body["temperature"] == 0 and body["stream"] is True and body["stream_options"]["include_usage"]
    assert body["messages"] == build_messages(ORIGINAL, "Add type hints to greet", "python")
    assert f"```python\n{ORIGINAL}\n```" in body["messages"][1]["content"]


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


# The case (issue 17, item 10): on a real framework file the default 1.5B pack answered
# "Rename <function> to <new name>." with 9 tokens, a fenced `obj['updated_code']`, finish_reason stop.
PLACEHOLDER = "```python\nobj['updated_code']\n```"


def test_in_place_follows_a_symlink_and_keeps_the_mode(server, tmp_path):
    """The file a link points to is edited and the link stays; an executable stays executable."""
    real = tmp_path / "real" / "greet.py"
    real.parent.mkdir()
    real.write_text(ORIGINAL)
    real.chmod(0o750)
    link = tmp_path / "greet.py"
    link.symlink_to(real)
    assert edit_cli(server, link, "--in-place") == 0
    assert link.is_symlink() and real.read_text() == EDITED
    assert real.stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "greet.py.bak").read_text() == ORIGINAL
    assert sorted(p.name for p in real.parent.iterdir()) == ["greet.py"]  # no temporary file left


def test_a_link_planted_at_the_temporary_file_s_name_is_not_written_through(server, tmp_path):
    """The write went through `.NAME.specserve-tmp`, a fixed name opened without O_EXCL: a symlink
    left there (a stale one, or planted by another user of a shared folder) had the edit written
    into the file it pointed to, and then replaced the edited file with that link. The temporary
    file is now made afresh (O_EXCL, a random name, mode 0600 until it takes the file's)."""
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)
    path.chmod(0o640)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    planted = tmp_path / ".greet.py.specserve-tmp"
    planted.symlink_to(victim)
    assert edit_cli(server, path, "--in-place") == 0
    assert victim.read_text() == "keep me\n"
    assert not path.is_symlink() and path.read_text() == EDITED and path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".greet.py.specserve-tmp",
        "greet.py",
        "greet.py.bak",
        "victim.txt",
    ]


def test_output_to_a_new_file_keeps_the_edited_file_s_mode(server, tmp_path):
    """`--output new.sh` from an executable script made a 0644 file: the edit lost its x bit."""
    script = tmp_path / "greet.py"
    script.write_text(ORIGINAL)
    script.chmod(0o755)
    out = tmp_path / "out.py"
    assert edit_cli(server, script, "--output", str(out)) == 0
    assert out.read_text() == EDITED and out.stat().st_mode & 0o777 == 0o755


def test_in_place_keeps_hard_links(server, src):
    other = src.parent / "also_greet.py"
    other.hardlink_to(src)
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED and other.read_text() == EDITED
    assert src.stat().st_ino == other.stat().st_ino


def test_crlf_line_ends_and_a_bom_are_kept(server, tmp_path):
    """The model sees '\\n' text; the file is written back with its CRLF line ends and BOM, so
    the diff a user's git shows is the edit, not every line."""
    path = tmp_path / "greet.py"
    original = ("\ufeff" + ORIGINAL).replace("\n", "\r\n").encode("utf-8")
    path.write_bytes(original)
    assert edit_cli(server, path, "--in-place") == 0
    assert "\r" not in server.requests[0]["prediction"]["content"]
    assert not server.requests[0]["prediction"]["content"].startswith("\ufeff")
    assert path.read_bytes() == ("\ufeff" + EDITED).replace("\n", "\r\n").encode("utf-8")
    again, out = tmp_path / "again.py", tmp_path / "out.py"
    again.write_bytes(original)
    assert edit_cli(server, again, "--output", str(out)) == 0
    assert out.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("ends", [("\r\n",) * 5 + ("\n",), ("\n", "\r\n", "\n", "\n", "\r\n", "\n")])
def test_a_file_that_mixes_line_ends_keeps_each_kept_line_s_own(server, tmp_path, ends):
    """CRLF lines with an LF last line (a Windows file appended to by another tool), or a few CRLF
    lines in an LF file: only the edited line may change its end, to the file's most common one,
    so the user's diff is the edit and not every line."""
    lines = ORIGINAL.split("\n")[:-1]
    path = tmp_path / "greet.py"
    path.write_bytes("".join(line + end for line, end in zip(lines, ends)).encode())
    assert edit_cli(server, path, "--in-place") == 0
    assert "\r" not in server.requests[0]["prediction"]["content"]
    majority = max(set(ends), key=ends.count)
    new_ends = (majority,) + ends[1:]  # the first line is the edited one
    expected = "".join(line + end for line, end in zip(EDITED.split("\n")[:-1], new_ends))
    assert path.read_bytes() == expected.encode()


def test_a_stray_cr_before_a_line_end_is_kept_on_lines_the_edit_did_not_touch(server, tmp_path):
    """A CRLF file with a line ending in CR CR LF (converted twice by some tool): the model sees
    that line with a CR before its '\n' and writes it back so; that '\r\n' in the answer was taken
    for the model's own CRLF and turned into '\n', so the untouched line lost its CR."""
    path = tmp_path / "greet.py"
    lines = ORIGINAL.split("\n")[:-1]
    ends = ["\r\n"] * len(lines)
    ends[3] = "\r\r\n"
    path.write_bytes("".join(line + end for line, end in zip(lines, ends)).encode())
    sent = server.answer
    server.on_request = lambda body: setattr(server, "answer", sent.replace("\n\n\ndef main", "\n\n\r\ndef main"))
    assert edit_cli(server, path, "--in-place") == 0
    assert "\r\n" in server.requests[0]["prediction"]["content"]  # the stray CR, as the model saw it
    expected = "".join(line + end for line, end in zip(EDITED.split("\n")[:-1], ends))
    assert path.read_bytes() == expected.encode()


def test_a_file_with_bare_cr_line_ends_is_edited_line_by_line(server, tmp_path, capsys):
    """A classic Mac file (a lone CR ends each line) was one line to the edit: the model was sent
    its CRs, the diff replaced the whole file, and the answer's '\n' lines were written over it.
    Now the model sees '\n' lines, the diff is the edited line, and the file keeps its CRs."""
    path = tmp_path / "greet.py"
    path.write_bytes(ORIGINAL.replace("\n", "\r").encode())
    assert edit_cli(server, path, "--in-place") == 0
    assert server.requests[0]["prediction"]["content"] == ORIGINAL
    diff = capsys.readouterr().out
    assert "-def greet(name):\n+def greet(name: str) -> str:\n" in diff
    assert sum(line.startswith(("+", "-")) for line in diff.splitlines()) == 4  # the headers and one line each
    assert path.read_bytes() == EDITED.replace("\n", "\r").encode()


@pytest.mark.parametrize(
    "raw",
    [
        b"a\rb\r\rc\r",  # classic Mac
        b"a\rb\rc",  # no end after the last line
        b"\xef\xbb\xbfa\rb\r",  # with a byte-order mark
        b"a\rb\rc\nd\r",  # a Mac file with one LF line appended
        b"a\r\nb\rc\r\rd\r",  # a CRLF line in a Mac file
        b"a\r\nb\r\r\nc\r\n",  # CRLF with a CR CR LF line
        b"a\nb\rc\nd\n",  # a CR inside a line of an LF file: a character, not a line end
        b"a\r\nb\n",
        b"a\rb\n",
        b"\r",
        b"\n\r\n\r",
        b"",
    ],
)
def test_a_file_written_back_unedited_is_the_same_bytes(tmp_path, raw):
    """Whatever its line ends, a file the edit leaves as it was is written back byte for byte."""
    path = tmp_path / "f.py"
    path.write_bytes(raw)
    source = read_source(path)
    assert source.encode(source.text) == raw
    assert "\r" not in source.text or b"\n" in raw  # lone CRs are line ends only in a file that has few LFs


def test_a_bare_cr_file_answered_unchanged_is_written_back_the_same(server, tmp_path):
    """--force writes an answer that is the file unchanged: the file's bytes stay what they were."""
    path = tmp_path / "greet.py"
    raw = ("\ufeff" + ORIGINAL).replace("\n", "\r").encode()
    path.write_bytes(raw)
    server.answer = "```python\n" + ORIGINAL + "```"
    assert edit_cli(server, path, "--in-place", "--force") == 0
    assert path.read_bytes() == raw and (tmp_path / "greet.py.bak").read_bytes() == raw


@pytest.mark.parametrize("how", ["--in-place", "--output FILE", "--output ./FILE"])
def test_a_file_changed_while_the_model_answers_is_not_overwritten(server, src, capsys, how):
    """Minutes pass while a CPU model answers: what the user saved meanwhile must survive, also
    when --output names the file itself."""
    mine = ORIGINAL + "\n\ndef bye():\n    return 'bye'\n"
    server.on_request = lambda body: src.write_text(mine)
    flags = how.replace("./FILE", str(src.parent / "." / src.name)).replace("FILE", str(src)).split()
    assert edit_cli(server, src, *flags) != 0
    assert src.read_text() == mine and not (src.parent / "greet.py.bak").exists()
    assert "changed on disk while the model was answering" in capsys.readouterr().err


def test_output_naming_the_file_itself_writes_the_edit(server, src):
    assert edit_cli(server, src, "--output", str(src)) == 0
    assert src.read_text() == EDITED and not (src.parent / "greet.py.bak").exists()


def test_a_file_removed_while_the_model_answers_is_not_written_back(server, src, capsys):
    server.on_request = lambda body: src.unlink()
    assert edit_cli(server, src, "--in-place") != 0
    err = capsys.readouterr().err
    assert "cannot be read back" in err and "Traceback" not in err and not src.exists()


def test_an_unwritable_destination_fails_before_the_model_is_asked(server, src, tmp_path, capsys):
    assert edit_cli(server, src, "--output", str(tmp_path / "missing" / "out.py")) != 0
    assert "does not exist" in capsys.readouterr().err and server.requests == []
    assert edit_cli(server, src, "--output", str(tmp_path)) != 0
    assert "is a folder" in capsys.readouterr().err and server.requests == []


def test_a_file_that_is_not_utf8_is_refused_in_one_line(server, tmp_path, capsys):
    path = tmp_path / "latin.py"
    path.write_bytes(b"caf\xe9 = 1\n")
    assert edit_cli(server, path, "--in-place") != 0
    err = capsys.readouterr().err
    assert err == f"specserve: error: cannot read {path}: not UTF-8 text (byte 3)\n" and server.requests == [], err
    assert path.read_bytes() == b"caf\xe9 = 1\n"


@pytest.mark.parametrize("name, reason", [("missing.py", "No such file or directory"), (".", "Is a directory")])
def test_a_file_that_cannot_be_read_is_named_in_plain_words(server, tmp_path, capsys, name, reason):
    """A missing FILE (a typo) was "specserve: error: [Errno 2] No such file or directory: '...'",
    Python's OSError text, and a folder "[Errno 21] Is a directory"; now one line in the words every
    command uses for an input file (inputs.py: the system's reason), before the server is asked."""
    path = tmp_path / name
    assert edit_cli(server, path, "--dry-run") == 2
    err = capsys.readouterr().err
    assert err == f"specserve: error: cannot read {path}: {reason}\n", err
    assert server.requests == []


def test_a_file_with_a_nul_byte_is_refused_as_binary_in_one_line(server, tmp_path, capsys):
    """A NUL byte is valid UTF-8, so a binary file that happened to decode (or a text file with a
    NUL in it) was sent to the model, and its answer, which cannot hold the NULs, would have been
    written over it. git takes a NUL for a binary file; so does the edit now, before asking."""
    path = tmp_path / "data.py"
    raw = b"MAGIC = 1\n\x00\x01\x02 payload\n"
    path.write_bytes(raw)
    assert edit_cli(server, path, "--in-place", "--force") != 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("specserve: error:")]
    assert len(lines) == 1 and "NUL byte" in lines[0] and "byte 10" in lines[0] and "Traceback" not in err
    assert server.requests == [] and path.read_bytes() == raw and not (tmp_path / "data.py.bak").exists()


def test_placeholder_answer_is_refused_in_place(server, src, capsys):
    server.answer = PLACEHOLDER
    assert edit_cli(server, src, "--in-place") == 2
    assert src.read_text() == ORIGINAL
    assert not (src.parent / "greet.py.bak").exists()
    out, err = capsys.readouterr()
    assert out == ""  # no diff deleting the file is shown as if it were the edit
    error = [ln for ln in err.splitlines() if ln.startswith("specserve: error:")]
    assert len(error) == 1 and "cannot be the updated file" in error[0] and "--force" in error[0]
    assert "obj['updated_code']" in err  # the answer itself is shown


def test_placeholder_answer_is_refused_for_output(server, src, tmp_path):
    server.answer = PLACEHOLDER
    out = tmp_path / "new.py"
    out.write_text("keep me\n")
    assert edit_cli(server, src, "--output", str(out)) == 2
    assert out.read_text() == "keep me\n" and src.read_text() == ORIGINAL


def test_force_writes_a_refused_answer(server, src, capsys):
    server.answer = PLACEHOLDER
    assert edit_cli(server, src, "--in-place", "--force") == 0
    assert src.read_text() == "obj['updated_code']\n"
    assert (src.parent / "greet.py.bak").read_text() == ORIGINAL
    assert "written because of --force" in capsys.readouterr().err


def test_force_does_not_write_a_truncated_answer(server, src):
    server.answer, server.finish = "```python\ndef greet(name: str) -> str:\n", "length"
    assert edit_cli(server, src, "--in-place", "--force") != 0
    assert src.read_text() == ORIGINAL and not (src.parent / "greet.py.bak").exists()


def test_dry_run_warns_about_a_broken_answer(server, src, tmp_path, capsys):
    """The diff and the problems are shown, and the exit code is the one a real run would give (2,
    refused): it was 0, so a script previewing an edit took a refused answer for a good one."""
    server.answer = PLACEHOLDER
    before = sorted(p.name for p in tmp_path.iterdir())
    assert edit_cli(server, src, "--dry-run") == 2
    assert src.read_text() == ORIGINAL and sorted(p.name for p in tmp_path.iterdir()) == before
    out, err = capsys.readouterr()
    assert "+obj['updated_code']" in out and "-def greet(name):" in out
    assert "warning: the answer may not be the updated file" in err and "placeholder" in err


def test_output_and_html(server, src, tmp_path):
    out, html = tmp_path / "new.py", tmp_path / "edit.html"
    assert edit_cli(server, src, "--output", str(out), "--html", str(html)) == 0
    assert out.read_text() == EDITED and src.read_text() == ORIGINAL
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "s-target" in page and "s-prediction" in page
    assert "accepted prediction tokens" in page


def test_html_naming_a_file_the_edit_keeps_is_refused_before_asking(server, src, tmp_path):
    """--html FILE used to write the report over the file being edited (no backup on a dry run)."""
    for extra in (["--html", str(src)], ["--in-place", "--html", str(src) + ".bak"]):
        assert edit_cli(server, src, *extra) == 2
    out = tmp_path / "new.py"
    assert edit_cli(server, src, "--output", str(out), "--html", str(out)) == 2
    assert edit_cli(server, src, "--html", str(tmp_path / "no" / "such" / "r.html")) == 2  # before asking, too
    assert src.read_text() == ORIGINAL and not out.exists() and not server.requests


def test_a_markdown_file_that_opens_and_closes_with_a_code_block_keeps_its_fences(server, tmp_path):
    """The answer is the file itself: its first and last lines are the file's fences, not a wrapper."""
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\nmake build\n```\n\nRun the build first.\n\n```python\nimport app\napp.run()\n```\n")
    edited = doc.read_text().replace("Run the build first.", "Run the build first, then the tests.")
    server.answer = edited
    rc = main(
        ["edit", str(doc), "-i", "say to run the tests after the build", "--base-url", server.base_url, "--in-place"]
    )
    assert rc == 0 and doc.read_text() == edited
    server.answer = "```markdown\n" + edited + "```"  # wrapped: the wrapper goes
    doc.write_text(edited.replace(", then the tests", ""))
    assert main(["edit", str(doc), "-i", "say it", "--base-url", server.base_url, "--in-place"]) == 0
    assert doc.read_text() == edited


def test_an_error_event_mid_stream_is_one_line_and_writes_nothing(server, src, capsys):
    """A server shutting down ends the stream with an error event: no traceback, exit 2."""
    server.error_mid_stream = "the server is shutting down"
    assert edit_cli(server, src, "--in-place") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "the server is shutting down" in err
    assert src.read_text() == ORIGINAL


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
            rc = main(
                [
                    "edit",
                    str(path),
                    "-i",
                    "Add type hints",
                    "--base-url",
                    srv.base_url,
                    "--in-place",
                    "--max-tokens",
                    "12",
                ]
            )
            assert rc != 0 and path.read_text() == ORIGINAL


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_an_answer_of_only_the_changed_function_is_put_in_place(server, tmp_path, capsys, end):
    """The 1.5B pack often answers with just the function it changed (eval_edit_prompt.py): the
    file gets that function in place of the old one, and nothing else changes (its line ends
    neither, a classic Mac file's lone CRs included)."""
    tail = "".join(f"\n\ndef helper_{i}(x):\n    return x + {i}\n" for i in range(3))
    path = tmp_path / "greet.py"
    path.write_bytes((ORIGINAL + tail).replace("\n", end).encode())
    changed = "def greet(name: str) -> str:\n    return 'hi ' + name\n"
    assert check_answer(ORIGINAL + tail, changed, "Add type hints")  # alone it is refused
    server.answer = f"```python\n{changed}```"
    assert edit_cli(server, path, "--in-place") == 0
    assert path.read_bytes() == (EDITED + tail).replace("\n", end).encode()
    assert "only the changed definitions (greet)" in capsys.readouterr().err


def _prompt_of(body: dict) -> str:
    """Which of PROMPTS laid out this request (by its system message and worked examples), or
    "feedback" for the first request's conversation continued with its answer and a complaint, or
    "blocks" for the request for SEARCH/REPLACE blocks."""
    messages = body["messages"]
    if messages[0] == blocks_ask(ORIGINAL, "").messages[0]:
        return "blocks"
    if [m["role"] for m in messages[-2:]] == ["assistant", "user"] and messages[-1]["content"].startswith(
        "That is not the updated file yet"
    ):
        return "feedback"
    opened = bool(body.get("continue_final_message"))
    names = [DEFAULT_PROMPT, *PROMPTS]  # the default first: without its opening it reads as "file-first"
    return next(
        name
        for name in names
        if messages[0]["content"] == PROMPTS[name].system
        and len(messages) == 2 + 2 * len(PROMPTS[name].examples) + opened
        and PROMPTS[name].opens >= opened
    )


def test_a_broken_answer_is_asked_for_again_with_the_retry_prompt(server, src, capsys):
    server.queue = [PLACEHOLDER]  # then the good answer
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED
    assert [_prompt_of(r) for r in server.requests] == [DEFAULT_PROMPT, "blocks", RETRY_PROMPT]
    assert all(r["prediction"]["content"] == ORIGINAL for r in server.requests)
    err = capsys.readouterr().err
    assert "asking for SEARCH/REPLACE blocks" in err  # the whole file is no block: refused
    assert f"asking again with the {RETRY_PROMPT!r} prompt" in err


def test_then_the_first_answer_is_sent_back_with_what_is_wrong(server, src, capsys):
    server.queue = [PLACEHOLDER, PLACEHOLDER, PLACEHOLDER]  # blocks, then example, refused: then the good answer
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED
    first, _, _, third = server.requests
    assert [_prompt_of(r) for r in server.requests] == [DEFAULT_PROMPT, "blocks", RETRY_PROMPT, "feedback"]
    assert third["messages"][:2] == first["messages"]  # the first conversation, continued
    assert third["messages"][2] == {"role": "assistant", "content": PLACEHOLDER}
    assert "placeholder" in third["messages"][3]["content"]
    assert "Add type hints to greet" in third["messages"][3]["content"]
    # a placeholder is no base for the fix: the file stays the prediction
    assert all(r["prediction"]["content"] == ORIGINAL for r in server.requests)
    assert "telling the model what is wrong" in capsys.readouterr().err


def test_a_rename_left_half_done_is_fixed_from_its_own_answer(server, tmp_path):
    """The feedback names the name left dangling, and the half-done answer (nearly the fix) is
    the prediction of that request."""
    original = "def hello(name):\n    return 'hi ' + name\n\n\ndef main():\n    print(hello('bob'))\n"
    half = original.replace("def hello", "def greet")
    done = half.replace("print(hello", "print(greet")
    path = tmp_path / "hello.py"
    path.write_text(original)
    server.queue, server.answer = [f"```python\n{half}```"] * 3, f"```python\n{done}```"
    rc = main(["edit", str(path), "-i", "Rename hello to greet.", "--base-url", server.base_url, "--in-place"])
    assert rc == 0 and path.read_text() == done
    feedback = server.requests[3]
    assert _prompt_of(feedback) == "feedback" and "`hello`" in feedback["messages"][3]["content"]
    assert feedback["prediction"]["content"] == half


def test_a_rename_not_done_is_asked_for_again_and_never_written(server, tmp_path):
    original = "def hello(name):\n    return 'hi ' + name\n\n\ndef main():\n    print(hello('bob'))\n"
    touched = original.replace("'hi '", "'hello '")  # an edit, but not the one asked for
    done = original.replace("hello(", "greet(")
    path = tmp_path / "hello.py"
    path.write_text(original)
    server.queue, server.answer = [f"```python\n{touched}```"], f"```python\n{done}```"
    rc = main(["edit", str(path), "-i", "Rename hello to greet.", "--base-url", server.base_url, "--in-place"])
    assert rc == 0 and path.read_text() == done and len(server.requests) == 3  # the blocks request refused
    server.requests.clear()
    path.write_text(original)
    server.queue, server.answer = [], f"```python\n{touched}```"
    rc = main(["edit", str(path), "-i", "Rename hello to greet.", "--base-url", server.base_url, "--in-place"])
    assert rc == 2 and path.read_text() == original and len(server.requests) == 4


def _blocks(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_a_refused_answer_is_asked_for_as_blocks_which_the_tool_applies_to_the_file(server, src, capsys):
    """The second request asks for SEARCH/REPLACE blocks (the file is the prediction); the file
    written is the original with them applied, judged like any answer."""
    server.queue = [PLACEHOLDER, "```\n" + _blocks("def greet(name):\n", "def greet(name: str) -> str:\n") + "```"]
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED
    assert [_prompt_of(r) for r in server.requests] == [DEFAULT_PROMPT, "blocks"]
    blocks = server.requests[1]
    assert blocks["prediction"]["content"] == ORIGINAL
    assert blocks["messages"][-1]["content"].startswith(f"Here is a file:\n\n```python\n{ORIGINAL}\n```")
    assert "asking for SEARCH/REPLACE blocks" in capsys.readouterr().err


@pytest.mark.parametrize(
    "answer, why",
    [
        (_blocks("def greet(nam):\n", "def greet(name: str) -> str:\n"), "cannot be applied: block 1 matches nothing"),
        (
            _blocks("def greet(name):\n", "def greet(name: str) -> str:\n") + "<<<<<<< SEARCH\ndef main():\n",
            "cannot be applied: block 2 is not closed",
        ),
        (  # applies, but main still calls greet
            _blocks("def greet(name):\n", "def hi(name: str) -> str:\n"),
            "the file the blocks build is refused: the answer uses `greet`",
        ),
    ],
)
def test_blocks_that_cannot_make_the_edit_are_refused_and_the_next_request_made(server, src, capsys, answer, why):
    server.queue = [PLACEHOLDER, answer, PLACEHOLDER, PLACEHOLDER]
    assert edit_cli(server, src, "--in-place") == 2
    assert src.read_text() == ORIGINAL
    assert [_prompt_of(r) for r in server.requests] == [DEFAULT_PROMPT, "blocks", RETRY_PROMPT, "feedback"]
    assert why in capsys.readouterr().err


def test_an_answer_cut_short_is_asked_for_again_and_never_written(server, tmp_path):
    """The data-loss case: the answer does the edit, then stops before the file's last function
    (under the length rule's half, so only the definitions show it). When the answer is only
    definitions and imports, the tool puts them into the file instead; otherwise it refuses."""
    original = "BASE = 10\n\n\n" + "".join(f"def f{i}(x):\n    return x + BASE + {i}\n\n\n" for i in range(5))
    hinted = original.replace("def f0(x)", "def f0(x: Any) -> Any")
    cut = hinted.split("\n\n\ndef f4")[0] + "\n"
    path = tmp_path / "fs.py"
    path.write_text(original)
    server.queue, server.answer = [], f"```python\n{cut.replace('BASE = 10', 'BASE: int = 10')}```"
    rc = main(["edit", str(path), "-i", "Add type hints to f0.", "--base-url", server.base_url, "--in-place"])
    assert rc == 2 and path.read_text() == original and len(server.requests) == 4
    assert not (tmp_path / "fs.py.bak").exists()
    server.requests.clear()
    definitions_only = "from typing import Any\n\n\n" + cut.split("\n\n\n", 1)[1]
    server.queue, server.answer = [], f"```python\n{definitions_only}```"
    # The instruction names the file's first line, so the answer is not begun at that line for the
    # model (`EditPrompt.opening`), and the model may answer with the changed definitions only.
    instruction = "Add type hints to f0; leave BASE as it is."
    rc = main(["edit", str(path), "-i", instruction, "--base-url", server.base_url, "--in-place"])
    assert rc == 0 and len(server.requests) == 1
    assert path.read_text() == "from typing import Any\n\n\n" + hinted  # the file had no imports: at the top


def test_an_unchanged_answer_is_asked_for_again(server, src):
    server.queue = ["```python\n" + ORIGINAL + "```"]
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED and len(server.requests) == 3  # the whole file is no block: refused


def test_an_edit_never_made_is_not_reported_as_written(server, src, capsys):
    """Every answer is the file unchanged: the user is told the edit was not made, the exit code
    says so, and the file is not touched (no write, no backup)."""
    server.answer = "```python\n" + ORIGINAL + "```"
    before = src.stat().st_mtime_ns
    assert edit_cli(server, src, "--in-place") == 2 and len(server.requests) == 4
    assert src.read_text() == ORIGINAL and src.stat().st_mtime_ns == before
    assert not src.with_name(src.name + ".bak").exists()
    assert "the edit was not made" in capsys.readouterr().err


@pytest.mark.parametrize("instruction", ["", "  \n"])
def test_an_empty_instruction_is_not_sent(server, src, capsys, instruction):
    assert main(["edit", str(src), "-i", instruction, "--base-url", server.base_url, "--in-place"]) == 2
    assert server.requests == [] and src.read_text() == ORIGINAL
    assert "the instruction is empty" in capsys.readouterr().err


@pytest.mark.parametrize("content", [ORIGINAL, ""])
def test_a_rename_of_a_name_the_file_never_mentions_is_not_sent(server, src, capsys, content):
    """A typo in the name (or the wrong file, or an empty one): asked anyway, the model makes
    up an answer (on an empty file, a whole new one, which --in-place wrote). The tool says why
    at once and asks nothing; --force asks anyway."""
    src.write_text(content)
    args = ["edit", str(src), "-i", "Rename greeet to welcome", "--base-url", server.base_url, "--in-place"]
    assert main(args) == 2 and server.requests == []
    assert src.read_text() == content and not src.with_name(src.name + ".bak").exists()
    assert "never mentions `greeet`" in capsys.readouterr().err
    main([*args, "--force"])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "instruction, refused",
    [
        ("Add type hints to the function greeet", True),  # click's _textwrap.py lacks _split_opt: the
        ("Add a docstring to the method mian", True),  # 1.5B pack then rewrote a condition elsewhere
        ("Add type hints to the function greet", False),
        ("Add a function bye that says bye", False),  # a function the edit is to write
        ("Add a new class Greeter around greet", False),
    ],
)
def test_an_edit_of_a_function_the_file_lacks_is_not_sent(server, src, capsys, instruction, refused):
    args = ["edit", str(src), "-i", instruction, "--base-url", server.base_url, "--in-place"]
    assert (main(args) == 2) == refused
    assert (server.requests == []) == refused
    if refused:
        assert src.read_text() == ORIGINAL and "never mentions" in capsys.readouterr().err


def test_later_broken_answers_keep_the_refusal(server, src, capsys):
    server.answer = PLACEHOLDER
    assert edit_cli(server, src, "--in-place") == 2
    assert src.read_text() == ORIGINAL and len(server.requests) == 4
    assert "no later answer is better" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--no-retry", "--force"])
def test_no_retry_and_force_ask_once(server, src, flag):
    server.queue = [PLACEHOLDER]
    edit_cli(server, src, "--in-place", flag)
    assert len(server.requests) == 1


def test_a_good_or_truncated_answer_is_not_asked_again(server, src):
    assert edit_cli(server, src, "--in-place") == 0 and len(server.requests) == 1
    server.answer, server.finish = "```python\ndef greet(name: str) -> str:\n", "length"
    src.write_text(ORIGINAL)
    assert edit_cli(server, src, "--in-place") == 2 and len(server.requests) == 2


WITH_IMPORT = "import os\n\n\n" + ORIGINAL  # a first line the edit does not touch
MAIN_RENAMED = WITH_IMPORT.replace("def main", "def run")


OPENED = "file-first-opened"  # a candidate prompt that begins a rename's answer (not the default)


def test_a_rename_can_begin_the_answer_at_the_files_first_line(server):
    """`file-first-opened` writes the fence and the file's first line for the model and predicts
    the rest; the answer is that opening and what the model wrote after it."""
    server.answer = f"```python\n{MAIN_RENAMED}```"
    r = refactor_with_predicted_outputs(
        WITH_IMPORT, "Rename main to run.", make_client(server.base_url), language="python", prompt=OPENED
    )
    assert r.code == MAIN_RENAMED and r.raw == server.answer
    (body,) = server.requests
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "```python\nimport os\n"}
    assert body["prediction"]["content"] == WITH_IMPORT[len("import os\n") :]
    assert _prompt_of(body) == OPENED


def test_a_server_without_continue_final_message_gets_the_request_unopened(server):
    server.refuse_continuing = True
    server.answer = f"```python\n{MAIN_RENAMED}```"
    r = refactor_with_predicted_outputs(
        WITH_IMPORT, "Rename main to run.", make_client(server.base_url), language="python", prompt=OPENED
    )
    assert r.code == MAIN_RENAMED
    opened, unopened = server.requests
    assert opened["continue_final_message"] and "continue_final_message" not in unopened
    assert unopened["messages"] == opened["messages"][:-1] and unopened["prediction"]["content"] == WITH_IMPORT


@pytest.mark.parametrize(
    "instruction, opened",
    [
        ("Rename main to run.", True),
        ("Rename the function greet to hello everywhere", True),
        ("Add type hints to greet", False),  # a local edit: left to the model
        ("Rename the os import to system", False),  # the first line is named
        ("Rename greet to hello and add a module docstring", False),  # the docstring goes above it
    ],
)
def test_when_the_answer_is_begun_for_the_model(instruction, opened):
    ask = ask_for(WITH_IMPORT, instruction, "python", OPENED)
    assert bool(ask.opening) == opened and (ask.opening == "```python\nimport os\n" or not opened)
    written = ask.opening.split("\n", 1)[1] if opened else ""
    assert written + ask.prediction == WITH_IMPORT  # nothing lost, nothing twice
    assert ask_for(WITH_IMPORT, instruction, "python").opening == ""  # the default prompt never opens


@pytest.mark.parametrize(
    "old,new",
    [
        ("x = 1", "y = 1"),  # neither ends with a newline
        ("x = 1\n", "y = 1"),  # the answer dropped the last newline
        ("x = 1", "x = 1\ny = 2\n"),  # the answer added one
        ("a\nb\nc\n", "a\nB\nc\n"),  # both end with one: no marker
        ("import os\n\f\ndef a():\n    return 1\n", "import os\n\f\ndef a():\n    return 5\n"),  # a page break
        ("s = 'a\u2028b'  # \x85\n", "s = 'a\u2028c'  # \x85\n"),  # Unicode line separators inside a line
        ("x = 1  # \r z\ny = 2\n", "x = 1  # \r z\ny = 3\n"),  # a lone CR inside a line
    ],
)
def test_the_diff_is_one_git_applies(tmp_path, old, new):
    """A last line without a newline is marked as diff -u marks it, not run together with the
    next line of the diff (`-x = 1+y = 1`): git applies the printed diff to the file and gets
    the answer, byte for byte. Only '\n' ends a line, as for diff and git: a form feed, a lone
    CR or a Unicode line separator inside a line is part of it (str.splitlines broke lines there,
    and the diff of a file with a ^L page break was one git called corrupt)."""
    import subprocess

    from specserve.cli.edit import unified_diff

    (tmp_path / "f.py").write_bytes(old.encode())
    patch = tmp_path / "edit.diff"
    patch.write_bytes(unified_diff(old, new, "f.py").encode())
    subprocess.run(["git", "apply", "--unsafe-paths", str(patch)], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "f.py").read_bytes() == new.encode()


CALC = """import math
import sys

CUTOFF = 0.5


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def scale(x, factor):
    if x < CUTOFF:
        return 0.0
    y = x * factor
    return math.floor(y)


def main(argv):
    total = 0
    for arg in argv[1:]:
        total = add(total, float(arg))
    print(scale(total, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
"""
FIRST_TWO = "import math\nimport sys\n\ndef add(a, b):\n    return a + b\n"


@pytest.mark.parametrize(
    "instruction, answer",
    [
        # a removal loses only what it names: not the rest of the file
        ("Remove the function sub", FIRST_TWO),
        ("Delete the unused CUTOFF constant", FIRST_TWO),
        # words that contain a removal verb are not one ("dropout", "os.remove", "CUTOFF")
        ("Add a dropout parameter to scale", FIRST_TWO),
        ("Use os.remove in main instead of printing", FIRST_TWO),
        ("Rename CUTOFF to THRESHOLD", "import math\nimport sys\n\nTHRESHOLD = 0.5\n"),
        # cut short inside or after the last function, with finish_reason stop
        ("Add type hints to add", CALC.replace("def add(a, b):", "def add(a: float, b: float) -> float:")[:-50]),
        ("Add type hints to add", "\n".join(CALC.splitlines()[:24]) + "\n"),
        # a body replaced by a placeholder
        ("Add a docstring to add", CALC.replace("    y = x * factor\n    return math.floor(y)\n", "    ...\n")),
        (
            "Add a docstring to add",
            CALC.replace("    y = x * factor\n    return math.floor(y)\n", "    ...  # unchanged\n"),
        ),
        ("Add a docstring to add", CALC.replace("    total = 0\n", "    # keep the existing logic as is\n")),
        # a function written twice, a diff, prose after the code
        ("Add a docstring to add", CALC + "\n\ndef sub(a, b):\n    return a - b\n"),
        ("Add a docstring to add", CALC + "\nI changed the docstring of add as requested.\n"),
    ],
)
def test_answers_that_lose_code_are_refused(instruction, answer):
    """Each of these was written over the file, exit 0 (found with a fake server streaming them)."""
    verdict = judge_answer(CALC, answer, instruction, "python")
    assert verdict.failure, verdict  # refused (or spliced back into the file, which is then unchanged)


@pytest.mark.parametrize(
    "instruction, answer",
    [
        ("Remove the function sub", CALC.replace("def sub(a, b):\n    return a - b\n\n\n", "")),
        ("Delete the unused CUTOFF constant", CALC.replace("CUTOFF = 0.5\n\n", "").replace("x < CUTOFF", "x < 0.5")),
        (
            "Add a dropout parameter to scale",
            CALC.replace("def scale(x, factor):", "def scale(x, factor, dropout=0.0):"),
        ),
        ("Rename CUTOFF to THRESHOLD", CALC.replace("CUTOFF", "THRESHOLD")),
        (
            "Make main a stub",
            CALC.split("def main")[0] + "def main(argv):\n    ...\n\n\n" + CALC.split("return 0\n\n\n")[1],
        ),
        ("Remove the main block", CALC.split("\n\nif __name__")[0] + "\n"),
    ],
)
def test_the_edits_asked_for_still_pass(instruction, answer):
    assert judge_answer(CALC, answer, instruction, "python").failure is None


@pytest.mark.parametrize(
    "name, original, answer",
    [
        (
            "config.json",
            '{\n  "host": "a",\n  "port": 80,\n  "debug": false\n}\n',
            '{\n  "host": "a",\n  "port": 9090,\n',
        ),
        (
            "deploy.yaml",
            "spec:\n  containers:\n    - name: web\n      image: x\n",
            "spec:\n  containers:\n    - name: web\n     image: y\n",
        ),
        (
            "Makefile",
            "build:\n\tcc -o app main.c\n\ntest:\n\t./app --test\n",
            "build:\n    cc -O2 -o app main.c\n\ntest:\n    ./app --test\n",
        ),
        (
            "server.go",
            'package main\n\nfunc greet() string {\n\treturn "Hello"\n}\n',
            "--- a/server.go\n+++ b/server.go\n@@ -1,5 +1,5 @@\n package main\n",
        ),
        (
            "server.go",
            'package main\n\nfunc greet() string {\n\treturn "Hello"\n}\n',
            'package main\n\nfunc greet() string {\n\treturn "Hi"\n}\n\nI changed the greeting in greet.\n',
        ),
        (
            "README.md",
            "# App\n\nRun it.\n",
            "Here is the updated README:\n\n```markdown\n# App\n\nRun it with `make`.\n```\n",
        ),
    ],
)
def test_other_languages_refuse_broken_answers(name, original, answer):
    verdict = judge_answer(original, answer, "Change the port to 9090", language_for(name))
    assert verdict.failure, verdict


@pytest.mark.parametrize(
    "original, raw, expected",
    [
        ("a = 1\n", "a = 2\r\n", "a = 2\n"),  # the model saw LF: its CRLF is not the file's
        ("a = 1", "```python\na = 2\n```", "a = 2"),  # no final newline stays none
        ("a: 1\n\n", "```yaml\na: 2\n```", "a: 2\n\n"),  # a blank last line stays
        ("a = 1\n", "\ufeffa = 2\n", "a = 2\n"),  # a BOM is the file's business (files.py)
        ("a: 1\n", "~~~yaml\na: 2\n~~~", "a: 2\n"),
    ],
)
def test_an_answer_keeps_the_file_s_line_ends_and_final_newlines(original, raw, expected):
    assert strip_fence(raw, original) == expected


def test_the_new_rules_leave_legitimate_edits_alone():
    """A renamed list whose method is called (`tests.append` -> `TESTS.append`), a YAML file whose
    last line changes, tabs turned to spaces when asked."""
    code = "tests = []\n\n\ndef f():\n    return 1\n\n\ntests.append(f)\n"
    assert judge_answer(code, code.replace("tests", "TESTS"), "Rename tests to TESTS", "python").failure is None
    yaml_file = "name: app\nnote: old\n"
    assert check_answer(yaml_file, "name: app\nnote: new\n", "Change the note", "yaml") == []
    make = "build:\n\tcc main.c\n"
    assert check_answer(make, "build:\n    cc main.c\n", "Indent with spaces instead of tabs") == []


def test_shell_functions_arrow_functions_and_methods_count_as_definitions():
    """An answer that lost a shell function, an arrow function or a class method was written:
    only `def`/`class`/`function`/`func`/`fn` lines counted."""
    ts = (
        "export class Store {\n  find(id: string): User | undefined {\n    if (id) {\n      return this.users[0];\n"
        "    }\n  }\n  count(): number {\n    return this.users.length;\n  }\n}\n"
        "export const formatUser = (u: User): string => u.name;\n"
    )
    lost = ts.replace("export const formatUser = (u: User): string => u.name;\n", "")
    assert "formatUser" in judge_answer(ts, lost, "Add a comment to Store", "typescript").failure
    no_count = ts.replace("  count(): number {\n    return this.users.length;\n  }\n", "")
    assert "count" in judge_answer(ts, no_count, "Add a comment to Store", "typescript").failure
    sh = "#!/bin/sh\nset -e\n\ncompile() {\n  cc -o app main.c\n}\n\nrun() {\n  ./app\n}\n\ncompile\nrun\n"
    no_compile = sh.replace("compile() {\n  cc -o app main.c\n}\n\n", "")
    assert "compile" in judge_answer(sh, no_compile, "Add -O2 to the build", "bash").failure
    assert judge_answer(sh, sh.replace("cc -o", "cc -O2 -o"), "Add -O2 to the build", "bash").failure is None


def test_a_read_only_file_is_not_written_even_by_root(server, src, capsys):
    """os.access says yes to root, so a 0444 file was overwritten without a word."""
    src.chmod(0o444)
    assert edit_cli(server, src, "--in-place") != 0
    assert src.read_text() == ORIGINAL and server.requests == []  # refused before the model is asked
    assert "read-only" in capsys.readouterr().err


def test_an_edit_of_one_function_may_not_change_another():
    """Told to add a docstring to one method of click's _textwrap.py, the 1.5B pack also dropped
    part of a condition in another, and the tool wrote it."""
    answer = CALC.replace("def add(a, b):\n", 'def add(a, b):\n    """Add."""\n').replace("x < CUTOFF", "x <= CUTOFF")
    verdict = judge_answer(CALC, answer, "Add a docstring to the function add", "python")
    assert "also changes `scale`" in verdict.failure
    only_add = CALC.replace("def add(a, b):\n", 'def add(a, b):\n    """Add."""\n')
    assert judge_answer(CALC, only_add, "Add a docstring to the function add", "python").failure is None
    # reaching further is asked for in so many words, or by a rename
    assert (
        judge_answer(CALC, answer, "Add a docstring to the function add and fix its callers", "python").failure is None
    )


README = "# App\n\nInstall:\n\n```bash\npip install app\n```\n\nRun it with `app serve`.\n"


@pytest.mark.parametrize(
    "raw",
    [
        # split at a heading, each part in its own ```markdown wrapper
        "```markdown\n# App\n\nInstall:\n```\n\n```markdown\n```bash\npip install app\n```\n\n"
        "Run it with `app run`.\n```",
        # two untagged wrappers: an empty block between the parts
        "```\n# App\n\nInstall:\n\n```bash\npip install app\n```\n```\n\n```\nRun it with `app run`.\n```",
    ],
)
def test_a_markdown_answer_split_over_two_fenced_blocks_is_refused(server, tmp_path, raw):
    """strip_fence unwrapped the outer fences as one and wrote the inner ones into the README."""
    doc = tmp_path / "README.md"
    doc.write_text(README)
    verdict = judge_answer(README, strip_fence(raw, README), "Say run, not serve", "markdown")
    assert verdict.failure and "split over several fenced blocks" in verdict.failure
    server.answer = raw
    assert main(["edit", str(doc), "-i", "Say run, not serve", "--base-url", server.base_url, "--in-place"]) != 0
    assert doc.read_text() == README
    # The same edit in one wrapper, or with a new code block added, is written.
    fixed = README.replace("app serve", "app run")
    assert (
        judge_answer(README, strip_fence("```markdown\n" + fixed + "```", README), "Say run", "markdown").failure
        is None
    )
    example = fixed + "\n```python\nimport app\n```\n"
    assert judge_answer(README, example, "Add a Python example", "markdown").failure is None


@pytest.mark.parametrize(
    "language, original, answer",
    [
        (
            "javascript",
            "function load(id) {\n  return db.get(id);\n}\n\nexport const user = load(1);\n",
            'function load(id) {\n  return db.get(id); // was fetchUser\n}\n\nexport const user = load("fetchUser");\n',
        ),
        (
            "go",
            "package main\n\nfunc load(id int) int {\n\treturn id\n}\n\nfunc main() {\n\tload(1)\n}\n",
            "package main\n\nfunc load(id int) int {\n\treturn id\n}\n\n"
            "func main() {\n\tprintln(`fetchUser`)\n\tload(1)\n}\n",
        ),
    ],
)
def test_a_rename_that_only_changed_a_string_or_comment_is_not_done(language, original, answer):
    """Outside Python the new name counted anywhere, so a narrowed rename whose answer only
    mentioned it in a string or a comment was written as done."""
    instruction = "Rename load to fetchUser in main"
    failure = judge_answer(original, answer, instruction, language).failure
    assert failure and "`fetchUser` appears nowhere in the answer's code" in failure
    done = original.replace("load", "fetchUser")
    assert judge_answer(original, done, instruction, language).failure is None


INTRANGES = '''"""Given a list of integers, made up of (hopefully) a small number of long runs
of consecutive integers, compute a representation of the form
((start1, end1), (start2, end2) ...). Then answer the question "was x present
in the original list?" in time O(log(# runs)).
"""


def _decode_range(r: int) -> tuple[int, int]:
    return (r >> 32), (r & ((1 << 32) - 1))


def intranges_contain(int_: int, ranges: tuple[int, ...]) -> bool:
    left, right = _decode_range(ranges[0])
    return left <= int_ < right
'''


def test_a_rename_that_also_rewrites_other_lines_is_refused():
    """Asked to rename a function of idna's intranges.py, the 1.5B pack renamed it right and also
    rewrote the module docstring, dropping a sentence; the tool wrote it."""
    instruction = "Rename the function _decode_range to _unpack_range."
    renamed = INTRANGES.replace("_decode_range", "_unpack_range")
    rewritten = renamed.replace('. Then answer the question "was x present', ", such that the original")
    assert rewritten != renamed
    failure = judge_answer(INTRANGES, rewritten, instruction, "python").failure
    assert failure and failure.startswith("the answer changes lines the rename does not touch")
    assert judge_answer(INTRANGES, renamed, instruction, "python").failure is None
    # asked for more than the rename, other lines may change
    assert judge_answer(INTRANGES, rewritten, instruction + " Rewrite the docstring too.", "python").failure is None


RENAMED_SOURCE = """def get_user(uid):
    if uid:
        log(uid)
        audit(uid)
    return load(uid)


def get_users(ids):
    return [get_user(i) for i in ids]
"""


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # a line moved out of its block: other code, which the set of stripped lines could not see
        (RENAMED_SOURCE.replace("        audit(uid)", "    audit(uid)"), "'audit(uid)' (indented otherwise)"),
        # two statements swapped
        (RENAMED_SOURCE.replace("log(uid)\n        audit(uid)", "audit(uid)\n        log(uid)"), "'audit(uid)'"),
        # the blank line between the functions dropped (found by a newcomer's edit on the 0.5B pack)
        (RENAMED_SOURCE.replace("\n\n\ndef", "\n\ndef"), "a blank line removed at line 7 of the file"),
        (RENAMED_SOURCE.replace("    return load", "\n    return load"), "a blank line added at line 5 of the file"),
    ],
)
def test_a_rename_that_moves_reorders_or_respaces_lines_is_refused(answer, said):
    """A pure rename's answer must be the file line for line but for the name: the check compared
    sets of stripped lines, so a reindented line, swapped lines or a dropped blank line were
    written as the rename."""
    instruction = "Rename get_user to fetch_user."
    answer = answer.replace("get_user(", "fetch_user(")
    failure = judge_answer(RENAMED_SOURCE, answer, instruction, "python").failure
    assert failure == f"the answer changes lines the rename does not touch: {said}", failure


def test_a_rename_may_differ_in_trailing_spaces_and_blank_lines_at_the_ends():
    """What a model's answer commonly drops or adds around the code is no change to refuse."""
    answer = "\n" + RENAMED_SOURCE.replace("get_user(", "fetch_user(").replace("(uid):", "(uid):  ") + "\n\n"
    assert judge_answer(RENAMED_SOURCE, answer, "Rename get_user to fetch_user.", "python").failure is None


def test_the_decode_rate_counts_only_the_tokens_it_timed():
    """tokens/s was every completion token over the time after the first chunk, so the first
    chunk's tokens counted without their time: a specserve chunk is a step, and a prediction's
    first step commits up to 9 tokens (a 20-token answer in two such chunks showed 20 tok/s for
    11 tokens in a second). specserve's own measure (its `speculation`, each token timed with the
    step that wrote it) is taken when the server sends it; else the first chunk counts as one
    token, as a server that streams a token a chunk sends it."""
    result = EditResult(code="", raw="", finish_reason="stop", model="m", completion_tokens=20, elapsed=3.0)
    result.time_to_first_token = 1.0
    assert result.tokens_per_second == pytest.approx(19 / 2.0)
    result.speculation = {"tokens_per_second": 7.5, "tokens_per_step": 5.0}
    assert result.tokens_per_second == 7.5


def test_each_refused_retry_says_why_and_the_step_that_wrote_the_file_is_named(server, src, capsys):
    """Found editing real files: after the blocks request, a refused `example` answer (or one cut by
    max_tokens) moved on to the next request without a word, so the user never learnt why it was
    refused; and a file written from a retry did not say which request's answer it was."""
    server.queue = [PLACEHOLDER, PLACEHOLDER, PLACEHOLDER]  # first, blocks, example refused; the feedback passes
    assert edit_cli(server, src, "--in-place") == 0
    err = capsys.readouterr().err
    example_refused = err.index(f"the answer to the {RETRY_PROMPT!r} prompt is refused: ")
    assert "placeholder" in err[example_refused:].splitlines()[0]
    assert "the first answer is refused: " in err.splitlines()[0]
    assert example_refused < err.index("telling the model what is wrong")
    assert "the answer to the feedback request passes the checks" in err
