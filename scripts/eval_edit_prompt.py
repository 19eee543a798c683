"""Choose `specserve edit`'s prompt by measurement: how often does each candidate get a complete updated file?

    PYTHONPATH=src SPECSERVE_HOME=/work/main/.cache/specserve .venv/bin/python scripts/eval_edit_prompt.py \
        --out docs/results/edit_prompt_eval.json

Runs every (instruction, file) pair below with every prompt in `specserve.edit.PROMPTS` (system message +
user-message layout; the CLI sends exactly these) through the in-process API on the default target pack
(Qwen2.5-Coder 1.5B Q4_K_M on llama.cpp), greedy, with the file as the prediction (Predicted Outputs), as
`specserve edit` asks a server to. An answer is **well-formed** when

- the model finished on its own (finish_reason "stop", not cut by max_tokens),
- `edit.check_answer` finds nothing wrong (not far shorter than the file, code rather than prose, no
  placeholder or elision, and it compiles, since every excerpt is Python), and
- for a rename: the old name is gone (as a word) and the new one is there, and
- it is not the file unchanged (complete, but no edit: every pair asks for one).

**Usable** counts what `specserve edit` can write: a well-formed answer, or an answer of only the changed
top-level definitions that `edit.splice` puts back into the file, the result passing the same checks.
**`A then B`** rows are what `specserve edit` ends with: it asks with prompt A, and asks again with B
(`edit.RETRY_PROMPT`) only when it refuses A's answer (`written_by_the_tool`); computed from the two runs
(greedy, so the same answers up to llama.cpp's default kernels rounding a batch of another shape).
**Blocks** (`--blocks`, cached as `edit.BLOCKS`): the request for SEARCH/REPLACE blocks that the tool
applies to the file itself (`edit.blocks_ask`, `edit.apply_blocks`), run where the tool refuses the first
answer (or on every pair); its rows place it at each point of the tool's sequence (`blocks_chains`). A
file built from blocks is never counted well-formed (the model did not return the whole file): it is
usable when the blocks applied and the built file passes the checks, applied as any other answer, and
counted in "from_blocks".
**Applied** is stricter and reported beside it: for type hints every parameter and the return of the named
functions are annotated, for a docstring the named function has one, for the logic changes the strings the
change must add are there and those it must remove are gone.

The files are real public source: excerpts of the CPython standard library this interpreter runs and of
Jinja2 from the same environment. An excerpt is chosen deterministically: from the named top-level
definition on, whole top-level statements until it holds at least MIN_LINES lines (never more than
MAX_LINES). The JSON records the Python and Jinja2 versions and each excerpt's sha256, so a rerun can tell
whether it measured the same text. Results are appended to a JSONL cache as they come, so an interrupted
run resumes where it stopped (--cache). Each line keeps the whole answer, and a rerun judges cached answers
again by the rules of the day (lines written before answers were kept keep their recorded verdicts).
A (pair, prompt) whose request is byte for byte one already answered, in this run or the cache, takes
that answer instead of asking the model again (`reuse_identical`: `file-first-hint` asks for any edit
but a rename exactly as `file-first` does).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import platform
import re
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

MIN_LINES, MAX_LINES = 60, 150


@dataclass(frozen=True)
class Pair:
    """One edit task: the excerpt of `file` that starts at top-level `start`, and what to do to it."""

    name: str
    file: str  # "stdlib:<path>" or "jinja2:<path>"
    start: str  # the top-level def/class the excerpt begins with
    kind: str  # rename | hints | docstring | logic
    instruction: str
    old: str = ""  # rename: the name that must be gone
    new: str = ""  # rename: the name that must be there
    targets: tuple[str, ...] = ()  # hints / docstring: the functions that must have them
    present: tuple[str, ...] = ()  # logic: text the edit must add
    absent: tuple[str, ...] = ()  # logic: text the edit must remove


PAIRS = [
    # -- renames (a function, variable or parameter used more than once in the excerpt) --
    Pair(
        "colorsys-rename",
        "stdlib:colorsys.py",
        "rgb_to_hls",
        "rename",
        "Rename the function _v to _hue_to_channel.",
        old="_v",
        new="_hue_to_channel",
    ),
    Pair(
        "heapq-rename",
        "stdlib:heapq.py",
        "heappush",
        "rename",
        "Rename the variable lastelt to last_item.",
        old="lastelt",
        new="last_item",
    ),
    Pair(
        "textwrap-rename",
        "stdlib:textwrap.py",
        "dedent",
        "rename",
        "Rename the variable margin to common_margin in dedent.",
        old="margin",
        new="common_margin",
    ),
    Pair(
        "genericpath-rename",
        "stdlib:genericpath.py",
        "exists",
        "rename",
        "Rename the parameter filename to file_path in every function.",
        old="filename",
        new="file_path",
    ),
    Pair(
        "linecache-rename",
        "stdlib:linecache.py",
        "clearcache",
        "rename",
        "Rename updatecache to update_cache.",
        old="updatecache",
        new="update_cache",
    ),
    Pair(
        "copy-rename",
        "stdlib:copy.py",
        "deepcopy",
        "rename",
        "Rename _deepcopy_atomic to _copy_atomic.",
        old="_deepcopy_atomic",
        new="_copy_atomic",
    ),
    Pair(
        "jsondecoder-rename",
        "stdlib:json/decoder.py",
        "_decode_uXXXX",
        "rename",
        "Rename _decode_uXXXX to _decode_unicode_escape.",
        old="_decode_uXXXX",
        new="_decode_unicode_escape",
    ),
    Pair(
        "getopt-rename",
        "stdlib:getopt.py",
        "gnu_getopt",
        "rename",
        "Rename the function do_longs to parse_long_options.",
        old="do_longs",
        new="parse_long_options",
    ),
    Pair(
        "quopri-rename",
        "stdlib:quopri.py",
        "needsquoting",
        "rename",
        "Rename needsquoting to needs_quoting.",
        old="needsquoting",
        new="needs_quoting",
    ),
    Pair(
        "sndhdr-rename",
        "stdlib:sndhdr.py",
        "what",
        "rename",
        "Rename the function whathdr to what_header.",
        old="whathdr",
        new="what_header",
    ),
    Pair(
        "bisect-rename",
        "stdlib:bisect.py",
        "insort_right",
        "rename",
        "Rename the parameter hi to high in every function.",
        old="hi",
        new="high",
    ),
    Pair(
        "imghdr-rename",
        "stdlib:imghdr.py",
        "what",
        "rename",
        "Rename the list tests to TESTS.",
        old="tests",
        new="TESTS",
    ),
    Pair(
        "jinja-rename",
        "jinja2:utils.py",
        "is_undefined",
        "rename",
        "Rename the function import_string to import_object.",
        old="import_string",
        new="import_object",
    ),
    # -- type hints (on functions that have none) --
    Pair(
        "colorsys-hints",
        "stdlib:colorsys.py",
        "rgb_to_hls",
        "hints",
        "Add type hints to hls_to_rgb and _v.",
        targets=("hls_to_rgb", "_v"),
    ),
    Pair(
        "base64-hints",
        "stdlib:base64.py",
        "b64encode",
        "hints",
        "Add type hints to standard_b64encode and standard_b64decode.",
        targets=("standard_b64encode", "standard_b64decode"),
    ),
    Pair(
        "genericpath-hints",
        "stdlib:genericpath.py",
        "exists",
        "hints",
        "Add type hints to commonprefix.",
        targets=("commonprefix",),
    ),
    Pair(
        "posixpath-hints",
        "stdlib:posixpath.py",
        "_get_sep",
        "hints",
        "Add type hints to the function split.",
        targets=("split",),
    ),
    Pair(
        "getopt-hints", "stdlib:getopt.py", "gnu_getopt", "hints", "Add type hints to do_longs.", targets=("do_longs",)
    ),
    Pair(
        "tempfile-hints",
        "stdlib:tempfile.py",
        "_exists",
        "hints",
        "Add type hints to the function _exists.",
        targets=("_exists",),
    ),
    Pair(
        "statistics-hints",
        "stdlib:statistics.py",
        "median",
        "hints",
        "Add type hints to median_low.",
        targets=("median_low",),
    ),
    # -- docstrings (on functions that have none) --
    Pair("heapq-doc", "stdlib:heapq.py", "_siftdown", "docstring", "Add a docstring to _siftup.", targets=("_siftup",)),
    Pair(
        "copy-doc",
        "stdlib:copy.py",
        "deepcopy",
        "docstring",
        "Add a one-line docstring to _deepcopy_atomic.",
        targets=("_deepcopy_atomic",),
    ),
    Pair(
        "getopt-doc",
        "stdlib:getopt.py",
        "gnu_getopt",
        "docstring",
        "Add a docstring to do_longs explaining what it returns.",
        targets=("do_longs",),
    ),
    Pair("imghdr-doc", "stdlib:imghdr.py", "what", "docstring", "Add a docstring to test_png.", targets=("test_png",)),
    Pair(
        "posixpath-doc",
        "stdlib:posixpath.py",
        "_get_sep",
        "docstring",
        "Write a docstring for _get_sep.",
        targets=("_get_sep",),
    ),
    Pair(
        "colorsys-doc",
        "stdlib:colorsys.py",
        "rgb_to_hls",
        "docstring",
        "Add docstrings to rgb_to_hls and hls_to_rgb.",
        targets=("rgb_to_hls", "hls_to_rgb"),
    ),
    # -- small logic changes (what they must add is not in the excerpt yet) --
    Pair(
        "textwrap-logic",
        "stdlib:textwrap.py",
        "dedent",
        "logic",
        "Make indent raise TypeError if prefix is not a str.",
        present=("TypeError",),
    ),
    Pair(
        "base64-logic",
        "stdlib:base64.py",
        "b64encode",
        "logic",
        "In b64encode, replace the assert on altchars with a ValueError.",
        present=("ValueError",),
        absent=("assert len(altchars)",),
    ),
    Pair(
        "linecache-logic",
        "stdlib:linecache.py",
        "clearcache",
        "logic",
        "Make getline return None instead of an empty string when the line does not exist.",
        present=("return None",),
        absent=("return ''",),
    ),
    Pair(
        "heapq-logic",
        "stdlib:heapq.py",
        "heappush",
        "logic",
        "Make heappop raise IndexError('pop from an empty heap') when the heap is empty.",
        present=("pop from an empty heap",),
    ),
    Pair(
        "quopri-logic",
        "stdlib:quopri.py",
        "needsquoting",
        "logic",
        "In quote, raise TypeError instead of the assert.",
        present=("TypeError",),
        absent=("assert isinstance",),
    ),
    Pair(
        "genericpath-logic",
        "stdlib:genericpath.py",
        "exists",
        "logic",
        "Make getsize raise ValueError('negative size') when the size is negative.",
        present=("negative size",),
    ),
    Pair(
        "jinja-logic",
        "jinja2:utils.py",
        "is_undefined",
        "logic",
        "Make is_undefined also return True when obj is None.",
        present=("is None",),
    ),
]


def source_root(spec: str) -> Path:
    kind, _, rel = spec.partition(":")
    if kind == "stdlib":
        return Path(sysconfig.get_paths()["stdlib"]) / rel
    if kind == "jinja2":
        import jinja2

        return Path(jinja2.__file__).parent / rel
    raise ValueError(f"unknown source {spec!r}")


def excerpt(spec: str, start: str) -> str:
    """Whole top-level statements from `start`'s definition on, until there are at least MIN_LINES lines."""
    text = source_root(spec).read_text(encoding="utf-8")
    lines = text.splitlines(True)
    body = ast.parse(text).body
    first = next(i for i, n in enumerate(body) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == start)
    begin = min([body[first].lineno] + [d.lineno for d in getattr(body[first], "decorator_list", [])]) - 1
    end = begin
    for node in body[first:]:
        end = node.end_lineno
        if end - begin >= MIN_LINES:
            break
    if not MIN_LINES <= end - begin <= MAX_LINES:
        raise ValueError(f"{spec} from {start}: {end - begin} lines, outside {MIN_LINES}..{MAX_LINES}")
    return "".join(lines[begin:end])


