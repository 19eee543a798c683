"""Prefix cache figures (docs/design.md "Prefix caching"): turn-2 vs turn-1 time to first token on a
~3k-token prompt, n=4 vs n=1 prefill.

Usage: python scripts/prefix_cache_figures.py [pack] [--exact] [--turns-only] [--threads N]"""

import sys
import time
from pathlib import Path

from specserve import LLM, SamplingParams
from specserve.engine.prefix_cache import common_prefix

model = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "smollm2-135m-instruct"
exact = "--exact" in sys.argv
threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
llm = LLM(model, draft_model="none", max_num_seqs=4, max_context=8192, exact=exact, speculation="none", threads=threads)
core = llm.engine.core
llm.engine.prices()  # measured once now, not inside a timed run
src = (Path(__file__).resolve().parents[1] / "src/specserve/bench/samples/users_controller.py").read_text()
text = src[:10500]
messages = [{"role": "user", "content": "Here is a file:\n```python\n" + text + "\n```\nWhat does get_user do?"}]
params = SamplingParams(max_tokens=32)
turn1 = llm.apply_chat_template(messages)
print("turn-1 prompt tokens", len(turn1), flush=True)
o1 = llm.generate(turn1, params)
messages += [{"role": "assistant", "content": o1.text}, {"role": "user", "content": "Now add a docstring to it."}]
turn2 = llm.apply_chat_template(messages)
o2 = llm.generate(turn2, params)
history = turn1 + o1.token_ids
print(
    f"template: turn 2 starts with turn 1's prompt: {turn2[: len(turn1)] == turn1}; shares "
    f"{common_prefix(turn2, history)} of turn 1's {len(history)} prompt+output tokens "
    f"(output {len(o1.token_ids)} tokens, finish {o1.finish_reason})"
)
llm.engine.clear_prefix_cache()
o2c = llm.generate(turn2, params)
print(f"turn1 ttft {o1.stats.time_to_first_token:.3f}s cached {o1.cached_tokens}")
print(
    f"turn2 ttft {o2.stats.time_to_first_token:.3f}s cached {o2.cached_tokens} of {len(turn2)}; "
    f"cold turn2 ttft {o2c.stats.time_to_first_token:.3f}s; equal {o2.token_ids == o2c.token_ids}"
)
print(
    f"turn2/turn1 {o2.stats.time_to_first_token / o1.stats.time_to_first_token:.3f}; "
    f"turn2/cold-turn2 {o2.stats.time_to_first_token / o2c.stats.time_to_first_token:.3f}",
    flush=True,
)
if "--turns-only" in sys.argv:
    sys.exit(0)
# n = 4 vs n = 1 on a ~2k-token prompt (max_tokens=1: the wall time is the prefill)
p2k = llm.apply_chat_template([{"role": "user", "content": src[:7000] + "\nSummarise."}])
one = SamplingParams(max_tokens=1)
print("n-test prompt tokens", len(p2k), flush=True)
res = {}
for label, n, share in (("n1", 1, True), ("n4", 4, True), ("n4-nocache", 4, False), ("n1b", 1, True)):
    llm.engine.clear_prefix_cache()
    saved = core.prefix
    if not share:
        core.prefix = None
    t = time.perf_counter()
    llm.generate([p2k] * n, one)
    res[label] = time.perf_counter() - t
    core.prefix = saved
    print(label, f"{res[label]:.3f}s", flush=True)
base = (res["n1"] + res["n1b"]) / 2
print(f"n4/n1 {res['n4'] / base:.3f}; n4 without the cache / n1 {res['n4-nocache'] / base:.3f}")
