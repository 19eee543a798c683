"""Loading a model spec into a backend and a tokenizer.

A spec is resolved by `packs.resolve_model` (pack name -> local folder -> .gguf file -> hub id);
this file picks the backend, turns the resolved source into objects and checks they fit.

Backend choice with `backend="auto"`: a GGUF (a pack or a `.gguf` file) runs on llama.cpp as it
is, unless a torch dtype was asked for (only transformers has one); Hugging Face folders and
hub ids run on transformers.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import torch
from transformers import AutoTokenizer  # modeling (4 s to import) only when a model runs on torch

from ..backends.compute import on_compute_thread
from ..config import SPARE_CELLS, EngineLimits, LoadOptions
from ..errors import ModelLoadError

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass
class LoadedModel:
    backend: object  # a backends.Backend
    tokenizer: object
    name: str
    eos_token_ids: set[int]


def pick_device(device: str | None) -> str:
    """The torch device to load on: `device` when this machine has it (None: cuda when available).

    A device torch lacks was found only when the weights moved there, as a traceback
    (`--device cuda` on a CPU-only torch: "AssertionError: Torch not compiled with CUDA enabled").
    """
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(device, str) and device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise ModelLoadError(f"--device {device}: this machine's torch sees {count} CUDA device(s)")
    return device


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


def choose_backend(source, options: LoadOptions) -> str:
    """The backend that will run `source` (a packs.ModelSource), or a clear error."""
    if options.backend == "auto":
        chosen = "llama.cpp" if source.gguf_file and options.dtype is None else "transformers"
        return choose_backend(source, replace(options, backend=chosen))
    if options.backend == "llama.cpp":
        if not source.gguf_file:
            raise ModelLoadError(
                f"the llama.cpp backend runs GGUF files, and {source.display_name!r} is a "
                f"Hugging Face model; use --backend transformers or give a .gguf file or pack"
            )
        if options.dtype is not None:
            raise ModelLoadError(
                "--dtype applies to the transformers backend only; llama.cpp runs the GGUF's own weights as they are"
            )
    if options.backend == "transformers" and options.gpu_layers is not None:
        raise ModelLoadError("--gpu-layers applies to the llama.cpp backend only; transformers takes --device")
    if options.backend == "transformers" and options.exact:  # ignored, it ran without the exactness asked for
        raise ModelLoadError("--exact applies to the llama.cpp backend only; on transformers, --dtype float32 is exact")
    return options.backend


def load(
    spec: str | None, role: str, options: LoadOptions | None = None, limits: EngineLimits | None = None
) -> LoadedModel:
    """Resolve and load one model on the chosen backend, with cache room for `limits`."""
    from .packs import resolve_model

    options = options or LoadOptions()
    source = resolve_model(spec, role=role)
    backend_name = choose_backend(source, options)
    t0 = time.perf_counter()
    # Built on the compute thread, which runs every model computation (backends/compute.py):
    # loading may run parallel native code (torch casts and copies), and the first parallel
    # region on another thread would leave OpenMP a second team that slows every later step.
    if backend_name == "llama.cpp":
        loaded = on_compute_thread(lambda: _load_llamacpp(source, options, limits or EngineLimits()))
    else:
        loaded = on_compute_thread(lambda: _load_transformers(source, options))
    what = (
        ("GGUF as is" + (", exact" if options.exact else ""))
        if backend_name == "llama.cpp"
        else (options.dtype or options.default_dtype)
    )
    _warn_if_context_capped(options.max_context, loaded.backend.max_context, source.display_name)
    cache = f"; {loaded.backend.describe_cache()}" if hasattr(loaded.backend, "describe_cache") else ""
    print(
        f"loaded {source.display_name} on {backend_name} ({what}) in {time.perf_counter() - t0:.1f}s{cache}",
        file=sys.stderr,
    )
    return loaded


def _warn_if_context_capped(asked: int | None, got: int, name: str) -> None:
    """Say so when --max-context asks for more than the model was trained on: both backends cap it
    there, and the capped context was then used without a word (a request that needed the context
    asked for was refused as over a context the user had not set)."""
    if asked is not None and got < asked:
        print(
            f"warning: --max-context {asked} is more than {name} was trained on: its context is {got} tokens",
            file=sys.stderr,
        )


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def load_tokenizer(source):
    """The tokenizer of a resolved source: a pack's saved tokenizer, a folder's, or a GGUF's own."""
    from pathlib import Path

    folder = Path(source.path)
    has_saved = folder.is_dir() and (folder / "tokenizer_config.json").is_file()
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file and not has_saved else {}
    try:
        return AutoTokenizer.from_pretrained(source.path, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"cannot load the tokenizer of {source.display_name!r}: {_first_line(e)}") from e


def _load_llamacpp(source, options: LoadOptions, limits: EngineLimits) -> LoadedModel:
    from pathlib import Path

    from ..backends.llamacpp import LlamaCppBackend

    path = Path(source.path) / source.gguf_file
    # One sequence more than the engine runs, and a few more cells: prices are measured on it.
    cache = limits.kv_cache_tokens + SPARE_CELLS if limits.kv_cache_tokens else None
    # Prefix caching keeps up to max_num_seqs finished requests' sequences (ids only: their cells
    # count against the same cache and are evicted first when a request needs room).
    backend = LlamaCppBackend(
        path,
        max_context=options.max_context,
        max_sequences=limits.max_num_seqs + 1,
        cache_tokens=cache,
        threads=options.threads,
        batch_invariant=options.exact,
        gpu_layers=options.gpu_layers,
        prefix_sequences=limits.max_num_seqs if limits.prefix_caching else 0,
    )
    if options.gpu_layers and not backend.on_gpu:
        print(f"warning: this llama.cpp build has no GPU: --gpu-layers {options.gpu_layers} ignored", file=sys.stderr)
    tokenizer = load_tokenizer(source)
    eos = backend.eog_token_ids()
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return LoadedModel(backend, tokenizer, source.display_name, eos)


def _load_transformers(source, options: LoadOptions) -> LoadedModel:
    from safetensors import SafetensorError  # a truncated or damaged weights file
    from transformers import AutoModelForCausalLM

    from ..backends.transformers import TransformersBackend
    from .gguf_reads import gguf_read_once
    from .packs import ensure_converted

    device = pick_device(options.device)  # before minutes of conversion and loading
    if source.pack:  # packs keep the GGUF; the safetensors folder is made on first use here
        source = ensure_converted(source)
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        dtype = torch_dtype(options.dtype or options.default_dtype)
        with gguf_read_once():  # tokenizer, config and weights from one parse of a GGUF
            tokenizer = load_tokenizer(source)  # a saved tokenizer beside a GGUF loads in 0.4 s
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, **kwargs)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        again = f"; `specserve models pull {source.pack} --force` rebuilds the pack" if source.pack else ""
        raise ModelLoadError(
            f"cannot load {source.display_name!r} as a causal language model: {_first_line(e)}{again}"
        ) from e
    model.to(device)
    backend = TransformersBackend(model, options.max_context)
    return LoadedModel(backend, tokenizer, source.display_name, eos_ids(model, tokenizer))


def eos_ids(model, tokenizer) -> set[int]:
    """Every token id that ends generation: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(gen_eos)
    return ids
