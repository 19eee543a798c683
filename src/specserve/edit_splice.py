"""Put an answer that holds only the changed definitions back into the whole file (Python).

Asked for the whole updated file, a small model often answers with just the function it changed
(measured with `scripts/eval_edit_prompt.py`: about a third of the default pack's answers on
docstring, type-hint and logic edits). That answer is not the file, and `edit.check_answer`
refuses to write it; but when it is nothing more than complete top-level definitions that the
file has, each under the same name, the intended file is clear: the original with those
definitions replaced. This builds it, and builds nothing (None) for anything less certain:
code that does not parse, a statement that is not such a definition (an import the original
does not have, a call, a method written at top level), or a name the original defines twice.
"""

from __future__ import annotations

import ast

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def splice_definitions(original: str, answer: str) -> tuple[str, list[str]] | None:
    """(the original with the answer's definitions in place, their names), or None."""
    try:
        old_tree, new_tree = ast.parse(original), ast.parse(answer)
    except (SyntaxError, ValueError):
        return None
    old_imports = {ast.unparse(n) for n in old_tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    defs = [n for n in new_tree.body if isinstance(n, _DEFS)]
    rest = [n for n in new_tree.body if not isinstance(n, _DEFS)]
    if not defs or any(ast.unparse(n) not in old_imports for n in rest):
        return None
    old_defs: dict[str, list[ast.AST]] = {}
    for n in old_tree.body:
        if isinstance(n, _DEFS):
            old_defs.setdefault(n.name, []).append(n)
    names = [n.name for n in defs]
    if len(set(names)) != len(names) or any(len(old_defs.get(name, [])) != 1 for name in names):
        return None
    old_lines, new_lines = original.splitlines(keepends=True), answer.splitlines(keepends=True)
    replacements = sorted(((*_span(old_defs[n.name][0]), _text(new_lines, n)) for n in defs), reverse=True)
    for start, end, text in replacements:  # bottom up, so earlier spans keep their line numbers
        old_lines[start:end] = [text if text.endswith("\n") or end >= len(old_lines) else text + "\n"]
    return "".join(old_lines), names


def _span(node: ast.AST) -> tuple[int, int]:
    """0-based [start, end) lines of a definition, its decorators included."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return first - 1, node.end_lineno


def _text(lines: list[str], node: ast.AST) -> str:
    start, end = _span(node)
    return "".join(lines[start:end])
