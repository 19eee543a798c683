"""How fast a server refuses an oversized body (413), and that it answers normally right after.

    python scripts/bench_body_limit.py --url http://127.0.0.1:8000              # a running server
    python scripts/bench_body_limit.py --model smollm2-135m-instruct --size-mb 50  # starts one

Sends `--repeat` bodies of `--size-mb` MB, with a Content-Length and chunked, and prints the
time from the first byte sent to the 413 (median and max), then times one normal request.
A benchmark, not a test: wall-clock numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from specserve.server.launch import ServerProcess

CHUNK = 1 << 16


def big_body(size: int, model: str) -> bytes:
    head = json.dumps({"model": model, "messages": [{"role": "user", "content": ""}]})[:-3].encode()
    tail = b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def time_refusal(url: str, body: bytes, chunked: bool, api_key: str | None) -> tuple[float, int]:
    """Seconds until the answer to one oversized body, and its status."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    content = (body[i : i + CHUNK] for i in range(0, len(body), CHUNK)) if chunked else body
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", content=content, headers=headers, timeout=120)
    return time.perf_counter() - t0, r.status_code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running server (default: start one with --model)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model to serve when --url is not given")
    ap.add_argument("--port", type=int, default=None, help="port for the started server (default: a free one)")
    ap.add_argument("--size-mb", type=float, default=50.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    server = (
        None
        if args.url
        else ServerProcess(
            ["--model", args.model, "--log-level", "warning"], port=args.port, startup_timeout=300.0
        ).start()
    )
    url = args.url or server.url
    try:
        model = httpx.get(
            f"{url}/v1/models", timeout=10, headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        ).json()
        name = model["data"][0]["id"]
        body = big_body(int(args.size_mb * 1e6), name)
        for chunked in (False, True):
            runs = [time_refusal(url, body, chunked, args.api_key) for _ in range(args.repeat)]
            times, statuses = [t for t, _ in runs], {s for _, s in runs}
            print(
                f"{args.size_mb:g} MB {'chunked' if chunked else 'Content-Length'}: status {sorted(statuses)}, "
                f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"
            )
        t0 = time.perf_counter()
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=120,
            headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
            json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        )
        print(f"then a normal request: status {r.status_code} in {(time.perf_counter() - t0) * 1000:.0f} ms")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
