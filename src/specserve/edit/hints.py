"""What the tool tells the model about the file beside the instruction: for a rename, where the
old name is used.

The tool reads the file as the rename check does (`names.use_lines`: in Python the code's uses,
not comments or prose), so it knows every place a rename must touch; the 1.5B pack, left to find
them, often renames only the definition, renames another name, or invents one. The hint lists
the places with their line numbers, the count and each line's text, so the model can copy them
rather than find them. It is measured as the `file-first-hint` prompt (docs/server.md).

The model also renames names nobody asked about when they look like the renamed one (`do_shorts`
beside `do_longs`, `what` when `whathdr` becomes `what_header`), so the `file-first-hint-others`
candidate names those too, as names to leave alone (`lookalike_names`).
"""

from __future__ import annotations

import builtins
import re

from .names import identifiers, python_definition_span, use_lines
from .rename import parse_rename

# A rename used on more lines than this is listed in part: the hint must not double the prompt.
MAX_LINES = 40
# At most this many look-alike names are named: the hint is about the rename, not a list of the file's names.
MAX_LOOKALIKES = 6


def rename_hint(original: str, instruction: str, language: str = "", lookalikes: bool = False) -> str:
    """The hint for a rename ("Rename X to Y"): where X is used, as lines the model can match, e.g.

        `_v` is used 4 times, on lines 12, 20 and 21; rename it to `_hue_to_channel` at each of
        them, and nowhere else:
        line 12: def _v(m1, m2, hue):
        ...

    Narrowed to a Python function or class ("... in dedent"), only the uses inside it are listed.
    "" when the instruction is no rename, the old name is not used, the new name is in the file
    already, or the rename is narrowed to a part the tool cannot find (then the model is told
    nothing rather than something wrong). With `lookalikes`, a last line names the file's other
    names that look like the old or the new one (`lookalike_names`) as names to leave as they are."""
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
    hint = _hint_text(original, old, new, uses, where)
    others = lookalike_names(original, old, new, language) if lookalikes else []
    return f"{hint}\n{_leave_alone(others)}" if others else hint


def lookalike_names(original: str, old: str, new: str, language: str = "") -> list[str]:
    """Python: the file's other identifiers (`names.identifiers`, builtins aside) that share a word
    with `old` or `new` (the words of `do_longs` are "do" and "longs", of `parseHeader` "parse" and
    "header"; glue words such as "to" do not count), in the order the file first uses them, at most
    MAX_LOOKALIKES. These are the names the 1.5B pack renamed unasked: `do_shorts` with `do_longs`,
    `what` when `whathdr` became `what_header`, the parameter `path` when `filename` became
    `file_path`, `v` beside `_v`. [] outside Python (no tokenizer here tells a name from a word)."""
    if language != "python":
        return []
    words = (_words(old) | _words(new)) - _GLUE
    others = [n for n in identifiers(original) if n not in (old, new) and not hasattr(builtins, n)]
    return [n for n in others if _words(n) & words][:MAX_LOOKALIKES]


# Words that join an identifier's parts without naming anything (`rgb_to_hls`, `is_file`).
_GLUE = frozenset({"to", "of", "in", "on", "at", "by", "for", "from", "and", "or", "the", "with", "as", "is"})


def _words(name: str) -> set[str]:
    """The lower-case words of an identifier, split at underscores and lower-to-upper case changes."""
    return {w.lower() for w in re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).split("_") if w}


def _leave_alone(names: list[str]) -> str:
    """The hint's last line: the look-alike names, as names to keep."""
    if len(names) == 1:
        return f"`{names[0]}` is a different name: leave it as it is."
    return f"{_listed([f'`{n}`' for n in names])} are different names: leave them as they are."


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


def _listed(items: list) -> str:
    """1, 2 and 3."""
    words = [str(n) for n in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
