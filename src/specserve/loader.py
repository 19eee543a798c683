"""Loading a model spec into a ModelRunner and tokenizer.

A spec is resolved by `packs.resolve_model` (pack name -> local folder -> .gguf file -> hub id);
this file only turns the resolved source into objects and checks they fit together.
"""

from __future__ import annotations

import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .errors import ModelLoadError
from .runner import ModelRunner

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
          "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}


def pick_device(device: str | None) -> str:
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


def load(spec: str | None, role: str, dtype: str, device: str | None, max_context: int | None = None):
    """Resolve and load one model. Returns (ModelRunner, tokenizer, display name)."""
    from .packs import resolve_model

    source = resolve_model(spec, role=role)
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    t0 = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype(dtype), **kwargs)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load {source.display_name!r} as a causal language model: {first}") from e
    model.to(pick_device(device))
    print(f"loaded {source.display_name} ({dtype}) in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return ModelRunner(model, max_context), tokenizer, source.display_name


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
