"""`specserve replay`: estimate Predicted Outputs gains on a known edit without running a model.

    specserve replay --prediction old.py --output new.py [--model NAME] [--cost-ratio 1.16]
"""

from __future__ import annotations

import json
from pathlib import Path

from ..bench.replay import DEFAULT_COST_RATIO, measure_cost_ratio, replay
from ..config import BACKENDS, LoadOptions
from ..models import loader


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("replay", help="estimate what the prediction drafter would achieve on a known edit",
                              description="Replay the prediction drafter through the real engine against a target "
                                          "that writes exactly --output; report acceptance, tokens per step and a "
                                          "projected speedup. Only the tokenizer is loaded.")
    p.add_argument("--prediction", required=True, type=Path, help="the predicted text (e.g. the file before the edit)")
    p.add_argument("--output", required=True, type=Path, help="the text the target produces (the file after)")
    p.add_argument("--model", default=None, help="pack name or model folder whose tokenizer to use "
                                                 "(default: the default target pack)")
    p.add_argument("--cost-ratio", type=float, default=None,
                   help=f"cost of verifying 8 tokens relative to 1 (default {DEFAULT_COST_RATIO}, "
                        "or measured with --measure-cost)")
    p.add_argument("--measure-cost", action="store_true", help="load the model and measure the cost ratio")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="backend for --measure-cost")
    p.add_argument("--dtype", default=None, help="torch dtype for --measure-cost on transformers")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def load_tokenizer(spec: str | None):
    """The tokenizer of a pack / folder / .gguf, without loading weights."""
    from transformers import AutoTokenizer

    from ..models.packs import resolve_model

    if spec and (Path(spec).expanduser() / "tokenizer_config.json").is_file():  # a tokenizer-only folder is enough
        return AutoTokenizer.from_pretrained(Path(spec).expanduser())
    return loader.load_tokenizer(resolve_model(spec, role="target"))


def cost_ratio_for(args) -> float:
    if args.cost_ratio is not None:
        if args.cost_ratio < 1.0:
            raise ValueError("--cost-ratio must be at least 1 (verifying 8 tokens cannot be cheaper than 1)")
        return args.cost_ratio
    if args.measure_cost:
        from ..backends import SequenceRunner

        loaded = loader.load(args.model, "target", LoadOptions(backend=args.backend, dtype=args.dtype))
        return measure_cost_ratio(SequenceRunner(loaded.backend))
    return DEFAULT_COST_RATIO


def run(args) -> int:
    prediction = args.prediction.read_text(encoding="utf-8")
    output = args.output.read_text(encoding="utf-8")
    tokenizer = load_tokenizer(args.model)
    result = replay(tokenizer, prediction, output, cost_ratio_for(args))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"output tokens      {result.output_tokens}   (prediction: {result.prediction_tokens})")
    print(f"steps              {result.steps}")
    print(f"proposed           {result.proposed}")
    print(f"accepted           {result.accepted}")
    print(f"rejected           {result.rejected}")
    print(f"acceptance rate    {result.acceptance_rate:.1%}")
    print(f"tokens per step    {result.tokens_per_step:.2f}")
    print(f"projected speedup  {result.projected_speedup:.2f}x  (cost of verifying 8 tokens = "
          f"{result.cost_ratio:.2f}x one token)")
    return 0
