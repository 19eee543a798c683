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
