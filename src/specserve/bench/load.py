"""`specserve bench --concurrency 1,4,16`: throughput and latency with C requests in flight at once.

For each concurrency C and each mode (plain, prediction), C requests start together (request i
takes scenario i mod the number of scenarios, so the prompts differ) and run to max_tokens with
EOS ignored, so every run does the same number of output tokens. Two paths:

  inproc  engine requests run together in this process (`llm.engine.run`), events timed in the
          engine's callback
  server  `specserve serve` started as a subprocess with the same model flags, C streaming
          /v1/completions requests sent at once from threads, SSE chunks timed as they arrive
          (each request asks for logprobs=0, only so that every chunk says how many tokens it
          carries)

Metrics per (via, mode, C):
  aggregate tok/s        all output tokens / wall time from the first submit to the last finish
  per-request tok/s p50  median over requests of the tokens after the first emission / the time
                         from the first emission to the finish (the decode rate one client sees)
  TTFT p50 / p99         seconds from submit to the first token
  ITL p50 / p99          inter-token latency: an emission of n tokens after a gap g (from the
                         previous emission of the same request) gives n samples of g / n
  acceptance             prediction mode: accepted / proposed draft tokens, summed over requests

Writes load.json, load.md (table + speedup of aggregate tok/s over C=1 per mode) and load.png.
Needs the `bench` extra: matplotlib for the chart, httpx for the server path.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from ..config import SamplingParams
from ..server.launch import ServerProcess
from . import pyplot, require
from .runner import BenchOptions, build_prompt, cell, environment, load_scenarios, save_report

LOAD_MODES = ("plain", "prediction")
VIAS = ("inproc", "server")
METHOD = {"plain": "none", "prediction": "prediction"}
SERVER_STARTUP_TIMEOUT_S = 900.0  # a real model: imports, load, maybe a download
SERVED_NAME = "specserve-bench"
WARMUP_TOKENS = 4


@dataclass
class LoadBenchOptions:
    concurrency: tuple[int, ...]
    modes: tuple[str, ...] = LOAD_MODES
    vias: tuple[str, ...] = ("inproc",)
    max_tokens: int = 128
    scenarios: tuple[str, ...] | None = None  # None: all (chat ones dropped when prediction runs)
    max_prompt_tokens: int | None = None


@dataclass
class RequestTiming:
    """One request's clock: submit, then (time, tokens) per emission that carried tokens, then finish."""

    submit: float = 0.0
    emissions: list[tuple[float, int]] = field(default_factory=list)
    finish: float | None = None
    finish_reason: str | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    proposed: int = 0
    accepted: int = 0

    def emitted(self, n: int, t: float) -> None:
        if n:
            self.emissions.append((t, n))

    @property
    def ttft(self) -> float | None:
        return self.emissions[0][0] - self.submit if self.emissions else None

    def itl_samples(self) -> list[float]:
        out = []
        for (t0, _), (t1, n) in zip(self.emissions, self.emissions[1:]):
            out.extend([(t1 - t0) / n] * n)
        return out

    def decode_rate(self) -> float | None:
        """Tokens after the first emission / seconds from the first emission to the finish."""
        if not self.emissions or self.finish is None:
            return None
        first, n_first = self.emissions[0]
        span = self.finish - first
        if span <= 0 or self.output_tokens <= n_first:
            return None
        return (self.output_tokens - n_first) / span


@dataclass
class LoadRow:
    via: str
    mode: str
    concurrency: int
    requests: int
    output_tokens: int = 0
    prompt_tokens: int = 0
    wall_s: float = 0.0
    aggregate_tok_s: float = 0.0
    per_request_tok_s_p50: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    acceptance_rate: float | None = None
    proposed: int = 0
    accepted: int = 0
    finish_reasons: dict = field(default_factory=dict)
    speedup_vs_c1: float | None = None  # aggregate tok/s over this mode and via's C=1 run
    steady_tok_s: float | None = None  # tokens/s while all C requests were decoding together
    of_prefill: float | None = None  # steady_tok_s over the backend's prefill rate (the CPU ceiling)


# --------------------------------------------------------------------------- arguments


