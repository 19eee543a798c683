"""The prefix cache's host tier on a shared server (docs/design.md, "The host tier").

User A asks about a file (a ~2k-token prompt). Then user B's unrelated requests run: one long
answer, then a second prompt, together more than the 4096 tokens an entry may stay in the cells
without the tier. Then A's next turn. Run with the host tier and without it (--host-cache-gib 0),
one engine each, same weights, plain decoding throughout:

- B's decoding rate: with the tier, A's entry leaves the cells for host memory as soon as B's
  prefill has paid its rent, and B, alone, is moved down, so B decodes as on an empty cache;
  without it, A's cells stay under B's answer;
- A's turn 2: time to first token, and the prompt tokens it found cached (restored from host
  memory, or prefilled again).

    PYTHONPATH=src python scripts/host_cache_figures.py [--out FILE.json] [--threads N]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import textwrap
import time
import zipfile
from pathlib import Path

from specserve import LLM, SamplingParams
from specserve.config import EngineLimits
from specserve.hardware import cpu_info


def source(module, chars: int) -> str:
    return Path(module.__file__).read_text()[:chars]


def ask(text: str, question: str) -> list[dict]:
    return [{"role": "user", "content": f"Here is a file:\n```python\n{text}\n```\n{question}"}]


def run(host_gib: float, threads: int | None, model: str) -> dict:
    limits = EngineLimits(max_num_seqs=4, host_cache_bytes=int(host_gib * 2**30))
    llm = LLM(model, draft_model="none", speculation="none", limits=limits, threads=threads)
    core = llm.engine.core
    llm.engine.prices()  # measured (or read from the price cache) before anything is timed
    spill_seconds = [0.0]
    if core.host is not None:
        spill = core._spill

        def timed(owner):
            t = time.perf_counter()
            spill(owner)
            spill_seconds[0] += time.perf_counter() - t

        core.prefix.spill = timed
    llm.engine.clear_prefix_cache()
    a = ask(source(fnmatch, 7000), "What does translate do? Answer in one sentence.")
    a1 = llm.generate(llm.apply_chat_template(a), SamplingParams(max_tokens=48))
    b1 = llm.generate(
        llm.apply_chat_template(ask(source(textwrap, 7000), "Explain each function of this module.")),
        SamplingParams(max_tokens=384, ignore_eos=True),
    )
    b2 = llm.generate(
        llm.apply_chat_template(ask(source(zipfile, 7000), "What does this module do?")),
        SamplingParams(max_tokens=16),
    )
    a += [{"role": "assistant", "content": a1.text}, {"role": "user", "content": "And what does filter do?"}]
    a2 = llm.generate(llm.apply_chat_template(a), SamplingParams(max_tokens=16))
    decode = (len(b1.token_ids) - 1) / (b1.stats.total_time - b1.stats.time_to_first_token)
    out = {
        "host_cache_gib": host_gib,
        "a1_prompt_tokens": len(a1.prompt_token_ids),
        "b1_prompt_tokens": len(b1.prompt_token_ids),
        "b1_output_tokens": len(b1.token_ids),
        "b2_prompt_tokens": len(b2.prompt_token_ids),
        "b1_decode_tok_s": round(decode, 2),
        "a2_prompt_tokens": len(a2.prompt_token_ids),
        "a2_cached_tokens": a2.cached_tokens,
        "a2_ttft_s": round(a2.stats.time_to_first_token, 3),
        "a1_ttft_s": round(a1.stats.time_to_first_token, 3),
        "spill_seconds": round(spill_seconds[0], 3),
        "prefix_cache": core.prefix_stats(),
        "a2_text": a2.text,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "prefix_cache"}), flush=True)
    del llm, core
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    runs = [run(gib, args.threads, args.model) for gib in (4.0, 0.0)]
    on, off = runs
    print(
        f"B decoding {on['b1_decode_tok_s']} tok/s with the tier, {off['b1_decode_tok_s']} without "
        f"({on['b1_decode_tok_s'] / off['b1_decode_tok_s']:.2f}x); A's turn 2 first token "
        f"{on['a2_ttft_s']} s against {off['a2_ttft_s']} s; same answer: {on['a2_text'] == off['a2_text']}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": cpu_info(), "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
