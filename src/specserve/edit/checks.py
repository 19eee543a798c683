"""The edit tool's one rule for what it writes: can this answer be the file with the instruction applied?

`check_answer` lists what is wrong with an answer (a pure function, so `specserve edit` and the
prompt evaluation judge with the same rules); `judge_answer` adds the one repair the tool makes,
splicing an answer of changed definitions back into the file (splice.py).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .form import PROSE_LANGUAGES, clip, fence_problem, form_problems, tabs_turned_to_spaces
from .names import (
    changed_functions,
    code_uses,
    dropped_definitions,
    dropped_statements,
    duplicate_definitions,
    emptied_bodies,
    indented_definitions,
    name_uses,
    new_unbound_names,
    python_definition_source,
    word_count,
)
from .rename import parse_rename

# An answer far shorter than the file is a lost file, unless the instruction asks to take code out.
SHORT_FRACTION = 0.5
# Verbs that take code out, as whole words ("dropout", "CUTOFF" are none). Those of _TAKE_OUT take
# whole definitions out; the others may only shorten code.
_TAKE_OUT = (
    r"delet(e|es|ed|ing|ion)|remov(e|es|ed|ing|al)|drop(s|ped|ping)?|cut(s|ting)?|eliminat(e|es|ed|ing|ion)"
    r"|get rid|keep only|only keep"
)
_KEEP_ONLY_WORDS = r"keep only|only keep|to\s+(?:\S+\s+){0,2}only"
_REMOVAL = re.compile(
    rf"\b({_TAKE_OUT}|strip(s|ped|ping)?|shorten(s|ed|ing)?|simplif(y|ies|ied|ying|ication)|trim(s|med|ming)?"
    r"|condens(e|es|ed|ing)|minif(y|ies|ied|ying)|collaps(e|es|ed|ing)|reduc(e|es|ed|ing|tion)|dedup\w*"
    r"|clean ?up|extract(s|ed|ing)?|split(s|ting)?|mov(e|es|ed|ing))\b",
    re.I,
)
# Of those, the words that ask to take whole definitions out. "Simplify greet" or "clean up greet"
# may shorten the file, but an answer that loses the file's other functions is not that edit: it
# is refused, or (Python) spliced into the file, so the functions are kept.
_DELETION = re.compile(rf"\b({_TAKE_OUT}|prun(e|es|ed|ing)|purg(e|es|ed|ing)|{_KEEP_ONLY_WORDS})\b", re.I)
# Of those, the ones that keep a part and drop all the rest: there any definition may go.
_KEEP_ONLY = re.compile(rf"\b({_KEEP_ONLY_WORDS})\b", re.I)
# A word of the instruction that names code is not a verb: "add type hints to the function split"
# asks for no removal. Names: in backticks, called (`split(`), after a kind of name, or defined by the file.
_NAMED_IN_TEXT = re.compile(
    r"`[^`]*`|\b[A-Za-z_]\w*(?=\()|\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"
    r"|\b(?:function|method|class|variable|parameter|argument|attribute|field|constant|def|helper)s?\s+[A-Za-z_]\w*",
    re.I,
)
_DEFINES = r"\b(?:def|class|function|func|fn|const|let|var)\s+{}\b"
_REWRITE = re.compile(r"\b(rewrite|translate|port|convert the (whole )?file|from scratch)\b", re.I)


def check_answer(original: str, answer: str, instruction: str = "", language: str = "") -> list[str]:
    """Why `answer` (fence already stripped) cannot be `original` with `instruction` applied; [] when none.

    A pure function, so `specserve edit` can refuse to write such an answer and the prompt evaluation
    can count well-formed answers with the same rules. Each problem is one short sentence:
    - empty, or no code at all: prose (a sentence such as "Here is ..." opening it, or a ``` fence
      inside it; not checked for markdown), or not one of the original's lines kept (unless the
      instruction asks for a rewrite);
    - a placeholder instead of code: a name such as `obj['updated_code']` that the original does not
      have, or an elision (`# ... rest of the file ...`, `// existing code`, `<rest of code>`, a bare
      `...` that is not a Python body) on a line the original does not have;
    - far shorter than the original (under SHORT_FRACTION of its non-blank lines or characters) when
      the instruction asks for no removal (delete, remove, drop, strip, shorten, simplify, ...);
    - a rename the instruction asks for ("Rename X to Y") not done: Y nowhere in the answer, or X
      still in it when the rename is not narrowed to part of the file ("... in dedent"), or, in
      Python, still inside the function it is narrowed to (Python counts code, not comments);
    - a function or class of the file (for Python: top-level ones and their methods) that the
      answer no longer defines, when the instruction asks for no deletion (delete, remove, drop,
      keep only, ...; "simplify" or "clean up" may shorten code, not lose it) and the name is not
      the one a rename replaces: the trace of an answer cut short, or of a name renamed unasked;
    - for Python (language "python"): the original compiles and the answer does not; or the answer
      reads a name that nothing in it binds and the original did not (names.py): the fault of
      a rename left half done, such as a definition renamed and its callers not.
    """
    if not answer.strip():
        return ["the answer is empty"]
    problems = form_problems(original, answer, language) + _size_problems(original, answer, instruction)
    return problems or _first_fault(original, answer, instruction, language)


def _size_problems(original: str, answer: str, instruction: str) -> list[str]:
    """An answer that keeps none of the file's lines (unless the instruction asks for a rewrite),
    or is far shorter than the file (unless it asks for a removal)."""
    problems = []
    old_lines = [ln for ln in original.splitlines() if ln.strip()]
    new_lines = [ln for ln in answer.splitlines() if ln.strip()]
    meaningful = {s for ln in old_lines if len(s := ln.strip()) >= 4 and any(c.isalnum() for c in s)}
    if (
        len(meaningful) >= 3
        and not (meaningful & {ln.strip() for ln in new_lines})
        and not _REWRITE.search(instruction)
    ):
        problems.append("the answer keeps none of the original's lines")
    if not _asks_for_removal(instruction, original):
        old_chars = sum(len(ln.strip()) for ln in old_lines)
        new_chars = sum(len(ln.strip()) for ln in new_lines)
        if len(new_lines) < SHORT_FRACTION * len(old_lines) or new_chars < SHORT_FRACTION * old_chars:
            problems.append(
                f"the answer is far shorter than the file ({len(new_lines)} of {len(old_lines)} "
                f"non-blank lines, {new_chars} of {old_chars} characters) and the instruction "
                "asks for no removal"
            )
    return problems


def _first_fault(original: str, answer: str, instruction: str, language: str) -> list[str]:
    """For an answer whose form and size are right: the first fault of its content, the checks in
    the order of how precisely they name one ([] when none)."""
    reindent = re.search(r"\b(indent\w*|spaces|tabs|whitespace|reformat|format)\b", instruction, re.I)
    if not reindent and (spaces := tabs_turned_to_spaces(original, answer)):
        return [f"the answer indents with spaces lines the file indents with tabs: {clip(spaces)!r}"]
    if language == "markdown" and (split := fence_problem(original, answer)):
        return [split]
    if broken := _data_problem(original, answer, language):
        return [broken]
    if language == "python" and (wrong := _python_code_problem(original, answer)):
        return [wrong]
    if rename := _rename_problem(original, answer, instruction, language):
        return [rename]
    if language not in PROSE_LANGUAGES and (dropped := _dropped_problem(original, answer, instruction, language)):
        return [dropped]
    if language == "python" and (problems := python_problems(original, answer, instruction)):
        return problems
    if unasked := _beyond_rename(original, answer, instruction):
        return [unasked]  # last: the checks above name a fault more precisely
    return []


def _python_code_problem(original: str, answer: str) -> str | None:
    """Python: the answer does not compile where the file does, or it reads a name that nothing
    in it binds and the file did not (names.py)."""
    err = _syntax_error(answer)
    if err and not _syntax_error(original):
        return f"the answer is not valid Python ({err})"
    if unbound := new_unbound_names(original, answer):
        return (
            f"the answer uses {_listed(unbound)}, which nothing in it defines "
            "(a rename left half done, or a name made up?)"
        )
    return None


def _data_problem(original: str, answer: str, language: str) -> str | None:
    """JSON or YAML that parsed before the edit and does not after (an answer cut short)."""
    if language == "json":
        import json

        def parse(text):
            return json.loads(text)

    elif language == "yaml":
        import yaml

        def parse(text):
            return list(yaml.safe_load_all(text))

    else:
        return None
    try:
        parse(original)
    except Exception:  # noqa: BLE001 - the file did not parse either: nothing to compare
        return None
    try:
        parse(answer)
    except Exception as e:  # noqa: BLE001 - any parser error is the answer's fault
        return f"the answer is not valid {language.upper()} ({clip(str(e).splitlines()[0], 60)})"
    return None


def python_problems(original: str, answer: str, instruction: str) -> list[str]:
    """What only Python's parse shows: a top-level statement or class attribute of the file gone
    (a `CUTOFF = 0.5`, the `if __name__ == "__main__":` block: an answer cut short after its
    last function, or a class spliced in without its attributes), a definition written twice,
    and a function whose body became `...` or `pass`. What the instruction names may go."""
    rename = parse_rename(instruction)
    keep_all = not (_REWRITE.search(instruction) or _KEEP_ONLY.search(instruction))
    gone = dropped_statements(original, answer, rename and rename.old) if keep_all else []
    gone = [g for g in gone if not any(word_count(instruction, w) for w in _key_words(g))]
    problems = []
    if gone:
        problems.append(f"the answer no longer has {_listed(gone)}, which the file has (cut short?)")
    if twice := duplicate_definitions(original, answer):
        problems.append(f"the answer defines {_listed(twice)} twice")
    if emptied := [n for n in emptied_bodies(original, answer) if not _named(instruction, n)]:
        problems.append(f"the answer leaves code out: the body of {_listed(emptied)} is only `...` or `pass`")
    if unasked := _changed_unasked(original, answer, instruction):
        problems.append(f"the answer also changes {_listed(unasked)}, which the instruction does not name")
    return problems


def _changed_unasked(original: str, answer: str, instruction: str) -> list[str]:
    """Python: when the instruction points at definitions ("add type hints to the function X"),
    the functions outside them that the answer changed. Told to add a docstring to one method, the
    1.5B pack also rewrote a condition in another. A rename, a rewrite, or an instruction that
    reaches further (its callers, everywhere) is not narrowed."""
    pointed = {m.group("name") for m in _POINTED_AT.finditer(instruction)}
    if not pointed or parse_rename(instruction) or _REWRITE.search(instruction) or _REACHES.search(instruction):
        return []
    return [n for n in changed_functions(original, answer) if not pointed & set(n.split("."))]


def _named(instruction: str, definition: str) -> bool:
    """Whether the instruction names a definition (`sub`, or `Store.count` by `count`)."""
    return bool(word_count(instruction, definition.rsplit(".", 1)[-1]))


def _key_words(key: str) -> set[str]:
    """The words an instruction would use for a statement: `CUTOFF`, `Config.port` -> port,
    `if __name__ == '__main__'` -> main (not "if", not "name")."""
    words = {w.strip("_") for w in re.findall(r"[A-Za-z_]\w*", key.split(".")[-1]) if w not in ("if", "__name__")}
    return {w for w in words if w}


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names[:5]) + (", ..." if len(names) > 5 else "")


def _dropped_problem(original: str, answer: str, instruction: str, language: str) -> str | None:
    """The functions or classes of the file the answer lost, unless the instruction asks for a
    removal or a rewrite; the name a rename replaces does not count."""
    if _REWRITE.search(instruction) or _KEEP_ONLY.search(instruction):
        return None
    rename = parse_rename(instruction)
    dropped = dropped_definitions(original, answer, language, rename and rename.old, rename and rename.new)
    if _asks_for_removal(instruction, original, _DELETION):  # only what it names may go, with its methods
        named = [n for n in dropped if _named(instruction, n)]
        inside = indented_definitions(original, language) if named else set()
        dropped = [n for n in dropped if n not in named and n.split(".")[0] not in named and n not in inside]
    if not dropped:
        return None
    return f"the answer no longer defines {_listed(dropped)}, which the file defines (cut short, or renamed unasked?)"


# Words that take an edit beyond the definitions it names.
_REACHES = re.compile(r"\b(callers?|call sites?|every\w*|all|each|whole|uses?|usages?|references?)\b", re.I)
# An existing definition the instruction points at: "the function X", "method X", "class X";
# not "a function X", "a new class X" or "another method X", which the edit is to write.
_POINTED_AT = re.compile(
    r"(?<!\ba )(?<!\ban )(?<!\bnew )(?<!\banother )\b(?:function|method|class)\s+`?(?P<name>[A-Za-z_]\w*)`?",
    re.I,
)


def missing_target(original: str, instruction: str) -> str | None:
    """Why the edit cannot be asked for: the instruction renames a name, or points at "the
    function X", that the file never mentions (a typo, or the wrong file). Asked anyway, a model
    makes something up: with an empty file it wrote a new one, and told to type-hint a function
    click's _textwrap.py lacks, the 1.5B pack rewrote a condition elsewhere instead. None when
    every such name is there."""
    rename = parse_rename(instruction)
    names = [rename.old] if rename else []
    names += [
        p.group("name") for p in _POINTED_AT.finditer(instruction) if not (rename and p.group("name") == rename.new)
    ]
    for name in names:
        if not word_count(original, name):
            what = "nothing to rename" if rename and name == rename.old else "nothing to change"
            return f"the file never mentions `{name}`: {what} (check the name and the file)"
    return None


def _rename_problem(original: str, answer: str, instruction: str, language: str = "") -> str | None:
    """Why `answer` does not do the rename the instruction asks for, if it asks for one: the new
    name appears nowhere, or the old name is still there: anywhere when the rename is not
    narrowed to part of the file, and in Python inside the function or class it is narrowed to
    ("... in dedent"). A half-done rename is the commonest wrong answer of a small model to this."""
    rename = parse_rename(instruction)
    if rename is None:
        return None
    old, new, scope = rename.old, rename.new, rename.scope

    def count(name: str, text: str) -> int:
        return name_uses(text, name) if language == "python" else code_uses(text, name, language)

    if old == new or not count(old, original) or count(new, original):
        return None  # nothing to rename, or the new name is taken already: the check cannot tell
    if not count(new, answer):
        return f"the rename is not done: `{new}` appears nowhere in the answer's code"
    left = count(old, answer)
    where = ""
    if scope and language == "python":
        body = python_definition_source(answer, scope)
        where, left = (f" in `{scope}`", count(old, body)) if body is not None else ("", 0)
    elif scope is not None:
        left = 0  # narrowed to a part the check cannot find: the old name may rightly stay elsewhere
    if left:
        return f"the rename is left half done{where}: `{old}` is still there {left} time{'s' * (left > 1)}"
    return None


def _beyond_rename(original: str, answer: str, instruction: str) -> str | None:
    """An instruction that only renames ("Rename X to Y.") changes no line but those naming X:
    the answer with Y named X again must be the original, line for line (trailing spaces and blank
    lines at either end aside). Asked to rename a function of idna's intranges.py, the 1.5B pack
    also rewrote the module's docstring, dropping a sentence, and the tool wrote it. Lines were
    compared as sets of stripped text until 2026-12-06: a line moved into or out of a block (in
    Python, other code), lines reordered, or a blank line dropped passed. None when the instruction
    asks for more than the rename, or the new name was in the file already (then the way back is
    ambiguous)."""
    rename = parse_rename(instruction)
    if rename is None or instruction.replace(rename.said, "").strip(" \t\n.!") or word_count(original, rename.new):
        return None
    back = re.sub(rf"(?<!\w){re.escape(rename.new)}(?!\w)", rename.old, answer)
    before, after = _content_lines(original), _content_lines(back)
    if before == after:
        return None
    return f"the answer changes lines the rename does not touch: {_first_difference(before, after)}"


def _content_lines(text: str) -> list[str]:
    """The text's lines without trailing spaces, and without blank lines at its start and end."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def _first_difference(before: list[str], after: list[str]) -> str:
    """The first place two line lists part, said as the user reads it: the line (of the answer,
    or of the file when a line is gone), or the blank line added or removed, with its line number."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    op, i1, i2, j1, j2 = next(op for op in matcher.get_opcodes() if op[0] != "equal")
    if op != "delete" and any(after[j1:j2]):
        line = next(ln for ln in after[j1:j2] if ln)
        moved = line.strip() in {ln.strip() for ln in before[i1:i2]}
        return f"{clip(line.strip())!r}" + (" (indented otherwise)" if moved and line not in before[i1:i2] else "")
    if op != "insert" and any(before[i1:i2]):
        return f"{clip(next(ln for ln in before[i1:i2] if ln).strip())!r} is gone"
    what = "a blank line added" if op == "insert" else "a blank line removed"
    return f"{what} at line {i1 + 1} of the file"


def _asks_for_removal(instruction: str, original: str, verbs: re.Pattern = _REMOVAL) -> bool:
    """Whether the instruction asks to take code out (then a far shorter answer may be right);
    verbs: _DELETION asks whether it takes whole definitions out. Only its words that are not
    names count: a file's function called `split` or `remove` must not let a short answer
    replace the whole file."""
    text = _NAMED_IN_TEXT.sub(" ", instruction)
    for m in list(verbs.finditer(text)):
        word = re.match(r"\w+", text[m.start() :]).group(0)
        if re.search(_DEFINES.format(re.escape(word)), original):
            text = text.replace(word, " ")
    return bool(verbs.search(text))


@dataclass(frozen=True)
class Verdict:
    """What `specserve edit` makes of one complete answer: the file it would write and why not.

    code: the answer, or, for a Python answer that holds only changed top-level definitions,
    the original with those put in place (splice.py); spliced: their names ([] when the
    answer was whole); problems: what `check_answer` finds wrong with `code`; unchanged: `code`
    is the original file."""

    code: str
    problems: list[str]
    spliced: list[str]
    unchanged: bool

    @property
    def failure(self) -> str | None:
        """Why this is no edit at all (None when the tool writes it without asking again)."""
        if self.problems:
            return "; ".join(self.problems)
        return "the answer is the file unchanged" if self.unchanged else None


def judge_answer(original: str, answer: str, instruction: str = "", language: str = "") -> Verdict:
    """The edit tool's one rule for a complete answer (fence stripped), shared by the CLI and the
    prompt evaluation: check it; if that fails on Python, try it as changed definitions spliced
    into the file, kept only when the spliced file passes the same check."""
    from .splice import splice_definitions

    problems = check_answer(original, answer, instruction, language)
    if problems and language == "python":
        spliced = splice_definitions(original, answer)
        if spliced is not None and not check_answer(original, spliced[0], instruction, language):
            return Verdict(spliced[0], [], spliced[1], spliced[0] == original)
    return Verdict(answer, problems, [], answer == original)


def _syntax_error(code: str) -> str | None:
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(code, "<answer>", "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"line {e.lineno}: {e.msg}"
    except ValueError as e:  # null bytes
        return str(e)
    return None
