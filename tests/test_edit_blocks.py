"""edit/blocks.py: SEARCH/REPLACE blocks parsed from an answer and applied to the original file,
exact match first, then a whitespace-tolerant one; anything ambiguous refuses the whole answer."""

from __future__ import annotations

import pytest

from specserve.edit import BlockError, apply_blocks, blocks_ask, parse_blocks
from specserve.edit.blocks import Block
from specserve.edit.prompts import _BLOCKS_EXAMPLE, _EXAMPLE_AFTER, _EXAMPLE_BEFORE

CODE = (
    "def area(radius):\n"
    "    return 3.14 * radius**2\n"
    "\n"
    "\n"
    "class Shape:\n"
    "    def area(self):\n"
    "        return 0\n"
    "\n"
    "    def size(self):\n"
    "        total = 0\n"
    "        return total\n"
)


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_blocks_are_parsed_in_order_and_the_text_around_them_is_ignored():
    answer = (
        "Here are the changes:\n\nshapes.py\n```python\n"
        + block("a\n", "b\n")
        + "```\n\n```python\n"
        + block("c\n  d\n", "")
        + "```\nDone."
    )
    assert parse_blocks(answer) == [Block(("a",), ("b",)), Block(("c", "  d"), ())]


@pytest.mark.parametrize(
    "answer, why",
    [
        ("def area(radius):\n    return 0\n", "no SEARCH/REPLACE block"),
        ("<<<<<<< SEARCH\ndef area(radius):\n", r"not closed \(no divider\)"),
        ("<<<<<<< SEARCH\ndef area(radius):\n=======\ndef f(radius):\n", r"not closed \(no REPLACE\)"),
    ],
)
def test_an_answer_without_whole_blocks_is_refused(answer, why):
    with pytest.raises(BlockError, match=why):
        parse_blocks(answer)


def test_an_exact_block_replaces_its_lines_and_keeps_the_rest_of_the_file():
    out = apply_blocks(CODE, block("        total = 0\n", "        total = 1\n"))
    assert out.code == CODE.replace("total = 0", "total = 1")
    assert (out.blocks, out.tolerant) == (1, 0)


def test_blocks_apply_in_order_each_to_the_file_the_ones_before_left():
    answer = block("def area(radius):\n", "def circle_area(radius):\n") + block(
        "def circle_area(radius):\n    return 3.14 * radius**2\n", "def circle_area(radius):\n    return 0\n"
    )
    assert apply_blocks(CODE, answer).code.startswith("def circle_area(radius):\n    return 0\n\n\nclass Shape:")


def test_an_empty_replacement_deletes_the_lines():
    out = apply_blocks(CODE, block("        total = 0\n", ""))
    assert "total = 0" not in out.code and out.code.endswith("    def size(self):\n        return total\n")


def test_a_block_that_matches_twice_refuses_the_answer_rather_than_guess():
    with pytest.raises(BlockError, match="block 1 matches 2 places in the file: 'x = 1'"):
        apply_blocks("x = 1\ny = 2\nx = 1\n", block("x = 1\n", "x = 3\n"))


def test_a_block_that_matches_nothing_refuses_the_answer_even_after_good_blocks():
    answer = block("        total = 0\n", "        total = 1\n") + block("def volume(radius):\n", "def v(radius):\n")
    with pytest.raises(BlockError, match="block 2 matches nothing in the file: 'def volume"):
        apply_blocks(CODE, answer)


def test_a_block_with_nothing_to_search_for_is_refused():
    with pytest.raises(BlockError, match="block 1 has nothing to search for"):
        apply_blocks(CODE, block("\n", "import math\n"))


def test_the_exact_match_wins_over_the_whitespace_tolerant_ones():
    """`def area(` is at the top level once, and, indented, in Shape: the exact match is the one."""
    out = apply_blocks(CODE, block("def area(radius):\n", "def circle_area(radius):\n"))
    assert out.code == CODE.replace("def area(radius)", "def circle_area(radius)")
    assert out.tolerant == 0


def test_trailing_whitespace_is_tolerated():
    out = apply_blocks(CODE, block("        total = 0   \n", "        total = 1\n"))
    assert out.code == CODE.replace("total = 0", "total = 1")
    assert out.tolerant == 1


