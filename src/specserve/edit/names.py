"""Names a Python file reads but never binds: how `specserve edit` sees a rename left half done.

A small model asked to rename a function often renames only its definition, or only its calls.
The answer still compiles, so only names can show the fault: the old name is now read where
nothing binds it (or the new one is). `unbound_names` is deliberately loose about scopes: a name
bound *anywhere* in the file (an assignment, a parameter, a def, an import, a loop or `with`
target, an `except ... as`, a match capture, a `global`) counts as bound everywhere. It can
therefore miss a fault, but it flags a name only when nothing in the whole file could bind it.
The edit tool compares the answer with the original, so a name the original already read
unbound (a star import, a name injected at run time) is never blamed on the answer.

Two more readings of an answer live here: the functions and classes it no longer defines
(`dropped_definitions`: an answer cut short, or a name renamed unasked), and how often its code
uses a name (`name_uses`, for the rename check in checks.py).
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import keyword
import re
import tokenize
from collections.abc import Iterator

# Names every module or class body has without binding them.
_IMPLICIT = frozenset(dir(builtins)) | {
    "__name__",
    "__file__",
    "__doc__",
    "__spec__",
    "__loader__",
    "__package__",
    "__builtins__",
    "__path__",
    "__annotations__",
    "__class__",
    "__module__",
    "__qualname__",
    "__dict__",
}


@functools.lru_cache(maxsize=8)
def _parse(code: str) -> ast.Module | None:
    """The module `code` parses to, or None (a syntax error, a null byte). One answer is judged by
    several checks against one original, each reading the same two trees: they are parsed once.
    The trees are shared, so nothing here may change them."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def unbound_names(code: str) -> set[str] | None:
    """The names `code` reads that nothing in it binds; None when that cannot be told (the code
    does not parse, or a star import binds names we cannot see). Annotations count as reads
    unless the module defers them (`from __future__ import annotations`)."""
    tree = _parse(code)
    if tree is None:
        return None
    future = {
        a.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "__future__"
        for a in node.names
    }
    deferred = "annotations" in future
    bound: set[str] = set()
    read: set[str] = set()
    skip = _annotation_nodes(tree) if deferred else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                if id(node) not in skip:
                    read.add(node.id)
            else:
                bound.add(node.id)
        else:
            bound.update(_binds(node))
    return read - bound - _IMPLICIT


def new_unbound_names(original: str, answer: str) -> list[str]:
    """Names the answer reads unbound that the original did not ([] when either cannot be told)."""
    before, after = unbound_names(original), unbound_names(answer)
    if before is None or after is None:
        return []
    return sorted(after - before)


def _binds(node: ast.AST) -> list[str]:
    """The names a non-Name node binds (defs, parameters, imports, except/match captures, global)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.ExceptHandler):
        return [node.name] if node.name else []
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, (ast.MatchAs, ast.MatchStar)):
        return [node.name] if node.name else []
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    if type(node).__name__ in ("TypeVar", "ParamSpec", "TypeVarTuple"):  # def f[T](), Python 3.12+
        return [node.name]
    return []


def identifiers(code: str) -> list[str]:
    """Python: the identifiers `code`'s tokens name (variables, functions, parameters, attributes,
    whether bound here or not), keywords aside, in the order they first appear; [] when it does
    not tokenize. The rename hint reads it for the file's names that look like a renamed one."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    names = (t.string for t in tokens if t.type == tokenize.NAME and not keyword.iskeyword(t.string))
    return list(dict.fromkeys(names))


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of the Name nodes inside annotations (not evaluated under deferred annotations)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root) if isinstance(n, ast.Name)}


DEFINITION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # also what splice.py moves
# A definition line in the languages the edit tool reads without a parser: `def f`, `class C`,
# `function f`, `func f`, `fn f` (optionally exported, public, async, ...).
_DEFINITION = re.compile(
    r"^[ \t]*(?:(?:export|default|public|private|protected|static|async|pub|abstract|final)\s+)*"
    r"(?:def|class|function|func|fn|interface)\s+(?P<name>[A-Za-z_$][\w$]*)",
    re.M,
)


