"""How `specserve edit` asks for an edit: the candidate prompts, the one chosen by measurement,
and the follow-up request that tells the model what was wrong with its answer.

The candidates live here so that `specserve edit`, the benchmarks and scripts/eval_edit_prompt.py
(which chose the default, docs/server.md) all send exactly the same text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .checks import SHORT_FRACTION
from .hints import rename_hint
from .rename import parse_rename


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
    opens: bool = False  # whether the answer is begun for the model (`opening`)
    hints: bool = False  # whether a rename's instruction is followed by where the name is used (hints.py)
    lookalikes: bool = False  # whether that hint also names the file's look-alike names, to leave alone

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
        hint = rename_hint(original_code, instruction, language, self.lookalikes) if self.hints else ""
        asked = f"{instruction}\n\n{hint}" if hint else instruction
        return [
            {"role": "system", "content": self.system},
            *shots,
            {
                "role": "user",
                "content": self.user.format(instruction=asked, language=language, code=original_code),
            },
        ]

    def opening(self, original_code: str, instruction: str, language: str = "") -> str:
        """The start of the answer, written for the model when `opens`: the code fence and the
        file's first line, for a rename only. A rename touches the whole file, so the answer must
        be the whole file, and a model that has begun the file at its top writes it out; left to
        itself, the default pack often answers with the renamed definition alone, which no splice
        can complete. Other edits are better left to the model: begun at the top, it copied the
        file past the function to change more often than it did the edit (docs/server.md, "Which
        edit prompt"). "" (the model begins) also when the instruction names something on the
        first line, or the file's head (a module docstring, the imports), which the edit may change."""
        first = original_code.split("\n", 1)[0]
        if not self.opens or not first.strip() or "\n" not in original_code or not parse_rename(instruction):
            return ""
        if _names(instruction) & _names(first) or _AT_THE_TOP.search(instruction):
            return ""
        return f"```{language}\n{first}\n"


# An instruction about the file's head: a module docstring, a licence header, the imports.
_AT_THE_TOP = re.compile(r"\b(module|header|licen[cs]e|shebang|top|imports?|encoding|package)\b", re.I)


def _names(text: str) -> set[str]:
    """The identifier-like words of `text` (a name the instruction mentions, a name on a line)."""
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


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
        # `file-first`, with a rename's answer begun for the model at the file's first line
        # (`opening`). Measured on the 33 pairs: no better than `file-first` (docs/server.md).
        EditPrompt(
            "file-first-opened",
            "You are a coding assistant that edits source files.",
            "Here is a file:\n\n```{language}\n{code}\n```\n\n{instruction}\n\nReply with the whole file "
            "after this change, in one ```{language} code block, and nothing else.",
            opens=True,
        ),
        # `file-first`, with a rename's instruction followed by the lines that use the old name
        # (`hints.rename_hint`); any other request is byte for byte `file-first`'s. The default.
        EditPrompt(
            "file-first-hint",
            "You are a coding assistant that edits source files.",
            "Here is a file:\n\n```{language}\n{code}\n```\n\n{instruction}\n\nReply with the whole file "
            "after this change, in one ```{language} code block, and nothing else.",
            hints=True,
        ),
        # `file-first-hint`, whose hint also names the file's other names that look like the old or
        # the new one (`hints.lookalike_names`: `do_shorts` beside `do_longs`) as names to leave as
        # they are; where there are none, the request is byte for byte `file-first-hint`'s.
        EditPrompt(
            "file-first-hint-others",
            "You are a coding assistant that edits source files.",
            "Here is a file:\n\n```{language}\n{code}\n```\n\n{instruction}\n\nReply with the whole file "
            "after this change, in one ```{language} code block, and nothing else.",
            hints=True,
            lookalikes=True,
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
# Chosen by scripts/eval_edit_prompt.py on 33 real edits (the measured tables in docs/server.md,
# "`specserve edit`"): with the retry below, `file-first` gives the most usable and the most correct
# files of the candidates; `file-first-hint` is the same request for every edit but a rename, where
# telling the model where the name is used doubled the well-formed first answers (4 to 8 of 13).
DEFAULT_PROMPT = "file-first-hint"
# `specserve edit` asks with this prompt when the first answer cannot be the updated file (short,
# no code, a placeholder, or the file unchanged) and the SEARCH/REPLACE blocks asked for before it
# (`blocks_ask`) are refused too: its worked example cures short answers, the commonest failure of
# the others (the same tables).
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


@dataclass(frozen=True)
class EditAsk:
    """One edit request as sent: the messages (ending with the `opening` as an assistant turn the
    model goes on writing, when the prompt opens the answer) and the prediction (the file, or
    what is left of it after the opening)."""

    messages: list[dict]
    opening: str
    prediction: str


def ask_for(
    original_code: str, instruction: str, language: str = "", prompt: str | EditPrompt = DEFAULT_PROMPT
) -> EditAsk:
    """The request `specserve edit` (and the prompt evaluation) sends for this file and instruction."""
    p = prompt if isinstance(prompt, EditPrompt) else PROMPTS[prompt]
    messages = p.messages(original_code, instruction, language)
    opening = p.opening(original_code, instruction, language)
    if not opening:
        return EditAsk(messages, "", original_code)
    turn = {"role": "assistant", "content": opening}  # the fence and the file's first line
    return EditAsk([*messages, turn], opening, original_code.split("\n", 1)[1])


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


# The retry that asks for SEARCH/REPLACE blocks (aider's format, `blocks.py`) rather than the whole
# file: the tool applies them to the original, so the file written is complete by construction.
BLOCKS = "search-replace"
_BLOCKS_SYSTEM = (
    "You are a coding assistant that edits source files. You never write the whole file: you answer with "
    "SEARCH/REPLACE blocks, each of which quotes lines of the file exactly and gives the lines that replace them."
)
_BLOCKS_USER = (
    "Here is a file:\n\n```{language}\n{code}\n```\n\n{instruction}\n\n"
    "Reply with SEARCH/REPLACE blocks only, each in this form:\n\n"
    "<<<<<<< SEARCH\n(lines copied exactly from the file)\n=======\n(the lines that replace them)\n>>>>>>> REPLACE\n\n"
    "Copy the SEARCH lines exactly, with their indentation, and enough of them to match one place in the "
    "file only. Make one block for each place the change touches (a renamed name at every use), and change "
    "nothing else."
)
# The worked example's answer: the rename of `_EXAMPLE_BEFORE`, one block per place it touches.
_BLOCKS_EXAMPLE = (
    "<<<<<<< SEARCH\ndef area(radius):\n=======\ndef circle_area(radius):\n>>>>>>> REPLACE\n\n"
    "<<<<<<< SEARCH\n    return sum(area(r) for r in radii)\n=======\n"
    "    return sum(circle_area(r) for r in radii)\n>>>>>>> REPLACE\n\n"
    '<<<<<<< SEARCH\n    return f"r={radius}: {area(radius):.2f}"\n=======\n'
    '    return f"r={radius}: {circle_area(radius):.2f}"\n>>>>>>> REPLACE\n'
)


def blocks_ask(original_code: str, instruction: str, language: str = "") -> EditAsk:
    """The request for SEARCH/REPLACE blocks: a worked example (the `example` prompt's rename, in
    blocks), then the file and the instruction, a rename's followed by where the name is used
    (`hints.rename_hint`, as the default prompt sends it). The prediction is the file: the SEARCH
    lines copy it, and Predicted Outputs re-anchors between them."""
    example_user = _BLOCKS_USER.format(
        instruction="Rename area to circle_area.", language="python", code=_EXAMPLE_BEFORE
    )
    hint = rename_hint(original_code, instruction, language)
    asked = f"{instruction}\n\n{hint}" if hint else instruction
    messages = [
        {"role": "system", "content": _BLOCKS_SYSTEM},
        {"role": "user", "content": example_user},
        {"role": "assistant", "content": _BLOCKS_EXAMPLE},
        {"role": "user", "content": _BLOCKS_USER.format(instruction=asked, language=language, code=original_code)},
    ]
    return EditAsk(messages, "", original_code)
