"""Layering: a lower part of the package never imports a higher one (read from the source, nothing runs).

From the bottom: `hardware`, `fim`, `tempfiles` (leaves: they import nothing of the package) -> `atomic` -> `errors`
-> `config`, `inputs` -> `chat`, `literal` -> `backends` -> `models` -> `proposers`, `engine` -> `llm` -> `server`,
`edit` -> `bench` -> `cli`. A module may import its own layer and those below (`server` and `edit` not each other).
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "specserve"

LAYERS = (  # bottom first
    {"hardware", "fim", "tempfiles"},
    {"atomic"},
    {"errors"},
    {"config", "inputs"},
    {"chat", "literal"},
    {"backends"},
    {"models"},
    {"proposers", "engine"},
    {"llm"},
    {"server", "edit"},
    {"bench"},
    {"cli"},
)
# part of the package -> the parts it must never import
FORBIDDEN = {part: set().union(*LAYERS[i + 1 :]) for i, layer in enumerate(LAYERS) for part in layer}
FORBIDDEN["server"].add("edit")  # siblings that stay apart: the edit client speaks HTTP to any server
FORBIDDEN["edit"].add("server")


def _part(module: str) -> str:
    """'specserve.engine.core' -> 'engine'; 'specserve.llm' -> 'llm'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    """Every specserve module a file imports (top level or inside functions), absolute names."""
    here = ["specserve", *path.relative_to(PKG).with_suffix("").parts]
    package = here[:-1]  # a module's own package (an __init__ is its package too)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("specserve."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("specserve."):
                found.add(name)
            elif name == "specserve":  # `from .. import x`: x may be a module
                found.update(f"specserve.{a.name}" for a in node.names)
    return found


def test_relative_imports_resolve():
    """The resolver itself: models/loader.py's `..config` is specserve.config."""
    assert "specserve.config" in _imports(PKG / "models" / "loader.py")
    assert "specserve.chat" in _imports(PKG / "llm.py")


def test_every_part_has_a_layer():
    """A new module or package at the top of specserve gets a layer here (fim.py and hardware.py had none)."""
    parts = {p.stem for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert parts - set(FORBIDDEN) == {"__init__"}


def test_no_layer_imports_a_higher_one():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if "samples" in path.parts:  # benchmark inputs, not package code
            continue
        own = _part(".".join(["specserve", *path.relative_to(PKG).with_suffix("").parts]))
        for module in sorted(_imports(path)):
            if _part(module) in FORBIDDEN.get(own, ()):
                bad.append(f"{path.relative_to(PKG)} imports {module}")
    assert not bad, "\n".join(bad)
