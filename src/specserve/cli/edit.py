"""`specserve edit FILE --instruction "..."`: edit a file through an OpenAI-compatible server.

Shows a unified diff and the Predicted Outputs figures. Writes (with --in-place or --output)
only after the answer completed: a response cut by max_tokens is refused, never written.
"""

from __future__ import annotations

import difflib
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from ..edit import (
    EditError,
    EditResult,
    language_for,
    make_client,
    refactor_with_predicted_outputs,
    write_atomic,
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("edit", help="edit a file with an LLM, using the file as the predicted output",
                              description="Send FILE and an instruction to an OpenAI-compatible server with "
                                          "prediction = FILE (temperature 0), show the diff, and write the result "
                                          "only when the answer is complete.")
    p.add_argument("file", type=Path, help="the file to edit")
    p.add_argument("--instruction", "-i", required=True, help="what to change")
    p.add_argument("--base-url", default=None,
                   help="server URL (default: $OPENAI_BASE_URL or http://127.0.0.1:8000/v1)")
    p.add_argument("--model", default=None, help="model name (default: the first one the server lists)")
    p.add_argument("--api-key", default=None, help="API key (default: $OPENAI_API_KEY, or none for local servers)")
    dest = p.add_mutually_exclusive_group()
    dest.add_argument("--output", "-o", type=Path, help="write the edited file here")
    dest.add_argument("--in-place", action="store_true", help="overwrite FILE (the original is kept as FILE.bak)")
    dest.add_argument("--dry-run", action="store_true", help="show the diff, write nothing (the default "
                                                              "without --output / --in-place)")
    p.add_argument("--max-tokens", type=int, default=None, help="cap on the answer's length")
    p.add_argument("--html", type=Path, help="also write an HTML report of the edit (lines kept vs changed)")
    p.set_defaults(func=run)


def unified_diff(old: str, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}"))


def colorize(diff: str) -> str:
    """ANSI colours for a terminal: additions green, removals red, hunks cyan."""
    out = []
    for line in diff.splitlines(True):
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
    d = {"model": result.model, "finish reason": result.finish_reason, "completion tokens": result.completion_tokens,
         "accepted prediction tokens": result.accepted_prediction_tokens,
         "rejected prediction tokens": result.rejected_prediction_tokens,
         "tokens/s": f"{result.tokens_per_second:.2f}", "time to first token": ttft,
         "total time": f"{result.elapsed:.2f} s"}
    if result.speculation:
        d["tokens per step"] = result.speculation.get("tokens_per_step")
        d["acceptance rate"] = result.speculation.get("acceptance_rate")
    return d


def target_path(args) -> Path | None:
    if args.dry_run:
        return None
    if args.in_place:
        return args.file
    return args.output


def run(args) -> int:
    original = args.file.read_text(encoding="utf-8")
    client = make_client(args.base_url, args.api_key)
    with tqdm(desc="receiving", unit="chunk", file=sys.stderr, leave=False, disable=None) as bar:
        result = refactor_with_predicted_outputs(original, args.instruction, client, args.model,
                                                 language_for(args.file), args.max_tokens,
                                                 on_delta=lambda _: bar.update(1))
    if args.html:
        from ..bench.report_html import render_diff_html

        args.html.write_text(render_diff_html(original, result.code, f"specserve edit: {args.file.name}",
                                               summary(result)), encoding="utf-8")
    for k, v in summary(result).items():
        print(f"{k:28s} {v}", file=sys.stderr)
    if not result.complete:
        raise EditError(f"the answer is incomplete (finish_reason={result.finish_reason!r}); nothing written"
                        + (" — raise --max-tokens" if result.finish_reason == "length" else ""))
    diff = unified_diff(original, result.code, args.file.name)
    print(colorize(diff) if sys.stdout.isatty() else diff, end="")
    if not diff:
        print("no changes", file=sys.stderr)
    dest = target_path(args)
    if dest is None:
        return 0
    if args.in_place:
        shutil.copy2(args.file, args.file.with_name(args.file.name + ".bak"))
    write_atomic(dest, result.code)
    print(f"wrote {dest}" + (f" (backup: {args.file.name}.bak)" if args.in_place else ""), file=sys.stderr)
    return 0