# More definition lines: a shell function `name() {`, a JavaScript/TypeScript function held by a
# name `const name = (...) =>` / `= function`, and a class method `name(args) {` (control words aside).
_MORE_DEFINITIONS = (
    re.compile(r"^[ \t]*(?:function\s+)?(?P<name>[A-Za-z_][\w-]*)\s*\(\)\s*\{", re.M),
    re.compile(
        r"^[ \t]*(?:export\s+)?(?:const|let|var)\s+(?P<name>[A-Za-z_$][\w$]*)\s*(?::[^=]+)?=\s*"
        r"(?:async\s*)?(?:function\b|\([^)]*\)\s*(?::[^=]+)?=>|[A-Za-z_$][\w$]*\s*=>)",
        re.M,
    ),
    re.compile(
        r"^[ \t]+(?:(?:public|private|protected|static|async|get|set|override|readonly)\s+)*"
        r"(?!(?:if|for|while|switch|catch|function|return|else|do|try|with)\b)"
        r"(?P<name>[A-Za-z_$][\w$]*)\s*\([^)]*\)\s*(?::\s*[^{;=]+)?\{\s*$",
        re.M,
    ),
)


def _definition_lines(code: str) -> Iterator[re.Match]:
    """Every definition line the regular expressions find (languages without a parser here)."""
    yield from _DEFINITION.finditer(code)
    for pattern in _MORE_DEFINITIONS:
        yield from pattern.finditer(code)


