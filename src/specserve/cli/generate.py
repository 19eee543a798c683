"""`specserve generate`: one request from the command line, streamed as it is accepted."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from ..config import (
    BACKENDS,
    METHODS,
    ONE_REQUEST,
    EngineLimits,
    LoadOptions,
    SamplingParams,
    SpeculationConfig,
    loads_draft_model,
)
from ..edit.files import check_writable
from ..errors import ContextLengthError, InvalidRequestError
from ..hardware import available_memory, cpu_info, describe
from ..inputs import decode_text, read_bytes
from ..models import packs
from .argtypes import path_text
from .flagnames import as_flags, flag_errors

DEFAULT_MAX_TOKENS = SamplingParams.max_tokens


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with speculative decoding",
        description="Generate from a prompt (argument, --prompt-file, or stdin) and print stats.",
    )
    p.add_argument("prompt", nargs="?", help="prompt text; omit to read --prompt-file or stdin")
    p.add_argument("--prompt-file", type=path_text, help="read the prompt from this file ('-': stdin)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--system", help="system message (implies --chat)")
    p.add_argument(
        "--prediction",
        type=path_text,
        metavar="FILE",
        help="Predicted Outputs: the text you expect (e.g. the file being edited; '-': stdin)",
    )
    p.add_argument(
        "--suffix",
        type=path_text,
        metavar="FILE",
        help="fill in the middle: FILE holds the code after the gap, the prompt the code before it "
        "(models with FIM tokens, such as Qwen2.5-Coder); the output is the middle",
    )
    add_model_args(p)
    p.add_argument("--speculation", choices=METHODS, default="auto", help="draft source (default: auto)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, help="starting K for every draft source")
    p.add_argument(
        "--max-tokens",
        type=int,
        help=f"most tokens to write (default {DEFAULT_MAX_TOKENS}, or what the context leaves after the "
        "prompt when that is less; more than it leaves is an error)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="nucleus sampling: the most likely tokens whose probabilities add up to P (default 1: all)",
    )
    p.add_argument("--top-k", type=int, default=0, help="sample from the K most likely tokens (default 0: all; -1 too)")
    p.add_argument("--seed", type=int, help="fixes sampling at temperature > 0 (a signed 64-bit integer)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object (text + stats) instead of streaming")
    p.add_argument("--html", type=path_text, metavar="FILE", help="write a visual acceptance report")
    p.set_defaults(func=run)


def add_model_args(p: argparse.ArgumentParser, dtype_help: str = "") -> None:
    """Model flags shared by generate, serve and bench."""
    p.add_argument(
        "--model", help="target: pack name, HF folder, .gguf file or hub id (default: Qwen2.5-Coder 1.5B pack)"
    )
    p.add_argument(
        "--draft-model", help="draft model (default: the 0.5B pack when --model is not given; 'none' for none)"
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=BACKENDS,
        help="auto (default): GGUF packs and .gguf files on llama.cpp unless --dtype is given, "
        "HF folders on transformers",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=("bfloat16", "float32", "float16"),
        help=dtype_help or "torch dtype, transformers backend only (default bfloat16)",
    )
    p.add_argument("--device", help="cpu, cuda, cuda:N or mps, transformers backend (default: cuda when available)")
    p.add_argument("--threads", type=int, help="llama.cpp CPU threads (default: every core)")
    p.add_argument(
        "--gpu-layers",
        type=int,
        metavar="N",
        help="llama.cpp built for a GPU: layers to put there (default: all; 0: CPU only; --exact: 0)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="llama.cpp: batch-invariant kernels, so speculative output equals plain decoding bit for "
        "bit on quantized GGUFs (about half the verification throughput on a CPU)",
    )
    p.add_argument(
        "--max-context", type=int, help="tokens per sequence (default: the model's, at most 8192 on llama.cpp)"
    )


def add_engine_args(p: argparse.ArgumentParser, max_num_seqs: int = 8) -> None:
    """Batching flags shared by serve and bench (config.EngineLimits)."""
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=max_num_seqs,
        metavar="N",
        help=f"requests decoding together; more wait in the queue (default {max_num_seqs})",
    )
    p.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=None,
        metavar="TOKENS",
        help="KV cache cells shared by running requests; a request joins only when its prompt + "
        "max_tokens fits (default: max-num-seqs full contexts)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        metavar="TOKENS",
        help="tokens one engine step may feed the model: pending + drafts + prefill (default 2048)",
    )
    p.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="prefill every prompt in full (default: reuse the cache of running and finished "
        "requests whose tokens start the same way)",
    )
    p.add_argument(
        "--host-cache-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="host memory for finished requests' KV caches once they leave the KV cache, restored "
        "when a prompt starts the same way (default 4, at most a quarter of free memory; 0: off)",
    )


def gib_bytes(gib: float | None) -> int | None:
    """A size in GiB as bytes (None stays None: the default)."""
    if gib is None:
        return None
    if not gib >= 0:  # NaN too
        raise InvalidRequestError(f"--host-cache-gib must be at least 0, got {gib}")
    if gib == float("inf"):  # int() of it was an OverflowError traceback
        raise InvalidRequestError("--host-cache-gib must be a finite size (leave it out for the default)")
    free = available_memory()
    if free is not None and gib * 2**30 > free:  # 1e30 was taken: the tier grew until the kernel killed the server
        raise InvalidRequestError(
            f"--host-cache-gib {gib:g} is more than the {free / 2**30:.1f} GiB of memory available now; "
            "give less (leave it out for the default: at most a quarter of it)"
        )
    return int(gib * 2**30)


def engine_limits(args) -> EngineLimits:
    """The EngineLimits that the flags of add_engine_args describe (one-line errors for bad values)."""
    try:
        return EngineLimits(
            max_num_seqs=args.max_num_seqs,
            kv_cache_tokens=args.kv_cache_tokens,
            max_num_batched_tokens=args.max_num_batched_tokens,
            prefix_caching=not getattr(args, "no_prefix_cache", False),
            host_cache_bytes=gib_bytes(getattr(args, "host_cache_gib", None)),
            host_cache_dir=getattr(args, "host_cache_dir", None),
        )
    except ValueError as e:
        raise InvalidRequestError(as_flags(str(e))) from None


def check_model_paths(args) -> None:
    """Refuse a mistyped --model/--draft-model path before torch is imported (a second, not ten)."""
    for model in (args.model, args.draft_model):
        packs.check_path(model)


def load_options(args, default_dtype: str = "bfloat16") -> LoadOptions:
    """The LoadOptions that the model flags of add_model_args describe (a warning on stderr for
    more threads than cores: 999 threads on 2 cores decoded at 0.3 tok/s instead of 40)."""
    if args.threads and args.threads > (cores := cpu_info()["cores"]):
        print(
            f"warning: --threads {args.threads} is more than the {cores} cores this process may use; "
            "threads that share a core wait on each other, so decoding slows down",
            file=sys.stderr,
        )
    with flag_errors():
        return LoadOptions(
            backend=args.backend,
            dtype=args.dtype,
            default_dtype=default_dtype,
            device=args.device,
            max_context=args.max_context,
            threads=args.threads,
            exact=args.exact,
            gpu_layers=args.gpu_layers,
        )


def read_text(path: str, flag: str | None) -> str:
    """A file's text, or stdin's for "-" (it was looked for as a file named "-"), byte for byte:
    line ends as they are (a text-mode open() made CRLF '\n'), and a one-line error for a file that
    cannot be read or bytes that are not UTF-8 (inputs.py: every command's words; stdin handed them
    over as lone surrogates, which failed in the tokenizer). flag: the option that named the file."""
    if path == "-":
        return decode_text(sys.stdin.buffer.read(), "stdin", flag)
    return decode_text(read_bytes(path, flag), path, flag)


def utf8_argument(text: str, what: str) -> str:
    """An argument as given; a one-line error for bytes that are not UTF-8 (Python hands them over
    as lone surrogates, which failed in the tokenizer with a traceback)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"the {what} is not UTF-8 text") from None
    return text


