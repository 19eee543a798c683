"""argparse value types shared by the subcommands: a bad number is refused at parse time with
argparse's one-line error, rather than read as "use the default" (0 is falsy) or found later.

A value that is not a number at all raises ArgumentTypeError in words too: from a bare ValueError
argparse wrote the function's name ("invalid positive_int value: 'x'", "invalid _port value")."""

from __future__ import annotations

import argparse
from pathlib import Path


def _whole_number(text: str, least: int) -> int:
    """`text` as an int of at least `least`, or ArgumentTypeError saying what is wanted."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, at least {least}; got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0)


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, 0-65535; got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be 0-65535")
    return value


def non_negative_seconds(text: str) -> float:
    wanted = "must be >= 0 seconds, and finite (0: no deadline)"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{wanted}; got {text!r}") from None
    if not 0 <= value < float("inf"):  # also refuses nan, and inf (0 is "none"; with --ray it became Ray's wait)
        raise argparse.ArgumentTypeError(wanted)
    return value


def path_text(text: str) -> str:
    """A file or folder path as given, refused when empty: `--prediction "$FILE"` with FILE unset
    dropped the flag without a word (an empty string is falsy), and Path("") is "." (the results
    of `bench --out ""` went into the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty: give a file's name, or leave the flag out")
    return text


def path_arg(text: str) -> Path:
    """path_text as a Path."""
    return Path(path_text(text))


def api_key(text: str) -> str:
    """A server's API key, refused when empty or blank: `serve --api-key "$KEY"` with KEY unset
    served every route to anyone, without a word (an empty key reads as "no key")."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the key is empty: give one, or leave --api-key out (then $SPECSERVE_API_KEY, else no key)"
        )
    return text
