"""The per-tokenizer compiler: a `GrammarSpec` in, a ready `Constraint` for one request out.

A `ConstraintFactory` holds xgrammar's view of one tokenizer (costly to build on a big
vocabulary, hence one per tokenizer: `factory_for`), the masks of banned characters, the
compile pool (pool.py) and the cache of compiled grammars (cache.py). It refuses, once
compiled, a grammar that allows no first token.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..tokenizer import shared
from .cache import GRAMMAR_CACHE_BYTES, GrammarCache, key_bytes
from .constraint import Constraint, next_allows_any
from .errors import ConstraintError, compile_errors
from .library import xgrammar
from .pool import GRAMMAR_TIME_LIMIT_S, GRAMMAR_WORKERS, CompilePool, PendingGuide
from .spec import CompiledGuide, GrammarSpec

if TYPE_CHECKING:
    import xgrammar as xgr


def check_satisfiable(spec: GrammarSpec, compiled, vocab_size: int, banned: torch.Tensor | None) -> None:
    """Refuse a grammar that allows no first token (no text satisfies it: `root ::= root`, a
    regex like `[^\\s\\S]`). Without this the request ran, sampled from an all-masked row and
    failed in the engine with a 500."""
    matcher = xgrammar().GrammarMatcher(compiled)
    if not matcher.is_terminated() and not next_allows_any(matcher, vocab_size, banned):
        raise ConstraintError(f"no text satisfies the {spec.kind} constraint: it allows no first token", spec.param)


class ConstraintFactory:
    """Per-tokenizer compiler: turns a GrammarSpec into a fresh Constraint for one request.

    time_limit_s, cache (a GrammarCache) and the pool's size can be changed on an instance."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]):
        self.vocab_size = vocab_size
        stops = sorted(stop_token_ids) or None
        info = xgrammar().TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
        self._setup(info)

    @classmethod
    def from_vocab(cls, vocab: list[str], stop_token_ids: set[int]) -> ConstraintFactory:
        """A factory over a raw string vocabulary (synthetic tests: token i is the string vocab[i])."""
        self = cls.__new__(cls)
        self.vocab_size = len(vocab)
        xgr = xgrammar()
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=sorted(stop_token_ids))
        self._setup(info)
        return self

    def _setup(self, info: xgr.TokenizerInfo) -> None:
        """What both constructors share, once xgrammar's TokenizerInfo is built."""
        self.compiler = xgrammar().GrammarCompiler(info, max_threads=1, cache_enabled=False)  # ours is bounded
        self.decoded = info.decoded_vocab
        self._bans: dict[str, torch.Tensor] = {}
        self._bans_lock = threading.Lock()
        self.time_limit_s = GRAMMAR_TIME_LIMIT_S
        self.cache = GrammarCache(GRAMMAR_CACHE_BYTES)
        self.pool = CompilePool(GRAMMAR_WORKERS)
        self._inflight: dict[tuple, Future] = {}  # key -> its compilation, so repeats join it
        self._lock = threading.Lock()

    def banned(self, chars: str) -> torch.Tensor | None:
        """[V] bool: tokens whose text contains any of `chars` (cached per set of chars)."""
        if not chars:
            return None
        with self._bans_lock:
            if chars not in self._bans:
                bad = set(chars.encode())
                # numpy, not torch: this runs on a grammar thread, where a torch fill of [V] would
                # start an OpenMP team and slow every later step of the process (backends/compute.py)
                ban = np.zeros(self.vocab_size, dtype=bool)  # [V]
                hits = [i for i, piece in enumerate(self.decoded[: self.vocab_size]) if any(b in bad for b in piece)]
                ban[hits] = True
                self._bans[chars] = torch.from_numpy(ban)
            return self._bans[chars]

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """Compile now, on this thread, with no time limit (the pool's jobs call this)."""
        with compile_errors(spec.kind, spec.param):
            return self.compiler.compile_grammar(spec.to_grammar())

    def submit(self, spec: GrammarSpec) -> PendingGuide:
        """Start compiling `spec` on the pool (or find it cached, or join its running compilation)."""
        key = spec.cache_key()
        cached = self.cache.get(key)
        if cached is not None:
            fut: Future = Future()
            fut.set_result(cached)
            return PendingGuide(fut, spec, self.time_limit_s, None)
        with self._lock:
            fut = self._inflight.get(key)
            started = fut is None or fut.cancelled()
            if started:
                fut = self.pool.submit(functools.partial(self._compile_and_keep, spec, key))
                self._inflight[key] = fut
        if started:  # outside the lock: a compilation already done calls _forget here, which takes it
            fut.add_done_callback(lambda f, key=key: self._forget(key, f))
        return PendingGuide(fut, spec, self.time_limit_s, self.pool)

    def _forget(self, key: tuple, fut: Future) -> None:
        """A compilation is over: a later submit of its key starts another (or finds it cached)."""
        with self._lock:
            if self._inflight.get(key) is fut:
                del self._inflight[key]

    def _compile_and_keep(self, spec: GrammarSpec, key: tuple) -> CompiledGuide:
        """Runs on a pool thread; the result is cached even if its caller stopped waiting."""
        compiled = self.compile(spec)
        guide = CompiledGuide(compiled, self.banned(spec.banned))
        check_satisfiable(spec, compiled, self.vocab_size, guide.banned)
        self.cache.put(key, guide, compiled.memory_size_bytes + key_bytes(key))
        return guide

    def prepare(self, spec: GrammarSpec | CompiledGuide | PendingGuide) -> CompiledGuide:
        """Compile once (e.g. while validating a request), within the time limit; make many Constraints from it."""
        if isinstance(spec, CompiledGuide):
            return spec
        if isinstance(spec, GrammarSpec):
            spec = self.submit(spec)
        return spec.result()

    def __call__(self, spec: GrammarSpec | CompiledGuide | PendingGuide) -> Constraint:
        """A fresh Constraint for one request (or one of its n choices), compiling `spec` if need be."""
        guide = self.prepare(spec)
        return Constraint(guide.compiled, self.vocab_size, guide.banned)


@functools.lru_cache(maxsize=8)
def _cached_factory(tokenizer_key: int, tokenizer, vocab_size: int, stops: tuple[int, ...]) -> ConstraintFactory:
    """The factory for one tokenizer (keyed by its id: a tokenizer need not be hashable), built once."""
    return ConstraintFactory(tokenizer, vocab_size, set(stops))


def factory_for(tokenizer, vocab_size: int, stop_token_ids: set[int]) -> ConstraintFactory:
    """One factory per (tokenizer, vocab size, stop tokens): TokenizerInfo is costly on big vocabularies."""
    tokenizer = shared(tokenizer)  # xgrammar reads the vocabulary once, and needs the real object
    return _cached_factory(id(tokenizer), tokenizer, vocab_size, tuple(sorted(stop_token_ids)))
