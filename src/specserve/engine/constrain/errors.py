"""The errors a constraint raises: what the server answers with a 400 or a 503.

Also `compile_errors`, the one place where xgrammar's own exceptions become a ConstraintError, and
`xgrammar_message`, the words of such an exception without its C++ log prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager


class ConstraintError(ValueError):
    """A grammar or schema we cannot enforce; `param` names the request field at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class GrammarBusy(ConstraintError):
    """Every grammar compiler was busy for the whole time limit: retry later (a 503, not a 400)."""


class GrammarDeadEnd(ConstraintError):
    """The grammar allows no token where the output has got to: no text satisfies it from there.

    Raised in a step, but the caller's grammar is at fault, not the engine: a 400, like a
    grammar refused before it runs (most such grammars are: see `factory.check_satisfiable`)."""


# what xgrammar's C++ errors open with: "[04:56:58] /project/cpp/regex_converter.cc:94: "
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def xgrammar_message(exc: Exception) -> str:
    """The one-line text of an exception xgrammar raised: its C++ log prefix (the time and the
    source file of xgrammar's build, which a 400 sent to a client as "cannot compile the
    json_schema constraint: [04:56:58] /project/cpp/regex_converter.cc:94: Regex parsing error
    ...\n") and a stack trace after it dropped, its lines joined."""
    text = _LOG_PREFIX.sub("", str(exc).strip()).split("Stack trace:")[0]
    return " ".join(text.split())


@contextmanager
def compile_errors(kind: str, param: str | None) -> Iterator[None]:
    """Turn whatever xgrammar raises while building or compiling a grammar into a ConstraintError
    (a 400 naming `param`); our own ConstraintErrors pass through as they are."""
    try:
        yield
    except ConstraintError:
        raise
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses
        raise ConstraintError(f"cannot compile the {kind} constraint: {xgrammar_message(e)}", param) from None
