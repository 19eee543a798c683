"""stdin and stdout as the command starts, and stdout as it fails.

A shell's `cmd <&-` or `cmd >&-` closes them, and Python then starts with sys.stdin / sys.stdout set
to None: generate failed with an AttributeError traceback, and `models list` exited 0 with its table
written nowhere. A stdout that refuses writes (`> /dev/full`, a full disk) printed "[Errno 28] No
space left on device" (models list: exit 1) as if a file of ours could not be written; its errors
now say stdout (StdoutWriteError)."""

from __future__ import annotations

import contextlib
import os
import sys

QUIET_COMMANDS = ("serve",)  # they print nothing a user reads on stdout: their logs go to stderr


def closed_stdout(command: str | None) -> str | None:
    """The one-line error for a command whose output would be lost on a closed stdout, else None;
    a closed stdin is opened on /dev/null, so it reads as empty, as `cmd < /dev/null` does."""
    if sys.stdin is None:
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - the process's stdin, for its lifetime
    if sys.stdout is not None or command in QUIET_COMMANDS:
        return None
    return nowhere_to_write(f"specserve {command}")


def nowhere_to_write(command_line: str) -> str:
    """The one-line error for `command_line` run with stdout closed (its output would be lost)."""
    return (
        f"stdout is closed, so `{command_line}` has nowhere to write its output: "
        "redirect it to a file (> FILE), or to > /dev/null to drop it"
    )


class StdoutWriteError(OSError):
    """stdout refused a write or a flush (not a reader that left: that stays a BrokenPipeError)."""


@contextlib.contextmanager
def _named_stdout():
    """Re-raises a write error of stdout as a StdoutWriteError that says it was stdout."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        raise StdoutWriteError(f"cannot write to stdout: {e.strerror or e}") from None


class _GuardedStdout:
    """sys.stdout for the command's run: the same stream, whose write and flush errors name stdout.
    The failed write cannot be told apart afterwards: its buffer is dropped, so a second flush works."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with _named_stdout():
            return self._stream.write(text)

    def flush(self) -> None:
        with _named_stdout():
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout():
    """sys.stdout wrapped in _GuardedStdout for the block (when there is one), then put back."""
    stream = sys.stdout
    if stream is None:
        yield
        return
    sys.stdout = _GuardedStdout(stream)
    try:
        yield
    finally:
        if isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = stream


def drop_stdout() -> None:
    """Points stdout's file descriptor at /dev/null, so Python's last flush at exit does not fail
    again on what stdout still holds."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no file descriptor (main() called from a test)
        pass


def print_or_exit(parser, text: str, command_line: str) -> None:
    """Writes argparse's own output (--help, --version) to stdout, or exits with its one line: 2 on a
    closed stdout or one that refuses writes, a quiet 141 when the reader left. argparse fell back
    to stderr on a closed stdout and dropped write errors, exiting 0 either way."""
    if sys.stdout is None:
        parser.exit(2, f"specserve: error: {nowhere_to_write(command_line)}\n")
    try:
        with _named_stdout():
            sys.stdout.write(text)
            sys.stdout.flush()
    except BrokenPipeError:
        drop_stdout()
        parser.exit(141)
    except StdoutWriteError as e:
        drop_stdout()
        parser.exit(2, f"specserve: error: {e}\n")
