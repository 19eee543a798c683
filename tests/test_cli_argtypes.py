"""The CLI's own argparse value types (cli/argtypes.py, serve's --port) on a value that is not a
number: argparse named the Python function in its error ("invalid _port value", "invalid
positive_int value"), which says nothing to a user."""

from __future__ import annotations

import pytest

from specserve.cli.main import main


@pytest.mark.parametrize(
    ("argv", "flag", "wanted"),
    [
        (["serve", "--port", "abc"], "--port", "a port number, 0-65535"),
        (["bench", "--max-tokens", "x"], "--max-tokens", "a whole number, at least 1"),
        (["edit", "f.py", "-i", "x", "--max-tokens", "1.5"], "--max-tokens", "a whole number, at least 1"),
        (["serve", "--max-queue", "many"], "--max-queue", "a whole number, at least 0"),
        (["serve", "--request-timeout", "soon"], "--request-timeout", "must be >= 0 seconds"),
    ],
)
def test_a_value_that_is_not_a_number_is_named_in_words(argv, flag, wanted, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: " in err and wanted in err
    assert "_port" not in err and "_int" not in err and "_seconds" not in err
    assert f"got {argv[-1]!r}" in err


NO_MODEL = ["--model", "no-such-model"]  # a command the check lets through stops there, before any load


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["generate", "hi", *NO_MODEL, "--prediction", ""], "--prediction"),  # ran without it, exit 0
        (["generate", "hi", *NO_MODEL, "--html", ""], "--html"),  # wrote no report, exit 0
        (["generate", "hi", *NO_MODEL, "--prompt-file", ""], "--prompt-file"),
        (["generate", "hi", *NO_MODEL, "--suffix", ""], "--suffix"),
        (["bench", *NO_MODEL, "--out", ""], "--out"),  # Path("") is ".": the results went into the current folder
        (["bench", *NO_MODEL, "--html", ""], "--html"),
        (["edit", "f.py", "-i", "x", "--output", ""], "--output/-o"),
        (["replay", "--output", "", "--prediction", "f.py"], "--output"),
        (["replay", "--bench", ""], "--bench"),
    ],
)
def test_an_empty_path_is_refused_not_ignored_or_read_as_the_current_folder(argv, flag, capsys):
    """`--prediction "$FILE"` with FILE unset: the flag was dropped without a word, or named '.'."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: the path is empty" in err and len(err.splitlines()) == 1


def test_serve_refuses_an_empty_api_key_rather_than_serving_open(capsys):
    """`serve --api-key "$KEY"` with KEY unset served every route to anyone, without a word."""
    assert main(["serve", "--api-key", "", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "argument --api-key: the key is empty" in err and len(err.splitlines()) == 1


def test_a_host_cache_larger_than_the_memory_is_refused(capsys, monkeypatch):
    """`serve --host-cache-gib 1e30` started, saying "kept in host memory, up to 1e30 GiB": the tier
    grows as entries leave the KV cache, until the kernel kills the server."""
    import specserve.cli.generate as generate

    monkeypatch.setattr(generate, "available_memory", lambda: 8 * 2**30)
    assert main(["serve", "--port", "0", "--model", "no-such-model", "--host-cache-gib", "9"]) == 2
    err = capsys.readouterr().err
    assert "--host-cache-gib 9 is more than the 8.0 GiB of memory available" in err and len(err.splitlines()) == 1


def test_replay_refuses_an_empty_curve_rather_than_using_its_default(tmp_path, capsys):
    """`replay --curve "$CURVE"` with CURVE unset projected with the default cost ratio, exit 0."""
    text = tmp_path / "f.py"
    text.write_text("def f():\n    return 1\n")
    assert main(["replay", "--prediction", str(text), "--output", str(text), "--curve", ""]) == 2
    err = capsys.readouterr().err
    assert "a cost curve has at least two points" in err and "got ''" in err and len(err.splitlines()) == 1
