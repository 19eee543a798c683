"""The rename hint (`edit.hints.rename_hint`): where the old name is used, as the `file-first-hint`
prompt tells the model."""

from __future__ import annotations

from specserve.edit import ask_for
from specserve.edit.hints import MAX_LINES, MAX_LOOKALIKES, lookalike_names, rename_hint
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


GETOPT = """def gnu_getopt(args, shortopts, longopts=[]):
    if args[0].startswith('--'):
        opts, args = do_longs(opts, args[0][2:], longopts, args[1:])
    else:
        opts, args = do_shorts(opts, args[0][1:], shortopts, args[1:])
    return opts, args


def do_longs(opts, opt, longopts, args):
    has_arg, opt = long_has_args(opt, longopts)
    return opts, args
"""


def test_lookalike_names_share_a_word_with_the_old_or_the_new_name():
    """`do_shorts` shares "do" with `do_longs` (the 1.5B pack renamed it to `parse_shorts`
    unasked), `long_has_args` shares "long" with `parse_long_options`; `do_shorts` is named though
    this file only calls it. Keywords, builtins and the two names themselves are never named."""
    assert lookalike_names(GETOPT, "do_longs", "parse_long_options", "python") == ["do_shorts", "long_has_args"]
    code = "def what(f):\n    return whathdr(f)\n\n\ndef whathdr(f):\n    return open(f).read()\n"
    assert lookalike_names(code, "whathdr", "what_header", "python") == ["what"]
    assert lookalike_names("def _v(m, hue):\n    return m\nv = _v(1, 2)\n", "_v", "_hue_to_channel", "python") == [
        "hue",
        "v",
    ]
    assert lookalike_names("import os\nn = len(os.sep)\n", "sep", "sep_len", "python") == []  # `len` is a builtin


def test_glue_words_and_other_languages_name_nothing():
    code = "def rgb_to_hls(r):\n    return _v(r)\n\n\ndef _v(x):\n    return x\n"
    assert lookalike_names(code, "_v", "to_channel", "python") == []  # "to" joins words, it names nothing
    assert lookalike_names("function doLongs() {}\ndoShorts();\n", "doLongs", "parseLong", "javascript") == []


def test_at_most_max_lookalikes_are_named_in_the_order_the_file_uses_them():
    code = "".join(f"get_{i} = {i}\n" for i in range(MAX_LOOKALIKES + 3)) + "get = get_0\n"
    assert lookalike_names(code, "get", "fetch", "python") == [f"get_{i}" for i in range(MAX_LOOKALIKES)]


def test_the_hint_with_lookalikes_ends_with_the_names_to_leave_alone():
    plain = rename_hint(GETOPT, "Rename the function do_longs to parse_long_options.", "python")
    hint = rename_hint(GETOPT, "Rename the function do_longs to parse_long_options.", "python", lookalikes=True)
    assert hint == plain + "\n`do_shorts` and `long_has_args` are different names: leave them as they are."
    one = rename_hint(GETOPT, "Rename long_has_args to has_argument.", "python", lookalikes=True)
    assert one.endswith(
        "\nline 10: has_arg, opt = long_has_args(opt, longopts)\n"
        "`args` and `has_arg` are different names: leave them as they are."
    )
    one = rename_hint(GETOPT, "Rename has_arg to has_value.", "python", lookalikes=True)
    assert one.endswith("\n`long_has_args` is a different name: leave it as it is.")
    assert rename_hint(PY, "Rename greet to hello.", "python", lookalikes=True) == rename_hint(
        PY, "Rename greet to hello.", "python"
    )  # no look-alike: the hint as before


def test_the_lookalike_prompt_is_the_hint_prompt_but_for_that_line():
    """`file-first-hint-others` adds only the look-alike line to `file-first-hint`'s request, so
    where a file has no look-alike (and for every edit but a rename) the two requests are the same."""
    instruction = "Rename the function do_longs to parse_long_options."
    others = ask_for(GETOPT, instruction, "python", "file-first-hint-others")
    hinted = ask_for(GETOPT, instruction, "python", "file-first-hint")
    hint = rename_hint(GETOPT, instruction, "python")
    assert others.messages[-1]["content"] == hinted.messages[-1]["content"].replace(
        hint, rename_hint(GETOPT, instruction, "python", lookalikes=True)
    )
    assert others.messages[-1]["content"] != hinted.messages[-1]["content"]
    for same in ("Rename greet to hello.", "Add a docstring to main."):
        assert ask_for(PY, same, "python", "file-first-hint-others") == ask_for(PY, same, "python", "file-first-hint")
