"""Where a batch of requests spends its steps: a pass's shape against its time, then each step.

    python scripts/batch_steps.py [--model smollm2-135m-instruct] [--max-tokens 160]

Found the GPU fault of docs/gpu.md ("Flash attention, and the prefix cache's copies, on a GPU"):
the passes were quick, and a few steps took seconds outside them.

1. Pass shapes, on the backend alone: 1-16 tokens for one sequence and 1-4 tokens for each of 2-4
   sequences, after 300 cached tokens each; the median forward and `llama_decode` in ms.
2. Four chat requests through the engine, greedy: one plain, four plain, four with n-gram
   drafting (twice: the second run meets the first's prefix-cache entries). For each, tok/s, the
   mean step, the time inside `llama_decode`, and the five slowest steps. On a GPU `llama_decode`
   returns before the pass ends, so a slow step with a quick `llama_decode` is not the pass;
   profile it (cProfile around `LLM.generate`) to see what it is.
"""

from __future__ import annotations

import argparse
import statistics
import time

from specserve import SamplingParams
from specserve.backends.base import SeqInput
from specserve.llm import LLM

ASKS = (
    "Explain what a hash map is and give a short Python example.",
    "Write a Python function that checks whether a string is a palindrome.",
    "List five ways to speed up a slow SQL query.",
    "Write a bash script that counts the lines of every .py file in a folder.",
)
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (2, 1), (4, 1), (4, 2), (4, 4))  # (sequences, tokens each)


class DecodeClock:
    """Seconds and calls inside the backend's `llama_decode` (reset with `zero`)."""

    def __init__(self, backend):
        self.seconds, self.calls, real = 0.0, 0, backend._ll.llama_decode

        def timed(*args):
            t = time.perf_counter()
            try:
                return real(*args)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1

        backend._ll.llama_decode = timed

    def zero(self) -> None:
        self.seconds, self.calls = 0.0, 0


def pass_shapes(backend, clock: DecodeClock, reps: int = 30) -> None:
    seqs = [backend.new_sequence() for _ in range(4)]
    for s in seqs:
        backend.forward([SeqInput(s, list(range(100, 400)), "none")])
    print("| sequences x tokens | forward ms | llama_decode ms |\n|---|---:|---:|")
    for n, k in SHAPES:
        walls, decodes = [], []
        for _ in range(reps):
            clock.zero()
            t = time.perf_counter()
            backend.forward([SeqInput(s, [500 + i for i in range(k)], "all") for s in seqs[:n]])
            walls.append(time.perf_counter() - t)
            decodes.append(clock.seconds)
            for s in seqs[:n]:
                backend.truncate(s, 300)
        print(f"| {n} x {k} | {statistics.median(walls) * 1e3:.2f} | {statistics.median(decodes) * 1e3:.2f} |")
    for s in seqs:
        backend.free_sequence(s)


def engine_runs(llm: LLM, clock: DecodeClock, max_tokens: int) -> None:
    core = llm.engine.core
    prompts = [llm.apply_chat_template([{"role": "user", "content": a}]) for a in ASKS]
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    steps: list[tuple[float, float]] = []  # (step seconds, llama_decode seconds)
    step = core.step

    def timed_step(*args, **kwargs):
        clock.zero()
        t = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            steps.append((time.perf_counter() - t, clock.seconds))

    core.step = timed_step
    for spec, batch in (("none", prompts[:1]), ("none", prompts), ("ngram", prompts), ("ngram", prompts)):
        steps.clear()
        t = time.perf_counter()
        outs = llm.generate(batch, [params] * len(batch), speculation=spec)
        wall = time.perf_counter() - t
        n = sum(len(o.token_ids) for o in outs)
        mean = sum(s for s, _ in steps) / len(steps)
        decode = sum(d for _, d in steps) / len(steps)
        slow = ", ".join(f"{s * 1e3:.1f} ({d * 1e3:.1f})" for s, d in sorted(steps, reverse=True)[:5])
        print(
            f"{spec} x{len(batch)}: {n} tokens, {n / wall:.0f} tok/s, {len(steps)} steps of {mean * 1e3:.2f} ms "
            f"({decode * 1e3:.2f} in llama_decode); slowest ms (llama_decode): {slow}"
        )
    core.step = step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-tokens", type=int, default=160)
    a = ap.parse_args()
    llm = LLM(a.model, speculation="ngram", max_num_seqs=4, draft_model="none", backend="llama.cpp")
    backend = llm.engine.core.target
    print(f"{a.model}: {backend.kernels}; {backend.describe_cache()}; on a GPU: {backend.on_gpu}\n")
    clock = DecodeClock(backend)
    pass_shapes(backend, clock)
    print()
    engine_runs(llm, clock, a.max_tokens)


if __name__ == "__main__":
    main()
