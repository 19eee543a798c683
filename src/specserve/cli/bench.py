"""`specserve bench`: scenarios x speculation modes x peers on the same weights -> JSON, Markdown, PNG.

specserve bench --quick --out bench-quick            # SmolLM2-135M, one scenario, short outputs (CI)
specserve bench --out bench --max-tokens 256 --scenarios py-rename,ts-async --modes plain,prediction
specserve bench --concurrency 1,4,16 --modes plain,prediction --load-via both --out bench-load
                                                     # load: C requests at once (bench/load.py)
specserve bench --session --out bench-session        # a 4-turn coding conversation (bench/session.py)
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from ..bench import require
from ..bench.runner import (
    EXTRA_MODES,
    FAILED,
    MODES,
    PEERS,
    BenchInterrupted,
    BenchOptions,
    environment,
    headlines,
    html_rows,
    load_scenarios,
    run_bench,
    write_results,
)
from ..edit.files import write_atomic
from .argtypes import path_arg, positive_int
from .generate import (
    add_engine_args,
    add_model_args,
    check_model_paths,
    check_not_an_input,
    engine_limits,
    load_options,
)
from .outfolder import make_folder, taken_back_if_empty

QUICK_MODEL = "smollm2-135m-instruct"
QUICK_SCENARIO = "py-rename"
QUICK_PROMPT_TOKENS = 1024  # a quarter of the file: CI time goes into prefill on CPU
# `make demo`: the whole 434-line file on the default Qwen pair (llama.cpp), against llama-cpp-python's
# plain decoding on the same GGUF (the headline ratio). Plain decoding (ours and the peer's) runs for
# its first 256 tokens: the full file would take it minutes on 2 CPU cores, and 256 tokens are past
# the first lines, where decoding is fastest; the report says so.
DEFAULT_OUT = Path("bench-results")
LOAD_MAX_TOKENS = 128  # output tokens per request of the load benchmark (--load-max-tokens)
DEMO = {
    "scenarios": "py-rename",
    "modes": "plain,prediction,auto",
    "peers": "llama.cpp",
    "max_tokens": 4096,
    "plain_max_tokens": 256,
    "out": Path("bench-out/demo"),  # made before the runs; the HTML report goes in it (report.html)
}


def _csv(value: str | None, allowed: tuple[str, ...] | None = None, what: str = "scenario") -> tuple[str, ...] | None:
    """A comma-separated option's names (None when the option was not given); 'none' names
    nothing on purpose, but a value with no name at all is a mistake, not "the default"."""
    if value is None:
        return None
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if not names:
        raise ValueError(f"--{what}s names no {what}" + ("; write 'none' for none" if what != "scenario" else ""))
    items = names if what == "scenario" else tuple(v for v in names if v != "none")
    if twice := sorted({v for v in items if items.count(v) > 1}):
        raise ValueError(f"--{what}s names {', '.join(twice)} twice")  # it would run twice, minutes each
    if allowed is not None:
        bad = [v for v in items if v not in allowed]
        if bad:
            raise ValueError(f"unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def make_out_folder(args) -> list[Path]:
    """Make --out now, before the runs (minutes on a CPU): a folder that cannot be made, or a file
    there, failed only when the results were written. Returns the folders it made (run takes them
    back if they are still empty at the end, a refusal of the checks that follow included)."""
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file, not a folder")
    try:
        return make_folder(args.out)
    except OSError as e:
        raise ValueError(f"--out {args.out}: cannot create the folder ({e.strerror or e})") from None


def check_outputs(args) -> None:
    """Refuse an --out that cannot be written, or an --html whose folder is missing, before the runs,
    not when their results are written."""
    if not os.access(args.out, os.W_OK):
        raise ValueError(f"--out {args.out}: the folder is not writable")
    if args.html is not None:
        check_html_path(args)


def check_html_path(args) -> None:
    """--html's folder must exist and be writable, and the path must be neither a folder nor a result file."""
    folder = args.html.expanduser().resolve().parent
    if not folder.is_dir():
        raise ValueError(f"--html {args.html}: the folder {args.html.parent} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--html {args.html}: the folder {args.html.parent} is not writable")
    if args.html.expanduser().is_dir():  # found only when the report was written, after the runs
        raise ValueError(f"--html {args.html} is a folder: give the report's file name")
    # The report was written over bench.md (then printed as the results) or bench.json.
    results = [args.out / f"bench.{ext}" for ext in ("json", "md", "png")]
    check_not_an_input(args.html, "--html", [str(p) for p in results], "a file of the bench's results")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark speculation modes and peers on refactor scenarios",
        description="Run refactor scenarios under each speculation mode and peers on the "
        "same weights (llama-cpp-python on llama.cpp, transformers generate() on "
        "transformers); write bench.json, bench.md and bench.png into --out.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"CI size: {QUICK_MODEL} (or --model) without a draft model (or --draft-model), one scenario, "
        f"32 output tokens, prompt <= {QUICK_PROMPT_TOKENS} tokens",
    )
    p.add_argument(
        "--demo",
        action="store_true",
        help="the README demo: the py-rename refactor of the whole file "
        "on the default packs, plain vs prediction vs auto (not with --quick)",
    )
    add_model_args(p, dtype_help="torch dtype, transformers backend only (default bfloat16; float32 with --quick)")
    p.add_argument(
        "--max-tokens", type=positive_int, default=None, help="output cap per run (default 256; 32 with --quick)"
    )
    p.add_argument(
        "--plain-max-tokens",
        type=positive_int,
        default=None,
        help="cap for the slow reference runs (plain, hf): their rate is measured on that many tokens "
        "and the other runs are checked against that prefix (default: --max-tokens)",
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        default=None,
        help="cut each file at a line boundary so the prompt stays under this many tokens "
        f"(default: the model's context; {QUICK_PROMPT_TOKENS} with --quick)",
    )
    p.add_argument(
        "--scenarios",
        default=None,
        help=f"comma-separated scenario names (default: all; {QUICK_SCENARIO} with --quick)",
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, from {','.join(MODES + EXTRA_MODES)} (default: {','.join(MODES)})",
    )
    p.add_argument(
        "--peers",
        default=None,
        help=f"peers, from {','.join(PEERS)}; 'none' for none (default: those on the same backend)",
    )
    p.add_argument(
        "--out",
        type=path_arg,
        default=DEFAULT_OUT,
        help=f"output folder (default {DEFAULT_OUT}; --demo: bench-out/demo); a run replaces the bench.json, "
        "bench.md and bench.png of an earlier run there (load.* and session.* for those benches): "
        "a folder per run keeps each",
    )
    p.add_argument(
        "--html",
        type=path_arg,
        default=None,
        metavar="FILE",
        help="also write an HTML token-source report of one run (replaces FILE)",
    )
    p.add_argument(
        "--html-run",
        default=None,
        help="which run the HTML shows, as scenario/mode (default: the first prediction run)",
    )
    add_engine_args(p, max_num_seqs=1)  # scenarios run one request at a time; --concurrency raises it
    p.add_argument(
        "--concurrency",
        default=None,
        metavar="C1,C2,...",
        help="run the load benchmark instead: for each C, start C requests at once (plain and "
        "prediction modes) and measure aggregate and per-request tok/s, TTFT and inter-token "
        "latency; writes load.json, load.md and load.png into --out",
    )
    p.add_argument(
        "--load-via",
        default=None,
        choices=("inproc", "server", "both"),
        help="load benchmark path: engine requests in this process, streaming requests to a "
        "`specserve serve` subprocess, or both (default inproc)",
    )
    p.add_argument(
        "--load-max-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"output tokens per load-benchmark request, EOS ignored (default {LOAD_MAX_TOKENS})",
    )
    p.add_argument(
        "--session",
        nargs="?",
        const="users",
        default=None,
        metavar="NAME",
        help="run the session benchmark instead: a 4-turn coding conversation over a sample controller "
        "(users: users_controller.py, the default; orders: orders_controller.ts), timed per turn with the "
        "prefix cache, without it, and llama-cpp-python's Llama (llama.cpp); writes session.json, "
        "session.md and session.png into --out",
    )
    p.set_defaults(func=run)


