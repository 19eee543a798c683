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

Compiling, off the request path and with a time limit. xgrammar's compile time is not bounded
by the size of the request: measured on SmolLM2's 49k-token vocabulary, an `anyOf` of 100 short
string patterns takes ~3 s and of 1000 ~32 s, and ten levels of nested objects ~1.5 s. So a
`ConstraintFactory` compiles on its own small pool of threads (`GRAMMAR_WORKERS`), never
on the caller's thread: `submit` returns a `PendingGuide` at once, and whoever waits for it (the
server's event loop, or `prepare` for the Python API) gives up after `GRAMMAR_TIME_LIMIT_S` with
a ConstraintError that says so (a 400). A thread cannot be killed: a compilation that overran
keeps its pool thread until it finishes, and its result then goes into the cache, so a retry of
the same grammar is instant. At most `GRAMMAR_WORKERS` compilations run at once, overrunning or
not; a grammar still queued when its time is up is dropped without being compiled, and the
caller gets `GrammarBusy` (a 503: the server, not the request, is at fault). The same grammar
asked for again while it compiles joins that compilation instead of starting another. The pool
threads are not daemons: a process that exits while an overrunning compilation runs waits for
it (a daemon thread inside xgrammar's C++ at interpreter exit aborts the process instead:
"terminate called without an active exception", measured).

Compiled grammars are kept in an LRU cache bounded in bytes (`GRAMMAR_CACHE_BYTES`, counted with
xgrammar's `memory_size_bytes`); xgrammar's own (unbounded) cache is off.

xgrammar is imported on first use (`xgrammar()`): importing it costs ~2.5 s here, paid by every
server start and CLI run, and most never constrain anything.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from .tokenizer import shared

if TYPE_CHECKING:
    import xgrammar as xgr


@functools.cache
def xgrammar():
    """The xgrammar module, imported the first time a grammar is built."""
    import xgrammar as module

    return module


# JSON-schema keywords the constraint enforces; anything else is refused (400), not ignored.
SUPPORTED_SCHEMA_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "$ref",
        "$defs",
        "definitions",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "maxItems",
        "format",
        "discriminator",  # OpenAPI's (pydantic writes it): next to oneOf/anyOf only, see _check_one_of
        # annotations: no effect on validity
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "strict",
    }
)
SUPPORTED_FORMATS = frozenset({"date", "time", "date-time", "email", "uuid", "ipv4", "ipv6", "uri", "hostname"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # keyword -> {name: subschema}
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")  # keyword -> [subschema]
_SCHEMA_ONE = ("items", "additionalProperties")  # keyword -> subschema (or a bool)


GRAMMAR_TIME_LIMIT_S = 10.0  # how long a request waits for its grammar to compile
GRAMMAR_WORKERS = 2  # compilations at once (overrunning ones included) per tokenizer
GRAMMAR_CACHE_BYTES = 256 << 20  # compiled grammars kept (LRU), per tokenizer


class ConstraintError(ValueError):
    """A grammar or schema we cannot enforce; `param` names the request field at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class GrammarBusy(ConstraintError):
    """Every grammar compiler was busy for the whole time limit: retry later (a 503, not a 400)."""


class GrammarDeadEnd(ConstraintError):
    """The grammar allows no token where the output has got to: no text satisfies it from there.

    Raised in a step, but the caller's grammar is at fault, not the engine: a 400, like a
    grammar refused before it runs (most such grammars are: see `_check_satisfiable`)."""


def _allows_any(bitmask: torch.Tensor, vocab_size: int, banned: torch.Tensor | None) -> bool:
    """Whether a [W] int32 token bitmask row allows any token below vocab_size that is not banned."""
    words = bitmask.numpy().view(np.uint32)  # [W]
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)  # [V]
    if banned is not None:
        bits &= ~banned.numpy()[:vocab_size]
    return bool(bits.any())


def _next_allows_any(matcher, vocab_size: int, banned: torch.Tensor | None) -> bool:
    """Whether the matcher's next token may be any token at all (one below vocab_size, not banned)."""
    row = xgrammar().allocate_token_bitmask(1, vocab_size)  # [1, W]
    matcher.fill_next_token_bitmask(row, 0)
    return _allows_any(row[0], vocab_size, banned)


def _check_satisfiable(spec: GrammarSpec, compiled, vocab_size: int, banned: torch.Tensor | None) -> None:
    """Refuse a grammar that allows no first token (no text satisfies it: `root ::= root`, a
    regex like `[^\\s\\S]`). Without this the request ran, sampled from an all-masked row and
    failed in the engine with a 500."""
    matcher = xgrammar().GrammarMatcher(compiled)
    if not matcher.is_terminated() and not _next_allows_any(matcher, vocab_size, banned):
        raise ConstraintError(f"no text satisfies the {spec.kind} constraint: it allows no first token", spec.param)


# Keywords xgrammar 0.2.9 applies only to a value of one type (integer and number share theirs).
# Next to no `type` (and no `properties`/`items` to infer one from) it drops them without a word
# and allows any value: `{"maxLength": 2}` let through a 40-character string, `{"minimum": 5}` -0.
_TYPED_KEYWORDS = {
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), ("string",)),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"), ("integer", "number")),
    **dict.fromkeys(("minItems", "maxItems"), ("array",)),
    "required": ("object",),
}
# xgrammar enforces one of these alone: every validation keyword next to it was dropped (an enum
# next to `maxLength`, `{"$ref": ..., "maxLength": 2}`, an object's `required` next to `anyOf`).
_ALTERNATIVES = ("enum", "const", "anyOf", "oneOf", "$ref")
_NOT_VALIDATION = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "strict"})
_JSON_TYPES = {"null": type(None), "boolean": bool, "string": str, "array": list, "object": dict}


