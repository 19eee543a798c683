"""The OpenAPI document: the request models the routes really parse, and the answers they give.

The generation routes read the raw body themselves (strict pydantic parsing, 400s that name the
parameter, the body-size cap before any parsing), so FastAPI cannot see their request model.
`install_openapi` publishes it: each route's `requestBody` points at the pydantic model's own
JSON schema (`ChatCompletionRequest`, `CompletionRequest`), and every documented status has a
schema, so schema-driven tools (fuzzers, SDK generators, gateways) see what the server accepts.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from .schemas import (
    ChatCompletionRequest,
    ChatCompletionUpdateRequest,
    CompletionRequest,
    DetokenizeRequest,
    InputTokensRequest,
    ResponsesRequest,
    TokenizeRequest,
)

REF = "#/components/schemas/{model}"
ERROR_STATUSES = {
    "400": "invalid request: JSON, types, ranges, OpenAI's limits, context length, unsupported parameters",
    "401": "missing or wrong API key",
    "404": "unknown model (or, for a stored response or chat completion, unknown id)",
    "413": "request body over --max-body-bytes",
    "429": "queue full; see Retry-After",
    "503": "shutting down",
    "504": "the request passed --request-timeout",
}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
USAGE_SCHEMA = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
}


def _completion_schema(obj: str, choice_required: list[str]) -> dict:
    """A chat.completion / text_completion body (the fields every answer carries)."""
    choice = {
        "type": "object",
        "required": ["index", "finish_reason", *choice_required],
        "properties": {"index": {"type": "integer"}, "finish_reason": {"enum": ["stop", "length", "tool_calls"]}},
    }
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": obj},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": choice},
            "usage": {"$ref": REF.format(model="Usage")},
            "speculation": {
                "anyOf": [
                    {"type": "object"},  # one per choice when n > 1
                    {"type": "array", "items": {"type": "object"}},
                ]
            },
        },
    }


RESPONSE_SCHEMA = {  # a Responses API response (the fields every answer carries)
    "type": "object",
    "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete"]},
        "model": {"type": "string"},
        "output": {"type": "array", "items": {"type": "object", "required": ["type"]}},
        "usage": {
            "type": "object",
            "required": ["input_tokens", "output_tokens", "total_tokens"],
            "properties": {k: {"type": "integer"} for k in ("input_tokens", "output_tokens", "total_tokens")},
        },
    },
}


# OpenAPI 3.1 (what FastAPI writes): the `schema` of an event stream describes one event. Ours are
# `data:` lines (a JSON chunk, an error object, or the final "[DONE]"), or for /v1/responses
# typed events: an `event:` line naming the type, then its `data:` line.
SSE_EVENT_SCHEMA = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
MODEL_SCHEMA = {
    "type": "object",
    "required": ["id", "object"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"}},
}
LIST_SCHEMA = {  # one page of stored objects (server/pagination.py)
    "type": "object",
    "required": ["object", "data", "first_id", "last_id", "has_more"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"type": "object", "required": ["id"]}},
        "first_id": {"type": ["string", "null"]},
        "last_id": {"type": ["string", "null"]},
        "has_more": {"type": "boolean"},
    },
}
CHAT_DELETED_SCHEMA = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion.deleted"},
        "deleted": {"const": True},
    },
}
METADATA_FILTER = {  # GET /v1/chat/completions?metadata[key]=value
    "name": "metadata",
    "in": "query",
    "required": False,
    "style": "deepObject",
    "explode": True,
    "schema": {"type": "object", "additionalProperties": {"type": "string"}},
}
EXTRA_SCHEMAS = {
    "ErrorResponse": ERROR_SCHEMA,
    "Usage": USAGE_SCHEMA,
    "ChatCompletion": _completion_schema("chat.completion", ["message"]),
    "Completion": _completion_schema("text_completion", ["text"]),
    "Response": RESPONSE_SCHEMA,
    "List": LIST_SCHEMA,
    "ChatCompletionDeleted": CHAT_DELETED_SCHEMA,
    "Model": MODEL_SCHEMA,
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL_SCHEMA}},
    },
}


def _errors(*statuses: str) -> dict:
    """OpenAPI responses for error statuses, all in OpenAI's error shape."""
    ref = {"$ref": REF.format(model="ErrorResponse")}
    return {s: {"description": ERROR_STATUSES[s], "content": {"application/json": {"schema": ref}}} for s in statuses}


def _generation(model: type[BaseModel], answer: str) -> dict:
    """requestBody and responses of a generation route (JSON answer, or SSE when stream is true)."""
    ok = {
        "description": f"a {answer}, or server-sent events of chunks when stream is true",
        "content": {
            "application/json": {"schema": {"$ref": REF.format(model=answer)}},
            "text/event-stream": {"schema": SSE_EVENT_SCHEMA},
        },
    }
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
        },
        "responses": {"200": ok, **_errors("400", "401", "404", "413", "429", "503", "504")},
    }


