"""`specserve generate` end to end in a subprocess: output, JSON stats, one-line errors."""

import json
import os
import subprocess
import sys

import pytest
from tiny import save_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-cli"))


def cli(*args, stdin: str | None = None):
    return subprocess.run(
        [sys.executable, "-m", "specserve.cli", *args], input=stdin, capture_output=True, text=True, timeout=120
    )


def test_generate_json_with_prediction(model_dir, tmp_path):
    from specserve import LLM, SamplingParams

    # plain decoding in this process (a second CLI start costs ~10 s of imports; the CLI's own
    # plain path runs in test_generate_streams_text_then_stats)
    llm = LLM(model_dir, dtype="float32")
    plain = llm.generate("def add(a, b):", SamplingParams(max_tokens=24), speculation="none")
    base = {"text": plain.text, "token_ids": plain.token_ids}
    pred = tmp_path / "pred.txt"
    pred.write_text(base["text"], encoding="utf-8")
    r = cli(
        "generate",
        "--model",
        model_dir,
        "--dtype",
        "float32",
        "--max-tokens",
        "24",
        "--prediction",
        str(pred),
        "--speculation",
        "prediction",
        "--json",
        stdin="def add(a, b):",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["token_ids"] == base["token_ids"]
    assert out["stats"]["by_source"]["prediction"]["accepted"] > 0
    assert len(out["token_sources"]) == len(out["token_ids"])


def test_generate_streams_text_then_stats(model_dir):
    r = cli("generate", "def add(a, b):", "--model", model_dir, "--dtype", "float32", "--max-tokens", "16")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "tokens/step" in r.stderr and "finish: length" in r.stderr


def test_empty_stdin_prompt_fails_before_loading_a_model():
    r = cli("generate", "--model", "/nonexistent/model", stdin="")
    assert r.returncode == 2 and "prompt on stdin is empty" in r.stderr  # not the model error: checked first


def test_prompt_prediction_and_suffix_files_are_read_byte_for_byte(tmp_path):
    """CRLF and lone CR line ends reach the model as the file has them (open() in text mode made
    them '\n', while the same text on stdin kept them: a CRLF file's prediction or FIM suffix was
    another text than the file)."""
    from specserve.cli.generate import read_text

    path = tmp_path / "crlf.py"
    path.write_bytes(b"a = 1\r\nb = 2\rc = 3\n")
    assert read_text(str(path), "prediction") == "a = 1\r\nb = 2\rc = 3\n"


@pytest.mark.parametrize("how", ["stdin", "--prompt-file", "argument", "--prediction"])
def test_text_that_is_not_utf8_is_refused_in_one_line(tmp_path, how):
    """Bytes that are not UTF-8 on stdin or in an argument came in as lone surrogates and ended in a
    tokenizer TypeError traceback after the model was loaded."""
    bad = b"caf\xe9 = 1\n"
    path = tmp_path / "latin.py"
    path.write_bytes(bad)
    args = {
        "stdin": [],
        "--prompt-file": ["--prompt-file", str(path)],
        "argument": [bad],
        "--prediction": ["x", "--prediction", "-"],
    }[how]
    r = subprocess.run(
        [sys.executable, "-m", "specserve.cli", "generate", "--model", "/nonexistent/model", *args],
        input=bad,
        capture_output=True,
        timeout=120,
    )
    err = r.stderr.decode()
    where = {"stdin": "stdin", "--prompt-file": f"--prompt-file {path}", "--prediction": "--prediction stdin"}
    said = f"cannot read {where[how]}: not UTF-8 text (byte 3)" if how in where else "the prompt is not UTF-8 text"
    assert r.returncode == 2 and err == f"specserve: error: {said}\n", err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prediction", "/nonexistent/file.py"], "cannot read --prediction /nonexistent/file.py: No such file"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--temperature", "-1"], "--temperature must be in"),
        (["--seed", str(2**64)], f"--seed must be in [{-(2**63)}, {2**63 - 1}]"),  # ran as seed 0, silently
        (["--seed", str(-(2**63) - 1)], "--seed must be in"),
        (["--model", "/nonexistent/model"], "no such file or folder"),
        (["--speculation", "draft"], "needs a draft model"),
        (["--max-context", "10"], "--max-context must be at least 256 tokens, got 10"),
        (["--suffix", "/nonexistent/after.py"], "cannot read --suffix /nonexistent/after.py: No such file"),
        (["--suffix", __file__, "--chat"], "does not go with --chat"),
        (["--suffix", __file__], "this model has no fill-in-the-middle tokens"),  # the tiny model has none
        (["--html", "/nonexistent-specserve/report.html"], "the folder /nonexistent-specserve does not exist"),
        (["--prediction", "-", "--suffix", "-"], "--prediction and --suffix both read stdin"),
        (["--device", "foo"], "--device must be cpu, cuda, cuda:N or mps, got 'foo'"),  # was torch's traceback
        (["--device", "cuda:99"], "--device cuda:99: this machine's torch sees"),  # an AssertionError traceback
    ],
)
def test_bad_input_gets_one_line_error(model_dir, args, message):
    base = ["generate", "hello", "--dtype", "float32"] + ([] if "--model" in args else ["--model", model_dir])
    r = cli(*base, *args)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("specserve: error:")
    assert not os.path.exists("/nonexistent-specserve")  # generate --html made the folder it was given


