"""Does the prefix cache stay out of the way under pressure? (issue 16, the capacity target)

64 distinct ~1k-token prompts (no two share a first block) arrive at once at a `specserve serve`
whose KV cache holds 8 such requests, with the prefix cache on and then off. Every request must
finish (200) or be refused (429, `--max-queue` already full); the cache must not add a 429 that
the cache-off server does not give; and afterwards nothing may be left reserved: `/health` shows
no running request and no reserved cells, only the cached entries (which the engine can drop,
`tests/test_prefix_cache.py::test_eviction_under_pressure` checks that on llama.cpp's cells).

    PYTHONPATH=src python scripts/prefix_capacity.py smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from specserve.server.launch import ServerProcess

SOURCE = Path(__file__).resolve().parents[1] / "src/specserve/bench/samples/users_controller.py"


def prompts(n: int, chars: int) -> list[str]:
    """n prompts of about `chars` characters; each starts with its own number, so none shares a block."""
    text = SOURCE.read_text(encoding="utf-8")
    return [f"Document {i} of {n}.\n" + text[i * 40 : i * 40 + chars] + "\nSummarise it." for i in range(n)]


def run(model: str, cache: bool, texts: list[str], args) -> dict:
    flags = ["--model", model, "--served-model-name", "m", "--speculation", "none", "--log-level", "warning"]
    flags += ["--max-num-seqs", "8", "--kv-cache-tokens", str(8 * args.cells_per_request)]
    flags += ["--max-queue", str(args.max_queue), "--request-timeout", "0", "--threads", str(args.threads)]
    if not cache:
        flags.append("--no-prefix-cache")
    with ServerProcess(flags, startup_timeout=600) as srv:
        url = f"{srv.base_url}/completions"

        def one(prompt: str) -> int:
            body = {"model": "m", "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0}
            return httpx.post(url, json=body, timeout=1800).status_code

        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(texts)) as pool:
            codes = list(pool.map(one, texts))
        seconds = time.perf_counter() - t0
        health = srv.health()
        for _ in range(50):  # the last response can arrive before its step has ended
            if health["active"] == 0 and health["kv_cache_usage"] == 0:
                break
            time.sleep(0.2)
            health = srv.health()
    return {
        "prefix_cache": cache,
        "requests": len(codes),
        "ok": codes.count(200),
        "refused_429": codes.count(429),
        "other": sorted(c for c in codes if c not in (200, 429)),
        "seconds": round(seconds, 1),
        "after": {k: health[k] for k in ("active", "queued", "kv_cache_usage", "prefix_cache")},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=64, help="distinct prompts, all sent at once")
    ap.add_argument("--chars", type=int, default=3800, help="characters per prompt (~1k tokens)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cells-per-request", type=int, default=1280, help="the cache holds 8 requests of this size")
    ap.add_argument("--max-queue", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    texts = prompts(args.n, args.chars)
    results = [run(args.model, cache, texts, args) for cache in (True, False)]
    for r in results:
        print(json.dumps(r))
    on, off = results
    problems = []
    if on["other"] or off["other"]:
        problems.append("a request ended with neither 200 nor 429")
    if on["refused_429"] > off["refused_429"]:
        problems.append("the prefix cache added 429s")
    if on["after"]["active"] or on["after"]["kv_cache_usage"]:
        problems.append("cells still reserved after every request ended")
    print("OK" if not problems else "FAIL: " + "; ".join(problems))
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "runs": results, "problems": problems}, indent=1) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
