"""Reading a regex pattern (JSON Schema's `pattern`, a `regex` constraint) and writing class members back.

`patterns.py` checks and rewrites patterns for xgrammar; this file only knows the syntax: a
pattern cut into tokens, what an escape stands for, the members of a character class and how to
write one so that xgrammar reads it.
"""

from __future__ import annotations

import re

_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


def tokens(pattern: str) -> list[str]:
    """The pattern cut into atoms (a character, an escape, a class), group opens "(" (their `?:` or
    `?P<name>` dropped), ")", "|", "^", "$" and quantifiers ("*", "+", "?", "{m,n}", lazy or not);
    inline flags (`(?i)`) are left out."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
        elif c == "[":
            end = read_class(pattern, i)[2]
            out.append(pattern[i : end + 1])
            i = end + 1
        elif c == "(" and re.match(r"\(\?[aiLmsux-]+\)", pattern[i:]):  # inline flags: no text
            i += len(re.match(r"\(\?[aiLmsux-]+\)", pattern[i:]).group())
        elif c == "(":
            prefix = re.match(r"\((?:\?:|\?P?<[^>]*>)?", pattern[i:]).group()
            out.append("(")
            i += len(prefix)
        elif c == "{" and re.match(r"\{\d*(,\d*)?\}", pattern[i:]):
            quantifier = re.match(r"\{\d*(,\d*)?\}\??", pattern[i:]).group()
            out.append(quantifier)
            i += len(quantifier)
        elif c in "*+?":
            out.append(pattern[i : i + 2] if pattern[i + 1 : i + 2] == "?" else c)
            i += len(out[-1])
        else:
            out.append(c)
            i += 1
    return out


def repeats(quantifier: str) -> bool:
    """Whether a quantifier lets its atom match more than once."""
    if quantifier[0] in "*+":
        return True
    bounds = re.match(r"\{(\d*)(,?)(\d*)\}", quantifier)
    return bool(bounds) and (bounds[2] == "," and (bounds[3] == "" or int(bounds[3]) > 1) or int(bounds[1] or 0) > 1)


def escape_at(pattern: str, i: int, in_class: bool) -> tuple[str | None, int]:
    """The character the escape at pattern[i] (a backslash) stands for, and where it ends.
    None: it stands for a set (`\\d`), an anchor (`\\b` outside a class) or a reference."""
    c = pattern[i + 1 : i + 2]
    for prefix, digits in (("x", 2), ("u", 4)):
        code = pattern[i + 2 : i + 2 + digits]
        if c == prefix and re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", code):
            return chr(int(code, 16)), i + 2 + digits
    if c == "0":
        octal = re.match(r"[0-7]{0,2}", pattern[i + 2 :]).group()
        return chr(int("0" + octal, 8)), i + 2 + len(octal)
    if c in _CHAR_ESCAPES or (in_class and c == "b"):
        return _CHAR_ESCAPES.get(c, "\b"), i + 2
    if c and not c.isalnum():  # an escaped punctuation character stands for itself
        return c, i + 2
    return None, i + 2


def _class_atom(pattern: str, i: int) -> tuple[tuple[str, str] | str, int]:
    """The class member at pattern[i] and where it ends: (ch, ch) for a character, the text of a set (`\\d`)."""
    if pattern[i] == "\\":
        ch, end = escape_at(pattern, i, in_class=True)
        return (pattern[i:end] if ch is None else (ch, ch)), end
    return (pattern[i], pattern[i]), i + 1


def _class_items(pattern: str, i: int) -> tuple[list, int]:
    """The members of the class whose body starts at pattern[i], and the index of its closing "]":
    (lo, hi) character ranges (a single character is lo == hi) and, as text, sets like `\\d`."""
    items, start = [], i
    while i < len(pattern) and (pattern[i] != "]" or i == start):
        item, i = _class_atom(pattern, i)
        if isinstance(item, tuple) and pattern[i : i + 1] == "-" and pattern[i + 1 : i + 2] not in ("]", ""):
            hi, end = _class_atom(pattern, i + 1)
            if isinstance(hi, tuple):
                item, i = (item[0], hi[1]), end
        items.append(item)
    return items, i


def read_class(pattern: str, i: int) -> tuple[bool, list, int]:
    """The class that opens at pattern[i] (a "["): whether it is negated ("[^"), its members (as
    `_class_items` gives them) and the index of its closing "]" (the pattern's length if none).
    A "]" right after "[" or "[^" is a member, not the end."""
    negated = pattern[i + 1 : i + 2] == "^"
    items, end = _class_items(pattern, i + 1 + negated)
    return negated, items, end


def code(ch: str) -> str:
    """`ch` as an escape xgrammar reads (a non-ASCII character written as it is breaks its JSON mode)."""
    return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\u{{{ord(ch):x}}}"


def _class_char(ch: str) -> str:
    """One character as a class member: escaped where the class syntax or xgrammar needs it."""
    if ord(ch) > 127 or ord(ch) < 32:
        return code(ch)
    return "\\" + ch if ch in "]\\^-[" else ch


def class_text(items: list) -> str:
    """Class members written back (characters and ranges escaped as needed, sets as they were)."""
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        else:
            out.append(_class_char(item[0]) + ("" if item[0] == item[1] else "-" + _class_char(item[1])))
    return "".join(out)
