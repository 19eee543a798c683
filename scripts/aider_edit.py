"""A real coding agent against `specserve serve`: aider edits one file, with each speculation mode.

aider (`pip install aider-chat`, in its own virtualenv: it pins its own dependencies) uses the
"whole" edit format here: it sends the file and asks for the whole updated file back, and never
sends `prediction`. So the speed it sees comes from `auto`'s prompt drafting (issue 15, item 5).

For each mode, a fresh server is started, a fresh copy of the file is edited by one aider run
(no git, no lint, no repo map, no confirmations), and the wall time of that run, the server's
speculation figures and the edited file are recorded. The edited files must be identical across
modes: greedy speculation is lossless, so any difference is a bug (or non-exact kernels, reported).

    python scripts/aider_edit.py --aider /tmp/aider-venv/bin/aider --file /usr/lib/python3.11/bisect.py \\
        --message "Rename the function insort_right to insort_after everywhere in the file." --out /tmp/aider
"""

from __future__ import annotations

import argparse
import difflib
import json
import shutil
import subprocess
import time
from pathlib import Path

from specserve.server.launch import ServerProcess


def metric_sum(metrics: str, name: str) -> float:
    """The sum over labels of one Prometheus counter in the /metrics text."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and not line.startswith(name + "_created"):
            head = line.split(" ")[0]
            if head == name or head.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def model_metadata(model: str, context: int, path: Path) -> Path:
    """The litellm metadata file aider's docs ask for when a local model is unknown to it.

    Without it aider assumes a small context window and, after each answer, sends the chat
    history back to be summarized: extra requests whose prefill both modes pay alike."""
    entry = {
        "max_input_tokens": context,
        "max_tokens": context,
        "max_output_tokens": context,
        "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0,
        "litellm_provider": "openai",
        "mode": "chat",
    }
    path.write_text(json.dumps({f"openai/{model}": entry}, indent=2))
    return path


def run_aider(
    aider: str, base_url: str, model: str, file: Path, message: str, log: Path, metadata: Path | None
) -> float:
    """One aider run on `file` (edited in place); its wall time in seconds."""
    cmd = [
        aider,
        "--model", f"openai/{model}",
        *(["--model-metadata-file", str(metadata)] if metadata else []),
        "--openai-api-base", base_url,
        "--openai-api-key", "none",
        "--edit-format", "whole",
        "--no-git", "--no-auto-lint", "--no-auto-test", "--no-auto-commits",
        "--map-tokens", "0", "--yes-always", "--no-show-model-warnings", "--no-check-update",
        "--no-analytics", "--no-pretty", "--no-stream",
        "--llm-history-file", str(log.with_name("llm-history.txt")),
        "--message", message,
        str(file),
    ]  # fmt: skip
    start = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(cmd, cwd=file.parent, stdout=out, stderr=subprocess.STDOUT, timeout=3600, check=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aider", required=True, help="the aider executable (in its own virtualenv)")
    ap.add_argument("--file", required=True, type=Path)
    ap.add_argument("--message", required=True)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--modes", default="none,auto", help="speculation modes, one server each")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("aider-out"))
    ap.add_argument("--context", type=int, default=32768, help="the context window aider is told (0: tell it nothing)")
    ap.add_argument(
        "--exact", action="store_true", help="serve with --exact: every mode writes plain decoding's answer bit for bit"
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    metadata = model_metadata(args.model, args.context, args.out / "model-metadata.json") if args.context else None
    rows = []
    for mode in args.modes.split(","):
        work = args.out / mode
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        target = work / args.file.name
        shutil.copy(args.file, target)
        serve = ["--model", args.model, "--speculation", mode]
        serve += ["--threads", str(args.threads)] if args.threads else []
        serve += ["--exact"] if args.exact else []
        with ServerProcess(serve, log_path=work / "server.log", startup_timeout=600) as srv:
            seconds = run_aider(
                args.aider, srv.base_url, args.model, target, args.message, work / "aider.log", metadata
            )
            metrics = srv.metrics()
        rows.append(
            {
                "mode": mode,
                "seconds": round(seconds, 2),
                "requests": metric_sum(metrics, "specserve_requests_total"),
                "server_seconds": round(metric_sum(metrics, "specserve_e2e_request_latency_seconds_sum"), 2),
                "first_token_seconds": round(metric_sum(metrics, "specserve_time_to_first_token_seconds_sum"), 2),
                "completion_tokens": metric_sum(metrics, "specserve_completion_tokens_total"),
                "prompt_tokens": metric_sum(metrics, "specserve_prompt_tokens_total"),
                "proposed": metric_sum(metrics, "specserve_spec_proposed_tokens_total"),
                "accepted": metric_sum(metrics, "specserve_spec_accepted_tokens_total"),
                "steps": metric_sum(metrics, "specserve_spec_steps_total"),
                "changed_lines": sum(
                    1
                    for d in difflib.unified_diff(args.file.read_text().splitlines(), target.read_text().splitlines())
                    if d[:1] in "+-" and d[:3] not in ("+++", "---")
                ),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    first = (args.out / rows[0]["mode"] / args.file.name).read_text()
    same = all((args.out / r["mode"] / args.file.name).read_text() == first for r in rows)
    base = rows[0]["seconds"]
    for r in rows:
        r["speedup_vs_first"] = round(base / r["seconds"], 2)
    summary = {
        "file": str(args.file),
        "message": args.message,
        "model": args.model,
        "exact": args.exact,
        "context_told": args.context,
        "same_file": same,
        "runs": rows,
    }
    (args.out / "aider.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
