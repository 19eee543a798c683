"""What an answer looks like as text, before what its code means: prose, a diff or a placeholder
where the file should be, code left out ("# ... rest of the file ..."), a Markdown answer split over
fenced blocks, tabs turned to spaces. These checks read lines and words, parse nothing, and know a
language only by its name; checks.py runs them first (`form_problems`), then judges the code.
"""

from __future__ import annotations

import re

# Languages whose files are prose: there a sentence or a ``` fence is content, not a wrapper.
PROSE_LANGUAGES = ("markdown", "text")

# Names the model invents for "the updated file" instead of writing it (the issue's `obj['updated_code']`).
_PLACEHOLDER_NAME = re.compile(
    r"\b(updated|modified|edited|refactored|new|complete|full|final|your)_?"
    r"(code|file|source|content|contents|version)\b",
    re.I,
)
_COMMENT = re.compile(r"^(#+|//+|/\*+|\*+|<!--|--|;+|%+|'|rem\b)\s*(?P<body>.*?)\s*(\*+/|-->)?$", re.I)
# The text of a comment (or of a <bracketed> line), ellipses and brackets taken out, that stands for code
# the model left out: "rest of the file", "existing code here", "code unchanged", "same as before", ...
_ELISION = re.compile(
    r"^(?:"
    r"(the )?(rest|remainder) of (the |your |this )?(\w+ )?"
    r"(code|file|class|module|functions?|implementation|methods?|body|script|program)"
    r"|(\w+ )?(existing|unchanged|remaining|previous|original|other|same) (\w+ )?"
    r"(code|methods?|functions?|imports?|lines?|content|implementation|logic|body|definitions?|tests?|classes)"
    r"|(code|everything|the rest|rest|body|implementation|file)"
    r"|unchanged|omitted|elided|truncated|snip|same as (before|above)|as before|etc|no changes?( here| needed)?"
    r"|(keep|leave) (the |it |this |them )?(\w+ )?(\w+ )?(as is|unchanged|as before)"
    r"|todo (rest|the rest|remaining)( \w+)?"
    r"|(\w+ ){0,5}(unchanged|as is|as before)"
    r")( (here|below|above|unchanged|omitted|elided|as before|goes here|follows|for brevity|(remains?|stays?|is|are) "
    r"(the )?(same|unchanged|as before)))*$",
    re.I,
)
_PROSE_START = re.compile(
    r"^(here([\'’]s| is| are)|sure\b|certainly\b|okay\b|ok,|below\b|the following\b|i have\b|"
    r"i[\'’]ve\b|i will\b|this (code|file|version)\b|to (rename|add|change|do)\b|"
    r"as requested\b|the updated\b|updated (code|file)\b)",
    re.I,
)
# A sentence after the code: "I changed ...", "Let me know ...", "This change ...", "Note: ...".
_PROSE_END = re.compile(
    r"^(i (changed|updated|added|renamed|removed|replaced|made|modified|have|also)\b|i[\'’](ve|ll)\b|"
    r"let me know\b|hope this\b|this (change|update|version|code|edit|will|should|way)\b|"
    r"the (change|changes|above|updated|modified)\b|in this (version|code|update)\b)",
    re.I,
)
# A unified diff's markers: the model answered with a patch, not the file.
_DIFF_LINE = re.compile(r"^(--- (a/)?\S|\+\+\+ (b/)?\S|@@ -\d+(,\d+)? \+\d+(,\d+)? @@)")


def form_problems(original: str, answer: str, language: str) -> list[str]:
    """What is wrong with the answer's text as a whole (at most two problems): it is wrapped in or
    made of prose, a diff, or a fenced block mixed with prose; and it is a placeholder or leaves code
    out. The answer has a non-blank line (check_answer said "empty" before)."""
    old_lines = [ln for ln in original.splitlines() if ln.strip()]
    new_lines = [ln for ln in answer.splitlines() if ln.strip()]
    old_set = {ln.strip() for ln in old_lines}
    found = (_wrapper_problem(old_lines, new_lines, old_set, language), _left_out_problem(original, answer, old_set))
    return [p for p in found if p]


def _wrapper_problem(old_lines: list[str], new_lines: list[str], old_set: set[str], language: str) -> str | None:
    """The file wrapped in prose and a fence (Markdown, text), or an answer of prose, a diff, or
    prose around a ``` fenced block (code)."""
    first, last = new_lines[0].strip(), new_lines[-1].strip()
    prose_ok = language in PROSE_LANGUAGES
    if prose_ok and first not in old_set and _PROSE_START.match(first) and _wrapped(new_lines, old_set):
        return f"the answer wraps the file in prose and a fence: {clip(first)!r}"
    if not prose_ok and first not in old_set and _PROSE_START.match(first) and not _COMMENT.match(first):
        return f"the answer is prose, not code: {clip(first)!r}"
    if not prose_ok and last not in old_set and _PROSE_END.match(last) and not _COMMENT.match(last):
        return f"the answer ends in prose, not code: {clip(last)!r}"
    if sum(1 for ln in new_lines if _DIFF_LINE.match(ln) and ln.strip() not in old_set) >= 2:
        return "the answer is a diff, not the updated file"
    if (
        not prose_ok
        and any(ln.lstrip().startswith("```") for ln in new_lines)
        and not any(ln.lstrip().startswith("```") for ln in old_lines)
    ):
        return "the answer mixes prose and a ``` fenced block"
    return None


