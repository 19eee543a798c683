"""Put an answer that holds only the changed definitions back into the whole file (Python).

Asked for the whole updated file, a small model often answers with just the function it changed
(measured with `scripts/eval_edit_prompt.py`: about a third of the default pack's answers on
docstring, type-hint and logic edits). That answer is not the file, and `edit.check_answer`
refuses to write it; but when it is nothing more than complete top-level definitions that the
file has, each under the same name, the intended file is clear: the original with those
definitions replaced. This builds it, and builds nothing (None) for anything less certain:
code that does not parse, a statement that is neither such a definition nor an import (a call,
an assignment, a method written at top level), or a name the original defines twice.

Imports the original lacks are kept: a type hint or a new helper call often needs one (`from
typing import Tuple`). They go right after the original's last top-level import, or at the top
(after the docstring and `from __future__` lines) when it has none; a new `from __future__`
import, which must come first, builds nothing.
"""

from __future__ import annotations

import ast
import io

from .names import DEFINITION_NODES

_IMPORTS = (ast.Import, ast.ImportFrom)


def splice_definitions(original: str, answer: str) -> tuple[str, list[str]] | None:
    """(the original with the answer's definitions in place, their names), or None."""
    try:
        old_tree, new_tree = ast.parse(original), ast.parse(answer)
    except (SyntaxError, ValueError):
        return None
    old_imports = {ast.unparse(n) for n in old_tree.body if isinstance(n, _IMPORTS)}
    defs = [n for n in new_tree.body if isinstance(n, DEFINITION_NODES)]
    rest = [n for n in new_tree.body if not isinstance(n, DEFINITION_NODES)]
    if not defs or not all(isinstance(n, _IMPORTS) for n in rest):
        return None
    added = [ast.unparse(n) for n in rest if ast.unparse(n) not in old_imports]
    if any(n.startswith("from __future__") for n in added):
        return None
    old_defs: dict[str, list[ast.AST]] = {}
    for n in old_tree.body:
        if isinstance(n, DEFINITION_NODES):
            old_defs.setdefault(n.name, []).append(n)
    names = [n.name for n in defs]
    if len(set(names)) != len(names) or any(len(old_defs.get(name, [])) != 1 for name in names):
        return None
    old_lines, new_lines = _lines(original), _lines(answer)
    replacements = sorted(((*_span(old_defs[n.name][0]), _text(new_lines, n)) for n in defs), reverse=True)
    for start, end, text in replacements:  # bottom up, so earlier spans keep their line numbers
        old_lines[start:end] = [text if text.endswith(("\n", "\r")) or end >= len(old_lines) else text + "\n"]
    if added:  # above every definition, so the replacements below did not move this line
        at = _import_line(old_tree, old_lines)
        gap = ["\n", "\n"] if at < len(old_lines) and old_lines[at].strip() else []  # none before code: PEP 8's two
        old_lines[at:at] = [line + "\n" for line in dict.fromkeys(added)] + gap
    return "".join(old_lines), names


def _lines(text: str) -> list[str]:
    """`text`'s lines as Python numbers them (`ast`'s lineno), each with its end: a line ends at
    '\n', '\r\n' or a lone '\r' only. (str.splitlines also ends one at a form feed, U+2028, U+0085
    and others, which Python reads as characters inside a line: the spans then missed.)"""
    return io.StringIO(text, newline="").readlines()


def _import_line(tree: ast.Module, lines: list[str]) -> int:
    """0-based line where new imports go: after the file's leading docstring and imports (all
    above every definition), else after its leading comments (a shebang, a coding line)."""
    at = 0
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (docstring or isinstance(node, _IMPORTS)):
            break
        at = node.end_lineno
    while at == 0 and at < len(lines) and lines[at].lstrip().startswith("#"):
        at += 1
    return at


def _span(node: ast.AST) -> tuple[int, int]:
    """0-based [start, end) lines of a definition, its decorators included."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return first - 1, node.end_lineno


def _text(lines: list[str], node: ast.AST) -> str:
    start, end = _span(node)
    return "".join(lines[start:end])
