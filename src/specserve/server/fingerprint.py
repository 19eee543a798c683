"""`system_fingerprint`: which configuration answered, as OpenAI's `fp_` + 10 hex digits.

OpenAI changes it when "backend changes ... that might impact determinism" are made; here it is a
digest of what decides the outputs of one request: specserve's version, the default speculation
method (a draft model's sampled drafts enter a seeded request's rejection rule), and for the target
and the draft model each the backend, the model (its file's path, size and modification time, or
the weight files of a Hugging Face folder; a model built in memory by its config) and what changes
its numerics (dtype, device type, exact mode, llama.cpp on a GPU and its flash attention). Threads,
context and cache sizes are left out: they change speed and limits, not what a request gets.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .. import __version__
from ..engine.prices import file_key, weight_files

NUMERICS = ("batch_invariant", "on_gpu", "flash_attention", "dtype")  # backend attributes, where it has them


def _model(backend) -> object:
    """What says which weights a backend holds."""
    if getattr(backend, "path", None) is not None:  # llama.cpp: one GGUF
        return file_key(Path(backend.path))
    model = getattr(backend, "model", None)
    weights = weight_files(model)
    if weights:
        return [file_key(w) for w in weights]
    config = getattr(model, "config", None)  # built in memory: nothing on disk names it
    return config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else type(model).__name__


def backend_identity(backend) -> dict | None:
    """What in one backend decides the outputs; None without one (no draft model)."""
    if backend is None:
        return None
    ident = {"backend": getattr(backend, "name", type(backend).__name__), "model": _model(backend)}
    ident |= {k: str(getattr(backend, k)) for k in NUMERICS if hasattr(backend, k)}
    device = getattr(backend, "device", None)
    if device is not None:
        ident["device"] = getattr(device, "type", str(device))
    return ident


def system_fingerprint(llm) -> str:
    """`fp_` and the first 10 hex digits of the configuration's SHA-256."""
    config = {
        "version": __version__,
        "speculation": getattr(getattr(llm, "speculation", None), "method", None),
        "target": backend_identity(llm.target_backend),
        "draft": backend_identity(llm.draft_backend),
    }
    return "fp_" + hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:10]
