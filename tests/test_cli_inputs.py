"""Every command says the same of an input file it cannot read, in one line, before any model
loads: "cannot read [FLAG ]PATH: <the system's reason>" (specserve/inputs.py). Each command had its
own words: generate "cannot read prediction file 'x': No such file or directory", replay
"--prediction x: cannot read it (...)" and "--bench x: not a bench report ([Errno 2] ...)", edit
"cannot read x: no such file"."""

from __future__ import annotations

import errno
import os

import pytest

from specserve.cli.main import main


def _commands(path: str, other: str) -> list[tuple[list[str], str]]:
    """(argv, the flag it names) for each way a command reads an input file."""
    return [
        (["generate", "--prompt-file", path], "--prompt-file "),
        (["generate", "x", "--prediction", path], "--prediction "),
        (["generate", "x", "--suffix", path], "--suffix "),
        (["replay", "--prediction", path, "--output", other], "--prediction "),
        (["replay", "--prediction", other, "--output", path], "--output "),
        (["replay", "--prompt", path, "--output", other, "--method", "auto"], "--prompt "),
        (["replay", "--bench", path], "--bench "),
        (["edit", path, "-i", "x", "--dry-run"], ""),
    ]


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_an_unreadable_input_is_one_line_in_one_style(tmp_path, capsys, kind):
    other = tmp_path / "after.py"
    other.write_text("a = 1\n")
    path = str(tmp_path / "missing.py") if kind == "missing" else str(tmp_path)
    reason = os.strerror(errno.ENOENT if kind == "missing" else errno.EISDIR)
    for argv, flag in _commands(path, str(other)):
        assert main([*argv, "--model", "/nonexistent-model"]) == 2, argv
        err = capsys.readouterr().err
        assert err == f"specserve: error: cannot read {flag}{path}: {reason}\n", (argv, err)


def test_an_input_that_is_not_utf8_is_one_line_in_the_same_style(tmp_path, capsys):
    """Bytes that are not UTF-8 were worded three ways: generate "--prediction x is not UTF-8 text
    (byte 3)", replay "--prediction x: not UTF-8 text", edit "x is not UTF-8 text (byte 3);
    specserve edit reads and writes UTF-8" (and replay --bench "not a bench report ('utf-8' codec
    can't decode ...)"). Now every command says it as it says any unreadable file."""
    other = tmp_path / "after.py"
    other.write_text("a = 1\n")
    path = tmp_path / "latin.py"
    path.write_bytes(b"caf\xe9 = 1\n")
    for argv, flag in _commands(str(path), str(other)):
        assert main([*argv, "--model", "/nonexistent-model"]) == 2, argv
        err = capsys.readouterr().err
        assert err == f"specserve: error: cannot read {flag}{path}: not UTF-8 text (byte 3)\n", (argv, err)
    assert path.read_bytes() == b"caf\xe9 = 1\n"  # edit wrote nothing
