"""How often does a seeded sampled token continued from the prefix cache differ from a cold run's?

On float32 transformers a CPU's matmuls round with a pass's length, so the row after a reused
prefix differs from the cold row by rounding (docs/design.md, Prefix caching: Exactness). A seeded
token differs where its position's number u lies between the two rows' cumulative edges of some
token. For each of N prompts this runs turn 1 (sharing a random prefix of at least one block with
the prompt) on an engine with the prefix cache, then the prompt greedily on it and on one without
the cache, and for every row along the common answer reports the measure of u for which
`sample_at` picks different tokens from the two rows (the chance a seeded token parts there), per
temperature, with the rows' largest logit difference and the smallest greedy top-2 gap.

    PYTHONPATH=src python scripts/sampled_divergence.py path/to/smollm2-135m-instruct --n 12
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch

from specserve import LLM, SamplingParams
from specserve.backends.recording import record_rows
from specserve.config import EngineLimits
from specserve.engine.sampling import probs_from_logits

TEXTS = [
    "def add(a, b):\n    return a + b\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n",
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a faraway land, there lived",
    "import os\nimport sys\n\nfor name in os.listdir('.'):\n    print(name, os.path.getsize(name))\n",
    "Write a short poem about the sea and the wind, and the ships that sail between the",
    "Question: What is the capital of France? Answer: The capital of France is Paris. Question: What",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name; -- list the older users first and then",
]
TEMPERATURES = [0.3, 0.7, 0.8, 1.0, 1.3, 2.0]


def parting_measure(warm: torch.Tensor, cold: torch.Tensor, temperature: float) -> float:
    """The length of the set of u in [0, 1) for which sample_at picks different tokens from the
    two rows: the union of the intervals between each token's two cumulative edges."""
    params = SamplingParams(temperature=temperature)
    edges = []
    for row in (warm, cold):
        c = probs_from_logits(row[None], params)[0].double().cumsum(0)
        edges.append((c / c[-1]).numpy())
    lo, hi = np.minimum(*edges), np.maximum(*edges)
    order = np.argsort(lo)
    total, end = 0.0, 0.0
    for a, b in zip(lo[order], hi[order]):
        a = max(a, end)
        if b > a:
            total, end = total + (b - a), b
    return total


def conversation(warm: LLM, cold: LLM, rng: random.Random, rows: tuple[list, list], max_tokens: int):
    """Turn 1 on the warm engine, then the prompt on both; the rows of the common answer."""
    prompt = warm.encode(rng.choice(TEXTS) + rng.choice(TEXTS))
    cut = rng.randint(16, len(prompt) - 2)
    warm.engine.clear_prefix_cache()
    warm.generate(prompt[:cut] + warm.encode(rng.choice(TEXTS))[: rng.randint(1, 20)], SamplingParams(max_tokens=2))
    for r in rows:
        r.clear()
    greedy = SamplingParams(max_tokens=max_tokens)
    w, c = warm.generate(prompt, greedy), cold.generate(prompt, greedy)
    same = next((j for j, (a, b) in enumerate(zip(w.token_ids, c.token_ids)) if a != b), len(c.token_ids) - 1)
    return w.cached_tokens, list(zip(rows[0][: same + 1], rows[1][: same + 1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an HF folder (the SmolLM2 pack folder holds model.safetensors)")
    ap.add_argument("--n", type=int, default=12, help="prompts")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()

    def engine(caching: bool) -> LLM:
        limits = EngineLimits(max_num_seqs=1, prefix_caching=caching)
        return LLM(model=args.model, dtype="float32", speculation="none", limits=limits)

    warm, cold = engine(True), engine(False)
    rows, rng = (record_rows(warm.engine.core.target), record_rows(cold.engine.core.target)), random.Random(args.seed)
    pairs, reused = [], []
    for _ in range(args.n):
        cached, common = conversation(warm, cold, rng, rows, args.max_tokens)
        pairs += common
        reused.append(cached)
    diffs = [float((w - c).abs().max()) for w, c in pairs]
    gaps = [float(g[0] - g[1]) for g in (torch.topk(c, 2).values for _, c in pairs)]
    print(f"{len(pairs)} rows, {min(reused)}-{max(reused)} reused tokens")
    print(f"largest logit difference {max(diffs):.2g}, median {np.median(diffs):.2g}")
    print(f"smallest greedy top-2 gap {min(gaps):.3g}")
    for t in TEMPERATURES:
        m = [parting_measure(w, c, t) for w, c in pairs]
        print(f"T = {t}: chance a seeded token parts, mean {np.mean(m):.2g} per token (largest {max(m):.2g})")


if __name__ == "__main__":
    main()
