"""Edit a file with an LLM through any OpenAI-compatible server, with Predicted Outputs.

    from specserve.edit import refactor_with_predicted_outputs
    result = refactor_with_predicted_outputs(code, "Rename foo to bar")
    print(result.code, result.accepted_prediction_tokens)

The original file is sent as the `prediction`: an unchanged line costs the server almost
nothing to write, so a small edit of a long file comes back several times faster. Greedy
(temperature 0) so the same request gives the same edit. The official `openai` SDK does the
talking, so this works against specserve, OpenAI, or anything else that speaks the protocol.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .edit_names import dropped_definitions, name_uses, new_unbound_names, python_definition_source, word_count
from .errors import SpecServeError

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
LANGUAGES = {
    ".py": "python",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".js": "javascript",
    ".jsx": "jsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".rb": "ruby",
    ".php": "php",
    ".c": "c",
    ".h": "c",
    ".cpp": "cpp",
    ".cs": "csharp",
    ".kt": "kotlin",
    ".swift": "swift",
    ".sql": "sql",
    ".sh": "bash",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".md": "markdown",
    ".html": "html",
    ".css": "css",
}
_FENCE = re.compile(r"\A\s*```[^\n`]*\n(?P<body>.*?)\n?[ \t]*```[ \t]*\s*\Z", re.S)


class EditError(SpecServeError):
    """The edit could not be completed (server unreachable, truncated answer, ...)."""


@dataclass
class EditResult:
    """The server's answer to one edit request, with its speculation figures."""

    code: str  # the updated file (fence stripped, trailing newline matched to the original)
    raw: str  # the answer as streamed
    finish_reason: str | None
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    elapsed: float = 0.0  # request sent -> last chunk, seconds
    time_to_first_token: float | None = None
    speculation: dict | None = None  # specserve's non-standard stats object, when the server sends it
    extra: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True only when the model finished on its own: anything else may be a truncated file."""
        return self.finish_reason == "stop"

    @property
    def tokens_per_second(self) -> float:
        """Completion tokens per second after the first token (the decode rate the user sees)."""
        ttft = self.time_to_first_token or 0.0
        t = self.elapsed - ttft
        return self.completion_tokens / t if t > 0 else 0.0


def language_for(path: str | Path | None) -> str:
    return LANGUAGES.get(Path(path).suffix.lower(), "") if path else ""


def strip_fence(text: str, original: str = "") -> str:
    """Remove a ``` fence around the whole answer; match the original's trailing newline."""
    m = _FENCE.match(text)
    code = m.group("body") if m else text
    if original.endswith("\n") and not code.endswith("\n"):
        code += "\n"
    return code


# An answer far shorter than the file is a lost file, unless the instruction asks to take code out.
SHORT_FRACTION = 0.5
_REMOVAL = re.compile(
    r"\b(delet|remov|drop|strip|shorten|simplif|trim|cut|eliminat|get rid|condens|minif|collaps"
    r"|reduc|dedup|clean ?up|keep only|only keep|extract|split|move)",
    re.I,
)
# A word of the instruction that names code is not a verb: "add type hints to the function split"
# asks for no removal. Names: in backticks, called (`split(`), after a kind of name, or defined by the file.
_NAMED_IN_TEXT = re.compile(
    r"`[^`]*`|\b[A-Za-z_]\w*(?=\()"
    r"|\b(?:function|method|class|variable|parameter|argument|attribute|field|constant|def|helper)s?\s+[A-Za-z_]\w*",
    re.I,
)
_DEFINES = r"\b(?:def|class|function|func|fn|const|let|var)\s+{}\b"
_REWRITE = re.compile(r"\b(rewrite|translate|port|convert the (whole )?file|from scratch)\b", re.I)
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
    r"|unchanged|omitted|elided|truncated|snip|same as (before|above)|as before"
    r")( (here|below|above|unchanged|omitted|elided|as before|goes here|follows|for brevity|(remains?|stays?|is|are) "
    r"(the )?(same|unchanged|as before)))*$",
    re.I,
)
_PROSE_START = re.compile(
    r"^(here(\'s| is| are)|sure\b|certainly\b|okay\b|ok,|below\b|the following\b|i have\b|"
    r"i\'ve\b|i will\b|this (code|file|version)\b|to (rename|add|change|do)\b|"
    r"as requested\b|the updated\b|updated (code|file)\b)",
    re.I,
)


def _is_elision(line: str, prev: str) -> bool:
    """A line standing for left-out code: `# ... rest of the file ...`, `// existing code`, `# ...`,
    `<rest of code>`, or a bare `...` that is not a Python body (a body follows a line ending in ':')."""
    s = line.strip()
    if s in ("...", "…"):
        return s == "…" or not prev.rstrip().endswith(":")
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
      answer no longer defines, when the instruction asks for no removal and the name is not
      the one a rename replaces: the trace of an answer cut short, or of a name renamed unasked;
    - for Python (language "python"): the original compiles and the answer does not; or the answer
      reads a name that nothing in it binds and the original did not (edit_names.py): the fault of
      a rename left half done, such as a definition renamed and its callers not.
    """
    problems: list[str] = []
    old_lines = [ln for ln in original.splitlines() if ln.strip()]
    new_lines = [ln for ln in answer.splitlines() if ln.strip()]
    if not new_lines:
        return ["the answer is empty"]
    old_set = {ln.strip() for ln in old_lines}
    new_set = {ln.strip() for ln in new_lines}
    first = new_lines[0].strip()
    prose_ok = language in ("markdown", "text")  # there prose and fences are the content
    if not prose_ok and first not in old_set and _PROSE_START.match(first) and not _COMMENT.match(first):
        problems.append(f"the answer is prose, not code: {_clip(first)!r}")
    elif (
        not prose_ok
        and any(ln.lstrip().startswith("```") for ln in new_lines)
        and not any(ln.lstrip().startswith("```") for ln in old_lines)
    ):
        problems.append("the answer mixes prose and a ``` fenced block")
    names = {m.group(0) for m in _PLACEHOLDER_NAME.finditer(answer)} - {
        m.group(0) for m in _PLACEHOLDER_NAME.finditer(original)
    }
    if names and len(new_lines) <= 3:
        problems.append(f"the answer is a placeholder, not the file: {_clip(new_lines[0].strip())!r}")
    else:
        prev = ""
        for ln in answer.splitlines():
            if ln.strip() and ln.strip() not in old_set and _is_elision(ln, prev):
                problems.append(f"the answer leaves code out: {_clip(ln.strip())!r}")
                break
            if ln.strip():
                prev = ln
    meaningful = {ln for ln in old_set if len(ln) >= 4 and any(c.isalnum() for c in ln)}
    if len(meaningful) >= 3 and not (meaningful & new_set) and not _REWRITE.search(instruction):
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
    if language == "python" and not problems:
        err = _syntax_error(answer)
        if err and not _syntax_error(original):
            problems.append(f"the answer is not valid Python ({err})")
        elif unbound := new_unbound_names(original, answer):
            problems.append(
                f"the answer uses {_listed(unbound)}, which nothing in it defines "
                "(a rename left half done, or a name made up?)"
            )
    if not problems and (rename := _rename_problem(original, answer, instruction, language)):
        problems.append(rename)
    if not problems and not prose_ok and (dropped := _dropped_problem(original, answer, instruction, language)):
        problems.append(dropped)
    return problems


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names[:5]) + (", ..." if len(names) > 5 else "")


def _dropped_problem(original: str, answer: str, instruction: str, language: str) -> str | None:
    """The functions or classes of the file the answer lost, unless the instruction asks for a
    removal or a rewrite; the name a rename replaces does not count."""
    if _REWRITE.search(instruction) or _asks_for_removal(instruction, original):
        return None
    rename = _RENAME.search(instruction)
    dropped = dropped_definitions(original, answer, language, rename and rename.group("old"))
    if not dropped:
        return None
    return f"the answer no longer defines {_listed(dropped)}, which the file defines (cut short, or renamed unasked?)"


# "Rename [the function] old to new [in dedent | everywhere | in every function]".
_RENAME = re.compile(
    r"\brename\s+(?:(?:the|every|all|each)\s+)?(?:(?:function|method|class|variable|parameter|argument|"
    r"attribute|field|constant|list|dict|type|property|helper|module|global|local|name)s?\s+)?"
    r"`?(?P<old>[A-Za-z_]\w*)`?\s+(?:to|as|into)\s+`?(?P<new>[A-Za-z_]\w*)`?(?P<rest>[^.;\n]*)",
    re.I,
)
# What narrows a rename to part of the file ("in dedent"), as opposed to "in every function" or "everywhere".
_SCOPE = re.compile(
    r"\b(?:in|inside|within)\s+(?!(?:every|all|each|the whole|the file|this file|the module)\b)"
    r"(?:the\s+(?:function|method|class)\s+)?`?(?P<name>[A-Za-z_][\w.]*)?",
    re.I,
)


def _rename_problem(original: str, answer: str, instruction: str, language: str = "") -> str | None:
    """Why `answer` does not do the rename the instruction asks for, if it asks for one: the new
    name appears nowhere, or the old name is still there: anywhere when the rename is not
    narrowed to part of the file, and in Python inside the function or class it is narrowed to
    ("... in dedent"). A half-done rename is the commonest wrong answer of a small model to this."""
    m = _RENAME.search(instruction)
    if m is None:
        return None
    old, new = m.group("old"), m.group("new")

    def count(name: str, text: str) -> int:
        return name_uses(text, name) if language == "python" else word_count(text, name)

    if old == new or not count(old, original) or count(new, original):
        return None  # nothing to rename, or the new name is taken already: the check cannot tell
    if not count(new, answer):
        return f"the rename is not done: `{new}` appears nowhere in the answer"
    left = count(old, answer)
    scope = _SCOPE.search(m.group("rest"))
    where = ""
    if scope and language == "python" and scope.group("name"):
        body = python_definition_source(answer, scope.group("name"))
        where, left = (f" in `{scope.group('name')}`", count(old, body)) if body is not None else ("", 0)
    elif scope:
        left = 0  # narrowed to a part the check cannot find: the old name may rightly stay elsewhere
    if left:
        return f"the rename is left half done{where}: `{old}` is still there {left} time{'s' * (left > 1)}"
    return None


def _asks_for_removal(instruction: str, original: str) -> bool:
    """Whether the instruction asks to take code out (then a far shorter answer may be right).
    Only its words that are not names count: a file's function called `split` or `remove` must
    not let a short answer replace the whole file."""
    text = _NAMED_IN_TEXT.sub(" ", instruction)
    for m in list(_REMOVAL.finditer(text)):
        word = re.match(r"\w+", text[m.start() :]).group(0)
        if re.search(_DEFINES.format(re.escape(word)), original):
            text = text.replace(word, " ")
    return bool(_REMOVAL.search(text))


@dataclass(frozen=True)
class Verdict:
    """What `specserve edit` makes of one complete answer: the file it would write and why not.

    code: the answer, or, for a Python answer that holds only changed top-level definitions,
    the original with those put in place (edit_splice.py); spliced: their names ([] when the
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
    from .edit_splice import splice_definitions

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


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


@dataclass(frozen=True)
class EditPrompt:
    """One way to ask for an edit: a system message and a user-message template.

    `user` is formatted with {instruction}, {language} and {code}; `examples` are worked (user,
    assistant) turns sent before it, each user turn formatted the same way. The candidates live here so that
    `specserve edit`, the benchmarks and scripts/eval_edit_prompt.py (which chose the default by
    measurement, docs/server.md) all send exactly the same text.
    """

    name: str
    system: str
    user: str
    examples: tuple[tuple[str, str, str], ...] = ()  # (instruction, file, updated file)

    def messages(self, original_code: str, instruction: str, language: str = "") -> list[dict]:
        shots = []
        for example_instruction, before, after in self.examples:
            shots += [
                {
                    "role": "user",
                    "content": self.user.format(instruction=example_instruction, language="python", code=before),
                },
                {"role": "assistant", "content": f"```python\n{after}```"},
            ]
        return [
            {"role": "system", "content": self.system},
            *shots,
            {
                "role": "user",
                "content": self.user.format(instruction=instruction, language=language, code=original_code),
            },
        ]


# A worked example for the "example" prompt: a rename that touches a definition and its uses, in a
# file whose other function does not change, answered with the whole file.
_EXAMPLE_BEFORE = """import math


def area(radius):
    \"\"\"The area of a circle.\"\"\"
    return math.pi * radius**2


def total_area(radii):
    return sum(area(r) for r in radii)


def describe(radius):
    return f"r={radius}: {area(radius):.2f}"
"""
_EXAMPLE_AFTER = (
    _EXAMPLE_BEFORE.replace("def area(", "def circle_area(")
    .replace("(area(", "(circle_area(")
    .replace("{area(", "{circle_area(")
)


PROMPTS: dict[str, EditPrompt] = {
    p.name: p
    for p in (
        # The first prompt specserve shipped: instruction first, then the file.
        EditPrompt(
            "instruction-first",
            "You are a coding assistant. Reply with the complete updated file only, no explanations.",
            "{instruction}\n\n```{language}\n{code}\n```",
        ),
        # The file first and the instruction last, nearest to the answer, with the reply's shape spelled out.
        EditPrompt(
            "file-first",
            "You are a coding assistant that edits source files.",
            "Here is a file:\n\n```{language}\n{code}\n```\n\n{instruction}\n\nReply with the whole file "
            "after this change, in one ```{language} code block, and nothing else.",
        ),
        # Explicit rules against the failures seen: shortened files, elisions, placeholders.
        EditPrompt(
            "rules",
            "You are an expert programmer who edits code. When asked to change a file, you write out the "
            "entire file with the change applied: every line, in order, from the first to the last, "
            "including the lines that do not change. Never shorten the file, never write placeholders "
            "such as '...' or '# rest of the code', and do not explain.",
            "Instruction: {instruction}\n\nFile:\n```{language}\n{code}\n```",
        ),
        # The same rules, with the file first and the instruction last.
        EditPrompt(
            "rules-file-first",
            "You are an expert programmer who edits code. When asked to change a file, you write out the "
            "entire file with the change applied: every line, in order, from the first to the last, "
            "including the lines that do not change. Never shorten the file, never write placeholders "
            "such as '...' or '# rest of the code', and do not explain.",
            "```{language}\n{code}\n```\n\n{instruction}\nWrite the full updated file.",
        ),
        # A worked example before the request: whole file back, the change made at every use.
        EditPrompt(
            "example",
            "You are a coding assistant that edits source files. Reply with the complete updated file in "
            "one code block: every line from the first to the last, with the change made everywhere it "
            "applies (a renamed name at every use), and nothing else.",
            "{instruction}\n\n```{language}\n{code}\n```",
            examples=(("Rename area to circle_area.", _EXAMPLE_BEFORE, _EXAMPLE_AFTER),),
        ),
    )
}
# Chosen by scripts/eval_edit_prompt.py on 33 real edits (docs/server.md): with the retry below,
# `file-first` gives a usable file for 29 and a correct one for 28, `instruction-first` 27 and 23.
DEFAULT_PROMPT = "file-first"
# `specserve edit` asks once more with this prompt when the first answer cannot be the updated
# file (short, no code, a placeholder, or the file unchanged): its worked example cures short
# answers, the commonest failure of the others (docs/server.md, "Which edit prompt").
RETRY_PROMPT = "example"
SYSTEM_PROMPT = PROMPTS[DEFAULT_PROMPT].system
# When that answer is refused too, the first request's conversation goes on with its answer and a
# turn that says what is wrong with it (`feedback_messages`). A rename left half done is the
# commonest fault on the default pack, and its fix differs from the answer in a few lines, so the
# answer is the prediction and the request costs little (docs/server.md).
FEEDBACK = (
    "That is not the updated file yet: {problems}. {instruction} Make the change everywhere it "
    "applies, and reply with the whole corrected file in one ```{language} code block, and nothing else."
)


def build_messages(
    original_code: str, instruction: str, language: str = "", prompt: str | EditPrompt = DEFAULT_PROMPT
) -> list[dict]:
    """The edit prompt (`PROMPTS[prompt]`, by default the measured best) for this file and instruction."""
    p = prompt if isinstance(prompt, EditPrompt) else PROMPTS[prompt]
    return p.messages(original_code, instruction, language)


def feedback_messages(
    original_code: str,
    instruction: str,
    answer: str,
    problems: list[str],
    language: str = "",
    prompt: str | EditPrompt = DEFAULT_PROMPT,
) -> list[dict]:
    """The first request's messages, its `answer` (as the model wrote it), and a user turn naming
    `problems`, what the tool found wrong with it: the model gets to fix its own answer."""
    turn = FEEDBACK.format(problems="; ".join(problems), instruction=instruction, language=language)
    return [
        *build_messages(original_code, instruction, language, prompt),
        {"role": "assistant", "content": answer},
        {"role": "user", "content": turn},
    ]


def feedback_prediction(original_code: str, answer_code: str) -> str:
    """What to predict for the corrected file: the refused answer when it is about as long as the
    file (a rename left half done: the fix keeps most of it), else the file itself (a placeholder
    or a shortened answer: the fix must write the file out)."""
    return answer_code if len(answer_code) >= SHORT_FRACTION * len(original_code) else original_code


def make_client(base_url: str | None = None, api_key: str | None = None):
    """An `openai.OpenAI` client; local servers get a dummy key when none is configured."""
    import openai

    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    api_key = api_key or os.environ.get("OPENAI_API_KEY") or "sk-no-key-needed"
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=3600.0)


def default_model(client) -> str:
    """The first model the server lists, else the default target pack's name."""
    try:
        models = client.models.list().data
    except Exception:  # noqa: BLE001 - listing is a convenience; the edit request reports real errors
        return DEFAULT_MODEL
    return models[0].id if models else DEFAULT_MODEL


def refactor_with_predicted_outputs(
    original_code: str,
    instruction: str,
    client=None,
    model: str | None = None,
    language: str = "",
    max_tokens: int | None = None,
    on_delta: Callable[[str], None] | None = None,
    prompt: str | EditPrompt = DEFAULT_PROMPT,
    messages: list[dict] | None = None,
    prediction: str | None = None,
) -> EditResult:
    """Ask the model to apply `instruction` to `original_code`, with the code as the prediction.

    Streams the answer (on_delta gets each text delta) and returns when the stream ends.
    The caller decides what to do with an incomplete answer: check `result.complete`.
    `prompt`: which of PROMPTS lays out the request; `messages` and `prediction`, when given,
    replace the prompt's messages and the file as the prediction (the feedback request).
    """
    import openai

    client = client or make_client()
    model = model or default_model(client)
    kwargs = {"max_tokens": max_tokens} if max_tokens else {}
    t0 = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=messages or build_messages(original_code, instruction, language, prompt),
            temperature=0,
            prediction={"type": "content", "content": original_code if prediction is None else prediction},
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
        result = _collect(stream, model, t0, on_delta)
    except openai.APIConnectionError as e:
        raise EditError(f"cannot reach the server at {client.base_url}: {e}") from e
    except openai.APIStatusError as e:
        raise EditError(f"the server refused the request ({e.status_code}): {_api_message(e)}") from e
    result.code = strip_fence(result.raw, original_code)
    return result


def _collect(stream, model: str, t0: float, on_delta) -> EditResult:
    """Read a chat-completion stream into an EditResult."""
    parts: list[str] = []
    result = EditResult(code="", raw="", finish_reason=None, model=model)
    for chunk in stream:
        for choice in chunk.choices:
            text = choice.delta.content or ""
            if text:
                if result.time_to_first_token is None:
                    result.time_to_first_token = time.perf_counter() - t0
                parts.append(text)
                if on_delta:
                    on_delta(text)
            if choice.finish_reason:
                result.finish_reason = choice.finish_reason
        if chunk.usage is not None:
            _read_usage(result, chunk.usage)
        spec = (chunk.model_extra or {}).get("speculation")
        if spec:
            result.speculation = spec
        result.model = chunk.model or result.model
    result.elapsed = time.perf_counter() - t0
    result.raw = "".join(parts)
    return result


def _read_usage(result: EditResult, usage) -> None:
    result.prompt_tokens = usage.prompt_tokens or 0
    result.completion_tokens = usage.completion_tokens or 0
    details = usage.completion_tokens_details
    if details is not None:
        result.accepted_prediction_tokens = details.accepted_prediction_tokens or 0
        result.rejected_prediction_tokens = details.rejected_prediction_tokens or 0


def _api_message(e) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    err = body.get("error", body) if isinstance(body, dict) else {}
    return (err.get("message") if isinstance(err, dict) else None) or str(e)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: never a half-written file."""
    tmp = path.with_name(f".{path.name}.specserve-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
