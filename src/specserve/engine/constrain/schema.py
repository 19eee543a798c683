"""Which JSON schemas we serve: `check_schema` refuses (a 400) what the grammar would not enforce.

xgrammar 0.2.9 compiles many schemas it does not enforce: a keyword it does not know, a bound
next to no `type`, a keyword next to `enum` or `$ref`, a `oneOf` (enforced as `anyOf`), a
pattern it reads wrongly. Each of those let invalid output through (measured), so each is
refused here by name, with the path of the subschema at fault, rather than ignored.
`rewrite.for_xgrammar` then writes a checked schema in the form xgrammar is to read.
"""

from __future__ import annotations

import re

from .errors import ConstraintError
from .formats import bounded_uri, uri_pattern
from .patterns import ANCHOR_REFUSAL, folds_negated_class, json_special_in_pattern, misplaced_anchor

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
SCHEMA_MAPS = ("properties", "$defs", "definitions")  # keyword -> {name: subschema}
SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")  # keyword -> [subschema]
SCHEMA_ONE = ("items", "additionalProperties")  # keyword -> subschema (or a bool)

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
    """Whether a JSON value is of the JSON-schema type `name` (an integral float is an integer; a bool is no number)."""
    if name in ("integer", "number") and not isinstance(value, bool):
        return isinstance(value, int) or (isinstance(value, float) and (name == "number" or value.is_integer()))
    return name in _JSON_TYPES and isinstance(value, _JSON_TYPES[name])


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
        if key in SCHEMA_MAPS:
            if not isinstance(value, (dict, type(None))):
                raise ConstraintError(f"{path}.{key} must be an object")
            for name, sub in (value or {}).items():
                check_schema(sub, f"{path}.{key}.{name}", root)
        elif key in SCHEMA_LISTS:
            if not isinstance(value, (list, type(None))):
                raise ConstraintError(f"{path}.{key} must be an array")
            for i, sub in enumerate(value or []):
                check_schema(sub, f"{path}.{key}[{i}]", root)
        elif key in SCHEMA_ONE:
            check_schema(value, f"{path}.{key}", root)
    _check_combinations(schema, path)
    if isinstance(schema.get("oneOf"), list):
        _check_one_of(schema["oneOf"], root, path)


def _check_combinations(schema: dict, path: str) -> None:
    """Refuse what xgrammar would compile but not enforce (measured: each let invalid output through)."""
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise ConstraintError(f"{path}: $ref {ref!r} is not supported, only references inside the schema ('#/...')")
    types = schema.get("type")
    types = {t for t in (types if isinstance(types, list) else [types]) if isinstance(t, str)}
    alternatives = [k for k in _ALTERNATIVES if k in schema]
    if alternatives:
        _check_alternative(schema, alternatives[0], types, path)
        return
    if "properties" in schema or "additionalProperties" in schema:
        types.add("object")
    if "items" in schema or "prefixItems" in schema:
        types.add("array")
    for key in schema:
        if key in _TYPED_KEYWORDS and not types:
            raise ConstraintError(f"{path}: {key!r} needs a 'type' next to it ({' or '.join(_TYPED_KEYWORDS[key])})")
    _check_string_bounds(schema, path)
    if isinstance(schema.get("pattern"), str):
        _check_pattern(schema["pattern"], path)
    properties, required = schema.get("properties") or {}, schema.get("required")
    for name in required if isinstance(required, list) else []:
        if isinstance(name, str) and name not in properties:
            raise ConstraintError(f"{path}: the required property {name!r} is not in 'properties'")


def _check_alternative(schema: dict, word: str, types: set[str], path: str) -> None:
    """A schema of `enum`, `const`, `anyOf`, `oneOf` or `$ref` (`word`, the first present): nothing
    but annotations may stand next to it, and with a `type`, every enum or const value has it."""
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


def _check_string_bounds(schema: dict, path: str) -> None:
    """A string's `pattern`, `format` and length bounds: xgrammar enforces one of them alone, except
    a bounded `uri`, which is written as a pattern that holds its bounds (`formats.uri_pattern`)."""
    if "pattern" in schema and "format" in schema:
        raise ConstraintError(f"{path}: 'pattern' cannot be combined with 'format'")
    for key in ("pattern", "format"):
        for length in ("minLength", "maxLength"):
            if key in schema and length in schema and not bounded_uri(schema):
                raise ConstraintError(f"{path}: {key!r} cannot be combined with {length!r}")
    if bounded_uri(schema):
        uri_pattern(schema.get("minLength", 0), schema.get("maxLength"), path)  # refuses bounds it cannot meet


def _check_pattern(pattern: str, path: str) -> None:
    """Refuse a `pattern` xgrammar would read wrongly in a JSON string (see patterns.py)."""
    if re.search(r"\(\?<?[=!]", pattern):
        raise ConstraintError(f"{path}: lookahead and lookbehind in a pattern are not supported")
    anchor = misplaced_anchor(pattern)
    if anchor is not None:
        raise ConstraintError(f"{path}: {ANCHOR_REFUSAL.format(anchor)}")
    if folds_negated_class(pattern):
        raise ConstraintError(
            f"{path}: a case-insensitive pattern ((?i)) with a negated class is not supported (the grammar "
            "folds case by ASCII there: (?i)[^k] wrote the Kelvin sign, which Python's re folds to k)"
        )
    special = json_special_in_pattern(pattern)
    if special is not None:
        raise ConstraintError(
            f"{path}: a pattern that names {special!r} is not supported (a quote, a backslash or a control "
            "character; the grammar would write it unescaped, which is not JSON)"
        )


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
