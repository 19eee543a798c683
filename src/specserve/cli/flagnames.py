"""Config errors in the words of the command line: SamplingParams, SpeculationConfig, LoadOptions and
EngineLimits name their fields ("top_p must be in [0, 1]"), which is right for the Python API and the
server's 400s (OpenAI's field names), but a CLI user typed `--top-p`. The CLI maps the field that
starts such a message to the flag that set it; the engine keeps its own words."""

from __future__ import annotations

import contextlib
import re

from ..errors import InvalidRequestError

FLAGS = {
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "seed": "--seed",
    "stop": "--stop",
    "num_speculative_tokens": "-k/--num-speculative-tokens",
    "threads": "--threads",
    "gpu_layers": "--gpu-layers",
    "max_context": "--max-context",
    "device": "--device",
    "max_num_seqs": "--max-num-seqs",
    "kv_cache_tokens": "--kv-cache-tokens",
    "max_num_batched_tokens": "--max-num-batched-tokens",
}

_LEADING_FIELD = re.compile(r"^(\w+)\b")


def as_flags(message: str) -> str:
    """`message` with the config field it starts with named as its flag (others as they are)."""
    return _LEADING_FIELD.sub(lambda m: FLAGS.get(m.group(1), m.group(1)), message, count=1)


@contextlib.contextmanager
def flag_errors():
    """Turns a config's ValueError raised inside into an InvalidRequestError that names the flag."""
    try:
        yield
    except ValueError as e:
        raise InvalidRequestError(as_flags(str(e))) from None
