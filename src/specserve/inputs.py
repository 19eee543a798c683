"""The files a command is given, read one way: one that cannot be read is one line in one style,
"cannot read [FLAG ]PATH: <the system's reason>" (the OS's own words: "No such file or directory",
"Is a directory", "Permission denied"), whichever command reads it. generate, replay and edit each
had their own wording before, one of them Python's "[Errno 2] ...: 'x'"."""

from __future__ import annotations

from pathlib import Path

from .errors import SpecServeError


class UnreadableInput(SpecServeError, ValueError):
    """An input file that could not be read (missing, a folder, not permitted)."""


def cannot_read(path, error: OSError, flag: str | None = None) -> str:
    """The one-line message for `path` (named by `flag`, when one named it) that raised `error`."""
    reason = error.strerror or type(error).__name__
    return f"cannot read {flag + ' ' if flag else ''}{path}: {reason}"


def read_bytes(path, flag: str | None = None) -> bytes:
    """The file's bytes as they are (no line-end translation); UnreadableInput when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UnreadableInput(cannot_read(path, e, flag)) from None
