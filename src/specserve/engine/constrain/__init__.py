"""Grammar constraints (structured outputs) for speculative decoding, backed by xgrammar.

A request that asks for JSON (a schema, or any object), a regex, an EBNF grammar or a forced
tool call gets a `Constraint`: it cuts each draft to what the grammar allows, masks the
verification rows, and follows the committed tokens, so speculation stays lossless with respect
to the constrained distribution (constraint.py says how). One file per concern:

    errors.py          ConstraintError (a 400), GrammarBusy (a 503), GrammarDeadEnd
    library.py         xgrammar, imported on first use
    spec.py            GrammarSpec (what to constrain to) and CompiledGuide (what it compiles to)
    schema.py          check_schema: the JSON schemas we serve, the rest refused by name
    rewrite.py         for_xgrammar: a checked schema written as xgrammar is to read it
    formats.py         string formats written as the stricter patterns we enforce them with
    patterns.py        regex patterns refused or rewritten where xgrammar would misread them
    pattern_syntax.py  reading a regex: tokens, escapes, character classes
    factory.py         ConstraintFactory (per tokenizer: spec -> Constraint) and factory_for
    pool.py            compiling on a thread pool, with a time limit (PendingGuide)
    cache.py           compiled grammars kept in an LRU cache bounded in bytes
    constraint.py      Constraint: one request's grammar state, consulted three times a step

Why xgrammar (not llguidance): both were tried on our tokenizers. llguidance 1.9 refuses the
tiny test tokenizer (its `Fuse` decoder: "can't determine decoder type"); xgrammar 0.2.9 reads
it, and byte-level BPE ones, from the Hugging Face tokenizer directly, compiles JSON schemas,
regexes and EBNF, and its matcher rolls back, which verification of a draft needs.

The names other modules use are imported here; the limits (`GRAMMAR_TIME_LIMIT_S`,
`GRAMMAR_WORKERS`, `GRAMMAR_CACHE_BYTES`) live in pool.py and cache.py, read when a factory is made.
"""

from .cache import GrammarCache
from .constraint import Constraint
from .errors import ConstraintError, GrammarBusy, GrammarDeadEnd, xgrammar_message
from .factory import ConstraintFactory, factory_for
from .formats import FORMAT_PATTERNS, uri_pattern
from .library import xgrammar
from .patterns import exact_pattern, json_special_in_pattern, misplaced_anchor, optional_groups
from .pool import CompilePool, PendingGuide
from .rewrite import for_xgrammar
from .schema import SUPPORTED_FORMATS, SUPPORTED_SCHEMA_KEYWORDS, check_schema
from .spec import JSON_BANNED, TOOL_BANNED, CompiledGuide, GrammarSpec, literal

__all__ = [
    "FORMAT_PATTERNS",
    "JSON_BANNED",
    "SUPPORTED_FORMATS",
    "SUPPORTED_SCHEMA_KEYWORDS",
    "TOOL_BANNED",
    "CompilePool",
    "CompiledGuide",
    "Constraint",
    "ConstraintError",
    "ConstraintFactory",
    "GrammarBusy",
    "GrammarCache",
    "GrammarDeadEnd",
    "GrammarSpec",
    "PendingGuide",
    "check_schema",
    "exact_pattern",
    "factory_for",
    "for_xgrammar",
    "json_special_in_pattern",
    "literal",
    "misplaced_anchor",
    "optional_groups",
    "uri_pattern",
    "xgrammar",
    "xgrammar_message",
]
