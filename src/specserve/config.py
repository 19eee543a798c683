"""Frozen configuration shared by the Python API, the CLI and the server.

`SamplingParams` says *what* distribution to draw from; `SpeculationConfig` says *how*
to get there faster. Neither changes the output distribution: speculation is lossless.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
from dataclasses import dataclass, replace

METHODS = ("auto", "none", "prediction", "ngram", "draft")
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # seeds: a signed 64-bit integer, as OpenAI documents


def is_integer(value) -> bool:
    """An integral number that is not a bool: Python's ints and numpy's alike."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters, shaped like vLLM's.

    temperature == 0 means greedy (exact argmax path). top_k == 0 / top_p == 1 disable those
    filters. Penalties follow OpenAI's definition and are applied to every verified position
    exactly as plain decoding would apply them.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: no logprobs; n >= 0: chosen token + n top alternatives
    ignore_eos: bool = False
    # Added to the target's logits before anything else, as OpenAI's logit_bias: {token id: bias}
    # (a dict is taken, as vLLM takes it, and kept as sorted (id, bias) pairs).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # The log-probability of each prompt token after the ones before it, with this many top
    # alternatives (vLLM's prompt_logprobs; None: not computed). Such a prompt is prefilled in
    # full, never taken from the prefix cache, whose cells hold no logits.
    prompt_logprobs: int | None = None
    # Samples per prompt (vLLM's n): LLM.generate and chat run n requests, seeds derived from `seed`
    # (per_sample), and give them as one RequestOutput's `outputs`. The engine runs one at a time.
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is None or isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        else:  # stop=5 was "'int' object is not iterable"
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self._check_types()
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:  # 0 (OpenAI accepts it): only the most probable token is kept
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        # The engine keys its random numbers with the seed's 64 bits (engine/sampling.py's Noise):
        # a larger seed sampled as another one (2**64 as 0). The server's range, OpenAI's int64.
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be in [{SEED_MIN}, {SEED_MAX}] (a 64-bit integer), got {self.seed}")
        if self.top_k == -1:  # vLLM's "off" (its default), as the server takes it
            object.__setattr__(self, "top_k", 0)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 or -1: off), got {self.top_k}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= 20:
                raise ValueError(f"{name} must be in [0, 20], got {getattr(self, name)}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        pairs = _bias_pairs(self.logit_bias)
        if any(t < 0 for t, _ in pairs) or len({t for t, _ in pairs}) < len(pairs):
            raise ValueError("logit_bias keys must be distinct token ids >= 0")
        if any(not -100.0 <= b <= 100.0 for _, b in pairs):
            raise ValueError("logit_bias values must be in [-100, 100]")
        object.__setattr__(self, "logit_bias", pairs)

    def _check_types(self) -> None:
        """Wrong types fail here, in one line, not inside an engine step (`seed=1.5` was an
        EngineFault there, which the server answers with a 500). Integers: `is_integer`."""

        if not is_integer(self.n) or self.n < 1:  # n=0 or 1.5 would silently give one sample, or none
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        for name in ("max_tokens", "top_k", "seed", "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if not (is_integer(value) or (value is None and name in ("seed", "logprobs", "prompt_logprobs"))):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value is not None:
                object.__setattr__(self, name, int(value))  # numpy's too: plain ints from here on
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or math.isnan(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if not isinstance(self.ignore_eos, bool):  # ignore_eos="false" was taken as True
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")

    def per_sample(self, n: int | None = None) -> list[SamplingParams]:
        """One SamplingParams (n=1) for each of n samples (default: self.n). With a seed, sample i
        gets a seed derived from (seed, i), so samples differ and a call repeats; one sample keeps
        the seed as given. The server's n choices and LLM.generate's n samples both come from here."""
        n = self.n if n is None else n
        one = replace(self, n=1) if self.n != 1 else self
        if n == 1 or self.seed is None:
            return [one] * n
        return [replace(one, seed=_derived_seed(self.seed, i)) for i in range(n)]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _derived_seed(seed: int, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: a valid torch seed


def _bias_pairs(bias) -> tuple[tuple[int, float], ...]:
    """logit_bias ({token id: bias}, OpenAI's string ids too, or (id, bias) pairs) as sorted
    (int, float) pairs. Other shapes are refused by name: {"a": 1} was "invalid literal for int()"
    and [1, 2] "cannot unpack non-iterable int object"."""
    items = bias.items() if isinstance(bias, dict) else (bias or ())
    try:
        pairs = [(t, b) for t, b in items]
        pairs = [(int(t), float(b)) for t, b in pairs if not isinstance(t, float) and not isinstance(b, bool)]
    except (TypeError, ValueError):
        pairs = None
    if pairs is None or len(pairs) != len(items):
        raise ValueError(f"logit_bias must map token ids to numbers ({{id: bias}}), got {bias!r}")
    return tuple(sorted(pairs))


VLLM_SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculationConfig:
    """Which drafter(s) to use and how many tokens they may propose per step.

    method: "auto" (prediction when given, else n-gram, the draft model filling in where the
    others have nothing), "none" (plain decoding), or a single source.
    num_speculative_tokens: starting K for every source; each source adapts K between its own
    bounds below as drafts are accepted or rejected.
    """

    method: str = "auto"
    num_speculative_tokens: int | None = None
    prediction_k_max: int = 1024  # with measured prices K is priced up to this (without, at most 128)
    prediction_min_anchor_chars: int = 4  # tuned by replay on 73 real file edits (docs/benchmarks.md)
    prediction_learn_edits: bool = True  # learn substitutions at re-anchors and draft them later on
    ngram_n_min: int = 2
    ngram_n_max: int = 4
    ngram_k_max: int = 16
    draft_k_max: int = 8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown speculation method {self.method!r}; choose one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if k is not None and not 1 <= k <= 256:
            raise ValueError(f"num_speculative_tokens must be in [1, 256], got {k}")
        if not 1 <= self.ngram_n_min <= self.ngram_n_max:
            raise ValueError("need 1 <= ngram_n_min <= ngram_n_max")

    @classmethod
    def coerce(cls, value: str | SpeculationConfig | dict | None) -> SpeculationConfig:
        """Accept a method name, a dict of fields, or a config object."""
        if value is None:
            return cls()
        if isinstance(value, SpeculationConfig):
            return value
        if isinstance(value, str):
            return cls(method=value)
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(f"speculation must be a method name or SpeculationConfig, got {type(value).__name__}")

    @classmethod
    def from_vllm(cls, config: dict) -> tuple[SpeculationConfig, str | None]:
        """vLLM's `speculative_config` dict as (our config, the draft model it names or None):
        {"method": "ngram", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"} or
        {"model": ..., "num_speculative_tokens"} (method "draft_model"). EAGLE, Medusa and MTP
        heads have no equivalent here, and any other key is refused by name."""
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(config).__name__}")
        unknown = sorted(set(config) - set(VLLM_SPEC_KEYS))
        if unknown:
            raise ValueError(
                f"speculative_config: {', '.join(unknown)} not supported (known: {', '.join(VLLM_SPEC_KEYS)})"
            )
        model, method = config.get("model"), config.get("method") or ("draft_model" if config.get("model") else None)
        if method not in ("ngram", "draft_model"):
            raise ValueError(
                f"speculative_config: method {method!r} not supported (choose 'ngram', or a draft 'model')"
            )
        if (method == "draft_model") != bool(model):
            raise ValueError(
                f"speculative_config: method {method!r} {'needs' if model is None else 'takes no'} 'model'"
            )
        fields = {"ngram_n_max": config.get("prompt_lookup_max"), "ngram_n_min": config.get("prompt_lookup_min")}
        fields = {k: v for k, v in fields.items() if v is not None}
        if "ngram_n_max" in fields and "ngram_n_min" not in fields:
            fields["ngram_n_min"] = min(cls.ngram_n_min, fields["ngram_n_max"])
        k = config.get("num_speculative_tokens")
        spec = cls("ngram" if method == "ngram" else "draft", num_speculative_tokens=k, **fields)
        return spec, model


# Measuring prices (engine/governor.py) times target passes of CALIBRATION_SIZES tokens over a short
# cached context, on a spare sequence while others run. The loader sizes a llama.cpp cache with
# SPARE_CELLS cells more than the engine hands out, and the engine keeps them free for that.
CALIBRATION_CONTEXT = 32  # tokens cached before timing, so attention is not free
CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)  # tokens per timed pass
SPARE_CELLS = CALIBRATION_CONTEXT + max(CALIBRATION_SIZES)  # what measuring prices holds for a moment
# The smallest --max-context a user may set: a context must hold measuring prices' passes
# (SPARE_CELLS) with room for a prompt; 10 used to load and then refuse every request with "the
# engine's cache holds -70".
MIN_MAX_CONTEXT = 256
# The passage on which a draft model's agreement with the target is measured with the prices (at most
# SPARE_CELLS tokens of it): an answer of the kind `auto` lets a draft model write, prose and then code.
# Changing it changes the price cache's key (prices.py).
AGREEMENT_TEXT = """Python's dictionaries keep insertion order, so a least-recently-used cache can be built on an
OrderedDict: move a key to the end on every hit and pop the first item when the cache is full. For
thread safety, guard both operations with a lock, because a lookup also changes the order.

```python
def lru_cache(maxsize):
    def decorator(fn):
        cache = OrderedDict()
        lock = threading.Lock()

        @functools.wraps(fn)
        def wrapper(*args):
            with lock:
                if args in cache:
                    cache.move_to_end(args)
                    return cache[args]
            value = fn(*args)
            with lock:
                cache[args] = value
                if len(cache) > maxsize:
                    cache.popitem(last=False)
            return value

        return wrapper

    return decorator
```
"""


@dataclass(frozen=True)
class EngineLimits:
    """How much the engine runs at once (continuous batching; docs/design.md, "Batching").

    max_num_seqs: requests decoding together; more wait in the queue.
    kv_cache_tokens: cache cells shared by all running requests (None: max_num_seqs full
    contexts). A request is admitted only when its prompt + max_tokens fits in what is left,
    so a running request can never run out of cache.
    max_num_batched_tokens: tokens one step may feed the target (pending + drafts + prefill): the
    prefill chunks fill it and, with prices measured, trim the greedy drafts of a batch to what is
    left; a lone decoding request's draft and sampled drafts are not cut, and come on top.
    prefill_slowdown: while other requests decode, a prompt is prefilled in chunks small enough
    that a step costs at most this many times a step without the chunk (measured prices).
    min_prefill_chunk: the smallest such chunk (at least 1), so a long prompt still makes progress.
    prefix_caching: a request whose prompt starts like a running or finished request's tokens
    reuses their cache and prefills only the rest (engine/prefix_cache.py); finished requests'
    prefixes stay cached until their cells are needed.
    host_cache_bytes: host memory for finished requests' caches that leave the KV cache, where
    the backend can copy a sequence out and back (llama.cpp; engine/host_cache.py). None: 4 GiB,
    at most a quarter of the memory available at start-up; 0: off.
    host_cache_dir: a folder the host tier is written to when the engine stops and read back
    from when it starts (engine/host_store.py); None: kept in memory only.
    """

    max_num_seqs: int = 8
    kv_cache_tokens: int | None = None
    max_num_batched_tokens: int = 2048
    prefill_slowdown: float = 2.0
    min_prefill_chunk: int = 4
    prefix_caching: bool = True
    host_cache_bytes: int | None = None
    host_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 16:
            raise ValueError(f"kv_cache_tokens must be at least 16, got {self.kv_cache_tokens}")
        if self.max_num_batched_tokens < self.max_num_seqs + 1:
            raise ValueError(
                "max_num_batched_tokens must exceed max_num_seqs (one pending token each, plus room for prefill)"
            )
        if self.host_cache_bytes is not None and self.host_cache_bytes < 0:
            raise ValueError(f"host_cache_bytes must be at least 0, got {self.host_cache_bytes}")
        if self.host_cache_dir and self.host_cache_bytes == 0:
            raise ValueError(
                "host_cache_dir (--host-cache-dir) needs the host tier, which host_cache_bytes=0 "
                "(--host-cache-gib 0) turns off"
            )
        if self.prefill_slowdown < 1.0:
            raise ValueError(f"prefill_slowdown must be at least 1, got {self.prefill_slowdown}")
        if self.min_prefill_chunk < 1:  # the floor that keeps a joining prompt moving (scheduler.py)
            raise ValueError(f"min_prefill_chunk must be at least 1, got {self.min_prefill_chunk}")

    def cache_tokens(self, max_context: int) -> int:
        """The cache cells to allocate for a model with this per-sequence context."""
        return self.kv_cache_tokens or self.max_num_seqs * max_context


# A command that runs one request at a time (`generate`, `replay --measure-cost`): one sequence's
# cache (the batching default of 8 allocated 8 full contexts, 1.6 GiB on SmolLM2, to use one), and
# no prefix cache or host tier, which only later requests read.
ONE_REQUEST = EngineLimits(max_num_seqs=1, prefix_caching=False, host_cache_bytes=0)

BACKENDS = ("auto", "llama.cpp", "transformers")


NO_DRAFT = ("", "none")  # draft_model values that ask for no draft model


def loads_draft_model(model: str | None, draft_model: str | None) -> bool:
    """Whether `LLM(model, draft_model)` loads a draft model: the default pair when neither is
    named, else only a draft model named explicitly (a check the CLI makes before loading)."""
    return (model is None and draft_model is None) or draft_model not in (None, *NO_DRAFT)


@dataclass(frozen=True)
class LoadOptions:
    """How models are run: shared by `LLM`, `specserve generate/serve/bench`.

    backend: "auto" (a GGUF pack or .gguf file on llama.cpp unless a torch dtype is asked for;
    HF folders and hub ids on transformers), "llama.cpp" or "transformers".
    dtype: torch dtype name, transformers only (None or vLLM's "auto": bfloat16 there; llama.cpp
    runs the GGUF's own weights). default_dtype: the torch dtype when `dtype` is None (it does not steer the
    backend choice). threads: llama.cpp CPU threads (None: every core this process may use).
    exact: llama.cpp's batch-invariant kernels, so that greedy speculation reproduces plain
    decoding bit for bit on quantized weights too, at about half the verification throughput
    on a CPU (docs/design.md, "Exactness on llama.cpp"). transformers in float32 is exact anyway.
    gpu_layers: llama.cpp layers on the GPU of a GPU build (None: all of them, or none with
    `exact`, which keeps to the CPU kernels it was made batch-invariant on; 0: CPU only).
    """

    backend: str = "auto"
    dtype: str | None = None
    default_dtype: str = "bfloat16"
    device: str | None = None  # None: cuda when available, else cpu (transformers)
    max_context: int | None = None
    threads: int | None = None
    exact: bool = False
    gpu_layers: int | None = None

    def __post_init__(self) -> None:
        if self.dtype == "auto":  # vLLM's default, as its scripts spell it: our default choice
            object.__setattr__(self, "dtype", None)
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.gpu_layers is not None and self.gpu_layers < 0:
            raise ValueError(f"gpu_layers must be 0 or more (leave it out for all), got {self.gpu_layers}")
        if self.exact and self.gpu_layers:
            raise ValueError(
                "--exact runs on the CPU kernels it was made batch-invariant on (a GPU's change with "
                f"the batch size): leave out --gpu-layers {self.gpu_layers}, or give 0"
            )
        if isinstance(self.device, str) and not re.fullmatch(r"cpu|mps|cuda(:\d+)?", self.device):
            # torch read any other name as the weights moved there: a traceback after the load
            raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {self.device!r}")
        if self.max_context is not None and self.max_context < MIN_MAX_CONTEXT:
            raise ValueError(f"max_context must be at least {MIN_MAX_CONTEXT} tokens, got {self.max_context}")