def read_prompt(args) -> str:
    if args.prompt is not None and args.prompt_file:
        raise InvalidRequestError("give the prompt as an argument or with --prompt-file, not both")
    if args.prompt is not None:
        return utf8_argument(args.prompt, "prompt")
    if args.prompt_file and args.prompt_file != "-":
        return read_text(args.prompt_file, "--prompt-file")
    if sys.stdin.isatty():
        raise InvalidRequestError("no prompt: pass it as an argument, with --prompt-file, or on stdin")
    prompt = read_text("-", None)
    if not prompt:
        raise InvalidRequestError("the prompt on stdin is empty")
    return prompt


def check_not_an_input(path: Path, flag: str, inputs: list, what: str = "an input file") -> None:
    """Refuse an output path that names one of the command's input files: the report was written
    over it (`generate --prediction app.py --html app.py` replaced app.py with HTML)."""
    real = path.expanduser().resolve()
    for given in inputs:
        if given and given != "-" and Path(given).expanduser().resolve() == real:
            raise InvalidRequestError(f"{flag} {path} is {what} ({given}): give the report a path of its own")


def check_stdin_once(args) -> None:
    """stdin holds one text: two "-" (or "-" beside a prompt read from stdin) would leave one empty."""
    named = (("--prompt-file", args.prompt_file), ("--prediction", args.prediction), ("--suffix", args.suffix))
    dashes = [flag for flag, value in named if value == "-"]
    if len(dashes) > 1:
        raise InvalidRequestError(f"{' and '.join(dashes)} both read stdin, which holds one text")
    if dashes and dashes != ["--prompt-file"] and args.prompt is None and not args.prompt_file:
        raise InvalidRequestError(f"{dashes[0]} - reads stdin: give the prompt as an argument or with --prompt-file")