def _parser_defaults() -> dict:
    """The parser's own defaults, so --demo only fills what the user did not set."""
    return {"modes": ",".join(MODES), "out": DEFAULT_OUT}


def apply_demo(args) -> None:
    """--demo's settings, where the user left a flag at its default (idempotent)."""
    if args.demo:
        for key, value in DEMO.items():
            if getattr(args, key) in (None, _parser_defaults().get(key)):
                setattr(args, key, value)
        if args.html is None:
            args.html = args.out / "report.html"


def resolve_options(args) -> tuple[dict, BenchOptions]:
    """LLM arguments and bench options, with --quick defaults filled in (run() applied --demo's)."""
    quick = args.quick
    model = args.model or (QUICK_MODEL if quick else None)
    draft = args.draft_model or ("none" if quick else None)
    options = load_options(args, "float32" if quick else "bfloat16")
    llm_kwargs = {"model": model, "draft_model": draft, "options": options}
    max_tokens = args.max_tokens or (32 if quick else 256)
    scenarios = _csv(args.scenarios) or ((QUICK_SCENARIO,) if quick else None)
    _, chosen = load_scenarios(scenarios)  # an unknown name: one line now, not after the model loads
    opts = BenchOptions(
        max_tokens=max_tokens,
        scenarios=scenarios,
        modes=_csv(args.modes, MODES + EXTRA_MODES, "mode"),
        peers=_csv(args.peers, PEERS, "peer"),
        html_run=args.html_run,
        max_prompt_tokens=args.max_prompt_tokens or (QUICK_PROMPT_TOKENS if quick else None),
        plain_max_tokens=args.plain_max_tokens,
    )
    if not opts.modes and opts.peers == ():
        raise ValueError("nothing to run: --modes and --peers both name none")
    _check_html_run(opts.html_run, [s.name for s in chosen], opts.modes)
    return llm_kwargs, opts