def test_serve_refuses_an_address_it_cannot_listen_on_before_loading(model_dir):
    """A taken port, a port out of range, a host that does not resolve (or a negative deadline): one line, exit 2, at
    once (uvicorn would find out only after the model loaded and, on the 1.5B pack, calibrated;
    a port over 65535 was a traceback)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, message in [
            (["--port", str(port)], f"cannot listen on 127.0.0.1:{port}"),
            (["--ray", "--port", str(port)], f"cannot listen on 127.0.0.1:{port}"),  # was Ray's "Failed to bind"
            (["--port", "99999"], "must be 0-65535"),
            (["--request-timeout", "-5"], "must be >= 0 seconds"),
            (["--request-timeout", "nan"], "must be >= 0 seconds"),
            (["--request-timeout", "inf"], "must be >= 0 seconds, and finite"),
            (["--host", "no-such-host.invalid"], "cannot listen on no-such-host.invalid"),
            (["--port", "0", "--host-cache-dir", __file__], "is a file, not a folder"),
        ]:
            r = cli("serve", "--model", model_dir, "--dtype", "float32", *args)
            assert r.returncode == 2 and message in r.stderr, r.stderr
            assert "Traceback" not in r.stderr and "loaded" not in r.stderr


def test_more_threads_than_cores_is_warned_about(capsys):
    """999 threads on 2 cores decoded at 0.3 tok/s: the run goes on, with a warning."""
    import argparse

    from specserve.cli.generate import load_options
    from specserve.hardware import cpu_info

    cores = cpu_info()["cores"]
    fields = dict(backend="auto", dtype=None, device=None, max_context=None, exact=False, gpu_layers=None)
    assert load_options(argparse.Namespace(threads=cores + 1, **fields)).threads == cores + 1
    assert f"--threads {cores + 1} is more than the {cores} cores" in capsys.readouterr().err
    load_options(argparse.Namespace(threads=cores, **fields))
    load_options(argparse.Namespace(threads=None, **fields))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "--max-tokens", "0"], "argument --max-tokens: must be >= 1"),
        (["bench", "--max-prompt-tokens", "0"], "argument --max-prompt-tokens: must be >= 1"),
        (["bench", "--plain-max-tokens", "-1"], "argument --plain-max-tokens: must be >= 1"),
        (["bench", "--modes", ""], "--modes names no mode"),
        (["bench", "--scenarios", " , "], "--scenarios names no scenario"),
        (["bench", "--peers", ""], "--peers names no peer"),
        (["bench", "--modes", "none", "--peers", "none"], "nothing to run"),
        (["bench", "--modes", "plain,prediction,plain"], "--modes names plain twice"),
        (["bench", "--out", __file__], "is a file, not a folder"),
        (["bench", "--html", "/nonexistent/folder/report.html"], "the folder /nonexistent/folder does not exist"),
        (["bench", "--out", "/proc/specserve-bench"], "--out /proc/specserve-bench: cannot create the folder"),
        (["bench", "--html-run", "py-rename/nope"], "--html-run py-rename/nope: not a run of this bench"),
        (["bench", "--html-run", "chat-lru/prediction", "--scenarios", "py-rename"], "not a run of this bench"),
        (["bench", "--concurrency", "1", "--html", "r.html"], "it does not take --html"),
        (["bench", "--concurrency", "1", "--demo"], "load benchmark: it does not take --demo"),  # said --html
        (["bench", "--demo", "--quick"], "--demo and --quick are two sizes of bench"),  # ran SmolLM2 at the demo's
        (["bench", "--concurrency", "1", "--peers", "hf", "--max-tokens", "9"], "not take --peers, --max-tokens"),
        (["bench", "--load-via", "server"], "--load-via: load benchmark flags, which need --concurrency"),
        (["bench", "--session", "--load-max-tokens", "9"], "--session runs its own script: it does not take --load"),
        (["edit", __file__, "-i", "x", "--max-tokens", "0"], "argument --max-tokens: must be >= 1"),
        (
            ["serve", "--port", "0", "--host-cache-gib", "inf"],
            "--host-cache-gib must be a finite size",
        ),  # OverflowError
    ],
)
def test_a_zero_an_empty_list_or_a_bad_output_is_refused_before_any_run(model_dir, capsys, args, message):
    """0 used to mean "the default" (256 tokens, the whole context), `--modes ""` ran only the peers
    and exited 0, and an --out that is a file failed after every run had finished."""
    from specserve.cli.main import main

    flags = ["--model", model_dir, "--dtype", "float32", "--draft-model", "none"] if args[0] == "bench" else []
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "specserve" in err and "loaded" not in err


def test_a_reader_that_leaves_ends_generate_quietly(model_dir):
    """`specserve generate ... | head -c 1`: exit 141 (SIGPIPE's status in a shell), no error line and no
    "Exception ignored" at exit (it printed "specserve: error: [Errno 32] Broken pipe" and exited 2)."""
    args = ["generate", "def add(a, b):", "--model", model_dir, "--dtype", "float32", "--max-tokens", "200"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "specserve.cli", *args, "--speculation", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.read(1)  # the first streamed text: generation is under way
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "error" not in err.lower() and "Exception" not in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "4"], "--replicas: Ray Serve flags, which need --ray"),  # served one process
        (["--replicas", "2"], "--replicas: Ray Serve flags, which need --ray"),  # the default's value: served one
        (["--replica-cpus", "1", "--target-ongoing-requests", "2"], "--target-ongoing-requests, --replica-cpus: Ray"),
        (["--replica-cpus", "2", "--ray-address", "auto"], "--ray-address, --replica-cpus: Ray Serve flags"),
        (["--ray", "--replicas", "0"], "--replicas must be at least 1, got 0"),  # after Ray had started
        (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "--max-replicas must be at least 1 and at least"),
        (["--ray", "--target-ongoing-requests", "nan"], "--target-ongoing-requests must be a number above 0"),
        (["--ray", "--replica-cpus", "-1"], "--replica-cpus must be a number at least 0"),
        (["--ray", "--replica-cpus", "inf"], "--replica-cpus must be a number at least 0, got inf"),
        # the replicas' own flags: each replica refused them after Ray had started, in config fields' words
        (["--ray", "-k", "0"], "-k/--num-speculative-tokens must be in [1, 256], got 0"),
        (["--ray", "--num-speculative-tokens", "300"], "-k/--num-speculative-tokens must be in [1, 256], got 300"),
        (["--ray", "--max-context", "10"], "--max-context must be at least 256 tokens, got 10"),
        (["--ray", "--gpu-layers", "-2"], "--gpu-layers must be 0 or more (leave it out for all), got -2"),
        (["--ray", "--device", "foo"], "--device must be cpu, cuda, cuda:N or mps, got 'foo'"),
        (["--ray", "--threads", "0"], "--threads must be at least 1, got 0"),  # was taken as --replica-cpus
    ],
)
def test_serve_refuses_ray_flags_it_would_ignore_or_ray_would_refuse(model_dir, capsys, args, message):
    """Without --ray the Ray flags were ignored; with it, Ray refused a bad one only after the cluster
    had started (seconds of start-up and shutdown logs). Both are one line now, before anything starts."""
    from specserve.cli.main import main

    assert main(["serve", "--model", model_dir, "--dtype", "float32", "--port", "0", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_bench_help_gives_the_defaults_quick_runs_with():
    """bench --help said --dtype defaults to bfloat16 and the draft model to the 0.5B pack, where
    --quick runs float32 with no draft model."""
    import argparse

    from specserve.cli.bench import resolve_options
    from specserve.cli.main import build_parser

    parser = build_parser()
    bench = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    helps = {a.dest: a.help for a in bench._actions}
    assert "float32 with --quick" in helps["dtype"] and "without a draft model" in helps["quick"]
    llm_kwargs, _ = resolve_options(parser.parse_args(["bench", "--quick"]))
    assert llm_kwargs["options"].default_dtype == "float32" and llm_kwargs["draft_model"] == "none"


def test_a_dash_reads_stdin(model_dir):
    """`--prompt-file -` and `--prediction -` read stdin (they looked for a file named "-")."""
    base = ["generate", "--model", model_dir, "--dtype", "float32", "--max-tokens", "8", "--json"]
    by_file = cli(*base, "--prompt-file", "-", "--speculation", "none", stdin="def add(a, b):")
    assert by_file.returncode == 0, by_file.stderr
    text = json.loads(by_file.stdout)["text"]
    predicted = cli(*base, "def add(a, b):", "--prediction", "-", "--speculation", "prediction", stdin=text)
    assert predicted.returncode == 0, predicted.stderr
    out = json.loads(predicted.stdout)
    assert out["text"] == text and out["stats"]["by_source"]["prediction"]["accepted"] > 0


def test_bench_refuses_an_html_path_its_results_or_a_folder_hold(model_dir, tmp_path, capsys):
    """--html bench-results/bench.md wrote the report over bench.md (then printed it as the results), and
    --html FOLDER failed with IsADirectoryError once every run had finished."""
    from specserve.cli.main import main

    flags = ["bench", "--model", model_dir, "--dtype", "float32", "--draft-model", "none", "--out", str(tmp_path)]
    for html, message in [
        (tmp_path, f"--html {tmp_path} is a folder"),
        (tmp_path / "bench.md", f"is a file of the bench's results ({tmp_path / 'bench.md'})"),
    ]:
        assert main([*flags, "--html", str(html)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_generate_refuses_an_html_path_that_is_one_of_its_inputs(model_dir, tmp_path):
    """`generate --prediction app.py --html app.py` wrote the report over app.py."""
    app = tmp_path / "app.py"
    app.write_text("def add(a, b):\n    return a + b\n")
    for flag in ("--prediction", "--prompt-file"):
        r = cli("generate", "--model", model_dir, "--dtype", "float32", flag, str(app), "--html", str(app), stdin="x")
        assert r.returncode == 2 and f"--html {app} is an input file ({app})" in r.stderr, r.stderr
        assert app.read_text() == "def add(a, b):\n    return a + b\n"


def test_models_list_into_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    """`specserve models list | head -1`: models' own handler printed "specserve: error: Broken pipe"
    and exited 1, where generate's reader leaving ends quietly with 141."""
    import io

    from specserve.cli.main import main

    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["models", "list"]) == 141
    assert capsys.readouterr().err == ""


def test_version(capsys):
    """`specserve --version` said "the following arguments are required: COMMAND"."""
    from specserve import __version__
    from specserve.cli.main import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"specserve {__version__}\n"
