"""The rename hint (`edit.hints.rename_hint`): where the old name is used, as the `file-first-hint`
prompt tells the model."""

from __future__ import annotations

from specserve.edit import ask_for
from specserve.edit.hints import MAX_LINES, rename_hint
from specserve.edit.names import use_lines

PY = '''import re


def greet(name):
    """Say hello; greet is polite."""  # the docstring's greet is prose
    return "greet: " + name  # greet in a comment


def main():
    print(greet("bob"), greet("ann"))
    return "greet"


def other():
    greet = 1
    return greet
'''


def test_the_hint_lists_each_line_with_its_text_and_the_count():
    assert rename_hint(PY, "Rename the function greet to hello.", "python") == (
        "`greet` is used 6 times, on lines 4, 10, 11, 15 and 16; rename it to `hello` at each of them,"
        " and nowhere else:\n"
        "line 4: def greet(name):\n"
        'line 10: print(greet("bob"), greet("ann"))\n'
        'line 11: return "greet"\n'
        "line 15: greet = 1\n"
        "line 16: return greet"
    )


def test_a_name_in_comments_docstrings_and_longer_strings_is_not_counted_in_python():
    """Lines 5 and 6 mention greet only in a docstring, a longer string and a comment: they are
    not uses, and a rename that leaves them is done (the rename check counts the same way)."""
    assert use_lines(PY, "greet", "python") == [4, 10, 10, 11, 15, 16]
    assert "line 5" not in rename_hint(PY, "Rename greet to hello", "python")


def test_a_rename_narrowed_to_a_function_lists_only_the_uses_inside_it():
    assert rename_hint(PY, "Rename the variable greet to g in other.", "python") == (
        "`greet` is used twice in `other`, on lines 15 and 16; rename it to `g` at each of them, and nowhere else:\n"
        "line 15: greet = 1\n"
        "line 16: return greet"
    )


def test_one_use_is_told_as_one():
    code = "def f():\n    return 1\n"
    assert rename_hint(code, "Rename f to g", "python") == (
        "`f` is used once, on line 1; rename it to `g` there, and nowhere else:\nline 1: def f():"
    )


def test_no_hint_where_it_could_mislead():
    for instruction in (
        "Add type hints to greet.",  # no rename
        "Rename greet to main.",  # the new name is taken: the model must decide
        "Rename farewell to bye.",  # the file never uses it
        "Rename greet to hello in nowhere_defined.",  # narrowed to a part the tool cannot find
    ):
        assert rename_hint(PY, instruction, "python") == "", instruction


def test_other_languages_count_whole_words_in_code_only():
    js = "// count the items\nfunction count(xs) {\n  log('count');\n  return xs.length + count2;\n}\ncount([1]);\n"
    assert use_lines(js, "count", "javascript") == [2, 6]
    assert use_lines(js, "count", "") == [1, 2, 3, 6]  # no rule for the language: every whole word
    assert rename_hint(js, "Rename count to size", "javascript").splitlines() == [
        "`count` is used twice, on lines 2 and 6; rename it to `size` at each of them, and nowhere else:",
        "line 2: function count(xs) {",
        "line 6: count([1]);",
    ]


def test_a_name_on_very_many_lines_is_listed_in_part():
    code = "".join(f"x{i} = v\n" for i in range(MAX_LINES + 5))
    hint = rename_hint(code, "Rename v to value", "python").splitlines()
    assert hint[0].startswith(f"`v` is used {MAX_LINES + 5} times, on lines 1, 2,")
    assert hint[1:] == [f"line {n}: x{n - 1} = v" for n in range(1, MAX_LINES + 1)] + ["(and 5 more lines)"]


def test_the_hint_prompt_adds_the_hint_after_the_instruction_and_nothing_else():
    """`file-first-hint` is `file-first` with the hint after a rename's instruction; any other
    request is byte for byte `file-first`'s (so its measured answers stand)."""
    hinted = ask_for(PY, "Rename greet to hello.", "python", "file-first-hint")
    plain = ask_for(PY, "Rename greet to hello.", "python", "file-first")
    hint = rename_hint(PY, "Rename greet to hello.", "python")
    assert hinted.messages[-1]["content"] == plain.messages[-1]["content"].replace(
        "Rename greet to hello.", f"Rename greet to hello.\n\n{hint}"
    )
    assert hinted.prediction == plain.prediction == PY
    other = "Add a docstring to main."
    assert ask_for(PY, other, "python", "file-first-hint") == ask_for(PY, other, "python", "file-first")


def test_specserve_edit_sends_the_hint_by_default():
    """Measured on the 13 renames (docs/server.md), the hint doubles the tool's well-formed first
    answers, so the default prompt carries it; other edits are asked exactly as before."""
    hint = rename_hint(PY, "Rename greet to hello.", "python")
    assert hint in ask_for(PY, "Rename greet to hello.", "python").messages[-1]["content"]
    other = "Add a docstring to main."
    assert ask_for(PY, other, "python") == ask_for(PY, other, "python", "file-first")
