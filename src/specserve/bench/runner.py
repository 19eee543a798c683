"""The benchmark: refactor scenarios x speculation modes, against peers on the same weights.

Every scenario runs plain decoding first; every other run of that scenario is compared with it
token for token (greedy: a lossless engine must reproduce it exactly; in bf16 a difference is
located and its logit gap (both tokens against the best) is reported, so a rounding near-tie can be told
from a bug). Speed is only ever reported as a ratio to the plain run of the same scenario in
the same process: never a wall-clock number compared across machines.

Metrics per run:
  latency      wall-clock seconds of the request (prefill included)
  ttft         seconds to the first output token
  tokens/s     decode rate: tokens after the first emission / (latency - ttft)
  speedup      tokens/s over plain's tokens/s (prefill is the same work in every mode)
  e2e speedup  plain latency / latency
  vs peer      tokens/s over the peer's plain decoding on the same weights (llama-cpp-python's
               `Llama` on llama.cpp, transformers' generate otherwise), when the peer ran
  acceptance   accepted / proposed draft tokens; tokens/step: output tokens / target passes
  of prefill   tokens/s over the backend's prefill rate on the same prompt (plain run's prefill):
               on a CPU, verified tokens cannot flow faster than prompt tokens do
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from tqdm import tqdm

from ..config import SamplingParams
from ..edit import build_messages
from ..edit.files import write_atomic
from ..hardware import cpu_info
from . import pyplot
from .curves import format_curve
from .peers import (
    PEER_ENGINE,
    PEERS,
    PROMPT_LOOKUP_TOKENS,
    peer_skip_reason,
    peers_for,
    run_peer,
)

MODES = ("plain", "prediction", "ngram", "draft", "auto")
# On request only: `auto` on an edit scenario without its prediction, as a coding agent that sends the
# whole file and asks for it back (aider's "whole" format) gets it; prompt drafting stands in.
EXTRA_MODES = ("auto-no-prediction",)
METHOD = {
    "plain": "none",
    "prediction": "prediction",
    "ngram": "ngram",
    "draft": "draft",
    "auto": "auto",
    "auto-no-prediction": "auto",
}
REFERENCE_MODES = ("plain", "hf", "llama.cpp")  # plain decoding: ours and the peers'
CONTEXT_COST_AT = 2048  # cached tokens the context cost is timed at (engine.context_cost)
FAILED = "FAILED: "  # how a run that raised is marked in `skipped` (no figures; bench exits 1)
NEAR_TIE = 0.5  # logits: a bf16 logit of magnitude ~20 is rounded in steps of 0.125


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "edit": file + instruction, prediction = file; "chat": open question, no prediction
    instruction: str
    lang: str = ""
    file: str | None = None
    code: str = ""  # the file's text (edit scenarios)


@dataclass
class BenchOptions:
    max_tokens: int = 256
    scenarios: tuple[str, ...] | None = None  # None: all
    modes: tuple[str, ...] = MODES
    peers: tuple[str, ...] | None = None  # None: the peers of the backend that runs the target
    html_run: str | None = None  # "scenario/mode" to render as HTML
    max_prompt_tokens: int | None = None  # cut the file so the prompt stays under this (None: the context)
    # Cap for the slow reference runs (plain decoding): their rate is measured on the first N tokens and
    # the other runs are checked against that prefix. None: the same cap as every other run.
    plain_max_tokens: int | None = None

    def cap(self, mode: str) -> int:
        if mode in REFERENCE_MODES and self.plain_max_tokens:
            return min(self.max_tokens, self.plain_max_tokens)
        return self.max_tokens


@dataclass
class Run:
    """One measured request."""

    scenario: str
    mode: str
    engine: str  # "specserve" | "transformers" | "llama-cpp-python"
    skipped: str | None = None
    prompt_tokens: int = 0
    trimmed_lines: int = 0  # lines cut off the end of the file so prompt + max_tokens fit the context
    output_tokens: int = 0
    finish_reason: str | None = None
    latency: float = 0.0
    ttft: float | None = None
    # Output tokens per second after the first emission; None when the whole answer came in one
    # emission (nothing was timed after it, and tokens / latency would count the prefill too).
    tokens_per_second: float | None = 0.0
    acceptance_rate: float | None = None
    tokens_per_step: float | None = None
    speedup: float | None = None
    e2e_speedup: float | None = None
    vs_peer: float | None = None  # tokens_per_second / the peer's plain decoding (same scenario)
    prefill_rate: float | None = None  # ours: prompt tokens per second of prefill
    of_prefill: float | None = None  # tokens_per_second / the scenario's plain prefill rate
    equal_to_plain: bool | None = None
    first_difference: dict | None = None
    stats: dict = field(default_factory=dict)
    output_ids: list[int] = field(default_factory=list)  # ours: the tokens written (`specserve replay --bench`)


# --------------------------------------------------------------------------- scenarios


def load_scenarios(names: tuple[str, ...] | None = None) -> tuple[str, list[Scenario]]:
    """The bundled scenarios (samples/scenarios.json), optionally only those named, in that order."""
    root = resources.files("specserve.bench") / "samples"
    spec = json.loads((root / "scenarios.json").read_text(encoding="utf-8"))
    found = {}
    for s in spec["scenarios"]:
        code = (root / s["file"]).read_text(encoding="utf-8") if s.get("file") else ""
        found[s["name"]] = Scenario(s["name"], s["kind"], s["instruction"], s.get("lang", ""), s.get("file"), code)
    if names is None:
        return spec["system"], list(found.values())
    unknown = [n for n in names if n not in found]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(found)}")
    return spec["system"], [found[n] for n in names]


# The edit scenarios' prompt: `file-first`, what `specserve edit` sent from 2026-12-02 (figures in
# docs/benchmarks.md dated before then were measured with "instruction-first", to which the 1.5B
# pack answered a placeholder on the four validate and route scenarios). Since 2026-12-05 the
# tool's default (edit.DEFAULT_PROMPT, `file-first-hint`) adds a rename hint; the benchmarks keep
# `file-first`, which their figures were measured with, until the rename scenarios are measured again.
BENCH_EDIT_PROMPT = "file-first"


def scenario_messages(s: Scenario, code: str) -> list[dict]:
    return (
        build_messages(code, s.instruction, s.lang, BENCH_EDIT_PROMPT)
        if s.kind == "edit"
        else [{"role": "user", "content": s.instruction}]
    )


def build_prompt(
    llm, s: Scenario, max_tokens: int, max_prompt_tokens: int | None = None
) -> tuple[list[int], str | None, int]:
    """(prompt ids, prediction, lines trimmed): the file is cut at a line boundary so that the
    prompt + max_tokens fit the context (and the prompt fits max_prompt_tokens, if given)."""
    limit = llm.max_context - max_tokens - 1
    if max_prompt_tokens:
        limit = min(limit, max_prompt_tokens)
    lines = s.code.splitlines(True)
    lo, hi = 0, len(lines)  # binary search the most lines that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(llm.apply_chat_template(scenario_messages(s, "".join(lines[:mid])))) <= limit:
            lo = mid
        else:
            hi = mid - 1
    code = "".join(lines[:lo])
    ids = llm.apply_chat_template(scenario_messages(s, code))
    if len(ids) > limit:
        raise ValueError(f"scenario {s.name}: the prompt ({len(ids)} tokens) does not fit within {limit} tokens")
    return ids, (code if s.kind == "edit" else None), len(lines) - lo


# --------------------------------------------------------------------------- runs


class _Clock:
    """Wall-clock of one request: start, first emission (and how many tokens it carried), end."""

    def __init__(self, bar: tqdm):
        self.bar, self.t0 = bar, time.perf_counter()
        self.first: float | None = None
        self.first_tokens = 0
        self.end = self.t0

    def emitted(self, n: int) -> None:
        if n and self.first is None:
            self.first, self.first_tokens = time.perf_counter() - self.t0, n
        self.bar.update(n)

    def stop(self) -> None:
        self.end = time.perf_counter()

    @property
    def latency(self) -> float:
        return self.end - self.t0

    def decode_rate(self, n: int) -> float | None:
        """Tokens after the first emission per second after it; None when nothing came after it.

        Not n / latency: that counts the prompt's prefill as decoding, so a run whose answer came
        in one step (a prediction accepted whole) got a rate no other row's can be compared with,
        and speedups and the peer ratio from it (bench reported them before 2026-12-05)."""
        if self.first is not None and n > self.first_tokens and self.latency > self.first:
            return (n - self.first_tokens) / (self.latency - self.first)
        return None


def run_ours(llm, prompt_ids, max_tokens: int, mode: str, prediction: str | None, bar: tqdm):
    """One specserve request, streamed so the bar moves. Returns (RequestOutput, _Clock)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    pred = prediction if mode in ("prediction", "auto") else None
    clock = _Clock(bar)
    llm.engine.clear_prefix_cache()  # every run prefills its prompt, as the peers do
    gen = llm.stream(prompt_ids, params, prediction=pred, speculation=METHOD[mode])
    for event in gen:
        clock.emitted(len(event.token_ids))
    clock.stop()
    return gen.output, clock