def _check_html_run(html_run: str | None, scenarios: list[str], modes) -> None:
    """An --html-run that names no run of this bench is refused before the runs (it used to leave
    the HTML unwritten after all of them)."""
    if html_run is None:
        return
    scenario, _, mode = html_run.partition("/")
    if scenario not in scenarios or mode not in modes:
        runs = ", ".join(f"{s}/{m}" for s in scenarios[:2] for m in modes[:3])
        raise ValueError(f"--html-run {html_run}: not a run of this bench (scenario/mode of ours, e.g. {runs})")


def write_no_report(path: Path, why: str) -> Path:
    """The page --html gets when there is no run to show: an old report left at the path would be
    taken for this bench's."""
    from html import escape

    write_atomic(  # whole or not at all
        path,
        f'<!doctype html><html lang="en"><meta charset="utf-8"><title>specserve bench</title>'
        f"<p>specserve bench: no report: {escape(why)}</p></html>\n",
    )
    return path


def exact(env: dict) -> bool:
    """Where greedy speculation must reproduce plain decoding bit for bit: float32 on transformers,
    and llama.cpp with its batch-invariant settings (any weights). bf16 rounds by batch shape."""
    if env["backend"] == "llama.cpp":
        return bool(env.get("batch_invariant"))
    return env["dtype"] in ("float32", "fp32")


def check_bench_kind_flags(args) -> None:
    """Flags of the other kind of benchmark are refused, not ignored: `--concurrency` took --demo,
    --peers, --plain-max-tokens and --max-tokens (it sets its output with --load-max-tokens), and the
    scenario bench took --load-via and --load-max-tokens, each without a word. --html is refused with
    --concurrency too: an old report at that path would pass for this one."""
    if args.session is not None:
        return  # run_session refuses its own list
    if args.concurrency is None:
        clash = [flag for flag in ("load_via", "load_max_tokens") if getattr(args, flag) is not None]
        if clash:
            flags = ", ".join("--" + flag.replace("_", "-") for flag in clash)
            raise ValueError(f"{flags}: load benchmark flags, which need --concurrency")
        return
    given = {
        "--demo": args.demo or None,
        "--html": args.html,
        "--html-run": args.html_run,
        "--peers": args.peers,
        "--plain-max-tokens": args.plain_max_tokens,
        "--max-tokens (--load-max-tokens sets the output per request)": args.max_tokens,
    }
    clash = [flag for flag, value in given.items() if value is not None]
    if clash:
        raise ValueError(f"--concurrency runs the load benchmark: it does not take {', '.join(clash)}")


