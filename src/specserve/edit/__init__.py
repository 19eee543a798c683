"""`specserve edit`'s library: edit a file with an LLM through any OpenAI-compatible server.

    from specserve.edit import refactor_with_predicted_outputs
    result = refactor_with_predicted_outputs(code, "Rename foo to bar")
    print(result.code, result.accepted_prediction_tokens)

One concern per module, in the order an edit goes through them:
- prompts.py: how the edit is asked for (the prompt chosen by measurement, the retry prompt, the
  follow-up that names what was wrong with an answer);
- client.py: the streamed request, with the file as the `prediction`, and its figures;
- checks.py: whether an answer can be the updated file (the one rule the CLI and the prompt
  evaluation share), with form.py (what the answer looks like as text: prose, a diff, code left
  out), rename.py (what a rename instruction asks for), names.py (names an answer reads but never
  binds, definitions it lost) and splice.py (an answer of only the changed definitions put back
  into the file);
- blocks.py: an answer of SEARCH/REPLACE blocks applied to the file (a candidate retry, measured
  in docs/server.md);
- files.py: the file's language and writing the result without losing anything.
"""

from .blocks import Applied, BlockError, apply_blocks, parse_blocks
from .checks import SHORT_FRACTION, Verdict, check_answer, judge_answer, missing_target
from .client import (
    DEFAULT_BASE_URL,
    DEFAULT_MODEL,
    EditError,
    EditResult,
    default_model,
    make_client,
    refactor_with_predicted_outputs,
    strip_fence,
)
from .files import LANGUAGES, SourceFile, check_writable, language_for, read_source, write_atomic, write_in_place
from .prompts import (
    BLOCKS,
    DEFAULT_PROMPT,
    FEEDBACK,
    PROMPTS,
    RETRY_PROMPT,
    SYSTEM_PROMPT,
    EditAsk,
    EditPrompt,
    ask_for,
    blocks_ask,
    build_messages,
    feedback_messages,
    feedback_prediction,
)

__all__ = [
    "BLOCKS",
    "Applied",
    "BlockError",
    "DEFAULT_BASE_URL",
    "DEFAULT_MODEL",
    "DEFAULT_PROMPT",
    "FEEDBACK",
    "LANGUAGES",
    "PROMPTS",
    "RETRY_PROMPT",
    "SHORT_FRACTION",
    "SYSTEM_PROMPT",
    "SourceFile",
    "EditError",
    "EditAsk",
    "EditPrompt",
    "EditResult",
    "Verdict",
    "apply_blocks",
    "ask_for",
    "blocks_ask",
    "build_messages",
    "check_answer",
    "check_writable",
    "default_model",
    "feedback_messages",
    "feedback_prediction",
    "judge_answer",
    "language_for",
    "make_client",
    "missing_target",
    "parse_blocks",
    "read_source",
    "refactor_with_predicted_outputs",
    "strip_fence",
    "write_atomic",
    "write_in_place",
]
