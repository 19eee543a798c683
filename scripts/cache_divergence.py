"""How often does a turn continued from the prefix cache answer differently from a cold one? (issue 16, item 7)

A cached prefix holds the keys and values a cold prefill computed for those tokens. The turn that
continues from it prefills only its new tokens, so its prefill passes have other shapes than the
cold run's; with batch-invariant kernels (`--exact` on llama.cpp, float32 on transformers) that
changes nothing, and the tests check it. On llama.cpp's default kernels a matrix product may round
differently with the number of rows, so a greedy answer can move where two tokens are nearly tied.
This measures how often, over N two-turn conversations about real source files:

  turn 1   the file (an excerpt of a CPython standard-library module) and a question, from a cold cache
  turn 2   turn 1's messages and answer re-sent with a follow-up question, run twice: continued from
           turn 1's cached prefix (as the server does), and from a cleared cache (as a cold server does)

and reports the share of turn-2 answers whose token ids differ, with where they first differ.

    PYTHONPATH=src python scripts/cache_divergence.py smollm2-135m-instruct --n 40
    PYTHONPATH=src python scripts/cache_divergence.py smollm2-135m-instruct --n 40 --exact   # expect 0
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

from specserve import LLM, SamplingParams
from specserve.engine.prefix_cache import common_prefix

MODULES = [  # plain-Python standard-library modules, in a fixed order
    "colorsys.py", "heapq.py", "textwrap.py", "genericpath.py", "linecache.py", "copy.py",
    "getopt.py", "quopri.py", "bisect.py", "fnmatch.py", "shlex.py", "glob.py", "keyword.py",
    "numbers.py", "operator.py", "queue.py", "sched.py", "stat.py", "string.py", "tabnanny.py",
]  # fmt: skip
QUESTIONS = [
    ("What does the first function do?", "Which edge cases does it miss?"),
    ("Summarise this module in three sentences.", "Which function would you test first, and why?"),
    ("List the public functions and their arguments.", "Add type hints to the first one."),
    ("Is there any duplicated code here?", "Show how you would remove it."),
]
SYSTEM = "You are a coding assistant. Answer briefly."


def excerpt(module: str, max_chars: int) -> str:
    """The module's first lines, whole, up to max_chars characters."""
    text = (Path(sysconfig.get_paths()["stdlib"]) / module).read_text(encoding="utf-8")
    out, size = [], 0
    for line in text.splitlines(keepends=True):
        if size + len(line) > max_chars:
            break
        out.append(line)
        size += len(line)
    return "".join(out)


def conversation(llm: LLM, i: int, args, params: SamplingParams) -> dict:
    module = MODULES[i % len(MODULES)]
    question, follow_up = QUESTIONS[(i // len(MODULES) + i) % len(QUESTIONS)]
    code = excerpt(module, args.chars)
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"```python\n{code}```\n\n{question}"},
    ]
    llm.engine.clear_prefix_cache()
    turn1 = llm.generate(llm.apply_chat_template(messages), params, speculation=args.speculation)
    messages += [{"role": "assistant", "content": turn1.text}, {"role": "user", "content": follow_up}]
    prompt2 = llm.apply_chat_template(messages)
    warm = llm.generate(prompt2, params, speculation=args.speculation)  # continues turn 1's entry
    llm.engine.clear_prefix_cache()
    cold = llm.generate(prompt2, params, speculation=args.speculation)
    same = warm.token_ids == cold.token_ids
    return {
        "conversation": i,
        "module": module,
        "question": question,
        "turn1_prompt_tokens": len(turn1.prompt_token_ids),
        "turn2_prompt_tokens": len(prompt2),
        "turn2_cached_tokens": warm.stats.cached_tokens,
        "cold_cached_tokens": cold.stats.cached_tokens,
        "output_tokens": [len(warm.token_ids), len(cold.token_ids)],
        "same": same,
        "first_difference": None if same else common_prefix(warm.token_ids, cold.token_ids),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=40, help="conversations")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per answer (greedy)")
    ap.add_argument("--chars", type=int, default=3000, help="characters of each file excerpt")
    ap.add_argument("--speculation", default="none", help="none isolates the cache; auto is what a server runs")
    ap.add_argument("--exact", action="store_true", help="llama.cpp's batch-invariant kernels (expect 0 differ)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write every conversation's figures as JSON")
    args = ap.parse_args(argv)
    llm = LLM(args.model, draft_model="none", threads=args.threads, exact=args.exact, max_num_seqs=2)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    rows, t0 = [], time.perf_counter()
    for i in range(args.n):
        rows.append(conversation(llm, i, args, params))
        r = rows[-1]
        verdict = "same" if r["same"] else f"DIFFERS at {r['first_difference']}"
        print(
            f"[{i + 1}/{args.n}] {time.perf_counter() - t0:5.0f}s {r['module']:15s} "
            f"cached {r['turn2_cached_tokens']:5d}/{r['turn2_prompt_tokens']:5d}  {verdict}",
            file=sys.stderr,
            flush=True,
        )
    differ = [r for r in rows if not r["same"]]
    summary = {
        "model": llm.model_name,
        "backend": llm.backend_name,
        "exact": args.exact,
        "speculation": args.speculation,
        "conversations": len(rows),
        "differ": len(differ),
        "differ_rate": round(len(differ) / max(1, len(rows)), 4),
        "first_difference_at": sorted(r["first_difference"] for r in differ),
        "mean_turn2_prompt_tokens": round(sum(r["turn2_prompt_tokens"] for r in rows) / max(1, len(rows)), 1),
        "mean_cached_tokens": round(sum(r["turn2_cached_tokens"] for r in rows) / max(1, len(rows)), 1),
        "max_tokens": args.max_tokens,
    }
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps({**summary, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