def _is_of_type(value, name: str) -> bool:
    if name in ("integer", "number") and not isinstance(value, bool):
        return isinstance(value, int) or (isinstance(value, float) and (name == "number" or value.is_integer()))
    return name in _JSON_TYPES and isinstance(value, _JSON_TYPES[name])


def _check_combinations(schema: dict, path: str) -> None:
    """Refuse what xgrammar would compile but not enforce (measured: each let invalid output through)."""
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise ConstraintError(f"{path}: $ref {ref!r} is not supported, only references inside the schema ('#/...')")
    types = schema.get("type")
    types = {t for t in (types if isinstance(types, list) else [types]) if isinstance(t, str)}
    alternatives = [k for k in _ALTERNATIVES if k in schema]
    if alternatives:
        word = alternatives[0]
        allowed = _NOT_VALIDATION | {"$defs", "definitions", word}
        if word in ("anyOf", "oneOf"):
            allowed |= {"discriminator"}
        if word in ("enum", "const"):  # with a `type` (as pydantic writes them), every value must have it
            allowed |= {"type"}
            values = schema["enum"] if word == "enum" else [schema["const"]]
            for value in values if types and isinstance(values, list) else []:
                if not any(_is_of_type(value, t) for t in types):
                    raise ConstraintError(f"{path}: the {word} value {value!r} is not of type {schema['type']!r}")
        others = sorted(set(schema) - allowed)
        if others:
            raise ConstraintError(f"{path}: {word!r} cannot be combined with {others[0]!r}")
        return
    if "properties" in schema or "additionalProperties" in schema:
        types.add("object")
    if "items" in schema or "prefixItems" in schema:
        types.add("array")
    for key in schema:
        if key in _TYPED_KEYWORDS and not types:
            raise ConstraintError(f"{path}: {key!r} needs a 'type' next to it ({' or '.join(_TYPED_KEYWORDS[key])})")
    if "pattern" in schema and "format" in schema:
        raise ConstraintError(f"{path}: 'pattern' cannot be combined with 'format'")
    for key in ("pattern", "format"):
        for length in ("minLength", "maxLength"):
            if key in schema and length in schema and not _bounded_uri(schema):
                raise ConstraintError(f"{path}: {key!r} cannot be combined with {length!r}")
    if _bounded_uri(schema):
        uri_pattern(schema.get("minLength", 0), schema.get("maxLength"), path)  # refuses bounds it cannot meet
    if isinstance(schema.get("pattern"), str) and re.search(r"\(\?<?[=!]", schema["pattern"]):
        raise ConstraintError(f"{path}: lookahead and lookbehind in a pattern are not supported")
    anchor = misplaced_anchor(schema["pattern"]) if isinstance(schema.get("pattern"), str) else None
    if anchor is not None:
        raise ConstraintError(f"{path}: {ANCHOR_REFUSAL.format(anchor)}")
    if isinstance(schema.get("pattern"), str) and _folds_negated_class(schema["pattern"]):
        raise ConstraintError(
            f"{path}: a case-insensitive pattern ((?i)) with a negated class is not supported (the grammar "
            "folds case by ASCII there: (?i)[^k] wrote the Kelvin sign, which Python's re folds to k)"
        )
    special = json_special_in_pattern(schema["pattern"]) if isinstance(schema.get("pattern"), str) else None
    if special is not None:
        raise ConstraintError(
            f"{path}: a pattern that names {special!r} is not supported (a quote, a backslash or a control "
            "character; the grammar would write it unescaped, which is not JSON)"
        )
    properties, required = schema.get("properties") or {}, schema.get("required")
    for name in required if isinstance(required, list) else []:
        if isinstance(name, str) and name not in properties:
            raise ConstraintError(f"{path}: the required property {name!r} is not in 'properties'")


# xgrammar 0.2.9's own regexes for these formats let invalid values through (measured): any day
# 01-31 in any month ("2023-02-30", "2023-04-31"), year 0000 and an IPv4 octet with a leading zero
# ("01.2.3.4"), all of which pydantic, Python's `date.fromisoformat` and `ipaddress` refuse, so a
# client's `parse(..., response_format=Model)` failed on an answer we called valid. They are
# enforced as these patterns instead: calendar dates (leap years included), years 0001-9999,
# octets without leading zeros. Times are xgrammar's, less the leap second (":60"), which RFC 3339
# allows and pydantic's `time` and `datetime` refuse: a stricter grammar never writes a value the
# schema rejects, and a client's pydantic model then parses every answer.
_YEAR = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d{2}|[1-9]\d{3})"
_LEAP_YEAR = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    rf"|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


def _label(most: int) -> str:
    """A hostname label (RFC 1123) of 1..most letters, digits and inner hyphens."""
    return rf"[a-zA-Z0-9](?:[a-zA-Z0-9\-]{{0,{most - 2}}}[a-zA-Z0-9])?"