def first_difference(llm, prompt_ids: list[int], plain: list[int], other: list[int]) -> dict | None:
    """Where `other` first departs from plain, and the target's top-2 logit gap at that position
    (computed by the backend that ran plain, as plain decoding computes it)."""
    n = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    if n == len(plain) == len(other):
        return None
    with llm.engine.scratch() as target:
        logits = target.forward(prompt_ids + plain[:n], last_only=True)[-1]  # [V]
    from ..backends.compute import on_compute_thread  # the backends package imports torch

    top = on_compute_thread(lambda: logits.topk(2))  # no torch op off that thread (backends/compute.py)
    top2_gap = gap = float(top.values[0] - top.values[1])
    tok = lambda i: llm.tokenizer.decode([i]) if i is not None else None  # noqa: E731
    a = plain[n] if n < len(plain) else None
    b = other[n] if n < len(other) else None
    pair_gap = float(logits[a] - logits[b]) if a is not None and b is not None else None  # plain's minus run's
    # A near-tie only if both tokens are near the top: a run token the target ranks far below is
    # no rounding tie, however close the top two happen to be.
    if pair_gap is not None:
        gap = max(gap, float(top.values[0]) - min(float(logits[a]), float(logits[b])))
    return {
        "position": n,
        "plain_token": a,
        "plain_text": tok(a),
        "run_token": b,
        "run_text": tok(b),
        "top2": top.indices.tolist(),
        "top2_gap": round(top2_gap, 4),
        "pair_gap": None if pair_gap is None else round(pair_gap, 4),
        "gap": round(gap, 4),  # how far below the best logit the lower of the two tokens is
        "near_tie": gap < NEAR_TIE,
    }


