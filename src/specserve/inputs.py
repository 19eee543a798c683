"""The files a command is given, read one way: one that cannot be read is one line in one style,
"cannot read [FLAG ]PATH: <the system's reason>" (the OS's own words: "No such file or directory",
"Is a directory", "Permission denied"), whichever command reads it. generate, replay and edit each
had their own wording before, one of them Python's "[Errno 2] ...: 'x'". A file that is not UTF-8
text is one more reason in the same line: "not UTF-8 text (byte N)"."""

from __future__ import annotations

from pathlib import Path

from .errors import SpecServeError


class UnreadableInput(SpecServeError, ValueError):
    """An input file that could not be read (missing, a folder, not permitted, not UTF-8)."""


def cannot_read(path, error: OSError | str, flag: str | None = None) -> str:
    """The one-line message for `path` (named by `flag`, when one named it) that raised `error`
    (or for which `error` is the reason, in words)."""
    reason = error if isinstance(error, str) else error.strerror or type(error).__name__
    return f"cannot read {flag + ' ' if flag else ''}{path}: {reason}"


def read_bytes(path, flag: str | None = None) -> bytes:
    """The file's bytes as they are (no line-end translation); UnreadableInput when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UnreadableInput(cannot_read(path, e, flag)) from None


def decode_text(data: bytes, path, flag: str | None = None) -> str:
    """`data`, read from `path`, as UTF-8 text; UnreadableInput naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableInput(cannot_read(path, f"not UTF-8 text (byte {e.start})", flag)) from None


def read_text(path, flag: str | None = None) -> str:
    """The file's UTF-8 text byte for byte (line ends as they are); UnreadableInput when it cannot
    be read or is not UTF-8."""
    return decode_text(read_bytes(path, flag), path, flag)
