"""What a request constrains its output to (`GrammarSpec`), and what that compiles to (`CompiledGuide`).

A spec is plain data (a kind, a schema or regex or EBNF text, the characters no token may
hold), so it can be checked while a request is validated, used as a cache key, and compiled on
another thread (factory.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConstraintError, compile_errors
from .library import xgrammar
from .patterns import ANCHOR_REFUSAL, exact_pattern, misplaced_anchor
from .rewrite import for_xgrammar

if TYPE_CHECKING:
    import torch
    import xgrammar as xgr

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
        with compile_errors(self.kind, self.param):
            if self.kind == "json_object":  # an object, any keys (xgrammar's builtin JSON grammar took `[1]`)
                return grammar.from_json_schema(
                    '{"type": "object"}', any_whitespace=self.any_whitespace, strict_mode=False
                )
            if self.kind == "json_schema":
                return grammar.from_json_schema(
                    json.dumps(for_xgrammar(self.source)), any_whitespace=self.any_whitespace, strict_mode=True
                )
            if self.kind == "regex":
                anchor = misplaced_anchor(self.source)
                if anchor is not None:
                    raise ConstraintError(ANCHOR_REFUSAL.format(anchor), self.param)
                return grammar.from_regex(exact_pattern(self.source))
            if self.kind == "ebnf":
                return grammar.from_ebnf(self.source)
            if self.kind == "grammar":
                return self.source
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


@dataclass(frozen=True)
class CompiledGuide:
    """A compiled grammar plus its banned-token mask: what one request (or each of its n choices) needs."""

    compiled: xgr.CompiledGrammar
    banned: torch.Tensor | None  # [V] bool
