"""Errors answered as OpenAI does, and the mapping onto them of invalid bodies and engine exceptions.

`APIError` carries the status and the `{"error": {"message", "type", "param", "code"}}` body;
`parse_body` turns pydantic's validation errors into a 400 that names the parameter;
`engine_error` maps what the engine raised for one request.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from ..engine.constrain import ConstraintError, GrammarBusy
from ..errors import ContextLengthError, InvalidRequestError


class APIError(Exception):
    """An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_a_string(value, param: str) -> APIError:
    """The 400 for a field that must be a string and is not: OpenAI's missing_required_parameter
    when it is left out (None), else invalid_type. One wording for every such field (a content
    part's text or refusal, an item reference's id, a json_schema format's name)."""
    if value is None:
        return bad_request(f"missing required parameter '{param}'", param, "missing_required_parameter")
    return bad_request(f"{param} must be a string", param, "invalid_type")


def unsupported(param: str, what: str, instead: str | None = None) -> APIError:
    """The 400 for a feature this server does not implement: `what` is the feature (in the
    singular: "... is not supported"), `instead` what the client can send in its place, said after
    the refusal so the one line reads as a sentence and ends with the way out."""
    message = f"{param}: {what} is not supported by this server" + (f"; {instead}" if instead else "")
    return APIError(400, message, param=param, code="unsupported_parameter")


def engine_error(exc: Exception) -> APIError:
    """Map an engine exception raised for a request onto an OpenAI error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, GrammarBusy):
        return APIError(503, str(exc), "server_error", exc.param, "grammar_busy", headers={"Retry-After": "5"})
    if isinstance(exc, ConstraintError):
        return bad_request(str(exc), exc.param)
    if isinstance(exc, ContextLengthError):
        return bad_request(str(exc), None, "context_length_exceeded")
    if isinstance(exc, (InvalidRequestError, ValueError)):
        return bad_request(str(exc), getattr(exc, "param", None))
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", code="internal_error")


def parse_body(model_cls: type[BaseModel], raw: bytes) -> BaseModel:
    """Validate a raw JSON body; invalid JSON and wrong types or ranges become a 400."""
    try:
        return model_cls.model_validate_json(raw or b"")
    except ValidationError as e:
        raise _validation_error(e) from None


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "function-before"}


def _param_path(loc: tuple) -> str | None:
    """('messages', 0, 'content', 'str') -> 'messages[0].content' (union member tags dropped).

    A dict key that failed ('metadata', 'k...', '[key]') names the dict, not the key.
    """
    if "[key]" in loc:
        loc = loc[: loc.index("[key]") - 1]
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier() and part not in _TYPE_TAGS and not part[0].isupper():
            out += f".{part}" if out else part
    return out or None


_RANGE_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "too_short",
    "too_long",
    "string_too_short",
    "string_too_long",
    "literal_error",
}


def _validation_error(e: ValidationError) -> APIError:
    """The most telling error: a value out of range beats the type mismatch of another union member
    (five stop strings are "at most 4 items", not "should be a valid string"), and else the one
    deepest in the body: a union member that the value's shape matched failed inside it
    (`"content": [{"type": "text", "text": 5}]` is "content[0].text: should be a valid string",
    where it was "content: should be a valid string", naming the wrong field)."""
    errors = e.errors(include_url=False)
    deepest = max(errors, key=lambda x: len(x["loc"]))  # the first of the deepest
    err = next((x for x in errors if x["type"] in _RANGE_ERRORS), deepest)
    if err["type"] == "json_invalid":
        return bad_request(f"the request body is not valid JSON ({err['msg']})", None, "invalid_json")
    param = _param_path(err["loc"])
    if param is None:
        return bad_request("the request body must be a JSON object", None, "invalid_type")
    if err["type"] == "missing":
        return bad_request(f"missing required parameter {param!r}", param, "missing_required_parameter")
    code = "invalid_value" if err["type"] in _RANGE_ERRORS else "invalid_type"
    message = err["msg"]
    if err["type"] == "value_error" and "error" in (err.get("ctx") or {}):  # our validators' words, unprefixed
        message = str(err["ctx"]["error"])
    return bad_request(f"{param}: {message}", param, code)
