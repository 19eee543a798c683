"""Fill-in-the-middle speed: `auto` against plain decoding on gaps cut from a source file.

    python scripts/fim_speed.py FILE [--model NAME] [--gaps 6] [--seed 1] [--max-tokens 64]

Cuts `--gaps` gaps of 1-3 lines at random from FILE (the text before a gap is the prompt, the
text after it the suffix), then for each gap runs the model's infilling prompt greedily with
`speculation="none"` and `"auto"`, twice each after one warm-up request, so that every run
reads the prompt from the prefix cache and only decoding is timed. Prints, per gap, the prompt
and answer lengths, the drafts `auto` made (source, proposed, accepted) and the ratio of the
best decoding rates (tokens per second after the first token; a rate, because the answers may
differ in length), and checks that both modes wrote the same tokens (where they do not, it reports the first
difference and the target's top-2 logit gap there, as `specserve bench` does: llama.cpp's
default kernels round a batch of another shape differently, so near-ties may go either way;
`--exact` rules that out). This is what an
editor's autocompletion asks of a server: many short answers after a long prompt.
"""

from __future__ import annotations

import argparse
import random
import statistics

from specserve import LLM, SamplingParams
from specserve.bench.runner import first_difference


def gaps(path: str, count: int, seed: int) -> list[tuple[str, str]]:
    """(prefix, suffix) for `count` gaps of 1-3 lines, at least 40 lines into the file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    if len(lines) < 80:
        raise SystemExit(f"{path}: {len(lines)} lines; the gaps need a file of 80 or more")
    rng = random.Random(seed)
    out = []
    for start in rng.sample(range(40, len(lines) - 20), count):
        n = rng.choice([1, 2, 3])
        out.append(("".join(lines[:start]), "".join(lines[start + n :])))
    return out


def decode_seconds(llm: LLM, ids: list[int], mode: str, max_tokens: int):
    out = llm.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0), speculation=mode)
    return out.stats.total_time - out.stats.prefill_time, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--model", default=None, help="pack name or folder (default: the default target)")
    ap.add_argument("--gaps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(args.model) if args.model else LLM()
    ratios = []
    for i, (prefix, suffix) in enumerate(gaps(args.file, args.gaps, args.seed)):
        ids = llm.fim_prompt_ids(prefix, suffix)
        llm.generate(ids, SamplingParams(max_tokens=1), speculation="none")  # fills the prefix cache
        times = {"none": [], "auto": []}
        outs = {}
        for mode in ("none", "auto") * 2:
            seconds, outs[mode] = decode_seconds(llm, ids, mode, args.max_tokens)
            times[mode].append(seconds)
        diff = first_difference(llm, ids, outs["none"].token_ids, outs["auto"].token_ids)
        rate = {m: (len(outs[m].token_ids) - 1) / min(times[m]) for m in times}  # the first token is the prefill's
        ratio = rate["auto"] / rate["none"]
        ratios.append(ratio)
        drafts = [(s["source"], s["proposed"], s["accepted"]) for s in outs["auto"].steps if s["proposed"]]
        answer = outs["auto"]
        print(f"gap {i}: prompt {len(ids)} tokens, answer {len(answer.token_ids)} tokens {answer.text[:60]!r}")
        print(f"  drafts (source, proposed, accepted): {drafts}")
        print(
            f"  none {1000 * min(times['none']):.0f} ms ({rate['none']:.1f} tok/s), "
            f"auto {1000 * min(times['auto']):.0f} ms ({rate['auto']:.1f} tok/s): "
            f"{ratio:.2f}x, outputs {'equal' if diff is None else 'differ'}",
            flush=True,
        )
        if diff is not None:  # the default kernels round a batch of another shape differently
            print(
                f"  first difference at token {diff['position']}: plain {diff['plain_text']!r}, auto "
                f"{diff['run_text']!r}; top-2 logit gap {diff['top2_gap']}"
                f" ({'a near-tie' if diff['near_tie'] else 'NOT a near-tie'})"
            )
    print(f"geometric mean {statistics.geometric_mean(ratios):.2f}x over {len(ratios)} gaps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
