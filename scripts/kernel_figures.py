"""What llama.cpp's kernel choices cost: prefill, verification passes and decoding, per setting.

    python scripts/kernel_figures.py MODEL [--context 2048] [--threads N] [--repeats 3]

MODEL is a pack name (`specserve models`) or a GGUF path. Each setting runs in its own child
process, because ggml reads its kernel switches once per process:
- `default`: the kernels the default mode runs (llamafile's sgemm on);
- `no sgemm`: the same with GGML_CPU_LLAMAFILE=0 (what our builds before the switch ran);
- `exact`: the batch-invariant kernels of `--exact`.
The settings alternate over `--repeats` rounds and the best figure of each is kept, so a
passing load on a shared machine hurts every setting alike. Figures: tokens/s of a
`--context`-token prefill (one request, 512-token micro-batches), then with that context
cached, one pass of 128 and of 8 tokens, and one-token decoding steps (median of 16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "default": ({"GGML_CPU_LLAMAFILE": "1"}, False),
    "no sgemm": ({"GGML_CPU_LLAMAFILE": "0"}, False),
    "exact": ({}, True),
}


def measure(model: str, context: int, threads: int | None, exact: bool) -> dict[str, float]:
    """Tokens/s of each pass, in this process (its kernel switches are already set)."""
    from specserve.backends import SeqInput
    from specserve.backends.llamacpp import LlamaCppBackend
    from specserve.models.packs import resolve_model

    src = resolve_model(model)
    path = Path(src.path) / src.gguf_file if src.gguf_file else Path(src.path)
    b = LlamaCppBackend(path, max_context=context + 256, threads=threads, batch_invariant=exact)
    seq = b.new_sequence()
    ids = [(i * 7919) % 20000 + 100 for i in range(context + 128)]  # varied ids; timing only

    def run(tokens: list[int]) -> float:
        t = time.perf_counter()
        b.forward([SeqInput(seq, tokens, logits="last")])
        return time.perf_counter() - t

    out = {"prefill": context / run(ids[:context])}
    for n in (128, 8):
        out[f"pass {n}"] = n / run(ids[context : context + n])
        b.truncate(seq, context)
    steps = []
    for i in range(16):
        steps.append(run([ids[context + i]]))
    out["decode"] = 1 / statistics.median(steps)
    b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.model, a.context, a.threads, SETTINGS[a.child][1])))
        return
    best: dict[str, dict[str, float]] = {}
    for _ in range(a.repeats):
        for name, (env, _exact) in SETTINGS.items():
            child_env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_")} | env
            cmd = [sys.executable, __file__, a.model, "--context", str(a.context), "--child", name]
            cmd += ["--threads", str(a.threads)] if a.threads else []
            r = subprocess.run(cmd, capture_output=True, text=True, env=child_env)
            if r.returncode:
                sys.exit(f"{name}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            got = json.loads(r.stdout.strip().splitlines()[-1])
            best[name] = {k: max(v, best.get(name, {}).get(k, 0.0)) for k, v in got.items()}
    cols = list(next(iter(best.values())))
    print(f"| kernels | {' | '.join(cols)} |")
    print("|---|" + "---:|" * len(cols))
    for name, row in best.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.1f} tok/s" for c in cols) + " |")


if __name__ == "__main__":
    main()
