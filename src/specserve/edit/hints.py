"""What the tool tells the model about the file beside the instruction: for a rename, where the
old name is used.

The tool reads the file as the rename check does (`names.use_lines`: in Python the code's uses,
not comments or prose), so it knows every place a rename must touch; the 1.5B pack, left to find
them, often renames only the definition, renames another name, or invents one. The hint lists
the places with their line numbers, the count and each line's text, so the model can copy them
rather than find them. It is measured as the `file-first-hint` prompt (docs/server.md).
"""

from __future__ import annotations

from .names import python_definition_span, use_lines
from .rename import parse_rename

# A rename used on more lines than this is listed in part: the hint must not double the prompt.
MAX_LINES = 40


def rename_hint(original: str, instruction: str, language: str = "") -> str:
    """The hint for a rename ("Rename X to Y"): where X is used, as lines the model can match, e.g.

        `_v` is used 4 times, on lines 12, 20 and 21; rename it to `_hue_to_channel` at each of
        them, and nowhere else:
        line 12: def _v(m1, m2, hue):
        ...

    Narrowed to a Python function or class ("... in dedent"), only the uses inside it are listed.
    "" when the instruction is no rename, the old name is not used, the new name is in the file
    already, or the rename is narrowed to a part the tool cannot find (then the model is told
    nothing rather than something wrong)."""
    rename = parse_rename(instruction)
    if rename is None:
        return ""
    old, new, scope = rename.old, rename.new, rename.scope
    uses = use_lines(original, old, language)
    if old == new or not uses or use_lines(original, new, language):
        return ""
    where = ""
    if scope is not None:
        span = python_definition_span(original, scope) if language == "python" else None
        if span is None:
            return ""
        uses = [n for n in uses if span[0] <= n <= span[1]]
        where = f" in `{scope}`"
        if not uses:
            return ""
    return _hint_text(original, old, new, uses, where)


def _hint_text(original: str, old: str, new: str, uses: list[int], where: str) -> str:
    """The hint's words: the count, the lines, and each line's text (at most MAX_LINES of them)."""
    lines = sorted(set(uses))
    text = original.split("\n")
    times = "once" if len(uses) == 1 else "twice" if len(uses) == 2 else f"{len(uses)} times"
    on = f"line {lines[0]}" if len(lines) == 1 else f"lines {_listed(lines)}"
    them = "there" if len(lines) == 1 else "at each of them"
    shown = [f"line {n}: {text[n - 1].strip()}" for n in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        shown.append(f"(and {len(lines) - MAX_LINES} more lines)")
    head = f"`{old}` is used {times}{where}, on {on}; rename it to `{new}` {them}, and nowhere else:"
    return "\n".join([head, *shown])


def _listed(numbers: list[int]) -> str:
    """1, 2 and 3."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
