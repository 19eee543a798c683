"""From an OpenAI request to a grammar, tool set-up and n choices (the server's side of issue 10).

    response_format  {"type": "text" | "json_object"}
                     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    extension        "structured_outputs": {"json" | "regex" | "grammar" | "choice": ...}
                     (vLLM's names; its older top-level guided_json / guided_regex /
                     guided_grammar / guided_choice are accepted as well)
    tools            tools, tool_choice, parallel_tool_calls (see tools.py)
    n                independent choices; per-choice seeds derived from `seed`
    strict_whitespace  extension: JSON outputs in one canonical layout (true, the default) or with
                     any whitespace between tokens (false); see `json_whitespace`

Every refusal is a ConstraintError naming the request parameter at fault (the caller turns
it into a 400).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from ..config import SamplingParams
from ..engine.constrain import ConstraintError, GrammarSpec, check_schema
from .tools import allowed_tools, check_forced_schemas, check_tools, forced_grammar, resolve_choice

MAX_N = 8  # choices per request: each one is a full generation on the single worker
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_grammar", "guided_choice")


@dataclass(frozen=True)
class ToolSetup:
    """What the chat template and the response need to know about tools."""

    tools: list[dict] | None  # validated, for the template (None: no tools)
    choice: str  # "none" | "auto" | "required" | a function name
    parallel: bool

    def kept(self, calls: list) -> list:
        """The calls a response returns: all of them, or the first without parallel_tool_calls."""
        return calls if self.parallel else calls[:1]

    @property
    def names(self) -> frozenset[str]:
        """The declared functions' names."""
        return frozenset(t["function"]["name"] for t in self.tools or ())

    @property
    def named(self) -> bool:
        """Whether one function was named in tool_choice: OpenAI then finishes with "stop", not
        "tool_calls" (the call was asked for, not chosen by the model)."""
        return self.choice not in ("none", "auto", "required")

    @property
    def parse_calls(self) -> bool:
        """Whether the output is scanned for <tool_call> blocks."""
        return bool(self.tools) and self.choice != "none"


def _schema_guide(schema, param: str) -> GrammarSpec:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise ConstraintError(f"{param} is not valid JSON", param) from None
    try:
        check_schema(schema, param)
    except ConstraintError as e:
        raise ConstraintError(str(e), param) from None
    return GrammarSpec("json_schema", schema, param=param)


def response_format_guide(fmt) -> GrammarSpec | None:
    """OpenAI's response_format (a pydantic model with extra fields allowed) -> a grammar."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GrammarSpec("json_object", param="response_format")
    if fmt.type == "json_schema":
        spec = (fmt.model_extra or {}).get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ConstraintError(
                "response_format.json_schema must be an object with a 'name'", "response_format.json_schema"
            )
        if "strict" in spec and not isinstance(spec["strict"], (bool, type(None))):
            raise ConstraintError(
                "response_format.json_schema.strict must be a boolean", "response_format.json_schema.strict"
            )
        schema = spec.get("schema", {"type": "object"})
        return _schema_guide(schema, "response_format.json_schema.schema")
    raise ConstraintError(
        f"response_format.type {fmt.type!r} is not supported (text, json_object, json_schema)", "response_format.type"
    )


def _choice_regex(choices, param: str) -> str:
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ConstraintError(f"{param} must be a non-empty list of non-empty strings", param)
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def extension_guide(extra: dict) -> GrammarSpec | None:
    """vLLM's `structured_outputs` object, or its legacy top-level guided_* fields."""
    so = extra.get("structured_outputs")
    if so is not None and not isinstance(so, dict):
        raise ConstraintError("structured_outputs must be an object", "structured_outputs")
    fields = {f"structured_outputs.{k}": v for k, v in (so or {}).items() if v is not None}
    fields.update({k: extra[k] for k in GUIDED_FIELDS if extra.get(k) is not None})
    if len(fields) > 1:
        raise ConstraintError(
            f"only one structured output constraint at a time (got {sorted(fields)})", sorted(fields)[1]
        )
    if not fields:
        return None
    ((param, value),) = fields.items()
    kind = param.rsplit(".", 1)[-1].removeprefix("guided_")
    if kind == "json":
        return _schema_guide(value, param)
    if kind == "choice":
        return GrammarSpec("regex", _choice_regex(value, param), param=param)
    if kind in ("regex", "grammar"):
        if not isinstance(value, str) or not value:
            raise ConstraintError(f"{param} must be a non-empty string", param)
        return GrammarSpec("regex" if kind == "regex" else "ebnf", value, param=param)
    raise ConstraintError(f"{param}: unknown structured output {kind!r} (json, regex, grammar, choice)", param)


STRICT_WHITESPACE = True  # the default when a request does not say


def json_whitespace(spec: GrammarSpec | None, strict: bool | None) -> GrammarSpec | None:
    """Apply the request's `strict_whitespace` to a JSON constraint.

    strict (the default): JSON in one layout only, `{"a": 1, "b": [2, 3]}`, so a small model
    cannot loop on spaces and newlines between tokens; false: any whitespace there (xgrammar's
    any_whitespace). Given with no JSON constraint, it is refused rather than ignored."""
    if strict is None:
        strict = STRICT_WHITESPACE
    elif spec is None or spec.kind not in ("json_object", "json_schema"):
        raise ConstraintError(
            "strict_whitespace applies to JSON outputs only (response_format json_object or "
            "json_schema, structured_outputs.json, guided_json)",
            "strict_whitespace",
        )
    return replace(spec, any_whitespace=not strict) if spec is not None else None


def tool_setup(tools, tool_choice, parallel_tool_calls) -> ToolSetup:
    """Validate tools / tool_choice / parallel_tool_calls."""
    if tools is not None and not isinstance(tools, list):
        raise ConstraintError("tools must be a list", "tools")
    declared = check_tools(tools) if tools else None
    offered = declared  # the tools the model may call: allowed_tools names a subset
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "allowed_tools":
        offered, tool_choice = allowed_tools(tool_choice, declared or [])
    choice = resolve_choice(tool_choice, offered or [])
    if offered and choice not in ("auto", "none"):
        check_forced_schemas(declared, choice, {t["function"]["name"] for t in offered})
    return ToolSetup(
        offered if choice != "none" else None,
        choice,
        True if parallel_tool_calls is None else bool(parallel_tool_calls),
    )


def tool_guide(setup: ToolSetup) -> GrammarSpec | None:
    """The forcing grammar for tool_choice "required" or a named function."""
    if setup.tools and setup.choice not in ("auto", "none"):
        return forced_grammar(setup.tools, setup.choice)
    return None


def check_guided(guide, ignore_eos: bool | None) -> None:
    """A grammar ends the output with EOS when it is complete; ignoring EOS would run past it."""
    if guide is not None and ignore_eos:
        raise ConstraintError(
            "ignore_eos cannot be combined with a structured output or forced tool call", "ignore_eos"
        )


def check_n(n: int | None) -> int:
    if n is None:
        return 1
    if n > MAX_N:
        raise ConstraintError(f"n={n} is more than this server's limit of {MAX_N}", "n")
    return n


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice (SamplingParams.per_sample): with a seed, choice i gets a seed
    derived from (seed, i), so a request is reproducible and its choices differ; n=1 keeps the seed."""
    return params.per_sample(n)
