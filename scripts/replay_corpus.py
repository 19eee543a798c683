#!/usr/bin/env python
"""Build a corpus of real before/after source files and replay the prediction drafter on it.

The pairs are the same .py files in two released versions of pure-Python packages (wheels from
PyPI, read as zips; nothing is installed or imported). Each pair is an "edit" a model could be
asked to make with the old file as the prediction. We replay every pair through the real engine
(`specserve.bench.replay`) and print aggregate acceptance, tokens per step and projected speedup,
optionally over a grid of re-anchoring parameters to tune `PredictionProposer`. With --curve
(a backend's measured cost curve, e.g. the llama.cpp 2-core one) the engine drafts with those
prices and the projected speedup is paid in them.

    python scripts/replay_corpus.py [--model smollm2-135m-instruct] [--curve 1:1,8:6.6,32:15.4,128:44.9]
                                    [--method prediction|auto] [--grid] [--json out.json]

It also prints the *copy ceiling* (`replay.copy_ceiling`): the most tokens per step a drafter
that copies runs of the prediction could reach on these pairs if it always knew which run to
copy, at K <= 128 and with no cap on K (an upper bound for copying; learned edits, n-gram lookup
and a draft model draft other text and are not bounded by it).

Wheels are cached in $SPECSERVE_REPLAY_CORPUS (default: <tmp>/specserve-replay-corpus).
Downloaded third-party source never enters the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specserve.bench.curves import DEFAULT_COST_RATIO, LLAMACPP_2CORE_CURVE, parse_curve
from specserve.bench.replay import aggregate, copy_ceiling, replay
from specserve.config import SpeculationConfig
from specserve.proposers.base import REGISTRY
from specserve.proposers.prediction import PredictionProposer

# (project, old version, new version): adjacent releases, mostly bug-fix diffs.
RELEASES = [
    ("requests", "2.31.0", "2.32.3"),
    ("click", "8.1.3", "8.1.7"),
    ("flask", "2.3.3", "3.0.3"),
    ("jinja2", "3.1.2", "3.1.4"),
    ("attrs", "23.1.0", "23.2.0"),
]
MIN_SIMILARITY = 0.5  # below this the "edit" is a rewrite; nobody would send the old file as a prediction
MAX_CHARS = 60_000


def cache_dir() -> Path:
    d = Path(os.environ.get("SPECSERVE_REPLAY_CORPUS") or Path(tempfile.gettempdir()) / "specserve-replay-corpus")
    d.mkdir(parents=True, exist_ok=True)
    return d


def wheel(project: str, version: str) -> Path:
    """The cached wheel of project==version, downloaded with pip on first use."""
    folder = cache_dir()
    norm = project.lower().replace("-", "_")
    for path in folder.glob("*.whl"):
        name, ver = path.name.split("-")[:2]
        if name.lower().replace("-", "_") == norm and ver == version:
            return path
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            f"{project}=={version}",
            "-d",
            str(folder),
        ],
        check=True,
    )
    return wheel(project, version)


def py_files(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n).decode("utf-8", "replace") for n in z.namelist() if n.endswith(".py")}


def pairs() -> list[tuple[str, str, str]]:
    """(name, before, after) for every file changed between the two versions, edits only."""
    out = []
    for project, old, new in RELEASES:
        before, after = py_files(wheel(project, old)), py_files(wheel(project, new))
        for name in sorted(before.keys() & after.keys()):
            a, b = before[name], after[name]
            if a == b or len(b) > MAX_CHARS:
                continue
            if difflib.SequenceMatcher(None, a, b, autojunk=False).quick_ratio() < MIN_SIMILARITY:
                continue
            out.append((f"{project} {old}->{new} {name}", a, b))
    return out


@contextlib.contextmanager
def prediction_params(min_anchor_chars: int, k_init: int, k_max: int):
    """Tuning only: swap the registry's prediction factory for one with these parameters."""
    original = REGISTRY["prediction"]

    def factory(ctx):
        if not ctx.prediction:
            return None
        return PredictionProposer(
            ctx.tokenizer, ctx.prediction, ctx.prompt_len, k_init, k_max, min_anchor_chars, ctx.prices
        )

    REGISTRY["prediction"] = factory
    try:
        yield
    finally:
        REGISTRY["prediction"] = original


