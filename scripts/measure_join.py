"""How much a long prompt joining a running batch slows the running streams (issue 9 target:
a 4k-token prompt joining 8 streams at most doubles their inter-token latency p99).

    .venv/bin/python scripts/measure_join.py [--model qwen2.5-coder-1.5b-instruct] [--streams 8] [--prompt-tokens 4096]

Starts N plain streams, measures their inter-token gaps for a while, then submits the long
prompt and measures the gaps while it is prefilled; prints p50/p99 before and during.
"""

from __future__ import annotations

import argparse
import statistics
import time

from specserve import LLM, SamplingParams


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * (len(xs) - 1) + 0.5))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--warm-steps", type=int, default=15)
    args = ap.parse_args()
    llm = LLM(args.model, "none", max_num_seqs=args.streams + 1, max_context=args.prompt_tokens + 64)
    from importlib import resources

    text = (resources.files("specserve.bench") / "samples" / "users_controller.py").read_text()
    ids = llm.encode(text * 4)
    gaps: dict[str, list[float]] = {"before": [], "during": []}
    phase = {"now": "before"}
    last: dict[int, float] = {}

    def on_event(req, event):
        t = time.perf_counter()
        if event.token_ids and req.id in last:
            gaps[phase["now"]].extend([(t - last[req.id]) / len(event.token_ids)] * len(event.token_ids))
        last[req.id] = t

    core = llm.engine.core
    params = SamplingParams(max_tokens=4000, ignore_eos=True)
    streams = [
        llm.request(ids[i * 50 : i * 50 + 40], params, speculation="none", on_event=on_event)
        for i in range(args.streams)
    ]
    for r in streams:
        core.add(r)
    steps = 0
    while steps < args.warm_steps + 3:
        core.step()
        steps += 1
    gaps["before"] = gaps["before"][args.streams * 3 :]  # drop the ramp-up
    long = llm.request(ids[: args.prompt_tokens], SamplingParams(max_tokens=1), speculation="none")
    core.add(long)
    phase["now"] = "during"
    t0 = time.perf_counter()
    while not long.finished:
        core.step()
    prefill_s = time.perf_counter() - t0
    for r in streams:
        r.should_cancel = lambda: True
    while core.has_work():
        core.step()
    b, d = gaps["before"], gaps["during"]
    print(f"{args.model}, {args.streams} streams, a {args.prompt_tokens}-token prompt joins:")
    print(f"  inter-token latency before: p50 {statistics.median(b) * 1000:.0f} ms, p99 {p99(b) * 1000:.0f} ms")
    print(
        f"  while it is prefilled:      p50 {statistics.median(d) * 1000:.0f} ms, p99 {p99(d) * 1000:.0f} ms "
        f"(p99 x{p99(d) / p99(b):.2f})"
    )
    print(f"  its prefill took {prefill_s:.1f} s ({args.prompt_tokens / prefill_s:.0f} tok/s while sharing steps)")


if __name__ == "__main__":
    main()
