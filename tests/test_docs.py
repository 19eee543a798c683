"""The docs name what the code has: commands, flags, routes, /health fields, metrics, API fields, files.

README.md and docs/*.md are read against the CLI parser, a tiny server app (its routes, /health
and Prometheus registry), `SamplingParams` and the source tree. A doc that shows a flag, route,
metric or file the code lacks fails here, and so does a serve flag, route, /health field or
metric the reference tables leave out (a newcomer reads the tables, not the parser).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import io
import re
import shlex
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families
from tiny import tiny_model, tiny_tokenizer

from specserve.cli import bench as bench_cli
from specserve.cli.main import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    "README.md",
    "docs/usage.md",
    "docs/design.md",
    "docs/server.md",
    "docs/deploy.md",
    "docs/models.md",
    "docs/gpu.md",
]
COMMAND_DOCS = [*DOCS, "docs/benchmarks.md"]  # benchmarks.md: its commands, not its measured figures
FLAG = r"(?<![\w-])--[a-z][a-z0-9-]*"
EXTERNAL_FLAGS = {"--message", "--cache-prompts", "--chat-mode"}  # aider's own flags (server.md, "With a coding agent")


def read(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def section(doc: str, heading: str) -> str:
    """The text under a `## heading` (or `###`), up to the next heading of any level."""
    text = read(doc)
    start = re.search(rf"^#+ {re.escape(heading)}\n", text, re.M)
    assert start, f"{doc} has no section {heading!r}"
    rest = text[start.end() :]
    end = re.search(r"^#+ ", rest, re.M)
    return rest[: end.start()] if end else rest


def table_rows(text: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows (header and rule left out)."""
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row] for row in rows[2:]]


FENCE = re.compile(r"```\w*\s*$")  # a fence line holds the fence and a language, nothing else


def fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced code block, read line by line (a fence opens with its language)."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        if FENCE.match(line):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                blocks.append((lang, "\n".join(body) + "\n"))
                lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def commands(text: str) -> list[str]:
    """`specserve ...` command lines of shell code blocks (continuations joined, comments cut,
    pipes, `&&`, `;` and a trailing `&` split off), templates such as `specserve edit FILE ...` left out."""
    found = []
    for lang, block in fenced(text):
        if lang not in ("", "sh", "bash", "console"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"\|\|?|&&|;", re.sub(r"\s+#.*$", "", line)):
                part = part.strip().removeprefix("$ ").removesuffix("&").strip()
                if part.startswith("specserve "):
                    found.append(part)
    return [c for c in found if not re.search(r"\.\.\.|\[|\bFILE\b|\bNAME\b", c)]


