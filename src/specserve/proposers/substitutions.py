"""Edits learned from divergences, applied to the rest of a prediction (drafts only).

When the output leaves the prediction and later re-anchors, the text in between is an edit:
prediction text P was replaced by output text O. A word-level diff of the two (what both share
at either end drops out) gives the changed words, widened to whole words and, when that is
shorter than MIN_CHARS non-space characters, to a little of the shared context on the same
line. That is a substitution such as `UserService` -> `UserRepository` or `@app.` -> `@bp.`.

A line whose indentation changed gives a shift instead (`"\n" + 8 spaces` -> `"\n" + 4 spaces`),
which moves every later line indented at least as deep: a block taken out of (or put into) a
`with`, `try` or `if` changes the indentation of all its lines, not just the first.

A rename, a changed signature, argument or decorator tends to recur, so the prediction drafter
rewrites the rest of its prediction with every substitution learned so far (`rewrite`): later
occurrences are drafted as the output will write them. Verification still decides every token,
and a substitution whose rewritten text verification rejects is dropped.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

MIN_CHARS = 4  # non-space characters a substitution's old text needs (shorter ones match too often)
MAX_CHARS = 120  # longer changes are rewrites of a line, not substitutions
MAX_REGION = 4000  # a diverged region longer than this is a wrong anchor or a rewrite: learn nothing
MAX_CHANGES = 4  # ... and so is one with more separate changes than this
MIN_RATIO = 0.5  # ... or whose words are less alike than this (difflib's ratio)
_WORDS = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass(frozen=True)
class Span:
    """A rewritten region: working text [w0, w1) stands for original text [o0, o1)."""

    w0: int
    w1: int
    o0: int
    o1: int
    old: str


def _nonspace(s: str) -> int:
    return len("".join(s.split()))


def learn(text: str, p0: int, p1: int, out: str, o0: int, o1: int) -> list[tuple[str, str]]:
    """Substitutions (old, new) that turn text[p0:p1] (prediction) into out[o0:o1] (output).

    Both regions are preceded by the same text (where the output last followed the prediction)
    and followed by the same anchor, so the shared context may widen a change on either side."""
    if p1 - p0 > MAX_REGION or o1 - o0 > MAX_REGION:
        return []
    pw = [(m.start(), m.end()) for m in _WORDS.finditer(text[p0:p1])]  # word spans, relative to p0
    ow = [(m.start(), m.end()) for m in _WORDS.finditer(out[o0:o1])]
    pt = [text[p0 + s : p0 + e] for s, e in pw]
    ot = [out[o0 + s : o0 + e] for s, e in ow]
    matcher = difflib.SequenceMatcher(None, pt, ot, autojunk=False)
    changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if len(changes) > MAX_CHANGES or matcher.ratio() < MIN_RATIO:
        return []  # not a few local edits: a wrong anchor or a rewritten block
    subs: list[tuple[str, str]] = []
    for _op, i1, i2, j1, j2 in changes:
        a = p0 + (pw[i1][0] if i1 < len(pw) else p1 - p0)
        b = p0 + pw[i2 - 1][1] if i2 > i1 else a
        c = o0 + (ow[j1][0] if j1 < len(ow) else o1 - o0)
        d = o0 + ow[j2 - 1][1] if j2 > j1 else c
        sub = _indent_shift(text, a, b, out, c, d) or _widen(text, a, b, out, c, d)
        if sub is not None and sub not in subs:
            subs.append(sub)
    return subs


def _widen(text: str, a: int, b: int, out: str, c: int, d: int) -> tuple[str, str] | None:
    """Grow text[a:b] -> out[c:d] over shared characters of the same line until the old text
    has MIN_CHARS non-space characters (whole words at both ends); None if it is no substitution."""

    def left() -> bool:
        return a > 0 and c > 0 and text[a - 1] == out[c - 1] and text[a - 1] != "\n"

    def right() -> bool:
        return b < len(text) and d < len(out) and text[b] == out[d] and text[b] != "\n"

    def words() -> None:
        nonlocal a, b, c, d
        while left() and (text[a - 1].isalnum() or text[a - 1] == "_"):
            a, c = a - 1, c - 1
        while right() and (text[b].isalnum() or text[b] == "_"):
            b, d = b + 1, d + 1

    words()
    while _nonspace(text[a:b]) < MIN_CHARS and (left() or right()):
        if left():
            a, c = a - 1, c - 1
        if right():
            b, d = b + 1, d + 1
        words()
    old, new = text[a:b], out[c:d]
    if old == new or _nonspace(old) < MIN_CHARS or "\n" in old or "\n" in new or max(len(old), len(new)) > MAX_CHARS:
        return None
    return old, new


def _indent_shift(text: str, a: int, b: int, out: str, c: int, d: int) -> tuple[str, str] | None:
    """A line's indentation changed (text[a:b] -> out[c:d] is whitespace that runs up to the
    line's first character): ('\n' + old indentation, '\n' + new indentation), which shifts
    every later line indented at least as deep, as a block wrapped in or taken out of a
    `with`/`try`/`if` is. None for any other change, or when the old line was not indented (the
    substitution would then touch every line)."""
    if text[a:b].strip() or out[c:d].strip() or b >= len(text) or d >= len(out):
        return None
    if text[b].isspace() or out[d].isspace():
        return None  # not up to the line's first character
    i, j = text.rfind("\n", 0, b), out.rfind("\n", 0, d)
    if i < 0 or j < 0 or i < a - 1 or j < c - 1:
        return None  # the whitespace does not start a line in both
    old, new = text[i + 1 : b], out[j + 1 : d]
    if not old or old == new or old.strip(" \t") or new.strip(" \t"):
        return None
    return "\n" + old, "\n" + new


def _pattern(olds) -> re.Pattern:
    """One regex for every old text, longest first, matched only as whole words at word edges."""
    parts = []
    for old in sorted(olds, key=len, reverse=True):
        p = re.escape(old)
        if old[0].isalnum() or old[0] == "_":
            p = r"(?<!\w)" + p
        if old[-1].isalnum() or old[-1] == "_":
            p += r"(?!\w)"
        parts.append(p)
    return re.compile("|".join(parts))


def rewrite(orig: str, start: int, subs: dict[str, str]) -> tuple[str, list[Span]]:
    """orig[start:] with every substitution applied (one pass, left to right), and the spans
    rewritten (offsets relative to the returned text for w, absolute in orig for o)."""
    if not subs:
        return orig[start:], []
    pieces, spans, w, last = [], [], 0, start
    for m in _pattern(subs).finditer(orig, start):
        pieces.append(orig[last : m.start()])
        w += m.start() - last
        new = subs[m.group(0)]
        pieces.append(new)
        spans.append(Span(w, w + len(new), m.start(), m.end(), m.group(0)))
        w += len(new)
        last = m.end()
    pieces.append(orig[last:])
    return "".join(pieces), spans