def _ours_run(llm, s: Scenario, mode: str, prompt_ids, prediction, trimmed, opts: BenchOptions, bar):
    out, clock = run_ours(llm, prompt_ids, opts.cap(mode), mode, prediction, bar)
    st = out.stats
    prefill = (len(prompt_ids) - 1) / st.prefill_time if st.prefill_time > 0 and len(prompt_ids) > 1 else None
    run = Run(
        s.name,
        mode,
        "specserve",
        prompt_tokens=len(prompt_ids),
        trimmed_lines=trimmed,
        output_tokens=len(out.token_ids),
        finish_reason=out.finish_reason,
        latency=clock.latency,
        ttft=clock.first,
        tokens_per_second=clock.decode_rate(len(out.token_ids)),
        acceptance_rate=st.acceptance_rate if st.proposed else None,
        tokens_per_step=st.tokens_per_step,
        prefill_rate=prefill,
        stats=st.to_dict(),
        output_ids=list(out.token_ids),
    )
    return run, out


def _peer_run(llm, s: Scenario, peer: str, prompt_ids, trimmed, opts: BenchOptions, bar) -> tuple[Run, list[int]]:
    clock = _Clock(bar)
    ids = run_peer(llm, prompt_ids, opts.cap(peer), peer, clock)
    eos = llm.engine.eos_token_ids
    finish = "stop" if ids and ids[-1] in eos else "length"
    run = Run(
        s.name,
        peer,
        PEER_ENGINE[peer],
        prompt_tokens=len(prompt_ids),
        trimmed_lines=trimmed,
        output_tokens=len(ids),
        finish_reason=finish,
        latency=clock.latency,
        ttft=clock.first,
        tokens_per_second=clock.decode_rate(len(ids)),
    )
    return run, ids


def skip_reason(llm, s: Scenario, mode: str) -> str | None:
    """Why a mode or peer cannot run for this scenario, or None."""
    if mode in PEERS:
        return peer_skip_reason(llm, mode)
    if mode == "draft" and not llm.has_draft_model:
        return "no draft model loaded"
    if mode == "prediction" and s.kind != "edit":
        return "no prediction for a chat question"
    return None


