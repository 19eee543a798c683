"""`specserve`'s main(): how a command ends when the user presses Ctrl+C, whatever the libraries
it is inside at that moment make of the KeyboardInterrupt."""

from __future__ import annotations

import contextlib
import signal

import pytest

import specserve.cli.generate as generate
from specserve.cli.main import main


@pytest.fixture
def sigint_handler():
    """main() sets a handler for a second Ctrl+C on its way out: put the test process's back."""
    before = signal.getsignal(signal.SIGINT)
    yield before
    signal.signal(signal.SIGINT, before)


def _swallowing_library(args):
    """A Ctrl+C during the model load, as seen on SmolLM2: it landed in an import that a library's
    bare `except:` wrapped, which left numpy half imported, and the load failed later with
    transformers' "Could not import module 'LlamaConfig'" and a traceback (exit status 1)."""
    with contextlib.suppress(KeyboardInterrupt):  # the library's bare except
        signal.raise_signal(signal.SIGINT)
    raise ModuleNotFoundError("Could not import module 'LlamaConfig'")


def test_a_ctrl_c_a_library_swallowed_still_ends_the_command_as_interrupted(monkeypatch, capsys, sigint_handler):
    monkeypatch.setattr(generate, "run", _swallowing_library)
    assert main(["generate", "hi"]) == 130
    assert capsys.readouterr().err == "specserve: interrupted\n"


def test_a_ctrl_c_turned_into_a_one_line_error_is_still_an_interruption(monkeypatch, capsys, sigint_handler):
    def run(args):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raise ValueError("the stream was cut") from None  # what a client library may turn it into

    monkeypatch.setattr(generate, "run", run)
    assert main(["generate", "hi"]) == 130
    assert capsys.readouterr().err == "specserve: interrupted\n"


def test_without_a_ctrl_c_errors_are_what_they_were(monkeypatch, capsys, sigint_handler):
    def run(args):
        raise ValueError("bad value")

    monkeypatch.setattr(generate, "run", run)
    assert main(["generate", "hi"]) == 2
    assert capsys.readouterr().err == "specserve: error: bad value\n"
    assert signal.getsignal(signal.SIGINT) is sigint_handler  # main() put its own handler away

    def bug(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(generate, "run", bug)
    with pytest.raises(RuntimeError, match="a bug"):  # a bug keeps its traceback
        main(["generate", "hi"])


def test_an_ignored_sigint_stays_ignored(monkeypatch, sigint_handler):
    """A command started in the background by a script (SIGINT ignored, as `cmd &` leaves it) is
    not made interruptible by main()."""
    seen = []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    monkeypatch.setattr(generate, "run", lambda args: seen.append(signal.getsignal(signal.SIGINT)) or 0)
    assert main(["generate", "hi"]) == 0
    assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