def parse_concurrency(value: str) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16), sorted and without repeats; anything else is a one-line ValueError."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if not v.isdigit() or int(v) < 1]
    if not items or bad:
        raise ValueError(f"--concurrency takes comma-separated positive integers such as 1,4,16; got {value!r}")
    return tuple(sorted({int(v) for v in items}))


def parse_vias(value: str) -> tuple[str, ...]:
    if value == "both":
        return VIAS
    if value not in VIAS:
        raise ValueError(f"--load-via must be inproc, server or both; got {value!r}")
    return (value,)


def load_modes(modes: tuple[str, ...], note: bool = True) -> tuple[str, ...]:
    """The modes the load benchmark runs (plain, prediction); notes the others it ignores (if `note`)."""
    kept = tuple(m for m in LOAD_MODES if m in modes)
    ignored = [m for m in modes if m not in LOAD_MODES]
    if not kept:
        raise ValueError(f"the load benchmark (--concurrency) runs modes {', '.join(LOAD_MODES)}; --modes has neither")
    if ignored and note:
        print(
            f"note: --concurrency runs only {', '.join(kept)}; ignoring mode(s) {', '.join(ignored)}", file=sys.stderr
        )
    return kept


# --------------------------------------------------------------------------- prompts


@dataclass
class Prompt:
    scenario: str
    ids: list[int]
    prediction: str | None


def load_prompts(llm, opts: LoadBenchOptions) -> list[Prompt]:
    """One prompt per scenario; only edit scenarios (the ones with a prediction) when prediction runs,
    so that both modes run the same prompts."""
    _, scenarios = load_scenarios(opts.scenarios)
    if "prediction" in opts.modes:
        chat = [s.name for s in scenarios if s.kind != "edit"]
        scenarios = [s for s in scenarios if s.kind == "edit"]
        if not scenarios:
            raise ValueError(
                "prediction mode needs an edit scenario (chat scenarios have no prediction); "
                "pick one with --scenarios, or run --modes plain"
            )
        if chat:
            print(f"note: prediction runs: leaving out chat scenario(s) {', '.join(chat)}", file=sys.stderr)
    prompts = []
    for s in scenarios:
        ids, prediction, _ = build_prompt(llm, s, opts.max_tokens, opts.max_prompt_tokens)
        prompts.append(Prompt(s.name, ids, prediction))
    return prompts


def prompt_for(prompts: list[Prompt], i: int) -> Prompt:
    return prompts[i % len(prompts)]


# --------------------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(via: str, mode: str, concurrency: int, timings: list[RequestTiming]) -> LoadRow:
    start = min(t.submit for t in timings)
    end = max(t.finish if t.finish is not None else t.submit for t in timings)
    wall = end - start
    out_tokens = sum(t.output_tokens for t in timings)
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    itls = [x for t in timings for x in t.itl_samples()]
    rates = [r for r in (t.decode_rate() for t in timings) if r is not None]
    proposed, accepted = sum(t.proposed for t in timings), sum(t.accepted for t in timings)
    return LoadRow(
        via,
        mode,
        concurrency,
        len(timings),
        output_tokens=out_tokens,
        prompt_tokens=sum(t.prompt_tokens for t in timings),
        wall_s=wall,
        aggregate_tok_s=out_tokens / wall if wall > 0 else 0.0,
        per_request_tok_s_p50=percentile(rates, 50),
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=percentile(ttfts, 99),
        itl_p50=percentile(itls, 50),
        itl_p99=percentile(itls, 99),
        acceptance_rate=accepted / proposed if mode == "prediction" and proposed else None,
        proposed=proposed,
        accepted=accepted,
        finish_reasons=dict(Counter(t.finish_reason for t in timings)),
        steady_tok_s=steady_rate(timings),
    )


def steady_rate(timings: list[RequestTiming]) -> float | None:
    """Tokens per second emitted in the window where every request was decoding: from the last
    first token to the first finish (prefill and the tail of stragglers left out)."""
    firsts = [t.emissions[0][0] for t in timings if t.emissions]
    ends = [t.finish for t in timings if t.finish is not None]
    if len(firsts) < len(timings) or not ends:
        return None
    lo, hi = max(firsts), min(ends)
    tokens = sum(n for t in timings for when, n in t.emissions if lo < when <= hi)
    return tokens / (hi - lo) if hi > lo and tokens else None


