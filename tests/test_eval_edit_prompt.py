"""scripts/eval_edit_prompt.py's reuse of answers: a (pair, prompt) whose request is byte for byte
one already answered takes that answer instead of asking the model again."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "eval_edit_prompt", Path(__file__).resolve().parent.parent / "scripts" / "eval_edit_prompt.py"
)
ev = sys.modules.setdefault("eval_edit_prompt", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(ev)  # registered first: its dataclasses look their module up

CODE = "def do_longs(opts):\n    return do_shorts(opts)\n\n\ndef main():\n    return do_longs([])\n"
RENAME = ev.Pair("r", "stdlib:x.py", "do_longs", "rename", "Rename do_longs to parse_long_options.", "do_longs", "p")
DOC = ev.Pair("d", "stdlib:x.py", "do_longs", "docstring", "Add a docstring to main.", targets=("main",))


def _answered(pair: ev.Pair, prompt: str) -> dict:
    return {"pair": pair.name, "prompt": prompt, "answer": "```python\n...\n```", "well_formed": False}


def test_an_identical_request_takes_the_answer_and_names_its_source(tmp_path):
    cache = tmp_path / "cache.jsonl"
    done = {("d", "file-first"): _answered(DOC, "file-first")}
    assert ev.reuse_identical(DOC, CODE, ["file-first-hint", "file-first-hint-others"], done, cache) == 2
    for name in ("file-first-hint", "file-first-hint-others"):
        assert done[("d", name)] == {**_answered(DOC, "file-first"), "prompt": name, "same_request_as": "file-first"}
    assert [json.loads(line)["prompt"] for line in cache.read_text().splitlines()] == [
        "file-first-hint",
        "file-first-hint-others",
    ]  # kept, so a rerun resumes with them


def test_a_request_that_differs_is_left_to_the_model(tmp_path):
    """A rename's hint makes `file-first-hint` ask otherwise than `file-first`, and the look-alike
    line (`do_shorts`) makes `file-first-hint-others` ask otherwise than `file-first-hint`."""
    done = {("r", "file-first"): _answered(RENAME, "file-first")}
    assert ev.reuse_identical(RENAME, CODE, ["file-first-hint"], done, tmp_path / "c.jsonl") == 0
    done = {("r", "file-first-hint"): _answered(RENAME, "file-first-hint")}
    assert ev.reuse_identical(RENAME, CODE, ["file-first-hint-others"], done, tmp_path / "c.jsonl") == 0
    assert set(done) == {("r", "file-first-hint")}


def test_one_batch_asks_each_distinct_request_once():
    both = ["file-first", "file-first-hint", "example"]
    assert ev.distinct_requests(DOC, CODE, both) == ["file-first", "example"]
    assert ev.distinct_requests(RENAME, CODE, both) == both


def _blocks(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_a_file_built_from_blocks_is_usable_and_applied_but_never_counted_well_formed():
    """The model did not return the whole file: the built one counts as usable (the tool writes it)
    and applied, not as well-formed, and says where it came from."""
    answer = _blocks("def main():\n", 'def main():\n    """Parse no options."""\n')
    r = ev.judge_record(DOC, "search-replace", CODE, answer, "stop")
    assert not r["well_formed"] and r["blocks_ok"] and r["from_blocks"]
    assert r["usable"] and r["applied"] and r["written"]
    assert r["from_blocks"] and r["problems"] == []


def test_blocks_that_do_not_apply_are_refused_with_the_reason():
    r = ev.judge_record(DOC, "search-replace", CODE, _blocks("def mian():\n", "def main():\n"), "stop")
    assert (r["well_formed"], r["blocks_ok"], r["usable"], r["applied"], r["written"]) == (False,) * 5
    assert r["problems"] == ["block 1 matches nothing in the file: 'def mian():'"]


def test_blocks_that_build_a_broken_file_are_refused_like_a_whole_answer():
    """The rename done at the definition only: the built file calls a name nothing defines."""
    answer = _blocks("def do_longs(opts):\n", "def parse_long_options(opts):\n")
    r = ev.judge_record(RENAME, "search-replace", CODE, answer, "stop")
    assert not r["usable"] and not r["written"] and not r["blocks_ok"] and r["problems"]


def _tried(pair: str, prompt: str, written: bool, finish: str = "stop") -> dict:
    return {"pair": pair, "prompt": prompt, "kind": "rename", "finish_reason": finish, "written": written}


def test_the_blocks_request_is_counted_only_where_the_tool_would_make_it():
    results = [
        _tried("a", "first", False),
        _tried("a", "second", False),
        _tried("a", "search-replace", True),
        _tried("b", "first", True),  # written: the tool asks nothing more
        _tried("c", "first", False, "length"),  # cut: the tool asks nothing more
        _tried("c", "search-replace", True),
    ]
    chain = ev.with_tries(results, ["first", "second", "search-replace"], "label")
    assert [(r["pair"], r["tries"], r["written"]) for r in chain] == [("a", 3, True), ("b", 1, True), ("c", 1, False)]
    assert {r["prompt"] for r in chain} == {"label"}