def _left_out_problem(original: str, answer: str, old_set: set[str]) -> str | None:
    """A short answer naming "the updated code" the file never names, or the first line the file
    does not have that stands for left-out code (`_is_elision`)."""
    new_lines = [ln for ln in answer.splitlines() if ln.strip()]
    names = {m.group(0) for m in _PLACEHOLDER_NAME.finditer(answer)} - {
        m.group(0) for m in _PLACEHOLDER_NAME.finditer(original)
    }
    if names and len(new_lines) <= 3:
        return f"the answer is a placeholder, not the file: {clip(new_lines[0].strip())!r}"
    prev = ""
    for ln in answer.splitlines():
        if ln.strip() and ln.strip() not in old_set and _is_elision(ln, prev):
            return f"the answer leaves code out: {clip(ln.strip())!r}"
        if ln.strip():
            prev = ln
    return None


def _is_elision(line: str, prev: str) -> bool:
    """A line standing for left-out code: `# ... rest of the file ...`, `// existing code`, `# ...`,
    `<rest of code>`, or a bare `...` that is not a Python body (a body follows a line ending in ':')."""
    s = line.strip()
    if s in ("...", "…"):
        return s == "…" or not prev.rstrip().endswith(":")
    code, sep, comment = s.partition("#") if "#" in s else s.partition("//")
    if sep and code.strip() in ("...", "…", "pass", "{ ... }", "{...}") and _elision_text(comment):
        return True  # `...  # unchanged`, `pass  # rest of the code`
    if len(s) >= 3 and s[0] + s[-1] in ("<>", "[]", "{}") and _elision_text(s[1:-1]):
        return True
    m = _COMMENT.match(s)
    if not m:
        return False
    body = m.group("body")
    if not body.strip(".… "):
        return "..." in body or "…" in body  # `# ...`, `// …`
    return _elision_text(body)


def _elision_text(text: str) -> bool:
    words = re.sub(r"\.\.\.+|…|[()\[\]<>{}:;,.!-]", " ", text).lower().split()
    if (
        not words
        or len(words) > 10
        or words in (["code"], ["file"], ["rest"], ["everything"], ["body"], ["the", "rest"], ["implementation"])
    ):
        return False
    return bool(_ELISION.match(" ".join(words)))


def _wrapped(new_lines: list[str], old_set: set[str]) -> bool:
    """Markdown: "Here is the updated README:", a fence the file lacks, the file, and a closing
    fence or a sentence at the end: the file inside a wrapper, not a new example at its top."""

    def fence(ln: str) -> bool:
        return ln.strip().startswith(("```", "~~~")) and ln.strip() not in old_set

    last = new_lines[-1].strip()
    return len(new_lines) > 2 and fence(new_lines[1]) and (fence(last) or bool(_PROSE_END.match(last)))


_WRAPPER_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*(markdown|md)\s*$", re.I)
_FENCE_LINE = re.compile(r"^ {0,3}(?P<mark>`{3,}|~{3,})(?P<info>[^\n]*)$")


def _fenced_blocks(text: str) -> tuple[int, bool]:
    """How many of Markdown `text`'s fenced code blocks are empty (blank lines only), and whether
    its last block is left open. A block closes on a bare fence of its own character, at least as
    long as the one that opened it (CommonMark): "```markdown" inside a block is content."""
    opened, empty, content = "", 0, False
    for line in text.splitlines():
        m = _FENCE_LINE.match(line)
        if not opened:
            if m:
                opened, content = m.group("mark"), False
        elif (
            m
            and m.group("mark")[0] == opened[0]
            and len(m.group("mark")) >= len(opened)
            and not m.group("info").strip()
        ):
            empty += not content
            opened = ""
        else:
            content = content or bool(line.strip())
    return empty, bool(opened)


def fence_problem(original: str, answer: str) -> str | None:
    """Markdown: an answer split over several fenced blocks, which strip_fence unwrapped as one,
    writes its inner wrapper fences into the file. They show as a ```markdown fence, a code block
    left open at the end, or an empty one between the parts, where the file has none of them."""
    old_empty, old_open = _fenced_blocks(original)
    new_empty, new_open = _fenced_blocks(answer)
    wrapper = {ln.strip() for ln in answer.splitlines() if _WRAPPER_FENCE.match(ln)}
    if wrapper - {ln.strip() for ln in original.splitlines()} or (new_open and not old_open) or new_empty > old_empty:
        return "the answer is split over several fenced blocks: their fences would be written into the file"
    return None


def tabs_turned_to_spaces(original: str, answer: str) -> str | None:
    """A line the file indents with a tab (and never with spaces) that the answer indents with
    spaces: a Makefile then fails, Go loses gofmt. The first such line, or None."""
    tabbed = {ln.strip() for ln in original.splitlines() if ln.startswith("\t") and ln.strip()}
    spaced = {ln.strip() for ln in original.splitlines() if ln.startswith(" ") and ln.strip()}
    return next((ln for ln in answer.splitlines() if ln.startswith(" ") and ln.strip() in tabbed - spaced), None)


def clip(text: str, n: int = 80) -> str:
    """`text` cut to `n` characters, "..." marking the cut: a line quoted in a one-line problem."""
    return text if len(text) <= n else text[: n - 3] + "..."