def check_one_size(args) -> None:
    """--demo and --quick together are refused: --demo filled its sizes (4096 output tokens, plain
    capped at 256, three modes, the llama.cpp peer, bench-out/demo) and --quick its model and prompt
    cut (SmolLM2-135M, no draft model, 1024 prompt tokens), so the run was neither the README's demo
    nor CI's size, and wrote over the demo's report, without a word."""
    if args.demo and args.quick:
        raise ValueError(
            "--demo and --quick are two sizes of bench (the default Qwen pair on the whole file; "
            f"{QUICK_MODEL} on a short run): give one"
        )


def run(args) -> int:
    check_model_paths(args)
    check_bench_kind_flags(args)  # before --demo fills in its own flags
    check_one_size(args)
    apply_demo(args)  # before the checks: --demo's --html is checked like any other
    with taken_back_if_empty(make_out_folder(args)):  # a later refusal left an empty --out behind
        check_outputs(args)
        return run_checked(args)


def run_checked(args) -> int:
    """run, once the flags and --out are checked: the session, load or scenario bench."""
    if args.session is not None:
        return run_session(args)
    if args.concurrency is not None:
        return run_load(args)
    require("matplotlib")  # the chart is written last: refuse before minutes of runs
    from ..llm import LLM

    llm_kwargs, opts = resolve_options(args)
    llm = LLM.from_options(
        llm_kwargs["model"], llm_kwargs["draft_model"], llm_kwargs["options"], limits=engine_limits(args)
    )
    try:
        runs, html = run_bench(llm, opts)
        interrupted = False
    except BenchInterrupted as stop:
        if not stop.runs:  # nothing measured: an earlier report in --out stays as it was
            raise
        runs, html, interrupted = stop.runs, stop.html_sink, True
    env = environment(llm, opts) | ({"interrupted": True} if interrupted else {})
    paths = write_results(runs, env, args.out)
    if args.html:
        from ..bench.report_html import write_html

        if "output" not in html:
            why = "no run of ours finished to render (check --html-run and bench.md)"
            print(f"--html: {why}; {args.html} says so", file=sys.stderr)
            paths["html"] = write_no_report(args.html, why)
        else:
            paths["html"] = write_html(
                args.html,
                llm.tokenizer,
                html["output"],
                f"specserve bench: {html['title']}",
                html_rows(html["run"]),
            )
    print(paths["markdown"].read_text())
    for line in headlines(runs):
        print(line)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}", file=sys.stderr)
    if interrupted:
        print(f"specserve: interrupted: {args.out} holds the {len(runs)} run(s) that finished", file=sys.stderr)
        return 130
    failed = [f"{r.scenario}/{r.mode}" for r in runs if r.skipped and r.skipped.startswith(FAILED)]
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)} (bench.md has their errors)", file=sys.stderr)
    bad = [r for r in runs if r.engine == "specserve" and r.equal_to_plain is False]
    if bad and exact(env):
        print(
            f"{len(bad)} speculative run(s) differ from plain greedy decoding on {env['backend']} "
            f"({env['dtype']}), where outputs must be identical: that is a bug",
            file=sys.stderr,
        )
        return 1
    return 1 if failed else 0


def run_load(args) -> int:
    """`--concurrency`: the load benchmark (bench/load.py) instead of the per-scenario one."""
    from ..bench import load as bench_load

    concurrency = bench_load.parse_concurrency(args.concurrency)  # bad values: one line, before any load
    vias = bench_load.parse_vias(args.load_via or "inproc")
    require("matplotlib", *(("httpx",) if "server" in vias else ()))
    llm_kwargs, opts = resolve_options(args)
    modes = bench_load.load_modes(opts.modes, note=args.modes != _parser_defaults()["modes"])
    limits = engine_limits(args)
    # Every C must run at once, in process and in the server alike.
    seqs = max(limits.max_num_seqs, max(concurrency))
    if limits.max_num_batched_tokens <= seqs:
        raise ValueError(f"--max-num-batched-tokens must exceed {seqs} (the largest concurrency)")
    limits = dataclasses.replace(limits, max_num_seqs=seqs)
    load_opts = bench_load.LoadBenchOptions(
        concurrency=concurrency,
        modes=modes,
        vias=vias,
        max_tokens=args.load_max_tokens or LOAD_MAX_TOKENS,
        scenarios=opts.scenarios,
        max_prompt_tokens=opts.max_prompt_tokens,
    )

    def make_llm():
        from ..llm import LLM

        return LLM.from_options(llm_kwargs["model"], llm_kwargs["draft_model"], llm_kwargs["options"], limits=limits)

    engine_args = ["--max-num-batched-tokens", str(limits.max_num_batched_tokens)]
    if limits.kv_cache_tokens:
        engine_args += ["--kv-cache-tokens", str(limits.kv_cache_tokens)]
    rows, env, paths = bench_load.run_load(
        make_llm, llm_kwargs, load_opts, opts, args.out, engine_args, max_num_seqs=limits.max_num_seqs
    )
    print(paths["markdown"].read_text())
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}", file=sys.stderr)
    if env.get("interrupted"):
        print(f"specserve: interrupted: {args.out} holds the {len(rows)} run(s) that finished", file=sys.stderr)
        return 130
    return 0


