"""`specserve edit FILE --instruction "..."`: edit a file through an OpenAI-compatible server.

Shows a unified diff and the Predicted Outputs figures. Writes (with --in-place or --output)
only an answer that can be the updated file: a response cut by max_tokens is refused, and so is
one that `edit.judge_answer` finds broken (far shorter than the file without a removal asked
for, no code, a placeholder such as `obj['updated_code']`) unless --force is given. A refused
answer never touches the file: no write, no .bak. A Python answer that holds only the changed
top-level definitions is put back into the whole file first (edit/splice.py). An answer that
still cannot be the updated file, or is the file unchanged, is asked for again as SEARCH/REPLACE
blocks that the tool applies to the file itself (`edit.blocks_ask`, edit/blocks.py), then with another
prompt (`edit.RETRY_PROMPT`), and if that answer is refused too, the first answer goes back to the
model with what is wrong with it (`edit.feedback_messages`), unless --no-retry; the first answer
the tool would write is kept, else the first. Writing keeps what the user had (edit/files.py): a
symlink is followed, the file's mode, byte-order mark and CRLF or lone-CR line ends stay, and a file changed
on disk while the model answered is not overwritten. An answer that is still the file unchanged
after the retries is reported as an edit not made (non-zero exit, nothing written).
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from pathlib import Path

from tqdm import tqdm

from ..edit import (
    DEFAULT_PROMPT,
    RETRY_PROMPT,
    BlockError,
    EditError,
    EditResult,
    Verdict,
    apply_blocks,
    blocks_ask,
    check_writable,
    feedback_messages,
    feedback_prediction,
    judge_answer,
    language_for,
    make_client,
    missing_target,
    read_source,
    refactor_with_predicted_outputs,
    write_atomic,
    write_in_place,
)
from .argtypes import path_arg, positive_int


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "edit",
        help="edit a file with an LLM, using the file as the predicted output",
        description="Send FILE and an instruction to an OpenAI-compatible server with "
        "prediction = FILE (temperature 0), show the diff, and write the result "
        "only when the answer is complete.",
    )
    p.add_argument("file", type=path_arg, help="the file to edit")
    p.add_argument("--instruction", "-i", required=True, help="what to change")
    p.add_argument(
        "--base-url", default=None, help="server URL (default: $OPENAI_BASE_URL or http://127.0.0.1:8000/v1)"
    )
    p.add_argument("--model", default=None, help="model name (default: the first one the server lists)")
    p.add_argument("--api-key", default=None, help="API key (default: $OPENAI_API_KEY, or none for local servers)")
    dest = p.add_mutually_exclusive_group()
    dest.add_argument("--output", "-o", type=path_arg, help="write the edited file here")
    dest.add_argument(
        "--in-place",
        action="store_true",
        help="overwrite FILE (the original is kept as FILE.bak, replacing an earlier FILE.bak)",
    )
    dest.add_argument(
        "--dry-run",
        action="store_true",
        help="show the diff, write nothing (the default without --output / --in-place)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write the answer even when it does not look like the updated file (far shorter than "
        "the original, no code, a placeholder), and ask for a rename of a name the file never mentions; "
        "a truncated answer is never written",
    )
    p.add_argument(
        "--no-retry",
        action="store_true",
        help="do not ask again when the answer cannot be the updated file (by default: for SEARCH/REPLACE blocks, "
        f"then with the {RETRY_PROMPT!r} prompt, then telling the model what is wrong with its answer)",
    )
    p.add_argument("--max-tokens", type=positive_int, default=None, help="cap on the answer's length")
    p.add_argument("--html", type=path_arg, help="also write an HTML report of the edit (lines kept vs changed)")
    p.set_defaults(func=run)


NO_NEWLINE = "\\ No newline at end of file\n"


def diff_lines(text: str) -> list[str]:
    """`text` cut into lines as diff and git cut it: after each '\n' only, each line keeping it.
    (str.splitlines also ends a line at a form feed, a lone CR or a Unicode line separator, which
    are characters inside a line to diff, so the diff of a file holding one was corrupt.)"""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def unified_diff(old: str, new: str, name: str) -> str:
    """A unified diff as `diff -u` and `git diff` write it, which `patch` applies: a line without
    a newline (a file's last) is followed by the "\\ No newline at end of file" marker, so it is
    not run together with the next line of the diff."""
    lines = difflib.unified_diff(diff_lines(old), diff_lines(new), f"a/{name}", f"b/{name}")
    return "".join(line if line.endswith("\n") else line + "\n" + NO_NEWLINE for line in lines)


def colorize(diff: str) -> str:
    """ANSI colours for a terminal: additions green, removals red, hunks cyan."""
    out = []
    for line in diff_lines(diff):
        if line.startswith(("+++", "---")):
            out.append(f"\033[1m{line}\033[0m")
        elif line.startswith("+"):
            out.append(f"\033[32m{line}\033[0m")
        elif line.startswith("-"):
            out.append(f"\033[31m{line}\033[0m")
        elif line.startswith("@@"):
            out.append(f"\033[36m{line}\033[0m")
        else:
            out.append(line)
    return "".join(out)


def summary(result: EditResult) -> dict:
    """The numbers we print and put in the HTML report."""
    ttft = "-" if result.time_to_first_token is None else f"{result.time_to_first_token:.2f} s"
    d = {
        "model": result.model,
        "finish reason": result.finish_reason,
        "completion tokens": result.completion_tokens,
        "accepted prediction tokens": result.accepted_prediction_tokens,
        "rejected prediction tokens": result.rejected_prediction_tokens,
        "tokens/s": f"{result.tokens_per_second:.2f}",
        "time to first token": ttft,
        "total time": f"{result.elapsed:.2f} s",
    }
    if result.speculation:
        d["tokens per step"] = result.speculation.get("tokens_per_step")
        d["acceptance rate"] = result.speculation.get("acceptance_rate")
    return d


def shown(text: str, max_lines: int = 40) -> str:
    """The answer as a user should see it in an error: whole if short, else its head and a count."""
    lines = text.splitlines()
    if len(lines) <= max_lines:
        return text.rstrip("\n")
    return "\n".join(lines[:max_lines]) + f"\n[... {len(lines) - max_lines} more lines]"


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # a destination that does not exist yet
        return False


def target_path(args) -> Path | None:
    if args.dry_run:
        return None
    if args.in_place:
        return args.file
    return args.output


def send(args, original: str, prompt: str, **request) -> EditResult:
    """One request, streamed with a progress bar. `request`: messages and prediction that replace
    the prompt's (a feedback or a blocks request)."""
    client = make_client(args.base_url, args.api_key)
    with tqdm(desc="receiving", unit="chunk", file=sys.stderr, leave=False, disable=None) as bar:
        return refactor_with_predicted_outputs(
            original,
            args.instruction,
            client,
            args.model,
            language_for(args.file),
            args.max_tokens,
            on_delta=lambda _: bar.update(1),
            prompt=prompt,
            **request,
        )


def ask(args, original: str, prompt: str, **request) -> tuple[EditResult, Verdict | None]:
    """One request: the answer (spliced into the file when it holds only changed definitions)
    and the tool's verdict on it (None when the answer is incomplete). `request`: messages and
    prediction for a feedback request."""
    result = send(args, original, prompt, **request)
    if not result.complete:
        return result, None
    verdict = judge_answer(original, result.code, args.instruction, language_for(args.file))
    if verdict.spliced:
        print(
            f"the answer held only the changed definitions ({', '.join(verdict.spliced)}): put in place in the file",
            file=sys.stderr,
        )
    return dataclasses.replace(result, code=verdict.code), verdict


def ask_blocks(args, original: str) -> tuple[EditResult, Verdict | None]:
    """The request for SEARCH/REPLACE blocks, and the file they build from the original, judged
    like any answer. Blocks that cannot be applied without guessing (edit/blocks.py) are refused,
    with the reason, and the file is left as it was."""
    ask_ = blocks_ask(original, args.instruction, language_for(args.file))
    result = send(args, original, DEFAULT_PROMPT, messages=ask_.messages, prediction=ask_.prediction)
    if not result.complete:
        return result, None
    try:
        built = apply_blocks(original, result.raw).code
    except BlockError as e:
        print(f"the blocks cannot be applied: {e}", file=sys.stderr)
        return dataclasses.replace(result, code=original), Verdict(original, [f"the blocks: {e}"], [], False)
    verdict = judge_answer(original, built, args.instruction, language_for(args.file))
    if verdict.failure:
        print(f"the file the blocks build is refused: {verdict.failure}", file=sys.stderr)
    return dataclasses.replace(result, code=verdict.code), verdict


def retries(args, original: str, first: EditResult, verdict: Verdict):
    """The requests after a refused answer, in order, each made only when the one before is
    refused too: SEARCH/REPLACE blocks applied by the tool, the file asked for with the other
    prompt, then the model told what is wrong with its first answer (that answer as the
    prediction). Measured on 33 real edits, the three turn 3 refused answers into usable files,
    2 of them by blocks (docs/server.md). Yields (the request's name, (answer, verdict)), so the
    caller can say which request's answer it writes, or why each is refused."""
    print(
        f"the first answer is refused: {verdict.failure}; asking for SEARCH/REPLACE blocks instead of the whole file",
        file=sys.stderr,
    )
    yield "blocks request", ask_blocks(args, original)
    print(f"asking again with the {RETRY_PROMPT!r} prompt", file=sys.stderr)
    yield f"{RETRY_PROMPT!r} prompt", ask(args, original, RETRY_PROMPT)
    print("telling the model what is wrong with its first answer, and asking once more", file=sys.stderr)
    language = language_for(args.file)
    yield (
        "feedback request",
        ask(
            args,
            original,
            DEFAULT_PROMPT,
            messages=feedback_messages(
                original, args.instruction, first.raw, verdict.problems or [verdict.failure], language
            ),
            prediction=feedback_prediction(original, verdict.code),
        ),
    )


def run(args) -> int:
    """`specserve edit`: check what can be checked before the model is asked (minutes on a CPU),
    ask (and ask again while the answer is refused), report, refuse what cannot be the updated
    file, then show the diff and write."""
    source = read_source(args.file)
    original = source.text
    dest = _preflight(args, original)
    result, verdict = _best_answer(args, original)
    if args.html:
        from ..bench.report_html import render_diff_html

        write_atomic(  # whole or not at all: a full disk left an earlier report truncated
            args.html, render_diff_html(original, result.code, f"specserve edit: {args.file.name}", summary(result))
        )
    for k, v in summary(result).items():
        print(f"{k:28s} {v}", file=sys.stderr)
    problems = verdict.problems if verdict else []
    _refuse_unless_usable(args, result, verdict, problems, dest)
    diff = unified_diff(original, result.code, args.file.name)
    print(colorize(diff) if sys.stdout.isatty() else diff, end="")
    if not diff:
        print("no changes", file=sys.stderr)
    if problems:
        print(
            f"warning: the answer may not be the updated file: {'; '.join(problems)}"
            + (" (written because of --force)" if dest is not None else ""),
            file=sys.stderr,
        )
    if dest is not None:
        _write(args, source, result.code, dest)
    return 2 if problems and dest is None and not args.force else 0  # a dry run says what a real run would do


def _preflight(args, original: str) -> Path | None:
    """The destination (None for --dry-run), once everything that would fail after the answer has
    been checked: an empty instruction, a name the file never mentions, a destination, backup or
    --html report that cannot be written or would overwrite a file the edit keeps."""
    if not args.instruction.strip():
        raise EditError("the instruction is empty: say what to change (-i '...')")
    missing = missing_target(original, args.instruction)
    if missing and not args.force:
        raise EditError(f"{missing}; nothing sent (--force asks anyway)")
    dest = target_path(args)
    if dest is not None:  # before the model is asked: an answer that cannot be written is minutes lost
        check_writable(dest)
        if args.in_place:
            _check_backup(args.file)
    if args.html:
        kept = [args.file, backup_path(args.file)] + ([dest] if dest is not None else [])
        if any(_same_file(args.html, p) or args.html.resolve() == p.resolve() for p in kept):
            raise EditError(f"--html {args.html} names a file the edit keeps; give the report a path of its own")
        check_writable(args.html)
    return dest


def _check_backup(path: Path) -> None:
    """FILE.bak can be written, and is not the file the edit writes: with FILE a link to FILE.bak,
    the backup was replaced by the edit itself, and the original was gone."""
    backup = backup_path(path)
    check_writable(backup, follow=False)
    if backup.parent.resolve() / backup.name == path.resolve():
        raise EditError(
            f"cannot keep a backup of {path}: it is a link to {backup.name}, which the edit would overwrite; "
            "nothing sent (--output writes the edit elsewhere)"
        )


def _best_answer(args, original: str) -> tuple[EditResult, Verdict | None]:
    """The first answer, or the first later one (`retries`) the tool would write when the first
    is refused (not with --no-retry or --force)."""
    result, verdict = ask(args, original, DEFAULT_PROMPT)
    if verdict and verdict.failure and not args.no_retry and not args.force:
        for step, (again, again_verdict) in retries(args, original, result, verdict):
            if again_verdict and again_verdict.failure is None:
                print(f"the answer to the {step} passes the checks: it is the edit below", file=sys.stderr)
                return again, again_verdict
            _say_refused(step, again, again_verdict)
        print("no later answer is better: keeping the first", file=sys.stderr)
    return result, verdict


def _say_refused(step: str, result: EditResult, verdict: Verdict | None) -> None:
    """One line on why a retry's answer is not used, before the next request (minutes on a CPU):
    the blocks request says it itself (`ask_blocks`); the others said nothing."""
    if verdict is None:
        print(f"the answer to the {step} is incomplete (finish_reason={result.finish_reason!r})", file=sys.stderr)
    elif step != "blocks request":
        print(f"the answer to the {step} is refused: {verdict.failure}", file=sys.stderr)


def _refuse_unless_usable(args, result: EditResult, verdict: Verdict | None, problems: list[str], dest) -> None:
    """EditError, nothing written, for an incomplete answer; for one the checks refuse, when it
    would be written (not with --force: the answer is shown); and for the file unchanged."""
    if not result.complete:
        raise EditError(
            f"the answer is incomplete (finish_reason={result.finish_reason!r}); nothing written"
            + (" — raise --max-tokens" if result.finish_reason == "length" else "")
        )
    if problems and dest is not None and not args.force:
        print(
            f"--- the answer ({len(result.raw)} characters) ---\n{shown(result.raw)}\n--- end of the answer ---",
            file=sys.stderr,
        )
        raise EditError(
            f"the answer cannot be the updated file: {'; '.join(problems)}; nothing written (--force writes it anyway)"
        )
    if verdict and verdict.unchanged and not args.force:
        raise EditError(
            "the model answered with the file unchanged: the edit was not made, and nothing was written"
            " (rephrase the instruction, or try a larger model)"
        )


def _write(args, source, code: str, dest: Path) -> None:
    """Write the edit: in place with a backup, over FILE itself (--output FILE), or to a new file.
    A write the system refuses (a full disk) is one line naming the file: the bare OS error said
    neither which file nor why the edit stopped."""
    try:
        if args.in_place:
            write_in_place(source, code, backup_path(args.file))
        elif _same_file(dest, args.file):  # --output FILE itself: what the user saved meanwhile still wins
            write_in_place(source, code)
        else:
            write_atomic(dest, source.encode(code), mode_of=args.file)
    except OSError as e:
        raise EditError(f"cannot write {e.filename or dest}: {e.strerror or e}") from None
    print(f"wrote {dest}" + (f" (backup: {backup_path(args.file).name})" if args.in_place else ""), file=sys.stderr)
