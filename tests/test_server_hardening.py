"""Hardening of a shared endpoint: body-size cap (413), OpenAI's limits (400 naming the param),
and an OpenAPI document that says what the server really accepts, checked by schemathesis.

One real server process on the tiny random model (no API key, so the fuzzer needs no auth).
How fast a 50 MB body is refused is measured by `scripts/bench_body_limit.py`, not asserted here.
"""

from __future__ import annotations

import itertools
import json
import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from server_proc import ServerProcess, metric_value
from tiny import save_tiny

from specserve.config import METHODS
from specserve.server.body_limit import default_max_body_bytes
from specserve.server.protocol import ChatCompletionRequest, CompletionRequest
from specserve.server.schemas import InputTokensRequest, ResponsesRequest

MODEL = "tiny"
CONTEXT = 512  # tiny.tiny_model's max_position_embeddings
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 4}
FUZZ_MAX_TOKENS = 8
# The same examples every run (stable CI); SPECSERVE_FUZZ_RANDOM=1 draws new ones each run, which
# is how the tiny-top_p / tiny-temperature 500s were found.
FUZZ_DERANDOMIZE = os.environ.get("SPECSERVE_FUZZ_RANDOM") != "1"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_tiny(tmp_path_factory.mktemp("hardening") / "tiny")
    with ServerProcess(path, "--served-model-name", MODEL, "--max-queue", "8", "--request-timeout", "60") as srv:
        yield srv


def _post(server, path: str, **kw) -> httpx.Response:
    return httpx.post(f"{server.base_url}/{path}", timeout=60, **kw)


def _assert_openai_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


def _still_serving(server) -> None:
    r = _post(server, "chat/completions", json=OK_CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


# -- body-size cap --------------------------------------------------------------------------------
def _big_chat_body(size: int) -> bytes:
    """A well-formed chat body of about `size` bytes (what a client pasting a huge file sends)."""
    head, tail = b'{"model":"tiny","messages":[{"role":"user","content":"', b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_50mb_body_is_refused_with_413_and_server_keeps_serving(server):
    r = _post(
        server, "chat/completions", content=_big_chat_body(50_000_000), headers={"Content-Type": "application/json"}
    )
    _assert_openai_error(r, 413, None, "request_too_large")
    _still_serving(server)
    assert server.health()["status"] == "ok"


def test_chunked_body_over_the_cap_is_refused(server):
    """No Content-Length: the cap is enforced by counting bytes while reading."""
    body = _big_chat_body(8_000_000)
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))  # a generator: sent chunked
    r = _post(server, "completions", content=chunks, headers={"Content-Type": "application/json"})
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    _assert_openai_error(r, 413, None, "request_too_large")
    _still_serving(server)


def test_cap_is_sized_from_the_context_and_bodies_under_it_pass(server):
    """Just under the default cap the body is parsed (and refused for its length in tokens, a 400)."""
    cap = default_max_body_bytes(CONTEXT)
    assert cap == 2 * 64 * CONTEXT + (1 << 20)
    r = _post(
        server, "chat/completions", content=_big_chat_body(cap - 10), headers={"Content-Type": "application/json"}
    )
    _assert_openai_error(r, 400, "messages", "context_length_exceeded")
    r = _post(
        server, "chat/completions", content=_big_chat_body(cap + 10), headers={"Content-Type": "application/json"}
    )
    _assert_openai_error(r, 413, None, "request_too_large")


def test_max_body_bytes_flag(tmp_path):
    path = save_tiny(tmp_path / "tiny")
    with ServerProcess(path, "--served-model-name", MODEL, "--max-body-bytes", "300") as srv:
        r = _post(srv, "chat/completions", json={**OK_CHAT, "stop": ["x" * 300]})
        _assert_openai_error(r, 413, None, "request_too_large")
        _still_serving(srv)
        # counted under its endpoint, as a 400 is (a 413 never reached the counter before)
        assert metric_value(srv.metrics(), "specserve_requests_total", endpoint="chat", status="413") == 1
        assert metric_value(srv.metrics(), "specserve_requests_total", status="413") == 1