def compare(llm, run: Run, plain_run: Run, plain_ids: list[int], ids: list[int], prompt_ids) -> None:
    """Fill equality with plain, first difference and the speedups (ratios in this process)."""
    if plain_run.finish_reason == "length" and len(plain_ids) < len(ids):
        ids = ids[: len(plain_ids)]  # plain was capped (plain_max_tokens): compare the prefix it made
    run.equal_to_plain = ids == plain_ids
    if not run.equal_to_plain:
        run.first_difference = first_difference(llm, prompt_ids, plain_ids, ids)
    if plain_run.tokens_per_second and run.tokens_per_second is not None:
        run.speedup = run.tokens_per_second / plain_run.tokens_per_second
    if run.latency and run.output_tokens == plain_run.output_tokens:  # latencies of equal work only
        run.e2e_speedup = plain_run.latency / run.latency
    if plain_run.prefill_rate and run.tokens_per_second is not None:
        run.of_prefill = run.tokens_per_second / plain_run.prefill_rate


def warm_up(llm, opts: BenchOptions) -> None:
    """Pay one-time costs (kernels, allocator, lazy imports) before anything is timed."""
    ids = llm.apply_chat_template([{"role": "user", "content": "Say hi."}])
    with tqdm(disable=True) as bar:
        run_ours(llm, ids, 4, "plain", None, bar)
        for peer in opts.peers or ():
            if peer_skip_reason(llm, peer) is None:
                run_peer(llm, ids, 4, peer, _Clock(bar))


def _wants_html(opts: BenchOptions, s: Scenario, mode: str, sink: dict) -> bool:
    """The run named by html_run, else the first prediction (then auto) run; a named run wins."""
    if opts.html_run is not None:
        return opts.html_run == f"{s.name}/{mode}"
    rank = {"prediction": 2, "auto": 1}.get(mode, 0)
    if rank <= sink.get("rank", 0):
        return False
    sink["rank"] = rank
    return True


def run_scenario(llm, s: Scenario, opts: BenchOptions, outer: tqdm, html_sink: dict, runs: list[Run]) -> list[Run]:
    """Plain first (the reference), then every other mode and peer of one scenario, appended to
    `runs` as each finishes (an interrupted scenario keeps those)."""
    prompt_ids, prediction, trimmed = build_prompt(llm, s, opts.max_tokens, opts.max_prompt_tokens)
    plain_run, plain_ids = None, None
    for mode in ("plain",) + tuple(m for m in opts.modes if m != "plain") + tuple(opts.peers):
        outer.set_postfix_str(f"{s.name}/{mode}")
        reason = skip_reason(llm, s, mode)
        if reason:
            runs.append(Run(s.name, mode, PEER_ENGINE.get(mode, "specserve"), skipped=reason))
            outer.update(1)
            continue
        try:
            with tqdm(
                total=opts.cap(mode), desc=f"  {s.name}/{mode}", unit="tok", leave=False, file=sys.stderr, disable=None
            ) as bar:
                if mode in PEERS:
                    run, ids = _peer_run(llm, s, mode, prompt_ids, trimmed, opts, bar)
                else:
                    run, out = _ours_run(llm, s, mode, prompt_ids, prediction, trimmed, opts, bar)
                    ids = out.token_ids
                    if _wants_html(opts, s, mode, html_sink):
                        html_sink.update(output=out, title=f"{s.name} / {mode}", run=run)
        except Exception as e:  # noqa: BLE001 - one failed run is a row of the report, not the end of it
            if plain_run is None:
                raise  # no reference: nothing of this scenario can be compared
            error = f"{type(e).__name__}: {e}"
            print(f"{s.name}/{mode} failed: {error}", file=sys.stderr)
            runs.append(Run(s.name, mode, PEER_ENGINE.get(mode, "specserve"), skipped=FAILED + error))
            outer.update(1)
            continue
        if plain_run is None:
            plain_run, plain_ids = run, ids
        compare(llm, run, plain_run, plain_ids, ids, prompt_ids)
        if mode in opts.modes or mode in PEERS:
            runs.append(run)
        outer.update(1)
    against_peer(runs)
    return runs


