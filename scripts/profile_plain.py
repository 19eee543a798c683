"""Where a plain decoding step's time goes, beyond llama.cpp's own `llama_decode`.

    python scripts/profile_plain.py [--model NAME] [--prompt-tokens 3000] [--max-tokens 256]

Runs one greedy plain request (speculation off) on the llama.cpp backend over a prompt of about
`--prompt-tokens` tokens (the py-rename sample file, repeated as needed), then the same prompt
and length on llama-cpp-python's own `Llama` (the peer a user compares with, sized to the run).
Every layer of our decode phase is timed from the first token to the last:

- `llama_decode`: llama.cpp's forward (the part both engines share);
- backend: filling the batch and copying the logits row out (backends/llamacpp.py);
- engine step: scheduling, sampling over the vocabulary, committing, bookkeeping (engine/core.py);
- between steps: the engine loop, detokenization and output (everything else).

Prints a table in milliseconds per generated token, and our decode rate against the peer's.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

from specserve import LLM, SamplingParams
from specserve.bench.runner import load_scenarios


class Timer:
    """Accumulated seconds of a wrapped callable, counting only calls that start once armed."""

    def __init__(self):
        self.seconds, self.calls, self.armed = 0.0, 0, False

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t, counted = time.perf_counter(), self.armed
            try:
                return fn(*args, **kwargs)
            finally:
                if counted:
                    self.seconds += time.perf_counter() - t
                    self.calls += 1

        return timed


@contextmanager
def patched(obj, name: str, timer: Timer):
    original = getattr(obj, name)
    setattr(obj, name, timer.wrap(original))
    try:
        yield
    finally:
        setattr(obj, name, original)


def prompt_ids(llm: LLM, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: a sample file (repeated) and a question about it."""
    code = load_scenarios(("py-rename",))[1][0].code
    text = code
    while len(llm.tokenizer.encode(text)) < tokens - 64:
        text += "\n\n" + code
    ids = llm.tokenizer.encode(text)[: tokens - 64]
    body = llm.tokenizer.decode(ids)
    msgs = [{"role": "user", "content": f"```python\n{body}\n```\nExplain what this code does, line by line."}]
    return llm.apply_chat_template(msgs)


def profile_ours(llm: LLM, ids: list[int], max_tokens: int) -> dict:
    import llama_cpp

    backend = llm.target_backend
    decode, fwd, step = Timer(), Timer(), Timer()
    first: list[float] = []
    last: list[float] = []

    def on_step(info) -> None:
        now = time.perf_counter()
        if info.prefilling or not info.decoding:
            return  # timed from the end of the first decoding step: prefill stays out
        if not first:
            first.append(now)
            for t in (decode, fwd, step):
                t.armed = True
        last[:] = [now]

    llm.engine.core.on_step = on_step
    with patched(llama_cpp, "llama_decode", decode), patched(backend, "forward", fwd):
        backend._ll = llama_cpp  # the module the backend calls through (now wrapped)
        with patched(llm.engine.core, "step", step):
            out = llm.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0), speculation="none")
    llm.engine.core.on_step = None
    n = max(1, step.calls)
    wall = last[0] - first[0]
    return {
        "tokens": len(out.token_ids),
        "steps": step.calls,
        "llama_decode": decode.seconds / n,
        "backend": (fwd.seconds - decode.seconds) / n,
        "engine step": (step.seconds - fwd.seconds) / n,
        "between steps": (wall - step.seconds) / n,
        "total": wall / n,
    }


class Stamps:
    """The clock `bench.peers._greedy` feeds: the time of each token."""

    def __init__(self):
        self.times: list[float] = []

    def emitted(self, n: int) -> None:
        self.times += [time.perf_counter()] * n


def profile_peer(llm: LLM, ids: list[int], max_tokens: int) -> float:
    """Seconds per token of llama-cpp-python's greedy decoding, first token to last."""
    from specserve.bench.peers import _greedy, _llama

    peer = _llama(llm, False, len(ids) + max_tokens + 1)
    peer.reset()
    stamps = Stamps()
    _greedy(peer, ids, max_tokens, llm.engine.eos_token_ids, stamps)
    return (stamps.times[-1] - stamps.times[0]) / (len(stamps.times) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompt-tokens", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--kv-cache-tokens", type=int, help="our cache size (default: the engine's)")
    a = ap.parse_args()
    llm = LLM(a.model, draft_model="none", speculation="none", backend="llama.cpp", kv_cache_tokens=a.kv_cache_tokens)
    print(llm.target_backend.describe_cache())
    ids = prompt_ids(llm, a.prompt_tokens)
    ours = profile_ours(llm, ids, a.max_tokens)
    peer = profile_peer(llm, ids, a.max_tokens)
    print(f"prompt {len(ids)} tokens, {ours['tokens']} generated in {ours['steps']} steps\n")
    print("| part | ms per token | share |")
    print("|---|---:|---:|")
    for k in ("llama_decode", "backend", "engine step", "between steps", "total"):
        print(f"| {k} | {1000 * ours[k]:.2f} | {100 * ours[k] / ours['total']:.1f}% |")
    print(f"| llama-cpp-python `Llama` (whole step) | {1000 * peer:.2f} | {100 * peer / ours['total']:.1f}% |")
    print(f"\nours {1 / ours['total']:.2f} tok/s, peer {1 / peer:.2f} tok/s: {peer / ours['total']:.3f}x the peer")


if __name__ == "__main__":
    main()
