"""What a rename instruction asks for: the old name, the new one, and the part of the file it is
narrowed to ("... in dedent"), read one way for the rename check (checks.py) and the rename hint
(hints.py), which each parsed the scope on their own before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "Rename [the function] old to new [in dedent | everywhere | in every function]".
RENAME = re.compile(
    r"\brename\s+(?:(?:the|every|all|each)\s+)?(?:(?:function|method|class|variable|parameter|argument|"
    r"attribute|field|constant|list|dict|type|property|helper|module|global|local|name)s?\s+)?"
    r"`?(?P<old>[A-Za-z_]\w*)`?\s+(?:to|as|into)\s+`?(?P<new>[A-Za-z_]\w*)`?(?P<rest>[^.;\n]*)",
    re.I,
)
# What narrows a rename to part of the file ("in dedent"), as opposed to "in every function" or "everywhere".
SCOPE = re.compile(
    r"\b(?:in|inside|within)\s+(?!(?:every|all|each|the whole|the file|this file|the module)\b)"
    r"(?:the\s+(?:function|method|class)\s+)?`?(?P<name>[A-Za-z_][\w.]*)?",
    re.I,
)


@dataclass(frozen=True)
class Rename:
    """One rename an instruction asks for.

    said: the instruction's words for it; scope: None when it is not narrowed (the whole file),
    the name of the function or class it is narrowed to, or "" when it is narrowed to a part
    that names nothing the tool can look for ("in the loop")."""

    old: str
    new: str
    said: str
    scope: str | None


def parse_rename(instruction: str) -> Rename | None:
    """The rename the instruction asks for, or None when it asks for none."""
    m = RENAME.search(instruction)
    if m is None:
        return None
    scope = SCOPE.search(m.group("rest"))
    return Rename(m.group("old"), m.group("new"), m.group(0), None if scope is None else scope.group("name") or "")
