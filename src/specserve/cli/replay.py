"""`specserve replay`: estimate Predicted Outputs gains on a known edit without running a model.

specserve replay --prediction old.py --output new.py [--model NAME] [--cost-ratio 1.16 | --curve 1:1,8:6.6,...]
specserve replay --prompt request.txt --output new.py --method auto   (no prediction: prompt drafting)
specserve replay --bench bench-out/bench.json   (each prediction run of a bench, replayed: projected vs measured)
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from ..bench.curves import DEFAULT_COST_RATIO, LLAMACPP_2CORE_CURVE
from ..config import BACKENDS, METHODS, ONE_REQUEST, LoadOptions, SpeculationConfig
from ..inputs import read_text
from .argtypes import path_arg

REPLAY_METHODS = [m for m in METHODS if m != "draft"]  # only a tokenizer is loaded: nothing could draft


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "replay",
        help="estimate what the prediction drafter would achieve on a known edit",
        description="Replay the prediction drafter through the real engine against a target "
        "that writes exactly --output; report acceptance, tokens per step and a "
        "projected speedup. Only the tokenizer is loaded.",
    )
    p.add_argument("--prediction", type=path_arg, help="the predicted text (e.g. the file before the edit)")
    p.add_argument("--output", type=path_arg, help="the text the target produces (the file after)")
    p.add_argument(
        "--bench",
        type=path_arg,
        help="instead: a `specserve bench` report (bench.json); replay each prediction run's own "
        "output with the cost curve the bench drafted with, and compare projected with measured speedups",
    )
    p.add_argument(
        "--prompt",
        type=path_arg,
        help="a prompt the target reads first (e.g. the request with the file in "
        "it): what --method auto drafts from without a prediction",
    )
    p.add_argument(
        "--method",
        default="prediction",
        choices=REPLAY_METHODS,
        help="speculation method (default prediction; no draft: replay loads no draft model)",
    )
    curve = ",".join(f"{n}:{c:g}" for n, c in LLAMACPP_2CORE_CURVE)
    p.add_argument(
        "--curve",
        default=None,
        help="a backend's measured cost curve, tokens:cost in decoding steps (e.g. llama.cpp, 2 cores: "
        f"{curve}); the engine drafts with these prices and the speedup uses them",
    )
    p.add_argument(
        "--model",
        default=None,
        help="pack name or model folder whose tokenizer to use (default: the default target pack)",
    )
    p.add_argument(
        "--cost-ratio",
        type=float,
        default=None,
        help=f"cost of verifying 8 tokens relative to 1 (default {DEFAULT_COST_RATIO}, "
        "or measured with --measure-cost)",
    )
    p.add_argument("--measure-cost", action="store_true", help="load the model and measure the cost ratio")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="backend for --measure-cost (default auto)")
    p.add_argument("--dtype", default=None, help="torch dtype for --measure-cost on transformers")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def load_tokenizer(spec: str | None):
    """The tokenizer of a pack / folder / .gguf, without loading weights."""
    from transformers import AutoTokenizer

    from ..models import loader
    from ..models.packs import resolve_model

    if spec and (Path(spec).expanduser() / "tokenizer_config.json").is_file():  # a tokenizer-only folder is enough
        return AutoTokenizer.from_pretrained(Path(spec).expanduser())
    notice = pull_notice(spec)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    return loader.load_tokenizer(resolve_model(spec, role="target"))


def pull_notice(spec: str | None) -> str | None:
    """The line said before a pack that is not cached is pulled for its tokenizer: the pull is
    the whole pack (the tokenizer comes out of its GGUF). Replay is documented as loading only
    a tokenizer, and its default, the 1.5B pack, was 1 GB downloaded without a word of why."""
    from ..models.packs import is_cached
    from ..models.registry import PACKS, ROLE_DEFAULTS, get_pack

    name = spec or ROLE_DEFAULTS["target"]
    if name.lower() not in PACKS or is_cached(get_pack(name).name):
        return None
    pack = get_pack(name)
    return (
        f"replay reads only {pack.name}'s tokenizer, which comes out of its GGUF: pulling the pack "
        f"({pack.size_mb} MiB, once); --model with a smaller pack or a tokenizer folder avoids it"
    )


def cost_ratio_for(args) -> float:
    if args.cost_ratio is not None:
        if not math.isfinite(args.cost_ratio) or args.cost_ratio < 1.0:
            raise ValueError(
                "--cost-ratio must be a number of at least 1 (verifying 8 tokens cannot be cheaper than 1)"
            )
        return args.cost_ratio
    if args.measure_cost:
        from ..backends import SequenceRunner
        from ..bench.replay import measure_cost_ratio
        from ..models import loader

        options = LoadOptions(backend=args.backend, dtype=args.dtype)
        loaded = loader.load(args.model, "target", options, ONE_REQUEST)  # one runner is timed
        return measure_cost_ratio(SequenceRunner(loaded.backend))
    return DEFAULT_COST_RATIO


def read_input(path: Path | None, flag: str) -> str | None:
    """The text of one input file, or a one-line error that names the flag (inputs.py: a binary
    file was "'utf-8' codec can't decode byte 0xcc in position 2", with no word of which file)."""
    return None if path is None else read_text(path, flag)  # byte for byte: CRLF line ends kept


def given_flags(args, *names: str) -> list[str]:
    """The flags among `names` (argparse dests) that the user set, as they are spelled."""
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name) not in (None, False)]


def run(args) -> int:
    from ..bench.curves import parse_curve

    costs = given_flags(args, "curve", "cost_ratio", "measure_cost")
    if args.bench is not None:
        given = given_flags(args, "prediction", "output", "prompt") + costs
        if given:  # they were ignored: a user read the bench's replay as the replay of their files
            raise ValueError(
                f"--bench replays a bench report's own runs with its own prices: it does not take {', '.join(given)}"
            )
        return check_bench(args)
    if len(costs) > 1:  # --curve won over the others (and --measure-cost loaded a model for nothing)
        raise ValueError(f"{' and '.join(costs)} each set the cost of verifying: give one")
    if args.output is None:
        raise ValueError("give --output (the text the target produces), or --bench with a bench report")
    if args.prediction is None and args.method == "prediction":
        raise ValueError("--method prediction needs --prediction (or choose --method auto with --prompt)")
    prediction = read_input(args.prediction, "--prediction")
    prompt = read_input(args.prompt, "--prompt")
    output = read_input(args.output, "--output")
    prices = None if args.curve is None else parse_curve(args.curve)  # "" too: it was dropped without a word
    from ..bench.replay import replay  # torch and the engine: once the arguments are read

    tokenizer = load_tokenizer(args.model)
    result = replay(tokenizer, prediction, output, cost_ratio_for(args), SpeculationConfig(args.method), prices, prompt)
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
    print(
        f"projected speedup  {result.projected_speedup:.2f}x  (cost of verifying 8 tokens = "
        f"{result.cost_ratio:.2f}x one token{', from --curve' if prices else ''})"
    )
    return 0


def check_bench(args) -> int:
    """--bench: the replay of each prediction run beside its measured speedup."""
    from ..bench.replay_check import check_report, markdown

    text = read_text(args.bench, "--bench")  # a missing or binary file is unreadable, not "not a bench report"
    try:
        report = json.loads(text)
        env = report["environment"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--bench {args.bench}: not a bench report ({e})") from None
    tokenizer = load_tokenizer(args.model or env["model"])
    try:
        checks = check_report(report, tokenizer)
    except KeyError as e:  # a run without a field, or a scenario this version does not have: was a traceback
        raise ValueError(f"--bench {args.bench}: not a bench report this version reads (no {e} in it)") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"--bench {args.bench}: not a bench report this version reads ({e})") from None
    if not checks:
        raise ValueError(
            f"--bench {args.bench}: no prediction run with its output ids and a measured speedup to replay "
            "(a run whose answer came in one emission has no speedup)"
        )
    if args.json:
        print(json.dumps([{**asdict(c), "error": c.error} for c in checks], indent=2))
    else:
        print(markdown(checks, env))
    return 0
