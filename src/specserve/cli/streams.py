"""stdin and stdout as the command starts: a shell's `cmd <&-` or `cmd >&-` closes them, and Python
then starts with sys.stdin / sys.stdout set to None. generate failed with an AttributeError
traceback, and `models list` exited 0 with its table written nowhere."""

from __future__ import annotations

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
    return (
        f"stdout is closed, so `specserve {command}` has nowhere to write its output: "
        "redirect it to a file (> FILE), or to > /dev/null to drop it"
    )