PEER_PLAIN = ("llama.cpp", "hf")  # the peers' plain decoding: the reference a user already runs


def peer_plain(runs: list[Run]) -> Run | None:
    """The peer's plain-decoding run among one scenario's runs, if it ran."""
    return next((r for r in runs if r.mode in PEER_PLAIN and not r.skipped and r.tokens_per_second), None)


def against_peer(runs: list[Run]) -> None:
    """Fill vs_peer for one scenario's runs from its peer plain run, if one ran."""
    peer = peer_plain(runs)
    for r in runs:
        if peer is not None and not r.skipped and r.tokens_per_second is not None:
            r.vs_peer = r.tokens_per_second / peer.tokens_per_second


def headlines(runs: list[Run]) -> list[str]:
    """One line per speculative run that has a peer to compare with: the ratio a user would quote."""
    return [
        f"{r.scenario}/{r.mode}: {r.tokens_per_second:.1f} tok/s = {r.vs_peer:.2f}x "
        f"{peer.engine}'s plain decoding on the same weights ({cell(r.speedup, '.2f', 'x')} ours"
        + (f", {r.of_prefill:.0%} of the prefill rate" if r.of_prefill else "")
        + ")"
        for r in runs
        if r.engine == "specserve" and r.mode != "plain" and r.vs_peer
        for peer in [peer_plain([q for q in runs if q.scenario == r.scenario])]
    ]


def run_bench(llm, opts: BenchOptions) -> tuple[list[Run], dict]:
    """All selected scenarios x modes x peers. Returns (runs, html_sink) — html_sink holds the
    RequestOutput chosen for the HTML report (`output`, `title`), if any."""
    _, scenarios = load_scenarios(opts.scenarios)
    if opts.peers is None:
        opts.peers = peers_for(llm.backend_name)
    html_sink: dict = {}
    warm_up(llm, opts)
    if set(opts.modes) - set(REFERENCE_MODES):  # for `specserve replay --bench`: passes read 3-8k cached tokens
        print(f"timing passes after {CONTEXT_COST_AT} cached tokens (for the replay's projection)", file=sys.stderr)
        llm.engine.context_cost(CONTEXT_COST_AT)
    per = len(set(opts.modes) | {"plain"}) + len(opts.peers)
    runs: list[Run] = []
    with tqdm(total=per * len(scenarios), desc="bench", unit="run", file=sys.stderr, disable=None) as outer:
        for s in scenarios:
            scenario_runs: list[Run] = []
            try:
                run_scenario(llm, s, opts, outer, html_sink, scenario_runs)
            except KeyboardInterrupt:
                against_peer(scenario_runs)
                raise BenchInterrupted(runs + scenario_runs, html_sink) from None
            runs += scenario_runs
    return runs, html_sink


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl+C during the runs, carrying the runs finished before it (and the HTML sink), so that
    they are written: a 25-minute demo stopped in its last run lost every figure it had measured."""

    def __init__(self, runs: list[Run], html_sink: dict):
        super().__init__(f"interrupted after {len(runs)} run(s)")
        self.runs, self.html_sink = runs, html_sink


# --------------------------------------------------------------------------- outputs


def environment(llm, opts: BenchOptions) -> dict:
    """What ran where: backend, weights, CPU model and SIMD flags, versions, threads."""
    import torch
    import transformers

    backend = llm.target_backend
    if llm.backend_name == "llama.cpp":
        import llama_cpp

        weights, device, threads = "GGUF as is", "cuda" if backend.on_gpu else "cpu", backend.threads
        versions = {"llama_cpp_python": llama_cpp.__version__, "batch_invariant": backend.batch_invariant}
    else:
        weights, device, threads = (
            str(backend.dtype).removeprefix("torch."),
            str(backend.device),
            torch.get_num_threads(),
        )
        versions = {}
    return {
        "model": llm.model_name,
        "draft_model": llm.draft_model_name,
        "backend": llm.backend_name,
        "dtype": weights,
        "device": _named(device),
        "threads": threads,
        **cpu_info(),
        "max_tokens": opts.max_tokens,
        "plain_max_tokens": opts.plain_max_tokens,
        "max_prompt_tokens": opts.max_prompt_tokens,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        **versions,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS,
        # the pass prices the speculative runs drafted with (None: no run needed them)
        "cost_curve": format_curve(prices) if (prices := llm.engine.measured_prices) is not None else None,
        "draft_price": prices.draft if prices is not None and llm.has_draft_model else None,  # of a 1-token target pass
        "draft_agreement": prices.agreement if prices is not None else None,  # governor.measure_agreement
        # a cache cell saved to host memory and restored, in 1-token passes (the host tier's copy)
        "copy_price": prices.copy if prices is not None else None,
        "context_cost": asdict(cc) if (cc := llm.engine.measured_context_cost) is not None else None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _named(device: str) -> str:
    """The device as the report shows it: a GPU by its name ("cuda (NVIDIA H200)")."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name()})"
    return device


