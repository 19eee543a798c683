"""`specserve edit` refuses a Python answer that reads a name nothing in it binds, where the
original did not: the trace of a rename left half done (edit/names.py). And in any language it
refuses an answer to "Rename X to Y" where Y appears nowhere, or X is still there when the
rename is not narrowed to part of the file."""

from __future__ import annotations

from specserve.edit import check_answer, judge_answer
from specserve.edit.names import dropped_definitions, identifiers, new_unbound_names, unbound_names

FILE = '''import bisect as _b


def insort_right(a, x):
    """Insert x into a, after any equal items."""
    a.insert(_b.bisect_right(a, x), x)


def insort(a, x):
    return insort_right(a, x)


def insort_all(a, xs):
    for x in xs:
        insort_right(a, x)
'''
RENAME = "Rename insort_right to insort_after everywhere in the file."


def test_a_rename_of_the_definition_alone_is_refused_and_a_whole_one_is_written():
    only_def = FILE.replace("def insort_right", "def insort_after")
    only_calls = FILE.replace("return insort_right", "return insort_after").replace(
        "        insort_right", "        insort_after"
    )
    whole = FILE.replace("insort_right", "insort_after")
    assert check_answer(FILE, whole, RENAME, "python") == []
    assert judge_answer(FILE, whole, RENAME, "python").failure is None
    [problem] = check_answer(FILE, only_def, RENAME, "python")
    assert "`insort_right`" in problem and "half done" in problem
    assert "`insort_after`" in check_answer(FILE, only_calls, RENAME, "python")[0]
    assert "`insort_right`" in judge_answer(FILE, only_def, RENAME, "python").failure
    # Only Python is read for names; in any language the rename check sees the old name left.
    assert check_answer(FILE, only_def, RENAME, "text") == [
        "the rename is left half done: `insort_right` is still there 2 times"
    ]


def test_a_rename_not_done_is_refused_in_any_language():
    no_rename = FILE.replace("after any equal items", "after any items equal to x")
    for language in ("python", "text"):
        [problem] = check_answer(FILE, no_rename, RENAME, language)
        assert problem == "the rename is not done: `insort_after` appears nowhere in the answer's code"
    ts = "export function toView(o) {\n  return o;\n}\n\nconst v = toView(order);\n"
    half = ts.replace("function toView", "function serializeOrder")
    problem = check_answer(ts, half, "Rename the function toView to serializeOrder.", "typescript")
    assert problem == ["the rename is left half done: `toView` is still there 1 time"]
    assert check_answer(ts, ts.replace("toView", "serializeOrder"), "Rename toView to serializeOrder.") == []


def test_a_rename_every_name_of_which_is_bound_can_still_be_half_done():
    """The old name left in `__all__` (a string) binds nothing, so only the rename check sees it."""
    listed = '__all__ = ["insort_right"]\n' + FILE
    half = listed.replace("def insort_right", "def insort_after").replace("insort_right(a, x)", "insort_after(a, x)")
    assert check_answer(listed, half, RENAME, "python") == [
        "the rename is left half done: `insort_right` is still there 1 time"
    ]
    assert check_answer(listed, listed.replace("insort_right", "insort_after"), RENAME, "python") == []


def test_prose_in_docstrings_and_comments_is_no_use_of_the_old_name():
    """In Python only code counts (names, attributes, a string that is exactly the name): a
    docstring or comment may still say "hi" in prose."""
    code = 'def f(lo, hi):\n    """Between lo and hi."""\n    # hi is the upper bound\n    return hi - lo\n'
    done = code.replace("f(lo, hi)", "f(lo, high)").replace("return hi", "return high")
    rename = "Rename the parameter hi to high in every function."
    assert check_answer(code, done, rename, "python") == []
    assert check_answer(code, done.replace("return high", "return hi"), rename, "python") == [
        "the answer uses `hi`, which nothing in it defines (a rename left half done, or a name made up?)"
    ]
    assert check_answer(code, done, rename, "text") == ["the rename is left half done: `hi` is still there 2 times"]


def test_a_rename_narrowed_to_one_function_may_leave_the_old_name_elsewhere():
    code = (
        "def dedent(text):\n    margin = 0\n    return margin\n\n\n"
        "def indent(text):\n    margin = 4\n    return margin\n"
    )
    once = code.replace("    margin = 0\n    return margin", "    common_margin = 0\n    return common_margin")
    scoped = "Rename the variable margin to common_margin in dedent."
    assert check_answer(code, once, scoped, "python") == []
    assert check_answer(code, once, "Rename the variable margin to common_margin in every function.", "python") == [
        "the rename is left half done: `margin` is still there 2 times"
    ]
    assert check_answer(code, code, scoped, "python") == [
        "the rename is not done: `common_margin` appears nowhere in the answer's code"
    ]
    # Left half done inside the function the rename is narrowed to: Python shows where.
    half = code.replace("    margin = 0\n", "    common_margin = 0\n")
    assert check_answer(code, half, scoped, "python") == [
        "the rename is left half done in `dedent`: `margin` is still there 1 time"
    ]
    assert check_answer(code, half, scoped, "text") == []  # elsewhere the part cannot be found


