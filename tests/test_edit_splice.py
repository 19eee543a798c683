"""edit/splice.py: an answer of only the changed definitions (and the imports they need) goes back
into the whole file; anything less certain builds nothing."""

from specserve.edit.splice import splice_definitions

FILE = """import os


def first(a):
    return a + 1


@decorator
def second(b):
    return b * 2


class Third:
    def method(self):
        return os.getcwd()


if __name__ == "__main__":
    print(first(1))
"""


def test_one_changed_function_is_put_in_place():
    answer = 'def second(b: int) -> int:\n    """Twice b."""\n    return b * 2\n'
    spliced, names = splice_definitions(FILE, answer)
    assert names == ["second"]
    assert spliced == FILE.replace("@decorator\ndef second(b):\n", 'def second(b: int) -> int:\n    """Twice b."""\n')


def test_two_definitions_and_a_known_import_with_decorators():
    answer = "import os\n\n@decorator\ndef second(b):\n    return b * 3\n\n\nclass Third:\n    pass\n"
    spliced, names = splice_definitions(FILE, answer)
    assert names == ["second", "Third"]
    assert "return b * 3" in spliced and "class Third:\n    pass\n" in spliced and "getcwd" not in spliced
    assert spliced.startswith("import os\n\n\ndef first(a):") and spliced.endswith("    print(first(1))\n")
    compile(spliced, "<spliced>", "exec")


def test_a_new_import_goes_after_the_files_imports():
    """A type hint often needs an import the file lacks; the answer's is kept, once, above every
    definition, and the file's own stay as they were."""
    answer = "import os\nfrom typing import Tuple\n\ndef first(a: int) -> Tuple[int]:\n    return (a + 1,)\n"
    spliced, names = splice_definitions(FILE, answer)
    assert names == ["first"]
    assert spliced == FILE.replace("import os\n", "import os\nfrom typing import Tuple\n", 1).replace(
        "def first(a):\n    return a + 1\n", "def first(a: int) -> Tuple[int]:\n    return (a + 1,)\n"
    )


def test_a_new_import_in_a_file_without_imports_goes_after_its_docstring_or_leading_comments():
    bare = '#!/usr/bin/env python\n"""Doc."""\ndef f(x):\n    return x\n'
    spliced, _ = splice_definitions(bare, "import math\n\ndef f(x: float) -> float:\n    return x\n")
    assert spliced == '#!/usr/bin/env python\n"""Doc."""\nimport math\n\n\ndef f(x: float) -> float:\n    return x\n'
    shebang = "#!/usr/bin/env python\ndef f(x):\n    return x\n"
    spliced, _ = splice_definitions(shebang, "import math\n\ndef f(x):\n    return math.floor(x)\n")
    assert spliced == "#!/usr/bin/env python\nimport math\n\n\ndef f(x):\n    return math.floor(x)\n"
    compile(spliced, "<spliced>", "exec")


def test_anything_uncertain_builds_nothing():
    assert splice_definitions(FILE, "def second(b):\n    return (\n") is None  # does not parse
    assert splice_definitions(FILE, "from __future__ import annotations\n\ndef first(a):\n    return a\n") is None
    assert splice_definitions(FILE, "X = 1\n\ndef first(a):\n    return a\n") is None  # a statement of its own
    assert splice_definitions(FILE, "def method(self):\n    return 1\n") is None  # a method, not top level
    assert splice_definitions(FILE, "def fourth():\n    pass\n") is None  # a name the file does not define
    assert splice_definitions(FILE, "print('hi')\n") is None  # no definition at all
    twice = FILE + "\n\ndef first(a):\n    return a\n"
    assert splice_definitions(twice, "def first(a):\n    return 0\n") is None  # defined twice: which one?
    assert splice_definitions(FILE, "def first(a):\n    return 0\n\ndef first(a):\n    return 1\n") is None


def test_the_edit_tools_verdict_splices_refuses_and_accepts_by_one_rule():
    """`judge_answer` is the rule the CLI writes by and the prompt evaluation counts with."""
    from specserve.edit import judge_answer

    whole = FILE.replace("return a + 1", "return a + 2")
    assert judge_answer(FILE, whole, "change first", "python").failure is None  # a whole, changed file
    part = judge_answer(FILE, "def first(a):\n    return a + 2\n", "change first", "python")
    assert part.spliced == ["first"] and part.code == whole and part.failure is None
    same = judge_answer(FILE, FILE, "change first", "python")
    assert same.failure == "the answer is the file unchanged" and not same.spliced
    text = judge_answer(FILE, "def first(a):\n    return a + 2\n", "change first", "text")  # no splice outside Python
    assert text.spliced == [] and "far shorter" in text.failure
    broken = judge_answer(FILE, "def first(a):\n    return (\n", "change first", "python")
    assert broken.failure and broken.code == "def first(a):\n    return (\n"


def test_simplify_or_clean_up_one_function_never_loses_the_others():
    """An instruction to simplify `first` may shorten the file, so an answer holding only `first` passed the length
    rule and was written as the whole file, losing `second`, `Third` and the main block. Only a
    deletion ("delete", "remove", "keep only", ...) may lose definitions; otherwise the answer is
    spliced into the file."""
    from specserve.edit import judge_answer

    short = "def first(a):\n    return a+1\n"
    for instruction in ("simplify first", "clean up the first function", "reduce first to one line", "shorten first"):
        verdict = judge_answer(FILE, short, instruction, "python")
        assert verdict.failure is None and verdict.spliced == ["first"], instruction
        assert verdict.code == FILE.replace("return a + 1", "return a+1"), instruction
    without_second = FILE.replace("@decorator\ndef second(b):\n    return b * 2\n\n\n", "")
    for instruction in ("delete second", "remove the function second", "drop second, it is unused"):
        verdict = judge_answer(FILE, without_second, instruction, "python")
        assert verdict.failure is None and verdict.code == without_second, instruction
    refused = judge_answer(FILE, short, "simplify first", "javascript")  # no splice outside Python: refused
    assert refused.failure and "no longer defines" in refused.failure


def test_characters_that_str_splitlines_takes_for_line_ends_do_not_move_the_splice():
    """Python ends a line at '\\n' (and a lone CR) only: a form feed (PEP 8's page break, found in
    the standard library), a Unicode line separator in a string, or U+0085 in a comment is inside
    a line. str.splitlines broke lines there too, so the definitions' line numbers from `ast` pointed
    at the wrong lines: the splice kept the old `second` beside the new one and ate blank lines."""
    odd = FILE.replace("import os\n", "import os\n\f\n").replace("return a + 1", "return a + 1  # \u2028 \x85")
    spliced, names = splice_definitions(odd, "def second(b):\n    return b * 3\n")
    assert names == ["second"] and spliced == odd.replace(
        "@decorator\ndef second(b):\n    return b * 2", "def second(b):\n    return b * 3"
    )
    lone_cr = "def first(a):\r    return a\n\n\ndef second(b):\n    return b\n"  # a lone CR ends a line for Python
    spliced, _ = splice_definitions(lone_cr, "def second(b):\n    return b * 3\n")
    assert spliced == "def first(a):\r    return a\n\n\ndef second(b):\n    return b * 3\n"