def run_corpus(
    tokenizer, corpus, cost_ratio: float, params: tuple[int, int, int] | None = None, prices=None, method="prediction"
) -> tuple[dict, list]:
    ctx = prediction_params(*params) if params else contextlib.nullcontext()
    with ctx:
        results = [replay(tokenizer, a, b, cost_ratio, SpeculationConfig(method), prices) for _, a, b in corpus]
    return aggregate(results, cost_ratio, prices), results


def ceilings(tokenizer, corpus) -> dict:
    """Tokens per step no drafter that copies the prediction can pass on the corpus, K <= 128 and unbounded."""
    enc = [
        (tokenizer.encode(a, add_special_tokens=False), tokenizer.encode(b, add_special_tokens=False))
        for _, a, b in corpus
    ]
    tokens = sum(len(b) for _, b in enc)
    return {f"k_max_{k or 'none'}": tokens / sum(copy_ceiling(a, b, k) for a, b in enc) for k in (128, None)}


GRID = {"min_anchor_chars": (4, 8, 16, 32), "k_max": (32, 64, 96, 128, 192), "k_init": (4, 8, 16)}


def tune(tokenizer, corpus, cost_ratio: float, prices=None) -> list[dict]:
    """Coordinate search over GRID (one parameter at a time, keeping the best so far)."""
    best = {"min_anchor_chars": 8, "k_init": 8, "k_max": 96}  # the engine's defaults
    seen: dict[tuple, dict] = {}
    for name, values in GRID.items():
        for v in values:
            cand = {**best, name: v}
            key = (cand["min_anchor_chars"], cand["k_init"], cand["k_max"])
            if key not in seen:
                agg, _ = run_corpus(tokenizer, corpus, cost_ratio, key, prices)
                seen[key] = {**cand, **agg}
                print(f"anchor {key[0]:2d} k_init {key[1]:2d} k_max {key[2]:3d}: {fmt(agg)}", flush=True)
        best = {k: v for k, v in max(seen.values(), key=lambda g: g["projected_speedup"]).items() if k in best}
    return list(seen.values())


def fmt(agg: dict) -> str:
    return (
        f"pairs {agg['pairs']:3d}  tokens {agg['output_tokens']:7d}  steps {agg['steps']:6d}  "
        f"acceptance {agg['acceptance_rate']:.3f}  tokens/step {agg['tokens_per_step']:6.2f}  "
        f"projected speedup {agg['projected_speedup']:5.2f}x"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="tokenizer source: pack name or folder (default: target pack)")
    ap.add_argument("--cost-ratio", type=float, default=DEFAULT_COST_RATIO)
    ap.add_argument(
        "--curve",
        default=None,
        help="a measured cost curve, tokens:cost,... (e.g. "
        + ",".join(f"{n}:{c:g}" for n, c in LLAMACPP_2CORE_CURVE)
        + ")",
    )
    ap.add_argument(
        "--method", default="prediction", choices=("prediction", "auto"), help="auto: prediction, then n-gram lookup"
    )
    ap.add_argument("--grid", action="store_true", help="tune min_anchor_chars, k_init, k_max")
    ap.add_argument("--json", type=Path, help="write results here")
    args = ap.parse_args()

    from specserve.cli.replay import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    prices = parse_curve(args.curve) if args.curve else None
    corpus = pairs()
    agg, results = run_corpus(tokenizer, corpus, args.cost_ratio, prices=prices, method=args.method)
    print(f"engine defaults ({args.method}): {fmt(agg)}")
    ceiling = ceilings(tokenizer, corpus)
    print(
        "copy ceiling (copying runs of the prediction, knowing which to copy): "
        f"{ceiling['k_max_128']:.2f} tokens/step at K <= 128, {ceiling['k_max_none']:.2f} with no cap on K"
    )
    report = {
        "method": args.method,
        "defaults": agg,
        "copy_ceiling": ceiling,
        "per_pair": [dict(name=n, **r.to_dict()) for (n, _, _), r in zip(corpus, results)],
    }
    worst = sorted(zip(corpus, results), key=lambda cr: cr[1].tokens_per_step)[:5]
    for (name, _, _), r in worst:
        print(f"  low: {name}: tokens/step {r.tokens_per_step:.1f}, acceptance {r.acceptance_rate:.2f}")
    if args.grid:
        report["grid"] = tune(tokenizer, corpus, args.cost_ratio, prices)
        best = max(report["grid"], key=lambda g: g["projected_speedup"])
        print(
            f"best: min_anchor_chars={best['min_anchor_chars']} k_init={best['k_init']} k_max={best['k_max']}: "
            f"{fmt(best)}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