# A hostname: labels of at most 63 characters, at most 253 in all (RFC 1123; xgrammar's own let a
# 64-character label through). A regex cannot count across labels, so it is written as up to four
# labels (the last at most 61 long: 3 x 63 + 61 + 3 dots = 253) or five to eight of at most 30.
_HOSTNAME = rf"(?:{_label(63)}(?:\.{_label(63)}){{0,2}}(?:\.{_label(61)})?|{_label(30)}(?:\.{_label(30)}){{4,7}})"
FORMAT_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}T{_TIME}",
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    "hostname": _HOSTNAME,
}


# A `format: uri` with a length bound (pydantic's HttpUrl and AnyUrl write one) is written as this
# pattern: xgrammar enforces no length next to a format or a pattern. It is a strict subset of RFC
# 3986: scheme://host[:port][/path][?query][#fragment], no percent-escapes, each part bounded so
# that every value it allows has the schema's length. A stricter grammar never writes a value the
# schema rejects; it only cannot write some (a mailto: link, a %20).
_URI_SCHEME = r"[a-zA-Z][a-zA-Z0-9+.\-]{0,15}"  # at most 16 characters
_URI_HOST = r"[a-zA-Z0-9\-._~!$&'()*+,;=]"  # a reg-name's characters, no escapes
_URI_PCHAR = r"a-zA-Z0-9\-._~!$&'()*+,;=:@"  # a path segment's characters, no escapes
_URI_FIXED = 16 + len("://") + len(":65535") + len("/?#")  # the longest scheme, the port and separators
_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"  # 0-65535
_URI_SHORTEST = len("a://h")
URI_MIN_MAX_LENGTH = _URI_FIXED + 4  # room for a host and a little path, query and fragment


def _bounded_uri(schema: dict) -> bool:
    return schema.get("format") == "uri" and ("minLength" in schema or "maxLength" in schema)