def _model_schemas(*models: type[BaseModel]) -> dict:
    """Each model's validation schema, its nested models lifted into components."""
    out: dict = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF, mode="validation")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def _json(description: str, model: str) -> dict:
    """A 200 whose JSON body is the named component."""
    return {
        "200": {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model)}}},
        }
    }


def _chat_store_paths(paths: dict) -> None:
    """The stored chat completions' routes (server/chat_store_api.py): answers, errors, the update's body."""
    listed = paths["/v1/chat/completions"]["get"]
    listed["parameters"] = [*listed.get("parameters", []), METADATA_FILTER]
    listed["responses"] = {**_json("stored chat completions, oldest first", "List"), **_errors("400", "401")}
    one = paths["/v1/chat/completions/{completion_id}"]
    one["get"]["responses"] = {**_json("the stored chat completion", "ChatCompletion"), **_errors("401", "404")}
    one["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": REF.format(model="ChatCompletionUpdateRequest")}}},
    }
    one["post"]["responses"] = {
        **_json("the stored chat completion, its metadata replaced", "ChatCompletion"),
        **_errors("400", "401", "404", "413"),
    }
    one["delete"]["responses"] = {**_json("deleted", "ChatCompletionDeleted"), **_errors("401", "404")}
    messages = paths["/v1/chat/completions/{completion_id}/messages"]["get"]
    messages["responses"] = {
        **_json("the stored completion's request messages", "List"),
        **_errors("400", "401", "404"),
    }


def build_openapi(app: FastAPI) -> dict:
    """FastAPI's document with the request models and response schemas filled in."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    doc.setdefault("components", {}).setdefault("schemas", {}).update(
        {
            **_model_schemas(
                ChatCompletionRequest,
                ChatCompletionUpdateRequest,
                CompletionRequest,
                ResponsesRequest,
                InputTokensRequest,
                TokenizeRequest,
                DetokenizeRequest,
            ),
            **EXTRA_SCHEMAS,
        }
    )
    paths = doc["paths"]
    paths["/v1/chat/completions"]["post"].update(_generation(ChatCompletionRequest, "ChatCompletion"))
    paths["/v1/completions"]["post"].update(_generation(CompletionRequest, "Completion"))
    paths["/v1/responses"]["post"].update(_generation(ResponsesRequest, "Response"))
    for path, model, answer in (
        ("/tokenize", TokenizeRequest, {"count", "max_model_len", "tokens"}),
        ("/detokenize", DetokenizeRequest, {"prompt"}),
        ("/v1/responses/input_tokens", InputTokensRequest, {"object", "input_tokens"}),
    ):
        schema = {"type": "object", "required": sorted(answer)}
        paths[path]["post"].update(
            {
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
                },
                "responses": {
                    "200": {"description": path[1:], "content": {"application/json": {"schema": schema}}},
                    **_errors("400", "401", "404", "413"),
                },
            }
        )
    stored = {
        "200": {
            "description": "the stored response",
            "content": {"application/json": {"schema": {"$ref": REF.format(model="Response")}}},
        }
    }
    paths["/v1/responses/{response_id}"]["get"]["responses"] = {**stored, **_errors("400", "401", "404")}  # stream
    deleted = {"200": {"description": "deleted", "content": {"application/json": {"schema": {"type": "object"}}}}}
    paths["/v1/responses/{response_id}"]["delete"]["responses"] = {**deleted, **_errors("401", "404")}
    paths["/v1/responses/{response_id}/cancel"]["post"]["responses"] = _errors("400", "401", "404")  # never a 200
    items = {"type": "object", "required": ["object", "data", "first_id", "last_id", "has_more"]}
    paths["/v1/responses/{response_id}/input_items"]["get"]["responses"] = {
        "200": {"description": "the response's input items", "content": {"application/json": {"schema": items}}},
        **_errors("400", "401", "404"),
    }
    _chat_store_paths(paths)
    ok = {"description": "the served model", "content": {"application/json": {"schema": {}}}}
    paths["/v1/models"]["get"]["responses"] = {
        "200": {**ok, "content": {"application/json": {"schema": {"$ref": REF.format(model="ModelList")}}}},
        **_errors("401"),
    }
    paths["/v1/models/{model_id}"]["get"]["responses"] = {
        "200": {**ok, "content": {"application/json": {"schema": {"$ref": REF.format(model="Model")}}}},
        **_errors("401", "404"),
    }
    info = {"type": "object", "required": ["bos_token", "chat_template", "eos_token", "model_max_length"]}
    paths["/tokenizer_info"]["get"]["responses"] = {
        "200": {"description": "the tokenizer", "content": {"application/json": {"schema": info}}},
        **_errors("401"),
    }
    paths["/health"]["get"]["responses"] = {
        "200": {"description": "serving", "content": {"application/json": {}}},
        "503": {"description": "worker down", "content": {"application/json": {}}},
    }
    paths["/metrics"]["get"]["responses"] = {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    }
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve `build_openapi`'s document at /openapi.json (built once, on first request)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi
