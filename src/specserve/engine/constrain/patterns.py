"""Regex patterns made to mean, under xgrammar 0.2.9, what they mean in Python's `re` and JSON Schema.

xgrammar reads a regex (a `regex` constraint, or a JSON schema's `pattern`) with defects we
measured; each function here either refuses what it would get wrong (`misplaced_anchor`,
`folds_negated_class`, `json_special_in_pattern`: the caller raises the 400) or rewrites a
pattern into one xgrammar enforces as meant, the same strings or a subset, never a superset
(`exact_pattern`, `optional_groups`; checked against Python's `re` over random patterns in
tests/test_grammar_limits.py). The syntax itself (tokens, escapes, classes) is `pattern_syntax.py`'s.
"""

from __future__ import annotations

import functools
import re

from .pattern_syntax import class_text, code, escape_at, read_class, repeats, tokens

ANCHOR_REFUSAL = (
    "a {0!r} anchor in the middle of a pattern (after or before a character it may match, or in a "
    "repeated group) is not supported"
)

# Characters a JSON string cannot hold as they are: it writes them as escapes (`\"`, `\\`, `\n`, `\u0001`).
_JSON_SPECIAL = frozenset('"\\' + "".join(map(chr, range(32))))

# Characters ECMA-262 counts as white space beyond Python's `\s` (JSON Schema's patterns are ECMA's).
_ECMA_SPACES = (
    "\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_SHORTHAND_SETS = {
    "w": lambda ch: ch.isalnum() or ch == "_",
    "d": str.isdecimal,
    "s": lambda ch: ch.isspace() or ch in _ECMA_SPACES,
}
_DOT = r"[^\n\r\u2028\u2029]"  # what `.` matches in Python (no \n) and in ECMA-262 (no line terminator)


def folds_negated_class(pattern: str) -> bool:
    """Whether a case-insensitive pattern holds a negated class: xgrammar folds case there by ASCII
    only, so `(?i)[^k]` took "K" (U+212A) and `(?i)[^é]` "É", which Python's `re` (and pydantic's
    Rust regex) fold into the class and refuse."""
    if not re.match(r"\(\?[a-zA-Z]*i[a-zA-Z]*\)", pattern):
        return False
    return any(tok.startswith("[^") for tok in tokens(pattern))


def misplaced_anchor(pattern: str) -> str | None:
    """The first `^` that may come after a matched character, or `$` before one (None: none does).

    xgrammar 0.2.9 drops such an anchor ("Anchor '^' in the middle of regex is ignored"), so `a^`
    matched "a" and `(a$)?b` "ab", strings the pattern never matches. An anchor at the start (end)
    of the pattern, of a top-level alternative or of a group that is itself there is kept, and
    means the same there; in a repeated group (`(^a)*`) it is refused."""
    toks, stack = tokens(pattern), []
    at_start, ended = True, False
    for k, tok in enumerate(toks):
        if tok == "(":
            stack.append({"start": at_start, "ended": ended, "any_ended": False, "anchor": False})
        elif tok == "|":
            frame = stack[-1] if stack else {"start": True, "ended": False, "any_ended": False}
            frame["any_ended"] |= ended
            at_start, ended = frame["start"], frame["ended"]
        elif tok == ")" and stack:
            frame = stack.pop()
            ended |= frame["any_ended"]
            at_start = False
            if frame["anchor"] and k + 1 < len(toks) and repeats(toks[k + 1]):
                return "^" if "^" in toks[:k] else "$"
            if stack:
                stack[-1]["anchor"] |= frame["anchor"]
        elif tok in ("^", "$"):
            if tok == "^" and not at_start:
                return "^"
            ended |= tok == "$"
            if stack:
                stack[-1]["anchor"] = True
        elif not (tok[0] in "*+?" or tok[0] == "{" and len(tok) > 1):
            if ended:
                return "$"
            at_start = False
    return None


def optional_groups(pattern: str) -> str:
    """`pattern` with each optional group `(...)?` written `(...){0,1}`: the same strings.

    xgrammar 0.2.9 matches a JSON-schema `pattern` (its JSON-string regex mode) wrongly where a
    group of one branch holding a repeated element is optional: `a(?:xy*)?` accepts "ay",
    `[0-9]{3}(?:-[0-9]+)?` accepts "1234", so answers broke their own schema while we called them
    valid. Plain regex mode is right, and so is `{0,1}` (checked against Python's `re` over random
    patterns in tests/test_grammar_limits.py). Escapes and character classes are copied as they are."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":  # an escape: the next character is literal, or names a class
            out.append(pattern[i : i + 2])
            i += 2
        elif c == "[":
            end = read_class(pattern, i)[2]
            out.append(pattern[i : end + 1])
            i = end + 1
        elif c == ")" and pattern[i + 1 : i + 2] == "?":
            out.append("){0,1}")
            i += 3 if pattern[i + 2 : i + 3] == "?" else 2  # lazy `??`: the same strings
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _special_member(items: list) -> str | None:
    """A member of a positive class that xgrammar may write raw into the JSON text: a quote or a
    backslash named as a member or a range's end, or a control character (alone or in a range)."""
    for item in items:
        if isinstance(item, str):
            continue
        for end in item:
            if end in '"\\':
                return end
        if any(item[0] <= chr(c) <= item[1] for c in range(32)):
            return item[0] if item[0] == item[1] else f"{item[0]}-{item[1]}"
    return None


def json_special_in_pattern(pattern: str) -> str | None:
    r"""The first character of `pattern` that xgrammar would copy raw into the JSON text (None if none).

    xgrammar 0.2.9 matches a JSON-schema `pattern` against the string's JSON text, not its value,
    and copies a quote, a backslash or a control character the pattern names into it: the pattern
    `\\` (one backslash) wrote the text `"\"`, `[\"]` wrote three quotes and `a\nb` a raw line
    break, none of them JSON. Writing them as their JSON escapes (`\\"`) was tried and is not
    safe: after such an escape xgrammar lets `.` and negated classes take any escape, `\q` included.
    Named through a range that holds no control character (`[ -~]`), in a negated class (`[^"]`)
    or by `.`, they are left out by xgrammar, which is stricter than the pattern, never looser."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            ch, i = escape_at(pattern, i, in_class=False)
            if ch is not None and ch in _JSON_SPECIAL:
                return ch
        elif c == "[":
            negated, items, end = read_class(pattern, i)
            found = None if negated else _special_member(items)
            if found is not None:
                return found
            i = end + 1
        elif c in _JSON_SPECIAL:
            return c
        else:
            i += 1
    return None


@functools.cache
def _unicode_set(letter: str) -> str:
    """Class members (ranges) for every character Python's `\\w`, `\\d` or `\\s` matches, all of
    Unicode (xgrammar's are ASCII only); `\\s` also holds ECMA-262's white space."""
    test, ranges, start = _SHORTHAND_SETS[letter], [], None
    for point in range(0x110001):
        inside = point <= 0x10FFFF and not 0xD800 <= point <= 0xDFFF and test(chr(point))
        if inside and start is None:
            start = point
        elif not inside and start is not None:
            ranges.append((chr(start), chr(point - 1)))
            start = None
    return class_text(ranges)


def _widened(items: list) -> list:
    """Negated-class members with `\\w`, `\\d`, `\\s` widened to all of Unicode."""
    return [_unicode_set(t[1]) if t in ("\\w", "\\d", "\\s") else t for t in items]


def exact_pattern(pattern: str) -> str:
    r"""`pattern` written so that xgrammar 0.2.9 holds to what it means; every change is the same
    set of strings or a subset of it (never a superset), checked against Python's `re` over random
    patterns in tests/test_grammar_limits.py.

    - Non-ASCII characters as escapes (`é` -> `\u00e9`): written as they are, they broke xgrammar's
      JSON-string mode (`é?..` let through `"\q"`, not JSON, and `"\""`, one character).
    - `\W`, `\D`, `\S` as the complement of all of Unicode's word characters, digits and spaces,
      and a negated class's `\w`, `\d`, `\s` widened the same way: xgrammar's are ASCII, so `\W`
      took "中" and `[^\d]` took "٣", which Python's `re`, pydantic's Rust regex and `jsonschema`
      refuse (`\w`, `\d`, `\s` themselves, ASCII, are a subset and stay).
    - `.` as `[^\n\r\u2028\u2029]`: xgrammar's took a line break ("(.)+" matched "\n-")."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            letter = pattern[i + 1 : i + 2]
            if letter in ("W", "D", "S"):
                out.append(f"[^{_unicode_set(letter.lower())}]")
            else:
                out.append(code(letter) if letter and ord(letter) > 127 else pattern[i : i + 2])
            i += 2
        elif c == "[":
            text, end = _exact_class(pattern, i)
            out.append(text)
            i = end + 1
        else:
            out.append(_DOT if c == "." else code(c) if ord(c) > 127 else c)
            i += 1
    return "".join(out)


def _exact_class(pattern: str, i: int) -> tuple[str, int]:
    """The class at pattern[i] as `exact_pattern` writes it, and the index of its closing "]"."""
    negated, items, end = read_class(pattern, i)
    if negated:
        widened = _widened(items)
        changed = widened != items or pattern[i + 2 : i + 3] == "]" or any(ord(ch) > 127 for ch in pattern[i:end])
        return ("[^" + class_text(widened) + "]" if changed else pattern[i : end + 1]), end
    wide = [t for t in items if t in ("\\W", "\\D", "\\S")]
    if wide:  # a complement inside a positive class: one alternative each
        rest = [t for t in items if t not in wide]
        parts = [f"[^{_unicode_set(t[1].lower())}]" for t in wide] + ([f"[{class_text(rest)}]"] if rest else [])
        return "(?:" + "|".join(parts) + ")", end
    rewrite = pattern[i + 1 : i + 2] == "]" or any(ord(ch) > 127 for ch in pattern[i:end])  # xgrammar: `[]a]` is empty
    return ("[" + class_text(items) + "]" if rewrite else pattern[i : end + 1]), end