def uri_pattern(min_length, max_length, path: str = "schema") -> str:
    """The pattern of a `format: uri` string of min_length..max_length characters (no bound: None)."""
    for name, value in (("minLength", min_length), ("maxLength", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConstraintError(f"{path}: {name} must be a non-negative integer")
    if max_length is not None and max_length < URI_MIN_MAX_LENGTH:
        raise ConstraintError(f"{path}: a 'uri' format with a maxLength below {URI_MIN_MAX_LENGTH} is not supported")
    budget = 4096 if max_length is None else max_length - _URI_FIXED  # characters for host, path, query, fragment
    needs_path = min_length > _URI_SHORTEST  # the shortest value, a://h, is too short without one
    least = max(0, min_length - _URI_SHORTEST - 1)  # path characters after its "/" that make it long enough
    if least > budget - 1:
        raise ConstraintError(f"{path}: minLength {min_length} leaves no room under maxLength {max_length}")
    host = min(253, max(1, budget // 2), budget - least)  # a DNS name is at most 253 characters
    rest = budget - host
    tail = max(least, rest - rest // 3 - rest // 6)  # the path's share; the query and fragment get the rest
    query = (rest - tail) * 2 // 3
    fragment = rest - tail - query
    path_part = rf"/[{_URI_PCHAR}/]{{{least},{tail}}}"
    return (
        rf"{_URI_SCHEME}://{_URI_HOST}{{1,{host}}}(?::{_PORT})?"
        + (path_part if needs_path else rf"(?:{path_part})?")
        + rf"(?:\?[{_URI_PCHAR}/?]{{0,{query}}})?(?:#[{_URI_PCHAR}/?]{{0,{fragment}}})?"
    )


def _tokens(pattern: str) -> list[str]:
    """The pattern cut into atoms (a character, an escape, a class), group opens "(" (their `?:` or
    `?P<name>` dropped), ")", "|", "^", "$" and quantifiers ("*", "+", "?", "{m,n}", lazy or not);
    inline flags (`(?i)`) are left out."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
        elif c == "[":
            end = _class_items(pattern, i + 1 + (pattern[i + 1 : i + 2] == "^"))[1]
            out.append(pattern[i : end + 1])
            i = end + 1
        elif c == "(" and re.match(r"\(\?[aiLmsux-]+\)", pattern[i:]):  # inline flags: no text
            i += len(re.match(r"\(\?[aiLmsux-]+\)", pattern[i:]).group())
        elif c == "(":
            prefix = re.match(r"\((?:\?:|\?P?<[^>]*>)?", pattern[i:]).group()
            out.append("(")
            i += len(prefix)
        elif c == "{" and re.match(r"\{\d*(,\d*)?\}", pattern[i:]):
            quantifier = re.match(r"\{\d*(,\d*)?\}\??", pattern[i:]).group()
            out.append(quantifier)
            i += len(quantifier)
        elif c in "*+?":
            out.append(pattern[i : i + 2] if pattern[i + 1 : i + 2] == "?" else c)
            i += len(out[-1])
        else:
            out.append(c)
            i += 1
    return out


def _repeats(quantifier: str) -> bool:
    """Whether a quantifier lets its atom match more than once."""
    if quantifier[0] in "*+":
        return True
    bounds = re.match(r"\{(\d*)(,?)(\d*)\}", quantifier)
    return bool(bounds) and (bounds[2] == "," and (bounds[3] == "" or int(bounds[3]) > 1) or int(bounds[1] or 0) > 1)


def _folds_negated_class(pattern: str) -> bool:
    """Whether a case-insensitive pattern holds a negated class: xgrammar folds case there by ASCII
    only, so `(?i)[^k]` took "K" (U+212A) and `(?i)[^é]` "É", which Python's `re` (and pydantic's
    Rust regex) fold into the class and refuse."""
    if not re.match(r"\(\?[a-zA-Z]*i[a-zA-Z]*\)", pattern):
        return False
    return any(tok.startswith("[^") for tok in _tokens(pattern))


ANCHOR_REFUSAL = (
    "a {0!r} anchor in the middle of a pattern (after or before a character it may match, or in a "
    "repeated group) is not supported"
)


def misplaced_anchor(pattern: str) -> str | None:
    """The first `^` that may come after a matched character, or `$` before one (None: none does).

    xgrammar 0.2.9 drops such an anchor ("Anchor '^' in the middle of regex is ignored"), so `a^`
    matched "a" and `(a$)?b` "ab", strings the pattern never matches. An anchor at the start (end)
    of the pattern, of a top-level alternative or of a group that is itself there is kept, and
    means the same there; in a repeated group (`(^a)*`) it is refused."""
    tokens, stack = _tokens(pattern), []
    at_start, ended = True, False
    for k, tok in enumerate(tokens):
        if tok == "(":
            stack.append({"start": at_start, "ended": ended, "any_ended": False, "anchor": False})
        elif tok == "|":
            frame = stack[-1] if stack else {"start": True, "ended": False, "any_ended": False}
            frame["any_ended"] |= ended
            at_start, ended = frame["start"], frame["ended"]
        elif tok == ")" and stack:
            frame = stack.pop()
            ended |= frame["any_ended"]
            at_start = False
            if frame["anchor"] and k + 1 < len(tokens) and _repeats(tokens[k + 1]):
                return "^" if "^" in tokens[:k] else "$"
            if stack:
                stack[-1]["anchor"] |= frame["anchor"]
        elif tok in ("^", "$"):
            if tok == "^" and not at_start:
                return "^"
            ended |= tok == "$"
            if stack:
                stack[-1]["anchor"] = True
        elif not (tok[0] in "*+?" or tok[0] == "{" and len(tok) > 1):
            if ended:
                return "$"
            at_start = False
    return None


def optional_groups(pattern: str) -> str:
    """`pattern` with each optional group `(...)?` written `(...){0,1}`: the same strings.

    xgrammar 0.2.9 matches a JSON-schema `pattern` (its JSON-string regex mode) wrongly where a
    group of one branch holding a repeated element is optional: `a(?:xy*)?` accepts "ay",
    `[0-9]{3}(?:-[0-9]+)?` accepts "1234", so answers broke their own schema while we called them
    valid. Plain regex mode is right, and so is `{0,1}` (checked against Python's `re` over random
    patterns in tests/test_grammar_limits.py). Escapes and character classes are copied as they are."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":  # an escape: the next character is literal, or names a class
            out.append(pattern[i : i + 2])
            i += 2
        elif in_class:
            in_class = c != "]"
            out.append(c)
            i += 1
        elif c == "[":  # a class; a "]" right after "[" or "[^" is a literal
            start = i + 2 if pattern[i + 1 : i + 2] == "^" else i + 1
            start += pattern[start : start + 1] == "]"
            out.append(pattern[i:start])
            in_class, i = True, start
        elif c == ")" and pattern[i + 1 : i + 2] == "?":
            out.append("){0,1}")
            i += 3 if pattern[i + 2 : i + 3] == "?" else 2  # lazy `??`: the same strings
        else:
            out.append(c)
            i += 1
    return "".join(out)


# Characters a JSON string cannot hold as they are: it writes them as escapes (`\"`, `\\`, `\n`, `\u0001`).
_JSON_SPECIAL = frozenset('"\\' + "".join(map(chr, range(32))))
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


def _escape_at(pattern: str, i: int, in_class: bool) -> tuple[str | None, int]:
    """The character the escape at pattern[i] (a backslash) stands for, and where it ends.
    None: it stands for a set (`\\d`), an anchor (`\\b` outside a class) or a reference."""
    c = pattern[i + 1 : i + 2]
    for prefix, digits in (("x", 2), ("u", 4)):
        code = pattern[i + 2 : i + 2 + digits]
        if c == prefix and re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", code):
            return chr(int(code, 16)), i + 2 + digits
    if c == "0":
        octal = re.match(r"[0-7]{0,2}", pattern[i + 2 :]).group()
        return chr(int("0" + octal, 8)), i + 2 + len(octal)
    if c in _CHAR_ESCAPES or (in_class and c == "b"):
        return _CHAR_ESCAPES.get(c, "\b"), i + 2
    if c and not c.isalnum():  # an escaped punctuation character stands for itself
        return c, i + 2
    return None, i + 2


def _class_atom(pattern: str, i: int) -> tuple[tuple[str, str] | str, int]:
    """The class member at pattern[i] and where it ends: (ch, ch) for a character, the text of a set (`\\d`)."""
    if pattern[i] == "\\":
        ch, end = _escape_at(pattern, i, in_class=True)
        return (pattern[i:end] if ch is None else (ch, ch)), end
    return (pattern[i], pattern[i]), i + 1


def _class_items(pattern: str, i: int) -> tuple[list, int]:
    """The members of the class whose body starts at pattern[i], and the index of its closing "]":
    (lo, hi) character ranges (a single character is lo == hi) and, as text, sets like `\\d`."""
    items, start = [], i
    while i < len(pattern) and (pattern[i] != "]" or i == start):
        item, i = _class_atom(pattern, i)
        if isinstance(item, tuple) and pattern[i : i + 1] == "-" and pattern[i + 1 : i + 2] not in ("]", ""):
            hi, end = _class_atom(pattern, i + 1)
            if isinstance(hi, tuple):
                item, i = (item[0], hi[1]), end
        items.append(item)
    return items, i


def _code(ch: str) -> str:
    """`ch` as an escape xgrammar reads (a non-ASCII character written as it is breaks its JSON mode)."""
    return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\u{{{ord(ch):x}}}"


def _class_char(ch: str) -> str:
    """One character as a class member: escaped where the class syntax or xgrammar needs it."""
    if ord(ch) > 127 or ord(ch) < 32:
        return _code(ch)
    return "\\" + ch if ch in "]\\^-[" else ch


def _class_text(items: list) -> str:
    """Class members written back (characters and ranges escaped as needed, sets as they were)."""
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        else:
            out.append(_class_char(item[0]) + ("" if item[0] == item[1] else "-" + _class_char(item[1])))
    return "".join(out)


def _special_member(items: list) -> str | None:
    """A member of a positive class that xgrammar may write raw into the JSON text: a quote or a
    backslash named as a member or a range's end, or a control character (alone or in a range)."""
    for item in items:
        if isinstance(item, str):
            continue
        for end in item:
            if end in '"\\':
                return end
        if any(item[0] <= chr(c) <= item[1] for c in range(32)):
            return item[0] if item[0] == item[1] else f"{item[0]}-{item[1]}"
    return None


def json_special_in_pattern(pattern: str) -> str | None:
    r"""The first character of `pattern` that xgrammar would copy raw into the JSON text (None if none).

    xgrammar 0.2.9 matches a JSON-schema `pattern` against the string's JSON text, not its value,
    and copies a quote, a backslash or a control character the pattern names into it: the pattern
    `\\` (one backslash) wrote the text `"\"`, `[\"]` wrote three quotes and `a\nb` a raw line
    break, none of them JSON. Writing them as their JSON escapes (`\\"`) was tried and is not
    safe: after such an escape xgrammar lets `.` and negated classes take any escape, `\q` included.
    Named through a range that holds no control character (`[ -~]`), in a negated class (`[^"]`)
    or by `.`, they are left out by xgrammar, which is stricter than the pattern, never looser."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            ch, i = _escape_at(pattern, i, in_class=False)
            if ch is not None and ch in _JSON_SPECIAL:
                return ch
        elif c == "[":
            negated = pattern[i + 1 : i + 2] == "^"
            items, end = _class_items(pattern, i + 1 + negated)
            found = None if negated else _special_member(items)
            if found is not None:
                return found
            i = end + 1
        elif c in _JSON_SPECIAL:
            return c
        else:
            i += 1
    return None


# Characters ECMA-262 counts as white space beyond Python's `\s` (JSON Schema's patterns are ECMA's).
_ECMA_SPACES = (
    "\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_SHORTHAND_SETS = {
    "w": lambda ch: ch.isalnum() or ch == "_",
    "d": str.isdecimal,
    "s": lambda ch: ch.isspace() or ch in _ECMA_SPACES,
}
_DOT = r"[^\n\r\u2028\u2029]"  # what `.` matches in Python (no \n) and in ECMA-262 (no line terminator)


@functools.cache
def _unicode_set(letter: str) -> str:
    """Class members (ranges) for every character Python's `\\w`, `\\d` or `\\s` matches, all of
    Unicode (xgrammar's are ASCII only); `\\s` also holds ECMA-262's white space."""
    test, ranges, start = _SHORTHAND_SETS[letter], [], None
    for code in range(0x110001):
        inside = code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF and test(chr(code))
        if inside and start is None:
            start = code
        elif not inside and start is not None:
            ranges.append((chr(start), chr(code - 1)))
            start = None
    return _class_text(ranges)


def _widened(items: list) -> list:
    """Negated-class members with `\\w`, `\\d`, `\\s` widened to all of Unicode."""
    return [_unicode_set(t[1]) if t in ("\\w", "\\d", "\\s") else t for t in items]


def exact_pattern(pattern: str) -> str:
    r"""`pattern` written so that xgrammar 0.2.9 holds to what it means; every change is the same
    set of strings or a subset of it (never a superset), checked against Python's `re` over random
    patterns in tests/test_grammar_limits.py.

    - Non-ASCII characters as escapes (`é` -> `\u00e9`): written as they are, they broke xgrammar's
      JSON-string mode (`é?..` let through `"\q"`, not JSON, and `"\""`, one character).
    - `\W`, `\D`, `\S` as the complement of all of Unicode's word characters, digits and spaces,
      and a negated class's `\w`, `\d`, `\s` widened the same way: xgrammar's are ASCII, so `\W`
      took "中" and `[^\d]` took "٣", which Python's `re`, pydantic's Rust regex and `jsonschema`
      refuse (`\w`, `\d`, `\s` themselves, ASCII, are a subset and stay).
    - `.` as `[^\n\r\u2028\u2029]`: xgrammar's took a line break ("(.)+" matched "\n-")."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            letter = pattern[i + 1 : i + 2]
            if letter in ("W", "D", "S"):
                out.append(f"[^{_unicode_set(letter.lower())}]")
            else:
                out.append(_code(letter) if letter and ord(letter) > 127 else pattern[i : i + 2])
            i += 2
        elif c == "[":
            out.append(_exact_class(pattern, i))
            i = _class_items(pattern, i + 1 + (pattern[i + 1 : i + 2] == "^"))[1] + 1
        else:
            out.append(_DOT if c == "." else _code(c) if ord(c) > 127 else c)
            i += 1
    return "".join(out)


def _exact_class(pattern: str, i: int) -> str:
    """The class at pattern[i] as `exact_pattern` writes it."""
    negated = pattern[i + 1 : i + 2] == "^"
    items, end = _class_items(pattern, i + 1 + negated)
    if negated:
        widened = _widened(items)
        changed = widened != items or pattern[i + 2 : i + 3] == "]" or any(ord(ch) > 127 for ch in pattern[i:end])
        return "[^" + _class_text(widened) + "]" if changed else pattern[i : end + 1]
    wide = [t for t in items if t in ("\\W", "\\D", "\\S")]
    if wide:  # a complement inside a positive class: one alternative each
        rest = [t for t in items if t not in wide]
        parts = [f"[^{_unicode_set(t[1].lower())}]" for t in wide] + ([f"[{_class_text(rest)}]"] if rest else [])
        return "(?:" + "|".join(parts) + ")"
    rewrite = pattern[i + 1 : i + 2] == "]" or any(ord(ch) > 127 for ch in pattern[i:end])  # xgrammar: `[]a]` is empty
    return "[" + _class_text(items) + "]" if rewrite else pattern[i : end + 1]


_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def _whole_bounds(schema: dict) -> dict:
    """An integer schema's fractional bounds as the whole ones that allow the same integers:
    `minimum: 0.5` is `minimum: 1`, `exclusiveMaximum: 2.5` is `maximum: 2`. xgrammar 0.2.9
    refuses a fractional bound on an integer ("Integer constraint must be a whole number"), so
    such a schema (valid JSON Schema) was a 400 carrying a C++ source path."""
    bounds = {k: schema[k] for k in _BOUNDS if k in schema}
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bounds.values())
    if schema.get("type") != "integer" or not numeric or all(float(v).is_integer() for v in bounds.values()):
        return schema
    whole = {
        "minimum": math.ceil,  # x >= m  <=>  x >= ceil(m), for an integer x
        "exclusiveMinimum": lambda v: math.floor(v) + 1,  # x > e  <=>  x >= floor(e) + 1
        "maximum": math.floor,
        "exclusiveMaximum": lambda v: math.ceil(v) - 1,
    }
    lows = [whole[k](v) for k, v in bounds.items() if k in ("minimum", "exclusiveMinimum")]
    highs = [whole[k](v) for k, v in bounds.items() if k in ("maximum", "exclusiveMaximum")]
    out = {k: v for k, v in schema.items() if k not in _BOUNDS}
    return out | ({"minimum": max(lows)} if lows else {}) | ({"maximum": min(highs)} if highs else {})


def for_xgrammar(schema):
    """A copy of `schema` as xgrammar is to read it: each `format` it under-enforces written as a
    `pattern`, each pattern written to hold to its meaning (`exact_pattern`) and its optional
    groups in the form xgrammar enforces (`optional_groups`), an integer's fractional bounds as
    whole ones (`_whole_bounds`), and
    OpenAPI's `discriminator` (an annotation once check_schema passed it) left out."""
    if isinstance(schema, list):
        return [for_xgrammar(sub) for sub in schema]
    if not isinstance(schema, dict):
        return schema
    out, schema = {}, _whole_bounds(schema)
    if _bounded_uri(schema):  # the pattern holds the bounds: xgrammar would drop them next to it
        schema = {k: v for k, v in schema.items() if k not in ("format", "minLength", "maxLength")} | {
            "pattern": uri_pattern(schema.get("minLength", 0), schema.get("maxLength"))
        }
    for key, value in schema.items():
        if key == "format" and value in FORMAT_PATTERNS:
            out["pattern"] = optional_groups(FORMAT_PATTERNS[value])
        elif key == "pattern" and isinstance(value, str):
            out[key] = optional_groups(exact_pattern(value))
        elif key == "discriminator":  # an annotation here: _check_one_of made sure the branches are disjoint
            continue
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: for_xgrammar(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS or key in _SCHEMA_ONE:
            out[key] = for_xgrammar(value)
        else:
            out[key] = value
    return out


def check_schema(schema, path: str = "schema", root=None) -> None:
    """Refuse JSON-schema keywords the grammar would not enforce (raises ConstraintError)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ConstraintError(f"{path} must be a JSON object")
    root = schema if root is None else root
    for key, value in schema.items():
        if key not in SUPPORTED_SCHEMA_KEYWORDS:
            raise ConstraintError(f"{path}: the JSON-schema keyword {key!r} is not supported")
        if key == "format" and value not in SUPPORTED_FORMATS:
            raise ConstraintError(f"{path}: the string format {value!r} is not supported")
        if key in _SCHEMA_MAPS:
            if not isinstance(value, (dict, type(None))):
                raise ConstraintError(f"{path}.{key} must be an object")
            for name, sub in (value or {}).items():
                check_schema(sub, f"{path}.{key}.{name}", root)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, (list, type(None))):
                raise ConstraintError(f"{path}.{key} must be an array")
            for i, sub in enumerate(value or []):
                check_schema(sub, f"{path}.{key}[{i}]", root)
        elif key in _SCHEMA_ONE:
            check_schema(value, f"{path}.{key}", root)
    _check_combinations(schema, path)
    if isinstance(schema.get("oneOf"), list):
        _check_one_of(schema["oneOf"], root, path)


# xgrammar enforces `oneOf` as `anyOf`: a value that two branches match (which oneOf forbids) was
# written and called valid. So oneOf is served only where no value can match two branches, as
# pydantic's unions are: branches of different types, or objects told apart by a property both
# require with different `const`/`enum` values (a discriminated union).
def _resolve(schema, root, depth: int = 0):
    """A local `$ref` followed to what it names (None when it cannot be)."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if ref is None:
        return schema if isinstance(schema, dict) else None
    if depth > 16 or not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    target = root
    for part in ref[2:].split("/"):
        target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
    return _resolve(target, root, depth + 1)


def _value_set(schema) -> list | None:
    """The values a `const` or `enum` schema allows (None: not one of those)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    return schema["enum"] if isinstance(schema.get("enum"), list) else None


def _types(schema) -> set[str] | None:
    """The JSON types a branch allows, as far as they can be read off it (None: unknown)."""
    values = _value_set(schema)
    if values is not None:
        return {
            t for v in values for t in ("null", "boolean", "string", "array", "object", "number") if _is_of_type(v, t)
        }
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else set()
    if not kinds:  # `properties` alone says nothing of the type: {"properties": ...} matches 5 too
        return None
    return {"number" if k == "integer" else k for k in kinds}


def _required(schema: dict) -> set[str]:
    names = schema.get("required")
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def _disjoint(a: dict, b: dict, root) -> bool:
    """Whether no value can match both branches (provably; False when unsure)."""
    va, vb = _value_set(a), _value_set(b)
    if va is not None and vb is not None:
        return not _values_overlap(va, vb)
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    if ta != {"object"} or tb != {"object"}:
        return False
    shared = _required(a) & _required(b)
    for name in shared:
        va = _value_set(_resolve((a.get("properties") or {}).get(name), root))
        vb = _value_set(_resolve((b.get("properties") or {}).get(name), root))
        if va is not None and vb is not None and not _values_overlap(va, vb):
            return True
    return False


def _values_overlap(va: list, vb: list) -> bool:
    """Whether two const/enum lists share a JSON value: 1 and 1.0 are one number, true is not 1."""
    return any(x == y and isinstance(x, bool) == isinstance(y, bool) for x in va for y in vb)


def _check_one_of(branches: list, root, path: str) -> None:
    resolved = [_resolve(b, root) for b in branches]
    for i, a in enumerate(resolved):
        for j in range(i + 1, len(resolved)):
            b = resolved[j]
            if a is None or b is None or not _disjoint(a, b, root):
                raise ConstraintError(
                    f"{path}: oneOf branches {i} and {j} may both match one value, and the grammar would "
                    "accept it (it enforces anyOf); use anyOf, or tell the branches apart by type or by a "
                    "const property both require"
                )


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
    # JSON kinds: False ("strict whitespace") writes JSON one way only, `{"a": 1, "b": [2, 3]}`
    # (json.dumps' separators); True lets the model put any whitespace between tokens, which
    # small models can fill forever. Regex, EBNF and tool grammars ignore it.
    any_whitespace: bool = False

    def __post_init__(self):
        if self.kind == "json_schema" and not self.banned:
            object.__setattr__(self, "banned", JSON_BANNED)

    def to_grammar(self) -> xgr.Grammar:
        """The xgrammar Grammar for this spec; a compile error is a ConstraintError."""
        grammar = xgrammar().Grammar
        try:
            if self.kind == "json_object":  # an object, any keys (xgrammar's builtin JSON grammar took `[1]`)
                return grammar.from_json_schema(
                    '{"type": "object"}', any_whitespace=self.any_whitespace, strict_mode=False
                )
            if self.kind == "json_schema":
                return grammar.from_json_schema(
                    json.dumps(for_xgrammar(self.source)), any_whitespace=self.any_whitespace, strict_mode=True
                )
            if self.kind == "regex":
                if misplaced_anchor(self.source) is not None:
                    raise ConstraintError(ANCHOR_REFUSAL.format(misplaced_anchor(self.source)), self.param)
                return grammar.from_regex(exact_pattern(self.source))
            if self.kind == "ebnf":
                return grammar.from_ebnf(self.source)
            if self.kind == "grammar":
                return self.source
        except ConstraintError:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses
            raise ConstraintError(f"cannot compile the {self.kind} constraint: {e}", self.param) from None
        raise ConstraintError(f"unknown constraint kind {self.kind!r}", self.param)

    def cache_key(self) -> tuple:
        """What makes two specs compile to the same grammar (the request field they came from does not)."""
        if self.kind == "json_schema":
            source = json.dumps(self.source)  # key order kept: properties are written in the schema's order
        elif self.kind == "grammar":
            source = str(self.source)  # an xgrammar Grammar prints as its EBNF
        else:
            source = self.source
        ws = self.any_whitespace if self.kind in ("json_object", "json_schema") else None
        return self.kind, source, self.banned, ws


def literal(text: str) -> xgr.Grammar:
    """A grammar that matches exactly `text`."""
    return xgrammar().Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


class GrammarCache:
    """Compiled grammars by spec key, least recently used first out once over `max_bytes`.

    A grammar larger than the whole budget is not kept. Thread-safe (compile threads put, request
    threads get)."""

    def __init__(self, max_bytes: int = GRAMMAR_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple, tuple[CompiledGuide, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: tuple) -> bool:
        return key in self._items

    def get(self, key: tuple) -> CompiledGuide | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: tuple, guide: CompiledGuide, nbytes: int) -> None:
        with self._lock:
            if key in self._items:
                self.bytes -= self._items.pop(key)[1]
            if nbytes > self.max_bytes:
                return
            self._items[key] = (guide, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes:
                self.bytes -= self._items.popitem(last=False)[1][1]


class _CompilePool:
    """`workers` threads compiling in order; `running` counts compilations under way (overrunning
    ones included). A job cancelled while queued is never started (Future.cancel)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="specserve-grammar")
        self._lock = threading.Lock()
        self.running = 0

    def submit(self, fn) -> Future:
        return self._executor.submit(self._run, fn)

    def _run(self, fn):
        with self._lock:
            self.running += 1
        try:
            return fn()
        finally:
            with self._lock:
                self.running -= 1


class PendingGuide:
    """A grammar being compiled for one request: wait with `result()` (any thread) or
    `await wait_async()` (an event loop); both give up at the same deadline, set at submission."""

    def __init__(self, future: Future, spec: GrammarSpec, limit_s: float, pool: _CompilePool | None):
        self.future, self.spec, self.limit_s, self.pool = future, spec, limit_s, pool
        self.deadline = time.monotonic() + limit_s

    def result(self) -> CompiledGuide:
        try:
            return self.future.result(max(0.0, self.deadline - time.monotonic()))
        except TimeoutError:
            raise self._overdue() from None
        except CancelledError:
            raise self._overdue() from None

    async def wait_async(self) -> CompiledGuide:
        wrapped = asyncio.wrap_future(self.future)
        done, _ = await asyncio.wait({wrapped}, timeout=max(0.0, self.deadline - time.monotonic()))
        if not done:  # the compilation goes on (or is dropped, if still queued)
            raise self._overdue()
        wrapped.exception()  # retrieved here, so asyncio does not log it as never retrieved
        return self.result()

    def _overdue(self) -> ConstraintError:
        """The error for a deadline that passed: queued (busy, dropped) or compiling (too slow)."""
        if self.future.done() and not self.future.cancelled() and self.future.exception() is not None:
            return self.future.exception()  # it failed just as time ran out: the real reason
        if self.future.cancel() or self.future.cancelled():  # still queued: drop it, it never runs
            running = self.pool.running if self.pool is not None else 0
            return GrammarBusy(
                f"the server's grammar compilers were busy ({running} compilations running) for "
                f"the whole {self.limit_s:g} s limit; retry later",
                self.spec.param,
            )
        return ConstraintError(
            f"compiling the {self.spec.kind} constraint exceeded the server's limit of "
            f"{self.limit_s:g} s; simplify it (fewer anyOf/enum alternatives, less nesting, "
            f"smaller repetition bounds)",
            self.spec.param,
        )


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
        self.compiler = xgrammar().GrammarCompiler(info, max_threads=1, cache_enabled=False)  # ours is bounded
        self.decoded = info.decoded_vocab
        self._bans: dict[str, torch.Tensor] = {}
        self._bans_lock = threading.Lock()
        self.time_limit_s = GRAMMAR_TIME_LIMIT_S
        self.cache = GrammarCache(GRAMMAR_CACHE_BYTES)
        self.pool = _CompilePool(GRAMMAR_WORKERS)
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
        try:
            return self.compiler.compile_grammar(spec.to_grammar())
        except ConstraintError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ConstraintError(f"cannot compile the {spec.kind} constraint: {e}", spec.param) from None

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
        with self._lock:
            if self._inflight.get(key) is fut:
                del self._inflight[key]

    def _compile_and_keep(self, spec: GrammarSpec, key: tuple) -> CompiledGuide:
        """Runs on a pool thread; the result is cached even if its caller stopped waiting."""
        compiled = self.compile(spec)
        guide = CompiledGuide(compiled, self.banned(spec.banned))
        _check_satisfiable(spec, compiled, self.vocab_size, guide.banned)
        self.cache.put(key, guide, compiled.memory_size_bytes)
        return guide

    def prepare(self, spec: GrammarSpec | CompiledGuide | PendingGuide) -> CompiledGuide:
        """Compile once (e.g. while validating a request), within the time limit; make many Constraints from it."""
        if isinstance(spec, CompiledGuide):
            return spec
        if isinstance(spec, GrammarSpec):
            spec = self.submit(spec)
        return spec.result()

    def __call__(self, spec: GrammarSpec | CompiledGuide | PendingGuide) -> Constraint:
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
        self.matcher = xgrammar().GrammarMatcher(compiled)
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
        rows = xgrammar().allocate_token_bitmask(len(draft_ids) + 1, self.vocab_size)  # [K+1, W]
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
        xgrammar().apply_token_bitmask_inplace(out, self._rows[: out.shape[0]], vocab_size=self.vocab_size)
        if self.banned is not None:
            out.masked_fill_(self.banned, float("-inf"))  # [V] broadcast over rows
        return out

    def advance(self, token_ids: list[int]) -> None:
        """Move the matcher over committed tokens (each was allowed by its row's mask)."""
        for tok in token_ids:
            if self.matcher.is_terminated():
                return
            if not self.matcher.accept_token(tok):
                if not _next_allows_any(self.matcher, self.vocab_size, self.banned):
                    raise GrammarDeadEnd(
                        "the structured-output constraint allows no token after the text so far: no text "
                        "satisfies it from there"
                    )
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