def _functions(tree: ast.AST, name: str) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]


def applied(pair: Pair, code: str) -> bool:
    """Whether the answer visibly makes the change asked for (see the module docstring)."""
    if pair.kind == "rename":
        return renamed(pair, code)
    if pair.kind == "logic":
        return all(s in code for s in pair.present) and not any(s in code for s in pair.absent)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    for name in pair.targets:
        fns = _functions(tree, name)
        if not fns:
            return False
        for fn in fns:
            if pair.kind == "docstring" and not ast.get_docstring(fn):
                return False
            if pair.kind == "hints":
                a = fn.args
                params = [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
                params += [p for p in (a.vararg, a.kwarg) if p is not None]
                if fn.returns is None or any(p.annotation is None for p in params):
                    return False
    return True


def renamed(pair: Pair, code: str) -> bool:
    """The old name is gone from the code and the new one is in it. Code as `edit.names.name_uses`
    reads it: names, attributes and strings that are exactly the name, not comments or prose in
    longer strings (a debug message's "margin = %r" label may stay)."""
    from specserve.edit.names import name_uses

    return not name_uses(code, pair.old) and bool(name_uses(code, pair.new))


def judge(pair: Pair, original: str, raw: str, finish_reason: str) -> dict:
    from specserve.edit import check_answer, strip_fence

    code = strip_fence(raw, original)
    problems = check_answer(original, code, pair.instruction, "python")
    if finish_reason != "stop":
        problems.append(f"finish_reason {finish_reason}")
    if pair.kind == "rename" and not problems and not renamed(pair, code):
        problems.append(f"rename not done ({pair.old} -> {pair.new})")
    if not problems and code.strip() == original.strip():
        problems.append("the answer is the file unchanged")  # complete, but no edit: useless to the user
    result = {
        "well_formed": not problems,
        "applied": not problems and applied(pair, code),
        "unchanged": code == original,
        "problems": problems,
        "usable": not problems,  # what `specserve edit` can write: the answer, or it spliced into the file
        "spliced": False,
    }
    if problems and finish_reason == "stop":
        spliced = _spliced(pair, original, code)
        if spliced is not None:
            unchanged = spliced == original
            result.update(usable=not unchanged, spliced=True, applied=applied(pair, spliced), unchanged=unchanged)
    result["written"] = finish_reason == "stop" and _tool_writes(pair, original, code)
    return result


def judge_blocks(pair: Pair, original: str, raw: str, finish_reason: str) -> dict:
    """Judge an answer of SEARCH/REPLACE blocks (`edit.apply_blocks`): the file they build from the
    original is judged as `judge` judges a whole answer, and the tool writes it when its rule would.
    Such a file is never counted well-formed (the model did not return the whole file):
    `blocks_ok` says the blocks applied and the built file passed every check; `usable` and
    `applied` count it like any other answer the tool writes."""
    from specserve.edit import BlockError, apply_blocks

    try:
        built = apply_blocks(original, raw).code
    except BlockError as e:
        problems = [str(e)] + ([f"finish_reason {finish_reason}"] if finish_reason != "stop" else [])
        return {"well_formed": False, "applied": False, "unchanged": False, "problems": problems, "usable": False}
    r = judge(pair, original, built, finish_reason)
    ok = r["well_formed"]
    r.update(well_formed=False, blocks_ok=ok, usable=ok, spliced=False, applied=ok and applied(pair, built))
    return {**r, "from_blocks": True, "written": r["written"] and ok}


def judge_record(pair: Pair, prompt: str, original: str, raw: str, finish_reason: str) -> dict:
    """The verdict on one answer: blocks for the blocks request (`edit.BLOCKS`), a whole file otherwise."""
    from specserve.edit import BLOCKS

    if prompt == BLOCKS:
        return {
            "from_blocks": True,
            "blocks_ok": False,
            "spliced": False,
            "written": False,
            **judge_blocks(pair, original, raw, finish_reason),
        }
    return judge(pair, original, raw, finish_reason)


def _tool_writes(pair: Pair, original: str, code: str) -> bool:
    """Whether `specserve edit` writes this complete answer without asking again: the CLI's own
    rule (`edit.judge_answer`), blind to what only this script knows, such as that a rename
    narrowed to one function ("... in dedent") left the old name in it."""
    from specserve.edit import judge_answer

    return judge_answer(original, code, pair.instruction, "python").failure is None


def _spliced(pair: Pair, original: str, code: str) -> str | None:
    """The file `specserve edit` writes for an answer of only the changed definitions, if it would
    write one (`edit.judge_answer`), and a rename is done in it."""
    from specserve.edit import judge_answer

    verdict = judge_answer(original, code, pair.instruction, "python")
    if not verdict.spliced or (pair.kind == "rename" and not renamed(pair, verdict.code)):
        return None
    return verdict.code


def written_by_the_tool(r: dict) -> bool:
    """Whether `specserve edit` keeps this answer without asking again (`_tool_writes`, recorded
    at judging). Records judged before it was recorded: usable, or complete and changed with only
    faults the tool cannot see (a rename left half done is well-formed code)."""
    if "written" in r:
        return r["written"]
    seen = [p for p in r["problems"] if not p.startswith("rename not done")]
    return r["usable"] or (r["finish_reason"] == "stop" and not seen and not r["unchanged"])


def _tool_ends_with(tries: list[dict | None]) -> tuple[dict, int] | None:
    """What `specserve edit` keeps from its requests in order, each made only when the tool
    refuses the answer before: (the first answer it would write, else the first answer; how many
    requests it made). None when a request it would make was not measured."""
    for n, r in enumerate(tries, 1):
        if r is None:
            return None
        if written_by_the_tool(r):
            return r, n
    return tries[0], len(tries)


def with_retry(results: list[dict], first: str, second: str) -> list[dict]:
    """What `specserve edit` ends with per pair when it asks with `first`, then with `second` if
    the first answer is refused (greedy answers are deterministic: the two runs above are the
    two requests), keeping the second only when the tool would write it. The second answer is
    needed only where the tool refuses the first (`--retry-when-refused` runs no other)."""
    by = {(r["pair"], r["prompt"]): r for r in results}
    chosen = []
    for pair in dict.fromkeys(r["pair"] for r in results):
        ended = _tool_ends_with([by.get((pair, first)), by.get((pair, second))])
        if ended is not None:  # every request the tool would make was measured
            chosen.append({**ended[0], "prompt": f"{first} then {second}"})
    return chosen


FEEDBACK = "feedback"  # the cache's name for a feedback request after `edit.DEFAULT_PROMPT`'s refused answer


def with_feedback(results: list[dict], first: str, second: str) -> list[dict]:
    """What `specserve edit` ends with per pair: `first`'s answer; if the tool refuses it,
    `second`'s; if that is refused too, the answer to the feedback request (`first`'s answer sent
    back with what is wrong with it, run by `run_feedback`)."""
    names = [first, second, f"{first}+{FEEDBACK}"]
    return with_tries(results, names, f"{first} then {second} then {FEEDBACK}")


def with_tries(results: list[dict], names: list[str], label: str) -> list[dict]:
    """What `specserve edit` ends with per pair when it makes the requests `names` in order, each
    only when the tool refuses the answer before, labelled `label` (the cache's names: a prompt,
    "<first>+feedback", or `edit.BLOCKS`). A cut first answer ends it: the tool writes nothing and
    asks nothing more. Pairs where a request the tool would make was not measured are left out."""
    by = {(r["pair"], r["prompt"]): r for r in results}
    chosen = []
    for pair in dict.fromkeys(r["pair"] for r in results):
        tries = [by.get((pair, name)) for name in names]
        if tries[0] is not None and tries[0]["finish_reason"] != "stop":
            tries = tries[:1]
        ended = _tool_ends_with(tries)
        if ended is not None:
            keep, tries = ended
            chosen.append({**keep, "prompt": label, "tries": tries})
    return chosen


def blocks_chains(first: str, second: str) -> dict[str, list[str]]:
    """The places the blocks request (`edit.BLOCKS`) could take in the tool's sequence of requests,
    label -> the cache names of the requests in order: instead of `second`, instead of the
    feedback request, after it, or before `second` (then the feedback)."""
    from specserve.edit import BLOCKS

    fed = f"{first}+{FEEDBACK}"
    return {
        f"{first} then {BLOCKS}": [first, BLOCKS],
        f"{first} then {second} then {BLOCKS}": [first, second, BLOCKS],
        f"{first} then {second} then {FEEDBACK} then {BLOCKS}": [first, second, fed, BLOCKS],
        f"{first} then {BLOCKS} then {second} then {FEEDBACK}": [first, BLOCKS, second, fed],
    }


def write_report(
    out: Path, llm, pairs: list[Pair], prompts: list[str], codes: dict[str, str], done: dict[tuple[str, str], dict]
) -> dict:
    """Write the JSON report of what has been measured so far; return its per-prompt summary."""
    import jinja2

    from specserve.edit import BLOCKS, DEFAULT_PROMPT, PROMPTS, RETRY_PROMPT

    results = [done[(p.name, name)] for p in pairs for name in prompts if (p.name, name) in done]
    firsts = [name for name in prompts if name != RETRY_PROMPT] if RETRY_PROMPT in prompts else []
    chained = [r for name in firsts for r in with_retry(results, name, RETRY_PROMPT)]
    chains = [f"{name} then {RETRY_PROMPT}" for name in firsts]
    if DEFAULT_PROMPT in prompts and RETRY_PROMPT in prompts:  # what the tool does
        fed = [done[k] for k in done if k[1] == f"{DEFAULT_PROMPT}+{FEEDBACK}"]
        chained += with_feedback(results + fed, DEFAULT_PROMPT, RETRY_PROMPT)
        chains.append(f"{DEFAULT_PROMPT} then {RETRY_PROMPT} then {FEEDBACK}")
        blocked = [done[k] for k in done if k[1] == BLOCKS and k[0] in {p.name for p in pairs}]
        if blocked:
            results += blocked
            chains.insert(0, BLOCKS)
            for label, names in blocks_chains(DEFAULT_PROMPT, RETRY_PROMPT).items():
                chained += with_tries(results + fed, names, label)
                chains.append(label)
    results += chained
    summary = {}
    for name in prompts + chains:
        rs = [r for r in results if r["prompt"] == name]
        summary[name] = {
            "pairs": len(rs),
            "well_formed": sum(r["well_formed"] for r in rs),
            "well_formed_rate": round(sum(r["well_formed"] for r in rs) / max(1, len(rs)), 4),
            "usable": sum(r["usable"] for r in rs),
            "usable_rate": round(sum(r["usable"] for r in rs) / max(1, len(rs)), 4),
            "applied": sum(r["applied"] for r in rs),
            "applied_rate": round(sum(r["applied"] for r in rs) / max(1, len(rs)), 4),
            "from_blocks": sum(bool(r.get("from_blocks")) and r["usable"] for r in rs),
            "by_kind": _by_kind(rs, "well_formed"),
            "usable_by_kind": _by_kind(rs, "usable"),
            "applied_by_kind": _by_kind(rs, "applied"),
            **(
                {"system": PROMPTS[name].system, "user": PROMPTS[name].user}
                if name in PROMPTS
                else {"request": "SEARCH/REPLACE blocks applied to the file (edit.blocks_ask)"}
                if name == BLOCKS
                else {"retry": "each later request is made only when the tool refuses the answer before"}
            ),
        }
    report = {
        "model": llm.model_name,
        "backend": llm.backend_name,
        "default_prompt": DEFAULT_PROMPT,
        "sampling": "temperature 0, prediction = the file, max_tokens = 1.5 x file tokens + 64",
        "python": platform.python_version(),
        "jinja2": jinja2.__version__,
        "excerpt_lines": {"min": MIN_LINES, "max": MAX_LINES},
        "measured": f"{len(results)} of {len(pairs) * len(prompts)} (pair, prompt) runs",
        "pairs": [
            {
                "name": p.name,
                "file": p.file,
                "start": p.start,
                "kind": p.kind,
                "instruction": p.instruction,
                "lines": codes[p.name].count("\n"),
            }
            for p in pairs
        ],
        "summary": summary,
        "results": [_reported(r) for r in results],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return summary


def _by_kind(rs: list[dict], key: str) -> dict[str, str]:
    """ "<count of `key`>/<pairs>" per kind of edit."""
    kinds = ("rename", "hints", "docstring", "logic")
    return {k: f"{sum(r[key] for r in rs if r['kind'] == k)}/{sum(1 for r in rs if r['kind'] == k)}" for k in kinds}


def _reported(r: dict) -> dict:
    """A result as the report shows it: the head of a failed answer instead of the whole answer."""
    shown = {k: v for k, v in r.items() if k != "answer"}
    if "answer" in r and not r["well_formed"]:
        shown["answer_head"] = r["answer"][:300]
    return shown


def answer_limit(llm, code: str) -> int:
    """max_tokens for an answer: room for the whole file and a half (the report's "sampling")."""
    return int(len(llm.encode(code)) * 1.5) + 64


def record(pair: Pair, prompt: str, code: str, out, seconds: float, opening: str = "") -> dict:
    """One (pair, prompt) result as the cache keeps it: the figures, the verdict and the whole answer
    (with the `opening` the prompt wrote for the model, as `specserve edit` puts them together)."""
    answer = opening + out.text
    return {
        "pair": pair.name,
        "prompt": prompt,
        "kind": pair.kind,
        "sha256": hashlib.sha256(code.encode()).hexdigest(),
        "finish_reason": out.finish_reason,
        "completion_tokens": len(out.token_ids),
        "prompt_tokens": len(out.prompt_token_ids),
        "batch_seconds": seconds,
        **judge_record(pair, prompt, code, answer, out.finish_reason),
        "answer": answer,  # kept whole, so that a change of the rules can judge it again
    }


def edit_request(llm, code: str, instruction: str, prompt: str) -> tuple[list[int], str, str]:
    """(prompt ids, prediction, opening) for one edit as `specserve edit` asks for it (`edit.ask_for`:
    where the prompt opens the answer, the model goes on with the opening)."""
    from specserve.edit import ask_for

    ask = ask_for(code, instruction, "python", prompt)
    return llm.apply_chat_template(ask.messages, continue_final_message=bool(ask.opening)), ask.prediction, ask.opening


def keep(done: dict[tuple[str, str], dict], cache: Path, r: dict) -> None:
    """Count a result and append it to the cache at once (an interrupted run resumes after it)."""
    done[(r["pair"], r["prompt"])] = r
    with cache.open("a", encoding="utf-8") as f:
        f.write(json.dumps(r) + "\n")


def reuse_identical(pair: Pair, code: str, prompts: list[str], done: dict, cache: Path) -> int:
    """Give each prompt of `prompts` not measured on `pair` the answer of a prompt whose request is
    byte for byte the same (`edit.ask_for`: messages, opening, prediction), from this run or the
    cache: `file-first-hint` asks for any edit but a rename exactly as `file-first` does, so its
    answer is that one (up to llama.cpp's default kernels rounding another batch shape otherwise).
    The copy names its source (`same_request_as`) and goes to the cache. Returns how many."""
    from specserve.edit import PROMPTS, ask_for

    answered = [name for (p, name) in done if p == pair.name and name in PROMPTS]
    reused = 0
    for name in prompts:
        if (pair.name, name) in done:
            continue
        ask = ask_for(code, pair.instruction, "python", name)
        source = next((o for o in answered if ask_for(code, pair.instruction, "python", o) == ask), None)
        if source is not None:
            first = done[(pair.name, source)]
            keep(done, cache, {**first, "prompt": name, "same_request_as": first.get("same_request_as", source)})
            reused += 1
    return reused


def distinct_requests(pair: Pair, code: str, todo: list[str]) -> list[str]:
    """`todo` without the prompts whose request repeats an earlier one's: those take its answer
    afterwards (`reuse_identical`)."""
    from specserve.edit import ask_for

    asks = [ask_for(code, pair.instruction, "python", name) for name in todo]
    return [name for i, name in enumerate(todo) if asks[i] not in asks[:i]]


def run_feedback(llm, pairs: list[Pair], codes: dict[str, str], done: dict[tuple[str, str], dict], cache: Path):
    """`specserve edit`'s second request, for every pair whose default-prompt answer the tool
    refuses: that conversation, the answer and what is wrong with it (`edit.feedback_messages`),
    with `edit.feedback_prediction` as the prediction. Results go to the cache as
    "<default prompt>+feedback"; all such requests run as one batch."""
    from specserve import SamplingParams
    from specserve.edit import DEFAULT_PROMPT, feedback_messages, feedback_prediction, judge_answer, strip_fence

    name = f"{DEFAULT_PROMPT}+{FEEDBACK}"
    todo = []
    for pair in pairs:
        first, code = done.get((pair.name, DEFAULT_PROMPT)), codes[pair.name]
        if (pair.name, name) in done or first is None or "answer" not in first or written_by_the_tool(first):
            continue
        if first["finish_reason"] != "stop":
            continue  # the tool writes nothing and asks nothing more for a cut answer
        verdict = judge_answer(code, strip_fence(first["answer"], code), pair.instruction, "python")
        messages = feedback_messages(
            code, pair.instruction, first["answer"], verdict.problems or [verdict.failure], "python"
        )
        todo.append((pair, llm.apply_chat_template(messages), feedback_prediction(code, verdict.code)))
    if not todo:
        return
    print(f"feedback requests for {len(todo)} refused answers", file=sys.stderr)
    t = time.perf_counter()
    outs = llm.generate(
        [prompt for _, prompt, _ in todo],
        [SamplingParams(max_tokens=answer_limit(llm, codes[p.name]), temperature=0) for p, _, _ in todo],
        prediction=[prediction for _, _, prediction in todo],
    )
    seconds = round(time.perf_counter() - t, 1)
    for (pair, _, _), out in zip(todo, outs):
        r = record(pair, name, codes[pair.name], out, seconds)
        keep(done, cache, r)
        print(
            f"{'ok ' if r['well_formed'] else 'BAD'} {name} {pair.name:20s} {'; '.join(r['problems'])[:100]}",
            file=sys.stderr,
        )


def run_blocks(llm, pairs: list[Pair], codes: dict[str, str], done: dict, cache: Path, every: bool = False):
    """The blocks request (`edit.blocks_ask`, cached as `edit.BLOCKS`) for every pair whose default-prompt
    answer the tool refuses (`every`: for every pair, to measure it as a first request too). It is a
    fresh request, independent of the answers before it, so one answer serves every place the tool
    could make it (`blocks_chains`). All such requests run as one batch."""
    from specserve import SamplingParams
    from specserve.edit import BLOCKS, DEFAULT_PROMPT, blocks_ask

    todo = []
    for pair in pairs:
        first = done.get((pair.name, DEFAULT_PROMPT))
        if (pair.name, BLOCKS) in done:
            continue
        if every or (first is not None and first["finish_reason"] == "stop" and not written_by_the_tool(first)):
            todo.append((pair, blocks_ask(codes[pair.name], pair.instruction, "python")))
    if not todo:
        return
    print(f"blocks requests for {len(todo)} pairs", file=sys.stderr, flush=True)
    t = time.perf_counter()
    outs = llm.generate(
        [llm.apply_chat_template(ask.messages) for _, ask in todo],
        [SamplingParams(max_tokens=answer_limit(llm, codes[p.name]), temperature=0) for p, _ in todo],
        prediction=[ask.prediction for _, ask in todo],
    )
    seconds = round(time.perf_counter() - t, 1)
    for (pair, _), out in zip(todo, outs):
        r = record(pair, BLOCKS, codes[pair.name], out, seconds)
        keep(done, cache, r)
        mark = "ok " if r.get("blocks_ok") else "BAD"
        print(f"{mark} {BLOCKS} {pair.name:20s} {'; '.join(r['problems'])[:100]}", file=sys.stderr, flush=True)


def run_pair(llm, pair: Pair, code: str, todo: list[str], done: dict, cache: Path, progress: tuple) -> int:
    """Ask for `pair`'s edit with each prompt of `todo`, as one batch: the candidates decode together
    (continuous batching), which on a CPU gets more done per second than one after the other.
    Each result goes to the cache at once; returns how many ran. progress: (runs done before,
    runs in all, the run's start time), for the log line."""
    from specserve import SamplingParams

    n, total, t0 = progress
    if not todo:
        return 0
    t = time.perf_counter()
    asks = [edit_request(llm, code, pair.instruction, name) for name in todo]
    outs = llm.generate(
        [prompt for prompt, _, _ in asks],
        SamplingParams(max_tokens=answer_limit(llm, code), temperature=0),
        prediction=[prediction for _, prediction, _ in asks],
    )
    seconds = round(time.perf_counter() - t, 1)
    for i, (name, out, (_, _, opening)) in enumerate(zip(todo, outs, asks), 1):
        r = record(pair, name, code, out, seconds, opening)
        keep(done, cache, r)
        mark = "ok " if r["well_formed"] else "SPL" if r["usable"] else "BAD"
        print(
            f"[{n + i}/{total}] {time.perf_counter() - t0:6.0f}s {mark} {name:18s} {pair.name:20s} "
            f"{r['completion_tokens']:5d} tok {'; '.join(r['problems'])[:100]}",
            file=sys.stderr,
            flush=True,
        )
    return len(todo)


def main(argv: list[str] | None = None) -> int:
    from specserve.edit import PROMPTS, RETRY_PROMPT

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=",".join(PROMPTS), help="comma-separated names from edit.PROMPTS")
    ap.add_argument("--pairs", default=None, help="comma-separated pair names (default: all)")
    ap.add_argument("--model", default=None, help="target model (default: the default target pack)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("docs/results/edit_prompt_eval.json"))
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path("bench-out/edit_prompt_eval.jsonl"),
        help="one line per finished (pair, prompt): a rerun skips those already there",
    )
    ap.add_argument(
        "--retry-when-refused",
        action="store_true",
        help=f"run the retry prompt ({RETRY_PROMPT}) for a pair only where the tool refuses another prompt's answer "
        "(what the tool asks; the retry prompt's own row then covers only those pairs)",
    )
    ap.add_argument("--no-feedback", action="store_true", help="run no feedback request (`run_feedback`)")
    ap.add_argument(
        "--blocks",
        choices=("refused", "all"),
        default=None,
        help="also run the SEARCH/REPLACE blocks request (`run_blocks`): where the tool refuses the default "
        "prompt's answer, or on every pair",
    )
    ap.add_argument("--list", action="store_true", help="print the pairs and their excerpts' sizes, run nothing")
    args = ap.parse_args(argv)

    pairs = [p for p in PAIRS if args.pairs is None or p.name in args.pairs.split(",")]
    # Round-robin over the kinds, so that a run stopped early has measured every kind of edit.
    kinds = {k: [p for p in pairs if p.kind == k] for k in dict.fromkeys(p.kind for p in pairs)}
    pairs = [p for group in zip(*[g + [None] * (len(pairs) - len(g)) for g in kinds.values()]) for p in group if p]
    prompts = args.prompts.split(",")
    unknown = [p for p in prompts if p not in PROMPTS]
    if unknown:
        ap.error(f"unknown prompt(s) {unknown}; choose from {list(PROMPTS)}")
    codes = {p.name: excerpt(p.file, p.start) for p in pairs}
    for p in pairs:  # a pair whose check already passes on the original would measure nothing
        if p.kind == "rename" and not re.search(rf"\b{re.escape(p.old)}\b", codes[p.name]):
            raise SystemExit(f"{p.name}: {p.old!r} is not in the excerpt")
        if p.kind != "rename" and applied(p, codes[p.name]):
            raise SystemExit(f"{p.name}: the excerpt already passes the check")
    if args.list:
        for p in pairs:
            print(f"{p.name:22s} {p.kind:9s} {codes[p.name].count(chr(10)):4d} lines  {p.instruction}")
        return 0

    from specserve import LLM
    from specserve.edit import DEFAULT_PROMPT

    done: dict[tuple[str, str], dict] = {}
    by_name = {p.name: p for p in PAIRS}
    if args.cache.exists():
        for line in args.cache.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r.get("sha256") != hashlib.sha256(codes.get(r["pair"], "").encode()).hexdigest():
                continue
            if "answer" in r:  # judged again by today's rules: a cached verdict never goes stale
                r.update(
                    judge_record(by_name[r["pair"]], r["prompt"], codes[r["pair"]], r["answer"], r["finish_reason"])
                )
                done[(r["pair"], r["prompt"])] = r
                continue
            if r.get("unchanged") and (r["well_formed"] or r.get("usable")):  # judged before "unchanged" failed
                r.update(well_formed=False, usable=False, applied=False)
                r["problems"] = [*r["problems"], "the answer is the file unchanged"]
            if "usable" not in r:  # judged before splicing was counted: a complete answer is usable as is
                if not r["well_formed"]:
                    continue  # its whole answer was not kept: run it again
                r.update(usable=True, spliced=False)
            done[(r["pair"], r["prompt"])] = r
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    t_load = time.perf_counter()
    llm = LLM(
        args.model,
        draft_model="none",
        speculation="prediction",
        threads=args.threads,
        max_num_seqs=len(prompts),
        max_context=4096,
    )
    print(f"loaded {llm.model_name} on {llm.backend_name} in {time.perf_counter() - t_load:.0f} s", file=sys.stderr)
    total, n = len(pairs) * len(prompts), 0
    t0 = time.perf_counter()
    for pair in pairs:
        reuse_identical(pair, codes[pair.name], prompts, done, args.cache)
        pending = [name for name in prompts if (pair.name, name) not in done]
        n += len(prompts) - len(pending)
        todo = distinct_requests(pair, codes[pair.name], pending)
        retry_later = args.retry_when_refused and RETRY_PROMPT in todo and len(prompts) > 1
        if retry_later:
            todo.remove(RETRY_PROMPT)
        n += run_pair(llm, pair, codes[pair.name], todo, done, args.cache, (n, total, t0))
        firsts = [done.get((pair.name, name)) for name in prompts if name != RETRY_PROMPT]
        if retry_later and any(r is not None and not written_by_the_tool(r) for r in firsts):
            n += run_pair(llm, pair, codes[pair.name], [RETRY_PROMPT], done, args.cache, (n, total, t0))
        n += reuse_identical(pair, codes[pair.name], prompts, done, args.cache)
        write_report(args.out, llm, pairs, prompts, codes, done)  # a run stopped early still leaves its figures

    if DEFAULT_PROMPT in prompts and RETRY_PROMPT in prompts and not args.no_feedback:
        run_feedback(llm, pairs, codes, done, args.cache)
    if args.blocks:
        run_blocks(llm, pairs, codes, done, args.cache, every=args.blocks == "all")
    summary = write_report(args.out, llm, pairs, prompts, codes, done)
    for name, s in summary.items():
        print(
            f"{name:20s} well-formed {s['well_formed']}/{s['pairs']} ({s['well_formed_rate']:.0%})  "
            f"usable {s['usable']}/{s['pairs']} ({s['usable_rate']:.0%})  "
            f"applied {s['applied']}/{s['pairs']}  from blocks {s['from_blocks']}  {s['by_kind']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