# -- OpenAI's limits ------------------------------------------------------------------------------
LIMITS = [  # (endpoint, extra fields, param)
    ("chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("chat/completions", {"logit_bias": {"42": 101}}, "logit_bias"),
    ("chat/completions", {"logit_bias": {"hello": 5}}, "logit_bias"),  # keys are token ids
    ("completions", {"logit_bias": {"-3": 5}}, "logit_bias"),
    ("chat/completions", {"logit_bias": {"100000000": 5}}, "logit_bias"),  # beyond the vocabulary
    ("chat/completions", {"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ("chat/completions", {"metadata": {"k" * 65: "v"}}, "metadata"),
    ("chat/completions", {"metadata": {"k": "v" * 513}}, "metadata.k"),
    ("chat/completions", {"safety_identifier": "u" * 129}, "safety_identifier"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
]


@pytest.mark.parametrize("path,extra,param", LIMITS)
def test_openai_limits_are_400_naming_the_param(server, path, extra, param):
    body = {**OK_CHAT, **extra} if path == "chat/completions" else {"model": MODEL, "prompt": "x", **extra}
    _assert_openai_error(_post(server, path, json=body), 400, param, "invalid_value")


def test_limits_allow_what_openai_allows(server):
    ok = {
        **OK_CHAT,
        "stop": ["a", "b", "c", "d"],
        "metadata": {f"k{i}": "v" * 512 for i in range(16)},
        "safety_identifier": "u" * 128,  # 128: the openai SDK's documented maximum (64 before)
    }
    assert _post(server, "chat/completions", json=ok).status_code == 200
    responses = {"model": MODEL, "input": "x", "max_output_tokens": 2, "safety_identifier": "u" * 128}
    assert _post(server, "responses", json=responses).status_code == 200


SEED_BODIES = {  # endpoint -> a body without its seed
    "chat/completions": {**OK_CHAT, "temperature": 1.0},
    "completions": {"model": MODEL, "prompt": "x", "max_tokens": 4, "temperature": 1.0},
    "responses": {"model": MODEL, "input": "x", "max_output_tokens": 16, "temperature": 1.0},
}


@pytest.mark.parametrize("path", SEED_BODIES)
def test_a_seed_outside_64_bits_is_a_400_and_its_ends_are_served(server, path):
    """The engine honours a seed as 64 bits (it keys its random numbers with seed mod 2**64), so
    a larger one would silently sample as another seed: the signed 64-bit range OpenAI documents
    is served and anything outside it is a 400 naming `seed`."""
    for seed in (2**63, -(2**63) - 1, 2**64, 10**30):
        _assert_openai_error(_post(server, path, json={**SEED_BODIES[path], "seed": seed}), 400, "seed")
    for seed in (2**63 - 1, -(2**63)):
        assert _post(server, path, json={**SEED_BODIES[path], "seed": seed}).status_code == 200


# -- OpenAPI --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path,model",
    [
        ("/v1/chat/completions", ChatCompletionRequest),
        ("/v1/completions", CompletionRequest),
        ("/v1/responses", ResponsesRequest),
        ("/v1/responses/input_tokens", InputTokensRequest),
    ],
)
def test_openapi_publishes_the_request_models(server, path, model):
    doc = httpx.get(f"{server.url}/openapi.json").json()
    body = doc["paths"][path]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert body["required"] and set(schema["properties"]) == set(model.model_fields)
    assert set(schema.get("required", ())) == {n for n, f in model.model_fields.items() if f.is_required()}
    if "stop" in model.model_fields:  # (the Responses API has no stop strings)
        stop_list = next(s for s in schema["properties"]["stop"]["anyOf"] if s.get("type") == "array")
        assert stop_list["maxItems"] == 4
    assert {"400", "413"} <= set(doc["paths"][path]["post"]["responses"])


# -- schemathesis ---------------------------------------------------------------------------------
# The fuzzer's own pytest plugin (schemathesis.pytest.from_fixture) breaks on pytest 9.2 (it sets a
# node attribute pytest no longer has), so each operation's hypothesis strategy is run directly.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
REFUSED = (
    "functions",
    "function_call",
    "audio",
    "modalities",
    "echo",
    "suffix",
    "best_of",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "stop_token_ids",
    "bad_words",
    "allowed_token_ids",
)  # documented 400s (unsupported parameters)
EXTENSION_GUIDES = ("structured_outputs", "guided_json", "guided_regex", "guided_grammar", "guided_choice")
FUZZ_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 4}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
FUZZ_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok"],
}
_turn = itertools.count()
_servable_turn = itertools.count()
reached: dict[str, int] = {}  # generation features the servable half got a 200 for


def _small(case) -> None:
    """Keep fuzzed generations short; every other request is also made servable (the served
    model, no unsupported parameters, text-only messages, one prompt) so that half the examples
    reach the engine with fuzzed sampling, speculation, grammar, tool and n values instead of
    stopping at a 400/404."""
    if not isinstance(case.body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if not isinstance(case.body.get(key), int) or case.body[key] > FUZZ_MAX_TOKENS:
            case.body[key] = FUZZ_MAX_TOKENS
    if next(_turn) % 2 == 0:
        if case.path in ("/tokenize", "/detokenize"):
            _servable_tokens(case.body)
        else:
            _servable(case.body)


def _servable(body: dict) -> None:
    """Turn a schema-valid body into one the tiny model serves (what is left is fuzzed). Grammar,
    tools and n are kept, made valid where the fuzzer's values cannot be, and one of them is
    added in turn when the fuzzer left it out, so the engine's constrained, tool and n > 1
    paths are fuzzed too."""
    body["model"] = MODEL
    for key in REFUSED:
        body.pop(key, None)
    if "input" in body:  # /v1/responses
        _servable_response(body)
        return
    if "messages" in body:
        body["messages"] = [
            {"role": "user", "content": m["content"] if isinstance(m.get("content"), str) else "hi"}
            for m in body["messages"]
            if isinstance(m, dict)
        ] or [{"role": "user", "content": "hi"}]
    if not body.get("stream"):
        body.pop("stream_options", None)  # without stream: a documented 400
    if "prompt" in body and not (isinstance(body["prompt"], str) and body["prompt"]):
        body["prompt"] = "def add"
    if isinstance(body.get("stop"), list):
        body["stop"] = [x for x in body["stop"] if x] or None
    if body.get("stop") == "":
        body["stop"] = None
    if isinstance(body.get("logit_bias"), dict):  # fuzzed values on token ids the model has
        body["logit_bias"] = {str(7 * i): v for i, v in enumerate(body["logit_bias"].values())}
    if body.get("top_logprobs") is not None and "messages" in body:
        body["logprobs"] = True
    if isinstance(body.get("speculation"), dict) and body["speculation"].get("method") not in METHODS:
        body["speculation"].pop("method", None)
    turn = next(_servable_turn) % 3
    chat = "messages" in body
    if isinstance(body.get("n"), int) or turn == 0:  # 1 ... 3 choices
        body["n"] = 1 + (body.get("n", 2) - 1) % 3 if isinstance(body.get("n"), int) else 2
    if chat and ("tools" in body or "tool_choice" in body or turn == 1):
        body["tools"] = [FUZZ_TOOL]
        choice = body.get("tool_choice")
        if choice not in ("none", "auto", "required"):
            choice = (
                "required"
                if turn == 1 or not isinstance(choice, dict)
                else {"type": "function", "function": {"name": "get_weather"}}
            )
        body["tool_choice"] = choice
    if body.get("response_format") is None:
        body.pop("response_format", None)
    if not chat and isinstance(body.get("response_format"), dict):  # completions take it too: a valid one
        body["response_format"] = {"type": "json_object"}
    if chat and ("response_format" in body or turn == 2):
        kind = body["response_format"].get("type") if isinstance(body.get("response_format"), dict) else None
        kind = kind if kind in ("text", "json_object") else "json_schema"
        body["response_format"] = (
            {"type": kind}
            if kind != "json_schema"
            else {"type": kind, "json_schema": {"name": "fuzz", "schema": FUZZ_SCHEMA}}
        )
    guides = [k for k in EXTENSION_GUIDES if body.get(k) is not None]
    for k in guides:
        body.pop(k)
    formatted = isinstance(body.get("response_format"), dict) and body["response_format"].get("type", "text") != "text"
    if (guides or (not chat and turn == 2)) and not formatted:  # one grammar from the extension fields
        body["structured_outputs"] = {"regex": "[a-c]{1,4}"} if len(guides) % 2 else {"choice": ["yes", "no"]}
    forced = body.get("tool_choice") not in (None, "none", "auto")
    if forced:  # a forced call is the constraint: another is a documented 400
        body.pop("structured_outputs", None)
        body.pop("response_format", None)
    if forced or "structured_outputs" in body or body.get("response_format", {}).get("type", "text") != "text":
        body.pop("ignore_eos", None)  # with a grammar: a documented 400
        body.pop("stop", None)  # likewise


def _servable_tokens(body: dict) -> None:
    """A /tokenize or /detokenize body the tiny model answers: the served model, exactly one of
    prompt and messages (text-only), token ids it has."""
    body["model"] = MODEL
    if "tokens" in body:
        body["tokens"] = [t % 64 for t in body["tokens"] if isinstance(t, int)]
    elif body.get("messages") is not None and body.get("prompt") is None:
        body["messages"] = [{"role": "user", "content": "hi"}]
        body.pop("continue_final_message", None)
        body.pop("add_generation_prompt", None)
    else:
        body.pop("messages", None)
        body["prompt"] = body["prompt"] if isinstance(body.get("prompt"), str) else "def add"


def _servable_response(body: dict) -> None:
    """A Responses API body the tiny model serves: text input, no stored state, and in turn a
    forced flat function tool or a JSON-schema text format (the rest is left fuzzed)."""
    for key in ("previous_response_id", "conversation", "background", "tools", "tool_choice", "text"):
        body.pop(key, None)
    if not isinstance(body["input"], str) or not body["input"]:
        body["input"] = "hi"
    turn = next(_servable_turn) % 3
    if turn == 1:
        body["tools"] = [{"type": "function", **FUZZ_TOOL["function"]}]
        body["tool_choice"] = "required"
    elif turn == 2:
        body["text"] = {"format": {"type": "json_schema", "name": "fuzz", "schema": FUZZ_SCHEMA}}


def _record(body, response) -> None:
    """Count the generation features a 200 reached."""
    if not isinstance(body, dict) or response.status_code != 200:
        return
    fmt = body.get("response_format") or (body.get("text") or {}).get("format") or {}
    features = {
        "n > 1": (body.get("n") or 1) > 1,
        "tools": bool(body.get("tools")) and body.get("tool_choice") != "none",
        "grammar": fmt.get("type", "text") != "text" or body.get("structured_outputs") is not None,
    }
    for name, on in features.items():
        reached[name] = reached.get(name, 0) + on


def test_schemathesis(server):
    """Schema-valid requests to every operation: never a 5xx, and status, content type and body
    match the document (up to 30 examples per operation)."""
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/v1/responses"}
    for op in operations:

        @given(case=op.as_strategy())
        @settings(
            max_examples=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=FUZZ_DERANDOMIZE,
        )
        def run(case):
            _small(case)
            _record(case.body, case.call_and_validate(base_url=server.url, checks=CHECKS, timeout=60))

        run()
    assert metric_value(server.metrics(), "specserve_requests_total", status="200") > 0  # the engine was reached
    assert all(reached.get(f) for f in ("n > 1", "tools", "grammar")), reached


SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    "path, extra, param",
    [
        # a stop string cut the constrained answer, which came back as finish_reason "stop"
        ("chat/completions", {"stop": [" is"], "structured_outputs": {"regex": "[A-Z][a-z]+ is"}}, "stop"),
        ("chat/completions", {"stop": ","} | {"response_format": SCHEMA_FORMAT}, "stop"),
        ("chat/completions", {"stop": ["Paris"], "tools": [FUZZ_TOOL], "tool_choice": "required"}, "stop"),
        ("completions", {"stop": "}", "response_format": {"type": "json_object"}}, "stop"),
        # a forced tool call dropped the other constraint without a word
        (
            "chat/completions",
            {"tools": [FUZZ_TOOL], "tool_choice": "required", "structured_outputs": {"regex": "a+"}},
            "structured_outputs.regex",
        ),
        (
            "chat/completions",
            {"tools": [FUZZ_TOOL], "tool_choice": "required", "response_format": SCHEMA_FORMAT},
            "response_format.json_schema.schema",
        ),
        # completions ignored response_format: now it constrains, and two constraints are refused
        (
            "completions",
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}},
            "structured_outputs.regex",
        ),
    ],
)
def test_constraints_that_would_be_cut_or_dropped_are_refused(server, path, extra, param):
    base = OK_CHAT if path.startswith("chat") else {"model": MODEL, "prompt": "def add", "max_tokens": 4}
    _assert_openai_error(_post(server, path, json=base | extra), 400, param)


def test_completions_honour_response_format(server):
    body = {"model": MODEL, "prompt": "def add", "max_tokens": 64, "temperature": 0}
    r = _post(server, "completions", json=body | {"response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["text"]), dict)
    else:  # cut by max_tokens: still a JSON object's beginning, never free text
        assert choice["text"].lstrip().startswith("{")


@pytest.mark.parametrize("role", ["user", "system", "tool"])
def test_a_message_without_content_is_a_400(server, role):
    """A user message with no `content` was templated as an empty turn and answered (a 200)."""
    messages = [{"role": "user", "content": "hi"}, {"role": role}] if role != "user" else [{"role": "user"}]
    r = _post(server, "chat/completions", json={**OK_CHAT, "messages": messages})
    err = _assert_openai_error(r, 400, f"messages[{len(messages) - 1}]")
    assert f"a {role} message needs content" in err["message"]
    # an assistant message may carry tool calls instead, or be left empty before a next turn
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "user", "content": "and?"}]
    assert _post(server, "chat/completions", json={**OK_CHAT, "messages": turns}).status_code == 200