def test_lines_quoted_one_level_out_match_and_the_replacement_is_indented_back():
    answer = block("def size(self):\n    total = 0\n", "def size(self):\n    total = 0\n    total += 1\n")
    out = apply_blocks(CODE, answer)
    assert "    def size(self):\n        total = 0\n        total += 1\n        return total\n" in out.code
    assert out.tolerant == 1


def test_a_whitespace_tolerant_match_in_two_places_is_refused():
    code = "def f():\n    x = 1\n\n\ndef g():\n        x = 1\n"
    with pytest.raises(BlockError, match="block 1 matches 2 places"):
        apply_blocks(code, block("x = 1\n", "x = 2\n"))


def test_a_shifted_match_whose_replacement_is_indented_less_is_refused():
    with pytest.raises(BlockError, match="indented less"):
        apply_blocks(CODE, block("    total = 0\n", "    total = 0\ntop = 1\n"))


def test_indentation_that_differs_inside_the_block_does_not_match():
    with pytest.raises(BlockError, match="matches nothing"):
        apply_blocks(CODE, block("def size(self):\n    total = 0\n  return total\n", "x\n"))


def test_the_file_keeps_its_line_ends_and_its_last_newline():
    crlf = CODE.replace("\n", "\r\n")
    out = apply_blocks(crlf, block("        total = 0\n", "        total = 1\n"))
    assert out.code == crlf.replace("total = 0", "total = 1")
    bare = CODE.rstrip("\n")
    assert apply_blocks(bare, block("        return total\n", "        return -total\n")).code == bare.replace(
        "return total", "return -total"
    )


def test_the_worked_example_in_the_blocks_request_is_right():
    """The request teaches by an example: its blocks must build the example's answer exactly."""
    assert apply_blocks(_EXAMPLE_BEFORE, _BLOCKS_EXAMPLE).code == _EXAMPLE_AFTER
    ask = blocks_ask(CODE, "Rename area to circle_area.", "python")
    assert ask.prediction == CODE and ask.opening == ""
    assert [m["role"] for m in ask.messages] == ["system", "user", "assistant", "user"]
    assert ask.messages[-1]["content"].startswith(f"Here is a file:\n\n```python\n{CODE}\n```\n\nRename area")
    assert "line 1: def area(radius):" in ask.messages[-1]["content"]  # the rename hint, as the default sends it


@pytest.mark.parametrize(
    "answer",
    [  # a Markdown heading's underline is a divider line: which one divides the block is a guess
        "<<<<<<< SEARCH\nUsage\n=======\n=======\nHow to use it\n=======\n>>>>>>> REPLACE\n",
        "<<<<<<< SEARCH\nUsage\n=======\n=======\n>>>>>>> REPLACE\n",  # the heading deleted
    ],
)
def test_a_block_with_a_second_divider_line_is_refused_rather_than_guess(answer):
    """The first divider-like line ended the SEARCH lines, and the heading's own underline went into
    the replacement: 'Usage' alone was replaced, leaving '=======\\nHow to use it\\n=======\\n======='
    in README.md, no error. Which line divides cannot be told, so the answer is refused."""
    with pytest.raises(BlockError, match="block 1 has more than one divider line"):
        apply_blocks("# Tool\n\nUsage\n=======\n\nRun it.\n", answer)


def test_a_block_with_two_divider_lines_is_refused_not_split_at_the_first():
    """A file with an RST underline (`=======`) in a docstring: a block that quotes it has two
    divider-like lines. Split at the first, the search was `Tools` alone and the rest of the
    block went into the file: a docstring holding both texts, which compiles and passed every
    check. Where the search ends cannot be told, so the answer is refused."""
    code = '"""\nTools\n=======\n\nGreeting helpers.\n"""\n\n\ndef greet(name):\n    return "hi " + name\n'
    answer = block("Tools\n=======\n\nGreeting helpers.\n", "Tools\n=======\n\nGreeting helpers, in English.\n")
    with pytest.raises(BlockError, match="block 1 has more than one divider line"):
        apply_blocks(code, answer)