SESSION_MAX_TOKENS = 6144  # per turn: the whole file back on an edit turn (questions: session.QUESTION_TOKENS)
SESSION_CONTEXT = 16384  # three copies of a ~4k-token file and the answers (capped at the model's context)
SESSION_QUICK_PROMPT_TOKENS = 512  # --quick: the cache-off run prefills every turn's prompt in full


def run_session(args) -> int:
    """`--session`: the multi-turn session benchmark (bench/session.py) instead of the scenarios."""
    from ..bench import session as bench_session

    clash = [
        flag
        for flag, value in (
            ("--concurrency", args.concurrency),
            ("--demo", args.demo or None),
            ("--html", args.html),
            ("--html-run", args.html_run),
            ("--scenarios", args.scenarios),
            ("--plain-max-tokens", args.plain_max_tokens),
            ("--modes", None if args.modes == _parser_defaults()["modes"] else args.modes),
            ("--load-via", args.load_via),
            ("--load-max-tokens", args.load_max_tokens),
            ("--no-prefix-cache (it runs with the cache and without)", args.no_prefix_cache or None),
        )
        if value is not None
    ]
    if clash:
        raise ValueError(f"--session runs its own script: it does not take {', '.join(clash)}")
    bench_session.script(args.session)  # an unknown name: one line, before any load
    peers = _csv(args.peers, PEERS, "peer")
    if peers is not None and set(peers) - {"llama.cpp"}:
        raise ValueError("--session has one peer, llama.cpp (llama-cpp-python's Llama); use --peers llama.cpp or none")
    require("matplotlib")
    if args.max_context is None and not args.quick:
        args.max_context = SESSION_CONTEXT
    args.max_tokens = args.max_tokens or (None if args.quick else SESSION_MAX_TOKENS)
    if args.quick and args.max_prompt_tokens is None:
        args.max_prompt_tokens = SESSION_QUICK_PROMPT_TOKENS
    llm_kwargs, opts = resolve_options(args)
    limits = engine_limits(args)
    session_opts = bench_session.SessionOptions(
        script=args.session,
        max_tokens=opts.max_tokens,
        max_prompt_tokens=opts.max_prompt_tokens,
        peer=peers is None or "llama.cpp" in peers,
    )

    def make_llm(prefix_caching: bool):
        from ..llm import LLM

        return LLM.from_options(
            llm_kwargs["model"],
            llm_kwargs["draft_model"],
            llm_kwargs["options"],
            limits=dataclasses.replace(limits, prefix_caching=prefix_caching),
        )

    runs, env, paths = bench_session.bench_session(make_llm, session_opts, args.out, lambda llm: environment(llm, opts))
    print(paths["markdown"].read_text())
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}", file=sys.stderr)
    on, off = (next(r for r in runs if r.name == name) for name in bench_session.RUNS[:2])
    differ = [t.turn for t in off.turns if t.same_as_cache_on is False]
    if differ:
        print(
            f"the cache-off run's answer differs from the cache-on run's at turn {differ[0]} "
            + ("(exact settings: that is a bug)" if exact(env) else "(default kernels: rounding may differ)"),
            file=sys.stderr,
        )
        return 1 if exact(env) else 0
    return 0