def test_an_answer_that_stops_before_the_last_function_is_refused():
    """A model that stops early writes a file that ends well and compiles: only the definitions
    show that `insort_all` (a fifth of the file here, under the length rule's half) was lost."""
    hinted = FILE.replace("def insort(a, x):", "def insort(a: list, x: object) -> None:")
    cut = hinted.split("\n\ndef insort_all")[0] + "\n"
    assert check_answer(FILE, hinted, "Add type hints to insort.", "python") == []
    assert check_answer(FILE, cut, "Add type hints to insort.", "python") == [
        "the answer no longer defines `insort_all`, which the file defines (cut short, or renamed unasked?)"
    ]
    assert check_answer(FILE, cut, "Delete insort_all.", "python") == []  # asked for
    # Whole definitions and the file's own imports only: the tool puts them into the file instead.
    spliced = judge_answer(FILE, cut, "Add type hints to insort.", "python")
    assert spliced.failure is None and spliced.code == hinted
    # With a statement that is no definition or import (a changed module line) it cannot, and
    # the answer is refused.
    typed = cut.replace("import bisect as _b", "import bisect as _b\nLIMIT: int = 10")
    assert "`insort_all`" in judge_answer(FILE, typed, "Add type hints to insort.", "python").failure


def test_a_rename_of_another_definition_than_the_one_asked_is_refused():
    renamed_too = FILE.replace("insort_right", "insort_after").replace("def insort(", "def insort_after2(")
    renamed_too = renamed_too.replace("\n    return insort_after", "\n    return insort_after")
    assert dropped_definitions(FILE, renamed_too, "python", "insort_right") == ["insort"]
    [problem] = check_answer(FILE, renamed_too, RENAME, "python")
    assert problem.startswith("the answer no longer defines `insort`")
    assert dropped_definitions(FILE, FILE.replace("insort_right", "insort_after"), "python", "insort_right") == []


def test_methods_and_other_languages_count():
    cls = "class Box:\n    def open(self):\n        pass\n\n    def close(self):\n        pass\n"
    assert dropped_definitions(cls, cls.split("\n\n    def close")[0] + "\n", "python") == ["Box.close"]
    ts = "".join(f"export function f{i}() {{\n  return {i};\n}}\n\n" for i in range(3))
    ts += "export async function b() {\n  return f0();\n}\n"
    cut = ts.split("\nexport async")[0]
    assert dropped_definitions(ts, cut, "typescript") == ["b"]
    assert check_answer(ts, cut, "Add JSDoc to f0.", "typescript") == [
        "the answer no longer defines `b`, which the file defines (cut short, or renamed unasked?)"
    ]
    assert dropped_definitions(FILE, "def broken(:\n", "python") == []  # unparsable: other checks say so


def test_a_missing_import_counts_unless_annotations_are_deferred():
    hinted = FILE.replace("def insort(a, x):", "def insort(a: List[int], x: int) -> Optional[int]:")
    assert new_unbound_names(FILE, hinted) == ["List", "Optional"]
    assert new_unbound_names(FILE, "from typing import List, Optional\n" + hinted) == []
    deferred = "from __future__ import annotations\n" + FILE
    assert new_unbound_names(deferred, deferred.replace("def insort(a, x):", "def insort(a: List[int], x):")) == []


def test_every_way_of_binding_a_name_counts():
    code = """
import os.path
from json import loads as parse
G = 1


class Box:
    size = 2

    def grow(self, *args, scale=1, **kw):
        global G
        G += scale
        with open(os.path.sep) as fh, open(fh.name) as (gh):
            pass
        try:
            n = parse("1")
        except ValueError as err:
            raise RuntimeError(err) from None
        squares = [k * k for k in range(n)]
        if (m := len(squares)) > 1:
            pass
        match kw:
            case {"a": first, **rest}:
                print(first, rest)
            case [one, *others]:
                print(one, others)
            case str() as text:
                print(text)
        for i, (j, q) in enumerate(args):
            del i
        f = lambda y, *z: y
        return f(m, j, q, args, Box, __name__)
"""
    assert unbound_names(code) == set()
    assert unbound_names(code.replace("return f(", "return g(")) == {"g"}


def test_names_the_original_already_reads_unbound_are_not_blamed_on_the_answer():
    star = "from os.path import *\n\ndef f():\n    return join('a', 'b')\n"
    assert unbound_names(star) is None
    assert new_unbound_names(star, star.replace("f()", "g()")) == []
    injected = "globals().update(X=1)\n\ndef f():\n    return X\n"
    assert unbound_names(injected) == {"X"}
    assert new_unbound_names(injected, injected.replace("def f", "def h")) == []
    assert new_unbound_names(FILE, "def broken(:\n") == []  # a syntax error is reported as such, not here


def test_identifiers_are_the_code_names_in_first_use_order_keywords_aside():
    """Bound here or not, attributes too; not keywords, comments or strings (the rename hint's
    look-alike names come from these)."""
    code = 'import os\n\n\ndef f(path):  # a comment names nothing\n    return os.stat(path).st_size or g("h")\n'
    assert identifiers(code) == ["os", "f", "path", "stat", "st_size", "g"]
    assert identifiers("def f(:\n  (") == []  # does not tokenize


def test_a_renamed_class_takes_its_methods_along():
    """A class rename done right was refused: its methods are named under the class
    (`InfinityType.__repr__`), and only a name whose last part was the renamed one was let go.
    Found trying `specserve edit` on packaging's _structures.py ("Rename the class InfinityType to
    PositiveInfinityType everywhere in the file.")."""
    code = 'class InfinityType:\n    def __repr__(self):\n        return "Infinity"\n\n\nINF = InfinityType()\n'
    renamed = code.replace("InfinityType", "PositiveInfinityType")
    instruction = "Rename the class InfinityType to PositiveInfinityType everywhere in the file."
    assert dropped_definitions(code, renamed, "python", "InfinityType", "PositiveInfinityType") == []
    assert check_answer(code, renamed, instruction, "python") == []
    # A method the renamed class lost is still missed.
    lost = "class PositiveInfinityType:\n    pass\n\n\nINF = PositiveInfinityType()\n"
    assert check_answer(code, lost, instruction, "python") != []
