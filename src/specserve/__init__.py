"""specserve: lossless speculative decoding with Predicted Outputs, n-gram and draft-model drafting."""

from .config import SamplingParams, SpeculationConfig
from .engine.stats import RequestOutput, SpecStats, StepEvent
from .errors import (
    ContextLengthError,
    InvalidRequestError,
    ModelLoadError,
    SpecServeError,
)

__version__ = "0.1.0"


def __getattr__(name):  # LLM imports torch/transformers: load it only when asked for
    if name == "LLM":
        from .llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = [
    "LLM",
    "SamplingParams",
    "SpeculationConfig",
    "RequestOutput",
    "SpecStats",
    "StepEvent",
    "SpecServeError",
    "ModelLoadError",
    "ContextLengthError",
    "InvalidRequestError",
]
