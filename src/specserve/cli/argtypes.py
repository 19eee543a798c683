"""argparse value types shared by the subcommands: a bad number is refused at parse time with
argparse's one-line error, rather than read as "use the default" (0 is falsy) or found later."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def non_negative_seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):  # also refuses nan, and inf (0 is "none"; with --ray it became Ray's wait)
        raise argparse.ArgumentTypeError("must be >= 0 seconds, and finite (0: no deadline)")
    return value