def cell(v, spec: str = ".2f", suffix: str = "") -> str:
    """A Markdown table cell of every bench report: the value formatted, or – when there is none."""
    return "–" if v is None else f"{v:{spec}}{suffix}"


def html_rows(r: Run) -> dict:
    """The HTML report's summary rows from the bench: its decode rate replaces the engine's
    (output tokens over the time after prefill), so that the page quotes bench.md's tok/s."""
    return {
        "output tokens/s": f"{cell(r.tokens_per_second)} (after the first token, as in bench.md)",
        "speedup vs plain": cell(r.speedup, ".2f", "x"),
    } | divergence_row(r)


def divergence_row(r: Run) -> dict:
    """The HTML report's line on how a run compares with plain decoding."""
    if r.equal_to_plain is None:
        return {}
    if r.equal_to_plain:
        return {"equal to plain decoding": "yes, token for token"}
    d = r.first_difference or {}
    kind = "a near-tie" if d.get("near_tie") else "NOT a near-tie"
    return {
        "equal to plain decoding": f"no: first difference at output token {d.get('position')} "
        f"(plain {d.get('plain_text')!r}, this run {d.get('run_text')!r}); the lower of the two "
        f"is {d.get('gap', d.get('top2_gap'))} below the target's best logit there, {kind}"
    }


def _equal_cell(r: Run) -> str:
    if r.equal_to_plain is None:
        return "–"
    if r.equal_to_plain:
        return "yes"
    d = r.first_difference or {}
    kind = "near-tie" if d.get("near_tie") else "DIFFERS"
    return f"{kind} @{d.get('position')} (gap {d.get('gap', d.get('top2_gap'))})"


