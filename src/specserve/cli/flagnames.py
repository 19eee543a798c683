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
# a field named later in the message ("... must exceed max_num_seqs"): only names with an underscore,
# which prose does not use (a plain "threads" or "seed" further on is a word, not the field)
_LATER_FIELD = re.compile(r"(?<![\w-])(" + "|".join(f for f in FLAGS if "_" in f) + r")(?!\w)")


def as_flags(message: str) -> str:
    """`message` with the config field it starts with, and any other flag's field with an
    underscore in it, named as its flag (other words as they are)."""
    head = _LEADING_FIELD.sub(lambda m: FLAGS.get(m.group(1), m.group(1)), message, count=1)
    return _LATER_FIELD.sub(lambda m: FLAGS[m.group(1)], head)


@contextlib.contextmanager
def flag_errors():
    """Turns a config's ValueError raised inside into an InvalidRequestError that names the flag."""
    try:
        yield
    except ValueError as e:
        raise InvalidRequestError(as_flags(str(e))) from None