def _python_definitions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(name, node) of the top-level functions and classes, and of the methods of top-level
    classes as `Class.method`."""
    for node in tree.body:
        if isinstance(node, DEFINITION_NODES):
            yield node.name, node
        if isinstance(node, ast.ClassDef):
            yield from ((f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, DEFINITION_NODES))


def definitions(code: str, language: str) -> set[str] | None:
    """The functions and classes `code` defines: for Python those of `_python_definitions`,
    elsewhere every definition line `_DEFINITION` finds. None when Python code does not parse."""
    if language != "python":
        return {m.group("name") for m in _definition_lines(code)}
    tree = _parse(code)
    return None if tree is None else {name for name, _ in _python_definitions(tree)}


def indented_definitions(code: str, language: str) -> set[str]:
    """Outside Python: the definitions whose line is indented (methods, nested functions), which
    go with the class or function that holds them. Python names methods `Class.method` instead."""
    if language == "python":
        return set()
    return {m.group("name") for m in _definition_lines(code) if m.group(0)[:1] in (" ", "\t")}


def dropped_definitions(
    original: str, answer: str, language: str, renamed: str | None = None, new: str | None = None
) -> list[str]:
    """The functions and classes the original defines and the answer no longer does (sorted),
    leaving out `renamed` (the old name of a rename the instruction asks for) and, given its `new`
    name, what it holds where the answer has it under the new name (a renamed class's methods): a
    model that stops early, or renames more than it was asked to, loses code this way while the
    rest of the answer looks whole."""
    before, after = definitions(original, language), definitions(answer, language)
    if before is None or after is None:
        return []
    return sorted(n for n in before - after if not _renamed_away(n, after, renamed, new))


def _renamed_away(name: str, after: set[str], renamed: str | None, new: str | None) -> bool:
    """Whether `name` is gone only by the rename: it is the renamed definition, or lies inside it
    and the answer has it under the new name (`InfinityType.__repr__` as `PositiveInfinityType.__repr__`)."""
    parts = name.split(".")
    if parts[-1] == renamed:
        return True
    return new is not None and renamed in parts and ".".join(new if p == renamed else p for p in parts) in after


def _statement_keys(body: list[ast.stmt], prefix: str = "") -> Iterator[str]:
    """What identifies a top-level (or class-level, with `prefix`) statement that is no
    definition, across an edit that may change its value: an assignment's targets, an `if`'s
    test (`if __name__ == "__main__":`), a call's function. Imports, docstrings and other
    statements are not followed (edits legitimately change them)."""
    for node in body:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        yield prefix + n.id
        elif isinstance(node, ast.If) and not prefix:
            yield "if " + ast.unparse(node.test)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not prefix:
            yield ast.unparse(node.value.func) + "(...)"
        elif isinstance(node, ast.ClassDef) and not prefix:
            yield from _statement_keys(node.body, node.name + ".")


def dropped_statements(original: str, answer: str, renamed: str | None = None) -> list[str]:
    """Python: the top-level statements and class attributes (`_statement_keys`) of the original
    that the answer no longer has, leaving out `renamed`. [] when either does not parse."""
    before, after = _parse(original), _parse(answer)
    if before is None or after is None:
        return []
    gone = set(_statement_keys(before.body)) - set(_statement_keys(after.body))
    return sorted(g for g in gone if renamed not in re.findall(r"[A-Za-z_]\w*", g))


def duplicate_definitions(original: str, answer: str) -> list[str]:
    """Python: the top-level functions and classes (and methods) the answer defines more than
    once where the original did not (a model that writes a function again further down)."""

    def twice(code: str) -> set[str] | None:
        tree = _parse(code)
        if tree is None:
            return None
        names = [name for name, _ in _python_definitions(tree)]
        return {n for n in names if names.count(n) > 1}

    before, after = twice(original), twice(answer)
    return [] if before is None or after is None else sorted(after - before)


def _placeholder_body(node: ast.AST) -> bool:
    body = [
        n
        for n in node.body
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str))
    ]
    return len(body) == 1 and (
        isinstance(body[0], ast.Pass)
        or (
            isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and body[0].value.value is Ellipsis
        )
    )


def emptied_bodies(original: str, answer: str) -> list[str]:
    """Python: the functions whose body the answer turned into `...` or `pass` (a docstring
    aside) where the original's did more: code left out, as a `# ... unchanged` comment is."""
    before, after = _parse(original), _parse(answer)
    if before is None or after is None:
        return []
    old = {name: node for name, node in _python_definitions(before) if not isinstance(node, ast.ClassDef)}
    return sorted(
        name
        for name, node in _python_definitions(after)
        if name in old and _placeholder_body(node) and not _placeholder_body(old[name])
    )


def changed_functions(original: str, answer: str) -> list[str]:
    """Python: the functions and methods both define whose source the answer changed (sorted).
    [] when either does not parse."""

    def sources(code: str) -> dict[str, str] | None:
        tree = _parse(code)
        if tree is None:
            return None
        return {
            name: ast.get_source_segment(code, node) or ""
            for name, node in _python_definitions(tree)
            if not isinstance(node, ast.ClassDef)
        }

    before, after = sources(original), sources(answer)
    if before is None or after is None:
        return []
    return sorted(n for n in before.keys() & after.keys() if before[n] != after[n])


def python_definition_source(code: str, name: str) -> str | None:
    """The source of the function or class `name` defines in `code` (top level, or `Class.method`
    / a method name inside a top-level class), or None when it parses to no such definition."""
    node = _python_definition(code, name)
    return None if node is None else ast.get_source_segment(code, node)


def _python_definition(code: str, name: str) -> ast.AST | None:
    """The first top-level function or class, or method of a top-level class, that Python `code`
    defines as `name` (`Class.method`, or the bare name); None when it parses to none. The
    rename check reads its source and the rename hint its lines: one lookup, so they agree."""
    tree = _parse(code)
    if tree is None:
        return None
    for qualified, node in _python_definitions(tree):
        if name in (qualified, qualified.rsplit(".", 1)[-1]):
            return node
    return None


def name_uses(code: str, name: str) -> int:
    """How often Python `code` uses `name`: as a name, an attribute, or a string that is exactly
    the name (an `__all__` entry, a `getattr` argument); not inside comments or longer strings
    such as docstrings, where prose may say "hi" or "data" after the code stopped. Code that
    does not tokenize is counted by whole words, comments and all."""
    return len(_python_use_lines(code, name))


def _python_use_lines(code: str, name: str) -> list[int]:
    """The 1-based line of each use of `name` in Python `code`, as `name_uses` counts them (the
    rename check) and `use_lines` lists them (the rename hint): one scan, so the two agree."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return _word_lines(code, name)
    quoted = {f"'{name}'", f'"{name}"'}
    return [
        t.start[0]
        for t in tokens
        if (t.type == tokenize.NAME and t.string == name) or (t.type == tokenize.STRING and t.string in quoted)
    ]


def use_lines(code: str, name: str, language: str) -> list[int]:
    """The 1-based line of each use of `name` in `code` (a line twice when it uses the name twice),
    counted as the rename check counts: in Python as `name_uses` does, elsewhere as `code_uses`
    does (comments and strings left out where the language has a rule). The edit prompt's rename
    hint lists them (hints.py)."""
    if language == "python":
        return _python_use_lines(code, name)
    noise = _NOISE_RE.get(language)
    blank = noise.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), code) if noise else code
    return _word_lines(blank, name)


def _word_lines(text: str, name: str) -> list[int]:
    """The 1-based line of each whole-word occurrence of `name` in `text`."""
    return [text.count("\n", 0, m.start()) + 1 for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text)]


def python_definition_span(code: str, name: str) -> tuple[int, int] | None:
    """The first and last line (1-based, decorators included) of the top-level function or class,
    or method `Class.name` (or just `name`), that Python `code` defines as `name`; None if none."""
    node = _python_definition(code, name)
    if node is None:
        return None
    return min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno


# Comments and string literals of the languages `specserve edit` knows besides Python, as one
# alternation each: what `code_uses` blanks out before counting a name. Single quotes are whole
# strings where the language says so, and only character literals ('a', '\\n') in the C family,
# where Rust's lifetimes ('a) would otherwise swallow the code between two of them.
_DOUBLE = r'"(?:\\.|[^"\\\n])*"'
_SINGLE = r"'(?:\\.|[^'\\\n])*'"
_CHAR = r"'(?:\\.|[^'\\\n])'"
_BACKTICK = r"`(?:\\.|[^`\\])*`"
_SLASHES = r"//[^\n]*|/\*.*?\*/"
_HASH = r"#[^\n]*"
_C_FAMILY = "|".join((_SLASHES, _DOUBLE, _CHAR))
_NOISE = {
    "javascript": "|".join((_SLASHES, _DOUBLE, _SINGLE, _BACKTICK)),
    "bash": "|".join((_HASH, _DOUBLE, _SINGLE)),
    "ruby": "|".join((_HASH, _DOUBLE, _SINGLE)),
    "php": "|".join((_SLASHES, _HASH, _DOUBLE, _SINGLE)),
    "sql": "|".join((r"--[^\n]*", r"/\*.*?\*/", _DOUBLE, _SINGLE)),
    "css": "|".join((r"/\*.*?\*/", _DOUBLE, _SINGLE)),
    "go": "|".join((_SLASHES, _DOUBLE, _CHAR, _BACKTICK)),
}
_NOISE |= {lang: _NOISE["javascript"] for lang in ("typescript", "tsx", "jsx")}
_NOISE |= {lang: _C_FAMILY for lang in ("rust", "java", "c", "cpp", "csharp", "kotlin", "swift")}
_NOISE_RE = {lang: re.compile(pattern, re.S) for lang, pattern in _NOISE.items()}


def code_uses(text: str, name: str, language: str) -> int:
    """How often `name` occurs as a whole word in the code of `text`, a file in `language`: its
    comments and string literals blanked out first, so a rename that only changed a log message
    is not counted as done. Languages without a rule (and Python: see `name_uses`) are counted by
    whole words, comments and strings included."""
    noise = _NOISE_RE.get(language)
    return word_count(noise.sub(" ", text) if noise else text, name)


def word_count(text: str, name: str) -> int:
    """How often `name` occurs in `text` as a whole word (comments and strings included)."""
    return len(re.findall(rf"(?<!\w){re.escape(name)}(?!\w)", text))
