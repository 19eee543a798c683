"""A checked JSON schema written as xgrammar is to read it (`for_xgrammar`).

Each rewrite allows the same values as the schema or fewer, never more: formats xgrammar
under-enforces become the patterns of formats.py, patterns are made exact (patterns.py), and an
integer's fractional bounds become whole ones. `check_schema` (schema.py) has refused, before
this runs, everything that cannot be written so.
"""

from __future__ import annotations

import math

from .formats import FORMAT_PATTERNS, bounded_uri, uri_pattern
from .patterns import exact_pattern, optional_groups
from .schema import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE

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
    if bounded_uri(schema):  # the pattern holds the bounds: xgrammar would drop them next to it
        schema = {k: v for k, v in schema.items() if k not in ("format", "minLength", "maxLength")} | {
            "pattern": uri_pattern(schema.get("minLength", 0), schema.get("maxLength"))
        }
    for key, value in schema.items():
        if key == "format" and value in FORMAT_PATTERNS:
            out["pattern"] = optional_groups(FORMAT_PATTERNS[value])
        elif key == "pattern" and isinstance(value, str):
            out[key] = optional_groups(exact_pattern(value))
        elif key == "discriminator":  # an annotation here: check_schema made sure the branches are disjoint
            continue
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: for_xgrammar(sub) for name, sub in value.items()}
        elif key in SCHEMA_LISTS or key in SCHEMA_ONE:
            out[key] = for_xgrammar(value)
        else:
            out[key] = value
    return out
