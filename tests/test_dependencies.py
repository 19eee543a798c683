"""Declared dependencies match what the code imports (pyproject.toml against the source, read with ast).

Every third-party module the package imports is declared, in the main dependencies or an extra;
one that only an extra provides is imported lazily (inside a function), so a server install
without that extra still imports everything it runs.
"""

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "specserve"
# import name -> distribution name, where they differ
DIST = {"llama_cpp": "llama-cpp-python", "prometheus_client": "prometheus-client", "yaml": "pyyaml"}


def _dist_names(requirements: list[str]) -> set[str]:
    """'ray[serve]>=2.60,<2.61' -> 'ray' (normalised); self-references ('specserve[bench]') dropped."""
    names = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}
    return names - {"specserve"}


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {name: _dist_names(reqs) for name, reqs in project.get("optional-dependencies", {}).items()}
    return _dist_names(project["dependencies"]), extras


def _third_party_imports() -> dict[str, dict[str, bool]]:
    """distribution -> {file: imported at module level?} for every non-stdlib, non-specserve import."""
    out: dict[str, dict[str, bool]] = {}
    for path in sorted(PKG.rglob("*.py")):
        if "samples" in path.parts:  # benchmark inputs, never imported
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root in sys.stdlib_module_names or root in ("specserve", "__future__"):
                    continue
                dist = DIST.get(root, root.replace("_", "-").lower())
                files = out.setdefault(dist, {})
                rel = str(path.relative_to(PKG))
                files[rel] = files.get(rel, False) or id(node) in top
    return out


def test_every_import_is_declared():
    main, extras = _declared()
    every = main.union(*extras.values())
    missing = {dist: sorted(files) for dist, files in _third_party_imports().items() if dist not in every}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_extras_are_imported_lazily():
    """A module only an extra provides is never imported at module level (a server install lacks it)."""
    main, _ = _declared()
    eager = {
        dist: sorted(f for f, at_top in files.items() if at_top)
        for dist, files in _third_party_imports().items()
        if dist not in main
    }
    eager = {d: f for d, f in eager.items() if f}
    assert not eager, f"extras imported at module level: {eager}"


def test_plotting_is_a_bench_extra():
    main, extras = _declared()
    assert "matplotlib" not in main and "matplotlib" in extras["bench"]
    assert "httpx" in extras["bench"]  # bench --load-via server streams through it
    assert "ruff" in extras["dev"]


def test_server_and_cli_do_not_load_the_plotting_library_or_the_grammar_engine():
    """Importing the API, the server and every CLI subcommand imports neither matplotlib nor
    xgrammar (~2.5 s at every start; loaded when a request first asks for a grammar)."""
    code = (
        "import sys, specserve.llm, specserve.server.app, specserve.server.launch; "
        "from specserve.cli.main import build_parser; build_parser(); "
        "print([m for m in ('matplotlib', 'xgrammar') if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": str(PKG.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_bench_refuses_at_once_without_its_extra(monkeypatch, capsys):
    """No matplotlib: `specserve bench` says how to install it in one line, before loading any model."""
    import importlib.util

    from specserve.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    for argv in (["bench", "--quick"], ["bench", "--quick", "--concurrency", "1,2", "--load-via", "server"]):
        rc = main([*argv, "--model", "no-such-pack"])  # a model error, had the check come later
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert "matplotlib" in err and "pip install 'specserve[bench]'" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi", "--model", "/nowhere/model.gguf"],
        ["serve", "--model", "/nowhere/model.gguf"],
        ["bench", "--model", "/nowhere/model.gguf"],
        ["bench", "--session", "--draft-model", "/nowhere/model.gguf"],
    ],
    ids=["generate", "serve", "bench", "bench-session-draft"],
)
def test_the_cli_parser_and_a_path_error_need_neither_torch_nor_transformers(argv):
    """`specserve --help`, and a model path that does not exist, answer before the heavy imports
    (they took 6 and 11 s on 2 cores when every subcommand imported torch at parse time)."""
    code = (
        "import sys; from specserve.cli.main import main; "
        f"rc = main({argv!r}); "
        "print(rc, sorted(m for m in ('torch', 'transformers', 'llama_cpp') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(PKG.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.stdout.strip() == "2 []", out.stdout + out.stderr[-2000:]
    assert out.stderr.strip() == "specserve: error: no such file or folder: /nowhere/model.gguf"