def measure_prefill_rate(llm, tokens: int = 512, repeats: int = 2) -> float:
    """The backend's own prefill rate (tokens/s of one `tokens`-token pass after a 256-token
    context, best of `repeats`): the ceiling for batched tokens on a CPU."""
    import time

    best = 0.0
    tokens = min(tokens, llm.max_context // 2)
    context = min(256, llm.max_context // 4)
    with llm.engine.scratch() as runner:
        for _ in range(repeats):
            runner.reset()
            runner.forward([1] * context, last_only=True)
            t = time.perf_counter()
            runner.forward([1] * tokens, last_only=True)
            best = max(best, tokens / (time.perf_counter() - t))
        runner.reset()
    return best


def add_ceiling(rows: list[LoadRow], prefill_rate: float | None) -> None:
    if prefill_rate:
        for r in rows:
            r.of_prefill = r.steady_tok_s / prefill_rate if r.steady_tok_s else None


def add_speedups(rows: list[LoadRow]) -> None:
    """speedup_vs_c1: aggregate tok/s over the C=1 run of the same via and mode (when one ran)."""
    for r in rows:
        base = next((b for b in rows if b.via == r.via and b.mode == r.mode and b.concurrency == 1), None)
        if base is not None and base.aggregate_tok_s > 0:
            r.speedup_vs_c1 = r.aggregate_tok_s / base.aggregate_tok_s


# --------------------------------------------------------------------------- in process


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run_inproc(llm, prompts: list[Prompt], mode: str, concurrency: int, max_tokens: int) -> list[RequestTiming]:
    """C engine requests added together and stepped until all finish; events timed in the callback."""
    timings = [RequestTiming() for _ in range(concurrency)]
    by_request: dict[int, RequestTiming] = {}

    def on_event(req, event) -> None:
        t = time.perf_counter()
        clock = by_request[id(req)]
        clock.emitted(len(event.token_ids), t)
        if event.finish_reason is not None:
            clock.finish, clock.finish_reason = t, event.finish_reason

    reqs = []
    for i in range(concurrency):
        p = prompt_for(prompts, i)
        req = llm.request(
            p.ids,
            _params(max_tokens),
            prediction=p.prediction if mode == "prediction" else None,
            speculation=METHOD[mode],
            on_event=on_event,
        )
        by_request[id(req)] = timings[i]
        timings[i].prompt_tokens = len(p.ids)
        reqs.append(req)
    llm.engine.clear_prefix_cache()  # each run starts cold (requests within it may share prefixes)
    start = time.perf_counter()
    for t in timings:
        t.submit = start
    outputs = llm.engine.run(reqs)
    end = time.perf_counter()
    for t, out in zip(timings, outputs):
        t.output_tokens = len(out.token_ids)
        t.proposed, t.accepted = out.stats.proposed, out.stats.accepted
        t.finish = t.finish if t.finish is not None else end
        t.finish_reason = t.finish_reason or out.finish_reason
    return timings


def warm_up_inproc(llm, prompts: list[Prompt], modes: tuple[str, ...], concurrency: int) -> None:
    """Pay one-time costs before timing: kernels, the engine's measured prices, a short batch per mode."""
    if concurrency > 1:
        llm.engine.prices()
    for mode in modes:
        run_inproc(llm, prompts, mode, min(concurrency, 2), WARMUP_TOKENS)


# --------------------------------------------------------------------------- through the server


def server_model_args(llm, llm_kwargs: dict) -> list[str]:
    """`specserve serve` flags that load what the in-process LLM loaded, the way it was loaded."""
    options = llm_kwargs["options"]
    args = []
    if llm_kwargs.get("model"):
        args += ["--model", str(llm_kwargs["model"])]
    if llm_kwargs.get("draft_model"):
        args += ["--draft-model", str(llm_kwargs["draft_model"])]
    if llm.backend_name == "transformers":
        args += ["--backend", "transformers", "--dtype", options.dtype or options.default_dtype]
        device = getattr(llm.target_backend, "device", None)
        if options.device or device is not None:
            args += ["--device", str(options.device or getattr(device, "type", device))]
    else:
        args += ["--backend", llm.backend_name]
        if options.threads:
            args += ["--threads", str(options.threads)]
        if options.exact:
            args += ["--exact"]
    if options.max_context:
        args += ["--max-context", str(options.max_context)]
    return args


def bench_server(
    model_args: list[str],
    max_num_seqs: int,
    log_path: Path,
    engine_args: list[str] = (),
    startup_timeout: float = SERVER_STARTUP_TIMEOUT_S,
) -> ServerProcess:
    """`specserve serve` for the load runs: the in-process run's model and engine flags, no request timeout,
    a queue deep enough for every request at once; its log in `log_path`."""
    args = [
        *model_args,
        "--max-num-seqs",
        str(max_num_seqs),
        *engine_args,
        "--max-queue",
        str(max(1024, 4 * max_num_seqs)),
        "--request-timeout",
        "0",
        "--served-model-name",
        SERVED_NAME,
        "--log-level",
        "warning",
    ]
    return ServerProcess(args, log_path=log_path, startup_timeout=startup_timeout, stop_timeout=30.0)


def completion_body(p: Prompt, mode: str, max_tokens: int) -> dict:
    body = {
        "model": SERVED_NAME,
        "prompt": p.ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "logprobs": 0,
        "speculation": {"method": METHOD[mode]},
    }
    if mode == "prediction" and p.prediction is not None:
        body["prediction"] = {"type": "content", "content": p.prediction}
    return body


def _stream_one(client, url: str, body: dict, clock: RequestTiming, barrier: threading.Barrier) -> None:
    barrier.wait()
    clock.submit = time.perf_counter()
    with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"the benchmark server answered {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            t = time.perf_counter()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"the benchmark server failed a request: {chunk['error'].get('message')}")
            for choice in chunk.get("choices") or ():
                lps = choice.get("logprobs") or {}
                n = len(lps.get("tokens") or ())
                clock.emitted(n, t)
                if choice.get("finish_reason"):
                    clock.finish, clock.finish_reason = t, choice["finish_reason"]
            spec = chunk.get("speculation")
            if isinstance(spec, dict):
                clock.output_tokens = spec.get("output_tokens", clock.output_tokens)
                clock.prompt_tokens = spec.get("prompt_tokens", clock.prompt_tokens)
                clock.proposed, clock.accepted = spec.get("proposed", 0), spec.get("accepted", 0)
    if clock.finish is None:
        clock.finish = time.perf_counter()
    if not clock.output_tokens:
        clock.output_tokens = sum(n for _, n in clock.emissions)


def run_server(url: str, prompts: list[Prompt], mode: str, concurrency: int, max_tokens: int) -> list[RequestTiming]:
    """C streaming /v1/completions requests released together from C threads."""
    import httpx  # the `bench` extra; run_load checked it is there before loading anything

    timings = [RequestTiming() for _ in range(concurrency)]
    barrier = threading.Barrier(concurrency)
    errors: list[BaseException] = []
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    with httpx.Client(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:

        def work(i: int) -> None:
            try:
                _stream_one(
                    client,
                    f"{url}/v1/completions",
                    completion_body(prompt_for(prompts, i), mode, max_tokens),
                    timings[i],
                    barrier,
                )
            except BaseException as e:  # noqa: BLE001 - reported below, on the calling thread
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return timings


def warm_up_server(url: str, prompts: list[Prompt], modes: tuple[str, ...], concurrency: int) -> None:
    for mode in modes:
        run_server(url, prompts, mode, min(concurrency, 2), WARMUP_TOKENS)


# --------------------------------------------------------------------------- outputs


def _ms(v) -> str:
    return "–" if v is None else f"{v * 1000:.1f}"


def markdown(rows: list[LoadRow], env: dict) -> str:
    head = (
        f"# specserve bench: load\n\ntarget `{env.get('model')}`, draft `{env.get('draft_model')}` on the "
        f"**{env.get('backend')}** backend ({env.get('dtype')}, {env.get('device')}, {env.get('threads')} "
        f"threads); CPU {env.get('cpu', '?')}; {env.get('load_max_tokens')} output tokens per request "
        f"(EOS ignored); the backend's prefill rate (one 512-token pass): {env.get('prefill_tok_s')} tok/s; "
        f"{env.get('date', '')}\n\n"
        + (
            "**Interrupted** (Ctrl+C): the rows below are the runs that finished before it.\n\n"
            if env.get("interrupted")
            else ""
        )
        + "*steady tok/s*: tokens per second while all C requests decode together (from the last first "
        "token to the first finish); *of prefill*: that over the prefill rate, the ceiling on a CPU.\n\n"
        "| via | mode | C | out tok | wall s | aggregate tok/s | per-request tok/s p50 | TTFT p50 ms "
        "| TTFT p99 ms | ITL p50 ms | ITL p99 ms | acceptance | vs C=1 | steady tok/s | of prefill |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {r.via} | {r.mode} | {r.concurrency} | {r.output_tokens} | {r.wall_s:.2f} | {r.aggregate_tok_s:.1f} | "
        f"{cell(r.per_request_tok_s_p50, '.1f')} | {_ms(r.ttft_p50)} | {_ms(r.ttft_p99)} | {_ms(r.itl_p50)} | "
        f"{_ms(r.itl_p99)} | {cell(r.acceptance_rate, '.1%')} | "
        f"{'–' if r.speedup_vs_c1 is None else f'{r.speedup_vs_c1:.2f}x'} | {cell(r.steady_tok_s, '.1f')} | "
        f"{cell(r.of_prefill, '.0%')} |\n"
        for r in rows
    )
    lines = []
    for via, mode in dict.fromkeys((r.via, r.mode) for r in rows):
        mine = [r for r in rows if r.via == via and r.mode == mode]
        parts = [f"{r.speedup_vs_c1:.2f}x at C={r.concurrency}" for r in mine if r.speedup_vs_c1 is not None]
        if parts:
            lines.append(f"- {mode} ({via}): aggregate tok/s vs C=1: {', '.join(parts)}\n")
        else:
            lines.append(f"- {mode} ({via}): no C=1 run to compare with\n")
    return head + body + "\n" + "".join(lines)


def chart_series(rows: list[LoadRow]) -> dict[str, tuple[list, list]]:
    """Per mode and via, its (C, aggregate tok/s) and (C, per-request tok/s p50) points. A rate
    that was not measured has no point: a run whose answers each came in one emission was drawn
    at 0 tok/s, where load.md says –."""
    series = {}
    for via, mode in dict.fromkeys((r.via, r.mode) for r in rows):
        mine = sorted((r for r in rows if r.via == via and r.mode == mode), key=lambda r: r.concurrency)
        series[f"{mode} ({via})"] = (
            [(r.concurrency, r.aggregate_tok_s) for r in mine],
            [(r.concurrency, r.per_request_tok_s_p50) for r in mine if r.per_request_tok_s_p50 is not None],
        )
    return series


def write_chart(rows: list[LoadRow], path: Path) -> Path:
    """Aggregate tok/s (top) and per-request tok/s p50 (bottom) vs concurrency, a line per mode/via."""
    plt = pyplot()

    fig, axes = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    cs = sorted({r.concurrency for r in rows})
    for label, (aggregate, per_request) in chart_series(rows).items():
        style = "--" if label.endswith("(server)") else "-"
        for ax, points in zip(axes, (aggregate, per_request)):
            ax.plot([c for c, _ in points], [v for _, v in points], style, marker="o", label=label)
    if len(cs) > 1 and cs[-1] / cs[0] >= 4:
        axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(cs, [str(c) for c in cs])
    axes[1].set_xlabel("concurrent requests")
    axes[0].set_ylabel("aggregate output tok/s")
    axes[1].set_ylabel("per-request tok/s (p50)")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    axes[0].set_title("specserve bench --concurrency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_results(rows: list[LoadRow], env: dict, out: Path) -> dict[str, Path]:
    """load.json, load.md and load.png in `out`."""
    return save_report(out, "load", env, "rows", rows, markdown(rows, env), lambda p: write_chart(rows, p))


# --------------------------------------------------------------------------- driver


def _release_memory() -> None:
    """After the in-process model is dropped: give its memory back before the server loads its own copy."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort
        pass


def _run_all(held: list, llm_kwargs, prompts, opts: LoadBenchOptions, out: Path, engine_args, seqs: int, rows: list):
    """Every (via, mode, C), in process then through the server, appending a row as each ends.
    held: [the in-process LLM], emptied before the server starts so that its memory is freed."""
    total = len(opts.vias) * len(opts.modes) * len(opts.concurrency)
    top = max(opts.concurrency)
    with tqdm(total=total, desc="load", unit="run", file=sys.stderr, disable=None) as bar:
        if "inproc" in opts.vias:
            warm_up_inproc(held[0], prompts, opts.modes, top)
            for mode in opts.modes:
                for c in opts.concurrency:
                    bar.set_postfix_str(f"inproc/{mode}/C={c}")
                    timings = run_inproc(held[0], prompts, mode, c, opts.max_tokens)
                    rows.append(summarize("inproc", mode, c, timings))
                    bar.update(1)
        if "server" in opts.vias:
            model_args = server_model_args(held[0], llm_kwargs)
            held.clear()
            _release_memory()
            bar.set_postfix_str("starting the server")
            with bench_server(model_args, seqs, out / "server.log", engine_args) as srv:
                warm_up_server(srv.url, prompts, opts.modes, top)
                for mode in opts.modes:
                    for c in opts.concurrency:
                        bar.set_postfix_str(f"server/{mode}/C={c}")
                        rows.append(
                            summarize("server", mode, c, run_server(srv.url, prompts, mode, c, opts.max_tokens))
                        )
                        bar.update(1)


def run_load(
    llm_factory,
    llm_kwargs: dict,
    opts: LoadBenchOptions,
    bench_opts: BenchOptions,
    out: Path,
    engine_args: list[str] = (),
    max_num_seqs: int | None = None,
) -> tuple[list[LoadRow], dict, dict[str, Path]]:
    """Build prompts, run every (via, mode, C), write load.json / load.md / load.png into `out`.

    llm_factory(): the in-process LLM (it must allow max(concurrency) sequences). The server gets
    --max-num-seqs max_num_seqs (default: max(concurrency)) and engine_args (KV cache, batched
    tokens), so that both paths batch alike. llm_kwargs: model, draft_model and the LoadOptions
    the LLM was built from, turned into the server's model flags."""
    require("matplotlib", *(("httpx",) if "server" in opts.vias else ()))  # before minutes of runs
    llm = llm_factory()
    prompts = load_prompts(llm, opts)
    env = environment(
        llm, dataclasses.replace(bench_opts, max_tokens=opts.max_tokens, max_prompt_tokens=opts.max_prompt_tokens)
    )
    env.update(
        load_max_tokens=opts.max_tokens,
        concurrency=list(opts.concurrency),
        load_via=list(opts.vias),
        load_modes=list(opts.modes),
        scenarios=[p.scenario for p in prompts],
        prompt_tokens=[len(p.ids) for p in prompts],
    )
    top = max(opts.concurrency)
    env["max_num_seqs"] = max_num_seqs or top
    env["prefill_tok_s"] = round(measure_prefill_rate(llm), 1)
    rows: list[LoadRow] = []
    held = [llm]
    del llm  # held alone keeps it: the server path frees it before the server loads its own
    try:
        _run_all(held, llm_kwargs, prompts, opts, out, list(engine_args), max_num_seqs or top, rows)
    except KeyboardInterrupt:  # the rows measured before Ctrl+C are written (they were lost)
        if not rows:
            raise
        env["interrupted"] = True
    add_speedups(rows)
    add_ceiling(rows, env["prefill_tok_s"])
    return rows, env, write_results(rows, env, out)


__all__ = [
    "LoadBenchOptions",
    "LoadRow",
    "RequestTiming",
    "parse_concurrency",
    "parse_vias",
    "run_load",
    "percentile",
    "summarize",
]