def sampling_flags(args) -> tuple[SamplingParams, SpeculationConfig]:
    """generate's SamplingParams and SpeculationConfig; a bad value's error names its flag."""
    with flag_errors():
        params = SamplingParams(
            max_tokens=DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens,  # fitted to the prompt
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=tuple(utf8_argument(stop, "--stop string") for stop in args.stop),
        )
        return params, SpeculationConfig(method=args.speculation, num_speculative_tokens=args.num_speculative_tokens)


def run(args) -> int:
    check_stdin_once(args)
    prompt = read_prompt(args)
    system = utf8_argument(args.system, "--system message") if args.system else None
    prediction = read_text(args.prediction, "--prediction") if args.prediction else None
    suffix = read_text(args.suffix, "--suffix") if args.suffix else None
    if suffix is not None and (args.chat or args.system):
        raise InvalidRequestError("--suffix fills a gap in code; it does not go with --chat or --system")
    params, spec = sampling_flags(args)
    options = load_options(args)  # before the model paths: a flag's error first, as for the sampling flags
    check_model_paths(args)
    if args.html:  # before the model loads: a missing folder was made (a typo made /nonexistent)
        check_writable(Path(args.html))
        check_not_an_input(Path(args.html), "--html", [args.prompt_file, args.prediction, args.suffix])
    if spec.method == "draft" and not loads_draft_model(args.model, args.draft_model):
        raise InvalidRequestError("--speculation draft needs a draft model: give one with --draft-model")
    from ..llm import LLM  # heavy import only once the arguments are known to be good

    llm = LLM.from_options(args.model, args.draft_model, options, limits=ONE_REQUEST)
    if args.chat or args.system:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        prompt_ids = llm.apply_chat_template(messages)
    elif suffix is not None:
        prompt_ids = llm.fim_prompt_ids(prompt, suffix)
    else:
        prompt_ids = llm.tokenizer.encode(prompt)
    hint = context_hint(llm)
    params = replace(params, max_tokens=fit_max_tokens(args.max_tokens, len(prompt_ids), llm.max_context, hint))
    gen = llm.stream(prompt_ids, params, prediction=prediction, speculation=spec)
    for event in gen:
        if not args.json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
    out = gen.output
    if args.json:
        print(
            json.dumps(
                out.to_dict() | {"token_sources": out.token_sources, "backend": llm.backend_name, **cpu_info()},
                ensure_ascii=False,
            )
        )
    else:
        print()
        print(format_stats(out.stats, out.finish_reason), file=sys.stderr)
        print(f"    {describe(llm.backend_name)}", file=sys.stderr)
    if args.html:
        from ..bench.report_html import write_html

        write_html(args.html, llm.tokenizer, out, title="specserve generate")
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def context_hint(llm) -> str:
    """What would lift the context, for fit_max_tokens' errors: --max-context below what the model
    was trained on, and nothing at that (both backends cap --max-context there: "(or raise
    --max-context)" sent the user to a flag that did nothing). generate's cache holds one full context."""
    backend = llm.target_backend
    trained = getattr(backend, "trained_context", None)
    if trained is None:
        return "(or raise --max-context)"
    if backend.max_context < trained:
        return f"(or raise --max-context: the model was trained on {trained} tokens)"
    return f"(the model was trained on {trained} tokens: its context cannot be raised)"


def fit_max_tokens(asked: int | None, prompt_len: int, context: int, hint: str = "(or raise --max-context)") -> int:
    """--max-tokens against what the context leaves after the prompt, as the server checks
    max_tokens: more than that is an error (it was cut at the context's end without a word, the
    answer shorter than asked); left out, the default is capped to it. `hint` says what would lift
    the context (context_hint)."""
    room = context - prompt_len
    if room <= 0:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens and the model's context length is {context}: "
            f"no room is left for an answer; shorten the prompt {hint}"
        )
    if asked is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if asked > room:
        raise ContextLengthError(
            f"--max-tokens {asked} does not fit: the model's context length is {context} tokens and the "
            f"prompt has {prompt_len}, which leaves {room}; lower --max-tokens {hint}"
        )
    return asked


def format_stats(stats, finish_reason: str) -> str:
    """A short human summary: totals, then one line per draft source that ran."""
    lines = [
        f"--- {stats.output_tokens} tokens in {stats.total_time:.2f}s "
        f"({stats.tokens_per_second:.1f} tok/s after a {stats.prefill_time:.2f}s prefill), "
        f"{stats.steps} steps, {stats.tokens_per_step:.2f} tokens/step, "
        f"acceptance {stats.acceptance_rate:.1%}, finish: {finish_reason}",
    ]
    for name, s in stats.by_source.items():
        if s.steps:
            lines.append(
                f"    {name:<10} steps {s.steps:>5}  proposed {s.proposed:>6}  accepted {s.accepted:>6}"
                f"  ({s.acceptance_rate:.1%})  {s.tokens_per_step:.2f} tokens/step"
            )
    return "\n".join(lines)
