"""specserve: lossless speculative decoding with Predicted Outputs, n-gram and draft-model drafting.

The public names load on first use (PEP 562): `import specserve.cli` or `specserve.models.packs`
must not pay for torch and transformers, so a CLI error or `--help` answers in a second.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "LLM": ".llm",
    "SamplingParams": ".config",
    "SpeculationConfig": ".config",
    "RequestOutput": ".engine.stats",
    "CompletionOutput": ".engine.completion",
    "SpecStats": ".engine.stats",
    "StepEvent": ".engine.stats",
    "SpecServeError": ".errors",
    "ModelLoadError": ".errors",
    "ContextLengthError": ".errors",
    "InvalidRequestError": ".errors",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = list(_EXPORTS)
