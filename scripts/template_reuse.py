"""How often does a chat template let turn 2 reuse all of turn 1's tokens? (issue 16, item 5)

A chat client re-sends the conversation: turn 2's prompt is the template applied to turn 1's
messages, the assistant's answer as text, and a new question. The prefix cache can reuse turn
1's prompt + output only as far as that re-tokenized text repeats the generated ids. This runs
N short conversations (varied questions about the sample controller, sampled answers so the
text varies) and counts, per conversation, the tokens turn 2 shares with turn 1's prompt +
output, and how often re-tokenizing the answer breaks the match before its end.

    PYTHONPATH=src python scripts/template_reuse.py smollm2-135m-instruct --n 40
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specserve import LLM, SamplingParams
from specserve.engine.prefix_cache import common_prefix

SOURCE = Path(__file__).resolve().parents[1] / "src/specserve/bench/samples/users_controller.py"
QUESTIONS = [
    "What does get_user do?",
    "Explain the error handling in this file.",
    "Write a one-line summary of the class.",
    "Which function would you test first, and why?",
    "List the public methods with their arguments.",
    "Suggest a better name for one variable.",
    "Is there any duplicated code? Show it.",
    "Rewrite the first function with type hints.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=40, help="conversations")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the per-conversation figures as JSON")
    args = ap.parse_args()
    llm = LLM(args.model, draft_model="none", speculation="none", threads=args.threads, max_num_seqs=4)
    code = SOURCE.read_text()[:2500]
    rows = []
    for i in range(args.n):
        question = QUESTIONS[i % len(QUESTIONS)]
        messages = [{"role": "user", "content": f"```python\n{code}\n```\n{question}"}]
        turn1 = llm.apply_chat_template(messages)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.8, seed=i)
        out = llm.generate(turn1, params)
        messages += [{"role": "assistant", "content": out.text}, {"role": "user", "content": "Thanks. And why?"}]
        turn2 = llm.apply_chat_template(messages)
        held = turn1 + out.token_ids
        shared = common_prefix(turn2, held)
        rows.append(
            {
                "conversation": i,
                "finish": out.finish_reason,
                "turn1_prompt": len(turn1),
                "output": len(out.token_ids),
                "shared": shared,
                "held": len(held),
                "prompt_kept": turn2[: len(turn1)] == turn1,
                "break_at_output_token": None if shared >= len(held) else shared - len(turn1),
            }
        )
    broken = [r for r in rows if r["break_at_output_token"] is not None]
    kept = sum(r["shared"] for r in rows) / sum(r["held"] for r in rows)
    print(f"model {args.model}: {len(rows)} conversations, answers of up to {args.max_tokens} tokens (T=0.8)")
    print(f"turn 2 keeps turn 1's whole prompt: {sum(r['prompt_kept'] for r in rows)}/{len(rows)}")
    print(f"turn 2 keeps turn 1's whole prompt + output: {len(rows) - len(broken)}/{len(rows)}")
    print(f"tokens of turn 1 (prompt + output) reused: {100 * kept:.2f}%")
    for r in broken:
        print(
            f"  conversation {r['conversation']}: match breaks at output token {r['break_at_output_token']} "
            f"of {r['output']} (finish {r['finish']})"
        )
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