def markdown_table(runs: list[Run], env: dict) -> str:
    flags = " ".join(env.get("cpu_flags") or []) or "no AVX2/AVX-512/AMX"
    head = (
        f"# specserve bench\n\ntarget `{env['model']}`, draft `{env['draft_model']}` on the "
        f"**{env.get('backend', 'transformers')}** backend ({env['dtype']}"
        + (", exact: batch-invariant kernels" if env.get("batch_invariant") else "")
        + f", {env['device']}, {env['threads']} "
        f"threads); CPU {env.get('cpu', '?')} ({flags}); max_tokens {env['max_tokens']}; torch {env['torch']}, "
        f"transformers {env['transformers']}"
        + (f", llama-cpp-python {env['llama_cpp_python']}" if env.get("llama_cpp_python") else "")
        + f"; {env['date']}\n\n"
        + (
            f"Prices: a draft-model pass costs {env['draft_price']:.2f} of a plain target step; the draft "
            f"model's greedy token is the target's on {env['draft_agreement']:.0%} of a reference passage.\n\n"
            if env.get("draft_price") is not None and env.get("draft_agreement") is not None
            else ""
        )
        + (
            "**Interrupted** (Ctrl+C): the runs below are those that finished before it; the rest did not run.\n\n"
            if env.get("interrupted")
            else ""
        )
        + (
            f"Plain decoding (ours and the peers') ran for its first {env['plain_max_tokens']} tokens only; "
            "its rate there is the reference for every ratio.\n\n"
            if env.get("plain_max_tokens") and env["plain_max_tokens"] < env["max_tokens"]
            else ""
        )
        + "| scenario | mode | engine | out tok | latency s | TTFT s | tok/s | acceptance | tok/step | speedup "
        "| vs peer plain | e2e speedup | of prefill | equal to plain |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    rows = []
    for r in runs:
        if r.skipped:
            why = r.skipped if r.skipped.startswith(FAILED) else f"skipped: {r.skipped}"
            rows.append(f"| {r.scenario} | {r.mode} | {r.engine} | {why} |||||||||||\n")
            continue
        rows.append(
            f"| {r.scenario} | {r.mode} | {r.engine} | {r.output_tokens} | {r.latency:.2f} | "
            f"{cell(r.ttft)} | {cell(r.tokens_per_second)} | {cell(r.acceptance_rate, '.1%')} | "
            f"{cell(r.tokens_per_step)} | {cell(r.speedup, '.2f', 'x')} | {cell(r.vs_peer, '.2f', 'x')} | "
            f"{cell(r.e2e_speedup, '.2f', 'x')} | "
            f"{cell(r.of_prefill, '.0%')} | {_equal_cell(r)} |\n"
        )
    return head + "".join(rows)


def chart_series(runs: list[Run]) -> tuple[list[str], dict[str, tuple[list, list]]]:
    """The chart's scenarios, and per mode its (x, speedup) and (x, tokens per step) bars.

    A figure that was not measured has no bar: a run with no rate (its answer came in one
    emission) was drawn as a 0x speedup, as if it had not decoded at all, where bench.md says '–'."""
    done = [r for r in runs if not r.skipped]
    scenarios = list(dict.fromkeys(r.scenario for r in done))
    modes = list(dict.fromkeys(r.mode for r in done))
    width = 0.8 / max(len(modes), 1)
    series = {}
    for j, mode in enumerate(modes):
        speedups, steps = [], []
        for i, s in enumerate(scenarios):
            r = next((r for r in done if r.scenario == s and r.mode == mode), None)
            x = i + (j - (len(modes) - 1) / 2) * width
            if r is not None and r.speedup is not None:
                speedups.append((x, r.speedup))
            if r is not None and r.tokens_per_step is not None:
                steps.append((x, r.tokens_per_step))
        series[mode] = (speedups, steps)
    return scenarios, series


def write_chart(runs: list[Run], path: Path) -> Path:
    """Grouped bars: decode speedup vs plain (top) and tokens per step (bottom), per scenario."""
    plt = pyplot()

    scenarios, series = chart_series(runs)
    fig, axes = plt.subplots(2, 1, figsize=(max(7, 1.6 * len(scenarios) + 3), 7), sharex=True)
    width = 0.8 / max(len(series), 1)
    for mode, (speedups, steps) in series.items():
        hatch = "//" if mode in PEERS else None
        axes[0].bar([x for x, _ in speedups], [y for _, y in speedups], width, label=mode, hatch=hatch)
        axes[1].bar([x for x, _ in steps], [y for _, y in steps], width, label=mode, hatch=hatch)
    axes[0].axhline(1.0, color="black", lw=0.8)
    axes[0].set_ylabel("decode speedup vs plain (x)")
    axes[1].set_ylabel("tokens per target pass")
    axes[1].set_xticks(range(len(scenarios)), scenarios, rotation=20, ha="right")
    axes[0].legend(ncol=4, fontsize=8)
    axes[0].set_title("specserve bench (hatched: peers; tokens/step unknown for peers)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_report(
    out: Path, stem: str, env: dict, key: str, rows: list, markdown: str, chart=None, as_dict=asdict
) -> dict[str, Path]:
    """<stem>.json ({"environment": env, key: [as_dict(row)]}), <stem>.md and, given a chart(path),
    <stem>.png in `out` (every bench report: scenarios, load, session)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    # each whole or not at all (a full disk left the earlier run's report truncated)
    write_atomic(paths["json"], json.dumps({"environment": env, key: [as_dict(r) for r in rows]}, indent=2))
    write_atomic(paths["markdown"], markdown)
    if chart is not None:
        paths["chart"] = out / f"{stem}.png"
        _save_whole(paths["chart"], chart)
    return paths


def _save_whole(path: Path, save) -> None:
    """`save(p)` into a temporary file, then written whole over `path`: an earlier chart stays whole
    when saving fails."""
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".chart-") as folder:
        tmp = Path(folder) / path.name
        save(tmp)
        write_atomic(path, tmp.read_bytes())


def write_results(runs: list[Run], env: dict, out: Path) -> dict[str, Path]:
    """bench.json, bench.md and bench.png in `out`."""
    return save_report(out, "bench", env, "runs", runs, markdown_table(runs, env), lambda p: write_chart(runs, p))
