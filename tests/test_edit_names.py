"""`specserve edit` refuses a Python answer that reads a name nothing in it binds, where the
original did not: the trace of a rename left half done (edit_names.py)."""

from __future__ import annotations

from specserve.edit import check_answer, judge_answer
from specserve.edit_names import new_unbound_names, unbound_names

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
    assert check_answer(FILE, only_def, RENAME, "text") == []  # only Python is read for names


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