def spans(text: str) -> list[str]:
    """Inline code spans outside fenced blocks, a span wrapped over two lines joined into one."""
    inside, kept = False, []
    for line in text.splitlines():
        fence = bool(FENCE.match(line))
        inside = inside != fence  # a fence line opens or closes a block
        kept += [] if inside or fence else [line]
    prose = "\n".join(kept)
    return [" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose)]


def mentions(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, flags) of each inline `specserve ...` span (line wraps joined): prose names a
    command and some of its flags, not always a whole command line."""
    found = []
    for span in spans(text):
        words = span.split()
        if len(words) > 1 and words[1] in SUBCOMMANDS:
            sub = " ".join(words[1:3]) if words[1] == "models" and words[2:3] in (["list"], ["pull"]) else words[1]
            found.append((sub, re.findall(FLAG, span)))
    return found


def parse(argv: list[str]):
    """The CLI's parse of argv, or the one-line error it prints."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return build_parser().parse_args(argv)
        except SystemExit as e:
            if e.code:
                return err.getvalue().strip()
            return None  # --help


def parser_flags() -> dict[str, set[str]]:
    """Each subcommand's option strings ('models list' and 'models pull' apart)."""

    def options(p):
        return {s for a in p._actions for s in a.option_strings}

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {}
    for name, p in sub.choices.items():
        flags[name] = options(p)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                flags.update({f"{name} {inner}": options(q) for inner, q in a.choices.items()})
    return flags


def script_flags() -> set[str]:
    return {f for p in (ROOT / "scripts").glob("*.py") for f in re.findall(rf"\"({FLAG})\"", p.read_text())}


def bench_refusals(args) -> list[str]:
    """What `specserve bench` would refuse in these arguments before loading a model."""
    from specserve.bench import load as bench_load

    try:
        bench_cli.check_bench_kind_flags(args)
        bench_cli.apply_demo(args)
        if args.session is None:
            bench_cli.resolve_options(args)
        if args.concurrency is not None:
            bench_load.parse_concurrency(args.concurrency)
            bench_load.parse_vias(args.load_via or "inproc")
    except ValueError as e:
        return [str(e)]
    return []


@pytest.mark.parametrize("doc", COMMAND_DOCS)
def test_every_documented_command_parses(doc):
    """Each example command runs as written, as far as its flags and names go: the parser takes
    it, and `bench`'s scenario, mode and peer names are ones bench knows."""
    problems = []
    flags = parser_flags()
    for cmd in commands(read(doc)):
        args = parse(shlex.split(cmd)[1:])
        if isinstance(args, str):
            problems.append(f"{cmd}\n    {args}")
            continue
        sub = " ".join(w for w in shlex.split(cmd)[1:3] if not w.startswith("-"))
        sub = sub if sub in flags else sub.split()[0]
        problems += [
            f"{cmd}\n    {f}: not a flag (argparse took it as short for another)"
            for f in re.findall(FLAG, cmd)
            if f not in flags[sub]
        ]
        if args is not None and args.command == "bench":
            problems += [f"{cmd}\n    {e}" for e in bench_refusals(args)]
    problems += [
        f"specserve {sub} has no {f}" for sub, named in mentions(read(doc)) for f in named if f not in flags[sub]
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS)
def test_every_flag_the_docs_name_exists(doc):
    """A flag in a code span is one of specserve's (or of the script the span runs)."""
    ours = set().union(*parser_flags().values()) | script_flags() | EXTERNAL_FLAGS
    missing = []
    for span in spans(read(doc)):
        script = re.match(r"(?:python )?scripts/(\w+)\.py\b", span)
        if script:
            source = (ROOT / "scripts" / f"{script.group(1)}.py").read_text()
            missing += [f"{f} ({span})" for f in re.findall(FLAG, span) if f'"{f}"' not in source]
        elif re.match(rf"{FLAG}( |$)", span):
            missing += [f"{f} ({span})" for f in re.findall(FLAG, span) if f not in ours]
    assert not missing, missing


def test_the_serve_flag_table_lists_every_serve_flag():
    """docs/server.md's flag table against `specserve serve`'s parser, both ways."""
    table = {
        f
        for row in table_rows(section("docs/server.md", "The OpenAI-compatible server"))
        for f in re.findall(r"(?<![\w-])--?[a-z][a-z0-9-]*", row[0])  # short flags (-k) too
    }
    serve = parser_flags()["serve"] - {"-h", "--help"}
    assert table - serve == set(), "documented, but serve has no such flag"
    assert serve - table == set(), "serve takes these, but docs/server.md's table leaves them out"


def test_readme_lists_every_sampling_param():
    from specserve import SamplingParams

    line = next(ln for ln in read("README.md").split("\n\n") if ln.startswith("`SamplingParams`:"))
    listed = set(re.findall(r"`(\w+)`", line.split("`SpeculationConfig`")[0])) - {"SamplingParams"}
    assert listed == {f.name for f in dataclasses.fields(SamplingParams)}


def test_the_readme_names_every_make_target():
    """The README is where a newcomer learns the Makefile: each target it declares (.PHONY) is
    named there as `make TARGET`."""
    phony = re.search(r"^\.PHONY:(.*)$", read("Makefile"), re.M).group(1).split()
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", read("README.md")))
    assert [t for t in phony if t not in named] == []


def test_design_files_table_names_files_that_exist():
    missing = []
    for row in table_rows(section("docs/design.md", "Files (package `src/specserve/`, one concern each)")):
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", row[0]):
            folder = ROOT / "src" / "specserve" / name
            missing += [] if folder.exists() else [name]
            if name.endswith("/"):  # its files are named in the concern column
                missing += [f"{name}{f}" for f in re.findall(r"`(\w+\.py)`", row[1]) if not (folder / f).exists()]
    assert not missing, missing


def test_design_files_table_names_every_module():
    """Every module of the package is in the Files table, a newcomer's map: its own row
    (`engine/core.py`) or its name in its folder's row (`backends/` ... `compute.py`). Package
    markers and bench/samples/ (example inputs, not code of ours to read) are left out."""
    rows = table_rows(section("docs/design.md", "Files (package `src/specserve/`, one concern each)"))
    named = set()
    for row in rows:
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", row[0]):
            named |= {name} if name.endswith(".py") else {f"{name}{f}" for f in re.findall(r"`(\w+\.py)`", row[1])}
    package = ROOT / "src" / "specserve"
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    unnamed = sorted(
        m for m in modules if m not in named and not m.endswith(("__init__.py", "__main__.py")) and "samples/" not in m
    )
    assert unnamed == []


OTHER_PROJECTS = {"transformers/integrations/ggml.py"}  # models.md: where to look in transformers


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_and_test_the_docs_cite_exists(doc):
    """A path in a code span (one with a folder: a bare `config.json` is any model's) is a file of
    the repo, from its root, src/, src/specserve/, docs/, tests/ or scripts/; and a test named as
    `test_x.py::test_y` or `test_y` is one."""
    roots = [ROOT, ROOT / "src", ROOT / "src" / "specserve", ROOT / "docs", ROOT / "tests", ROOT / "scripts"]
    tests = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py"))
    missing = []
    for span in spans(read(doc)):
        for path in re.findall(r"^(?:python )?(\w[\w.-]*(?:/[\w.-]+)*\.(?:py|sh|json|md|toml))\b", span):
            if "/" in path and path not in OTHER_PROJECTS and not any((root / path).exists() for root in roots):
                missing.append(path)
        for name in re.findall(r"(?:^|::)(test_\w+)$", span):
            missing += [] if re.search(rf"^def {name}\(", tests, re.M) else [name]
    assert not missing, missing


def doc_sections(path: Path) -> tuple[set[str], list[str]]:
    """A doc's link anchors (GitHub's slugs of its headings) and its section names: the headings
    and the bold labels that open a paragraph or item (`**The order of a sequence's cells**`)."""
    prose = path.read_text(encoding="utf-8")
    for _, body in fenced(prose):  # a `# comment` in a code block is no heading
        prose = prose.replace(body, "")
    headings = re.findall(r"^#+ (.+)$", prose, re.M)
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    return anchors, [h.lower() for h in headings + re.findall(r"\*\*([^*]+)\*\*", prose)]


SECTION_REFS = [  # '"Title" in [docs/x.md](...)', '[x.md](x.md), "Title"', 'docs/x.md "Title"', 'x.md, "Title"'
    re.compile(r"\"(?P<name>[^\"]+)\" in \[[^\]]*\]\((?P<path>[\w/.-]+\.md)\)"),
    re.compile(r"\[[^\]]*\]\((?P<path>[\w/.-]+\.md)\),? \"(?P<name>[^\"]+)\""),
    re.compile(r"(?<![\w/(])(?P<path>(?:docs/)?\w+\.md),? \"(?P<name>[^\"]+)\""),
]


def broken_link(here: Path, link: str) -> bool:
    """A relative link whose file, or whose #anchor in a Markdown file, is not there."""
    path, _, anchor = link.partition("#")
    if re.match(r"\w+:", link) or not path:
        return False
    target = here / path
    if not target.exists():
        return True
    return bool(anchor) and target.suffix == ".md" and anchor not in doc_sections(target.resolve())[0]


def unknown_section(here: Path, path: str, name: str) -> bool:
    """A section named beside a doc that is none of its headings or bold labels."""
    target = next((p for p in (here / path, ROOT / path) if p.exists()), None)
    names = doc_sections(target.resolve())[1] if target else []
    return not any(n.startswith(name.lower()) or name.lower() in n for n in names)


@pytest.mark.parametrize("doc", COMMAND_DOCS)
def test_every_section_a_doc_points_to_is_there(doc):
    """A relative link's file and #anchor exist, and a section named in quotes beside a doc
    ('see "Serving many requests" in docs/server.md') is one of its headings or bold labels."""
    here, text = (ROOT / doc).parent, read(doc)
    missing = [link for link in re.findall(r"\]\(([^)\s]+)\)", text) if broken_link(here, link)]
    for pattern in SECTION_REFS:
        missing += [
            f'{m["path"]} "{m["name"]}"' for m in pattern.finditer(text) if unknown_section(here, m["path"], m["name"])
        ]
    assert not missing, missing


@pytest.fixture(scope="module")
def client():
    """A tiny model's server app, started once (its lifespan runs once per app)."""
    from specserve.backends.transformers import TransformersBackend
    from specserve.llm import LLM
    from specserve.server.app import create_app

    llm = LLM.from_backends(TransformersBackend(tiny_model()), tiny_tokenizer(), name="tiny", speculation="none")
    with TestClient(create_app(llm, "tiny")) as client:
        yield client
    llm.close()


def test_the_endpoint_table_lists_every_route(client):
    """docs/server.md's endpoint table against the app's routes, both ways."""
    documented = set()
    for row in table_rows(section("docs/server.md", "Endpoints")):
        methods = []  # "`GET` / `DELETE /v1/responses/{id}`": both methods go with the path after them
        for method, path in re.findall(r"\b(GET|POST|DELETE)\b|(/[\w{][\w/{}.]*)", row[0]):
            if method:
                methods.append(method)
            else:
                documented |= {(m, path) for m in methods}
                methods = []
    served = set()
    for route in client.app.routes:
        path = getattr(route, "path", "").replace("{model_id:path}", "{id}").replace("{response_id}", "{id}")
        served |= {(m, path) for m in getattr(route, "methods", ()) or () if m in ("GET", "POST", "DELETE")}
    served -= {("GET", "/docs/oauth2-redirect")}  # FastAPI's, for /docs' OAuth login, which we have none of
    assert documented - served == set(), "documented, but not served"
    assert served - documented == set(), "served, but docs/server.md's endpoint table leaves it out"


def test_health_fields_are_documented(client):
    row = next(r for r in table_rows(section("docs/server.md", "Endpoints")) if "/health" in r[0])
    body = client.get("/health").json()
    fields = set(body) | set(body["prefix_cache"]) | set(body["prefix_cache"].get("host") or {})
    assert {f for f in fields if f"`{f}`" not in row[1]} == set()


def label_names(cell: str) -> set[str]:
    """A labels cell opens with its label names, each in backticks ("`endpoint` (...), `status` (...)");
    a cell that opens with prose describes a series without labels."""
    while re.search(r"\([^()]*\)", cell):
        cell = re.sub(r"\s*\([^()]*\)", "", cell)
    opening = re.match(r"`\w+`(?:, `\w+`)*", cell)
    return set(re.findall(r"`(\w+)`", opening.group(0))) if opening else set()


def test_the_metrics_table_lists_every_series_and_label(client):
    """docs/server.md's metrics table against a real scrape (names) and the registry (label names,
    which a scrape shows only once a series has samples), both ways."""
    from specserve.server.metrics import Metrics

    documented = {}
    for row in table_rows(section("docs/server.md", "Metrics")):
        for name in re.findall(r"`(specserve_\w+)`", row[0]):
            documented[name] = label_names(row[2])
    assert client.post("/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 2}).status_code == 200
    scrape = client.get("/metrics").text
    families = text_string_to_metric_families(scrape)
    families = [f for f in families if not f.name.endswith("_created")]  # prometheus_client's own
    scraped = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    assert set(documented) == scraped
    exported = {}
    for metric in vars(Metrics()).values():
        if isinstance(metric, MetricWrapperBase):
            exported[metric._name + ("_total" if metric._type == "counter" else "")] = set(metric._labelnames)
    assert documented == exported


def streaming_examples(text: str) -> list[str]:
    """The streaming requests of a doc's code blocks: each Python call with `stream=True` or to a
    `.stream(...)` method (a block that is not Python fails the test), and each curl command line
    (continuations joined) with `"stream": true`."""
    found = []
    for lang, block in fenced(text):
        if lang == "python":
            for node in ast.walk(ast.parse(block)):
                streams = isinstance(node, ast.Call) and (
                    any(k.arg == "stream" and getattr(k.value, "value", None) is True for k in node.keywords)
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "stream")
                )
                found += [ast.unparse(node)] if streams else []
        elif lang in ("", "sh", "bash", "console"):
            commands = re.split(r"\n(?=\S)", block.replace("\\\n", " "))
            found += [c for c in commands if c.startswith("curl") and re.search(r'"stream":\s*true', c)]
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_streaming_example_asks_for_few_tokens(doc):
    """A streaming example without `max_tokens` ran as long as the answer went: a chat answer may
    run to the end of the context, and on a CPU a newcomer trying server.md's example waited for it."""
    unbounded = [example for example in streaming_examples(read(doc)) if "max_tokens" not in example]
    assert not unbounded, f"{doc}: streaming examples without max_tokens: {unbounded}"


def test_streaming_examples_are_found():
    """The examples the test above reads: the README's LLM.stream loop, server.md's chat and curl streams."""
    assert any("llm.stream(" in e for e in streaming_examples(read("README.md")))
    server = streaming_examples(read("docs/server.md"))
    assert any("chat.completions.create" in e for e in server) and any(e.startswith("curl") for e in server)
