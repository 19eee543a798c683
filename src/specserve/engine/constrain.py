"""Grammar constraints (structured outputs) for speculative decoding, backed by xgrammar.

A `Constraint` follows one request. The engine consults it at three points of every step:

    draft = constraint.cut(draft)       # (a) keep the longest draft prefix the grammar allows
    logits = target.forward(...)        #     [K+1, V]
    logits = constraint.mask(logits)    # (b) row i: only tokens the grammar allows after draft[:i]
    ...verify, commit...
    constraint.advance(committed)       # (c) move the matcher over the committed tokens

(a) and (b) are computed together in `cut`: the matcher walks the draft token by token,
filling one bitmask row per position, then rolls back. Row i is therefore exactly the mask
plain decoding would apply after committing draft[:i], so speculation verifies against the
*constrained* target distribution, the same one plain decoding samples from: greedy output is
identical and rejection sampling stays lossless with respect to it. When the grammar is
complete, only the stop tokens (EOS) are allowed: the constraint forces the end.

Why xgrammar (not llguidance): both were tried on our tokenizers. llguidance 1.9 refuses the
tiny test tokenizer (its `Fuse` decoder: "can't determine decoder type"); xgrammar 0.2.9 reads
it, and byte-level BPE ones, from the Hugging Face tokenizer directly, compiles JSON schemas,
regexes and EBNF, and its matcher rolls back, which verification of a draft needs.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import torch
import xgrammar as xgr

from .tokenizer import shared

# JSON-schema keywords the constraint enforces; anything else is refused (400), not ignored.
SUPPORTED_SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
    "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "pattern", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "format",
    # annotations: no effect on validity
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "strict",
})
SUPPORTED_FORMATS = frozenset({"date", "time", "date-time", "email", "uuid", "ipv4", "ipv6", "uri", "hostname"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # keyword -> {name: subschema}
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")  # keyword -> [subschema]
_SCHEMA_ONE = ("items", "additionalProperties")  # keyword -> subschema (or a bool)


class ConstraintError(ValueError):
    """A grammar or schema we cannot enforce; `param` names the request field at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def check_schema(schema, path: str = "schema") -> None:
    """Refuse JSON-schema keywords the grammar would not enforce (raises ConstraintError)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ConstraintError(f"{path} must be a JSON object")
    for key, value in schema.items():
        if key not in SUPPORTED_SCHEMA_KEYWORDS:
            raise ConstraintError(f"{path}: the JSON-schema keyword {key!r} is not supported")
        if key == "format" and value not in SUPPORTED_FORMATS:
            raise ConstraintError(f"{path}: the string format {value!r} is not supported")
        if key in _SCHEMA_MAPS:
            for name, sub in (value or {}).items():
                check_schema(sub, f"{path}.{key}.{name}")
        elif key in _SCHEMA_LISTS:
            for i, sub in enumerate(value or []):
                check_schema(sub, f"{path}.{key}[{i}]")
        elif key in _SCHEMA_ONE:
            check_schema(value, f"{path}.{key}")


# Raw control characters are never valid in compact JSON (strings must escape them), but
# xgrammar 0.2.9's string rule under maxLength/minLength lets them through (measured: it accepts
# '"a\x0cb"' for {"type": "string", "maxLength": 6}). JSON kinds therefore also ban every token
# containing one; tool calls keep "\n", which their <tool_call> framing needs.
JSON_BANNED = "".join(map(chr, range(32)))
TOOL_BANNED = JSON_BANNED.replace("\n", "")


@dataclass(frozen=True)
class GrammarSpec:
    """What to constrain to: kind is json_object | json_schema | regex | ebnf | grammar (a ready
    xgrammar Grammar, e.g. a tool call). `source` is the schema dict, regex or EBNF text.
    banned: characters no generated token may contain (on top of the grammar)."""

    kind: str
    source: object = None
    banned: str = ""
    param: str | None = None  # the request field it came from, named by errors

    def __post_init__(self):
        if self.kind == "json_schema" and not self.banned:
            object.__setattr__(self, "banned", JSON_BANNED)

    def to_grammar(self) -> xgr.Grammar:
        """The xgrammar Grammar for this spec; a compile error is a ConstraintError."""
        try:
            if self.kind == "json_object":
                return xgr.Grammar.builtin_json_grammar()
            if self.kind == "json_schema":
                return xgr.Grammar.from_json_schema(json.dumps(self.source), any_whitespace=False, strict_mode=True)
            if self.kind == "regex":
                return xgr.Grammar.from_regex(self.source)
            if self.kind == "ebnf":
                return xgr.Grammar.from_ebnf(self.source)
            if self.kind == "grammar":
                return self.source
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses
            raise ConstraintError(f"cannot compile the {self.kind} constraint: {e}", self.param) from None
        raise ConstraintError(f"unknown constraint kind {self.kind!r}", self.param)


def literal(text: str) -> xgr.Grammar:
    """A grammar that matches exactly `text`."""
    return xgr.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


class ConstraintFactory:
    """Per-tokenizer compiler: turns a GrammarSpec into a fresh Constraint for one request."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: set[int]):
        self.vocab_size = vocab_size
        stops = sorted(stop_token_ids) or None
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.decoded = info.decoded_vocab
        self._bans: dict[str, torch.Tensor] = {}

    @classmethod
    def from_vocab(cls, vocab: list[str], stop_token_ids: set[int]) -> "ConstraintFactory":
        """A factory over a raw string vocabulary (synthetic tests: token i is the string vocab[i])."""
        self = cls.__new__(cls)
        self.vocab_size = len(vocab)
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(vocab),
                                 stop_token_ids=sorted(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.decoded, self._bans = info.decoded_vocab, {}
        return self

    def banned(self, chars: str) -> torch.Tensor | None:
        """[V] bool: tokens whose text contains any of `chars` (cached per set of chars)."""
        if not chars:
            return None
        if chars not in self._bans:
            bad = set(chars.encode())
            ban = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
            for i, piece in enumerate(self.decoded[: self.vocab_size]):
                ban[i] = any(b in bad for b in piece)
            self._bans[chars] = ban
        return self._bans[chars]

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        try:
            return self.compiler.compile_grammar(spec.to_grammar())
        except ConstraintError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ConstraintError(f"cannot compile the {spec.kind} constraint: {e}", spec.param) from None

    def prepare(self, spec: "GrammarSpec | CompiledGuide") -> "CompiledGuide":
        """Compile once (e.g. while validating a request); make many Constraints from it."""
        if isinstance(spec, CompiledGuide):
            return spec
        return CompiledGuide(self.compile(spec), self.banned(spec.banned))

    def __call__(self, spec: "GrammarSpec | CompiledGuide") -> "Constraint":
        guide = self.prepare(spec)
        return Constraint(guide.compiled, self.vocab_size, guide.banned)


@dataclass(frozen=True)
class CompiledGuide:
    """A compiled grammar plus its banned-token mask: what one request (or each of its n choices) needs."""

    compiled: xgr.CompiledGrammar
    banned: torch.Tensor | None  # [V] bool


class Constraint:
    """One request's grammar state: cut drafts, mask verification rows, advance on commit."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int, banned: torch.Tensor | None = None):
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.banned = banned  # [V] bool, or None
        self._rows: torch.Tensor | None = None  # [K+1, ceil(V/32)] int32 bitmask of the last cut

    def cut(self, draft_ids: list[int], sampled: bool = False) -> list[int]:
        """The draft to verify, and the masks of its K+1 rows (kept for `mask`).

        Deterministic draft: the longest prefix the grammar accepts. For it, rejecting the first
        disallowed token x and sampling the bonus from the masked p are the same law, because
        the residual of p against one-hot(x) is p itself when p(x) = 0.
        Sampled draft (sampled=True, q a full distribution): that first disallowed token is kept,
        so verification rejects it (p(x) = 0) and samples the *residual* max(0, p - q): sampling
        from p there instead would not be lossless (see tests/test_structured_lossless.py).
        """
        m = self.matcher
        rows = xgr.allocate_token_bitmask(len(draft_ids) + 1, self.vocab_size)  # [K+1, W]
        kept, walked = len(draft_ids), 0
        for i, tok in enumerate(draft_ids):
            self._fill(rows, i)
            if m.is_terminated():  # draft[:i] ended with a stop token: nothing after it counts
                kept = i
                break
            if (self.banned is not None and self.banned[tok]) or not m.accept_token(tok):
                kept = i + 1 if sampled else i
                break
            walked += 1
        if kept == walked:
            self._fill(rows, kept)
        else:  # the row after a disallowed token is never committed: any valid distribution
            rows[kept] = -1
        if walked:
            m.rollback(walked)
        self._rows = rows[: kept + 1]
        return draft_ids[:kept]

    def _fill(self, rows: torch.Tensor, i: int) -> None:
        """Row i of the bitmask: the grammar's allowed tokens, or all of them once it has ended
        (a row after a stop token is never committed, but must stay a valid distribution)."""
        if self.matcher.is_terminated():
            rows[i] = -1  # every bit set
        else:
            self.matcher.fill_next_token_bitmask(rows, i)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [K+1, V] -> a copy with disallowed tokens at -inf (rows from the last `cut`)."""
        out = logits.float().clone()  # [K+1, V]
        if out.shape[-1] != self.vocab_size:
            raise ValueError(f"logits have {out.shape[-1]} columns, the grammar {self.vocab_size}")
        xgr.apply_token_bitmask_inplace(out, self._rows[: out.shape[0]], vocab_size=self.vocab_size)
        if self.banned is not None:
            out.masked_fill_(self.banned, float("-inf"))  # [V] broadcast over rows
        return out

    def advance(self, token_ids: list[int]) -> None:
        """Move the matcher over committed tokens (each was allowed by its row's mask)."""
        for tok in token_ids:
            if self.matcher.is_terminated():
                return
            if not self.matcher.accept_token(tok):
                raise RuntimeError(f"token {tok} was committed but the grammar rejects it")

    @property
    def finished(self) -> bool:
        return self.matcher.is_terminated()


@functools.lru_cache(maxsize=8)
def _cached_factory(tokenizer_key: int, tokenizer, vocab_size: int, stops: tuple[int, ...]) -> ConstraintFactory:
    return ConstraintFactory(tokenizer, vocab_size, set(stops))


def factory_for(tokenizer, vocab_size: int, stop_token_ids: set[int]) -> ConstraintFactory:
    """One factory per (tokenizer, vocab size, stop tokens): TokenizerInfo is costly on big vocabularies."""
    tokenizer = shared(tokenizer)  # xgrammar reads the vocabulary once, and needs the real object
    return _cached_factory(id(tokenizer), tokenizer, vocab_size, tuple(sorted(stop_token_ids)))
