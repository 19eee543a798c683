"""OpenAI request and response shapes, and their mapping onto the engine's configuration.

Requests are parsed strictly (wrong JSON types are a 400, as OpenAI does) into pydantic
models; `prepare_chat` / `prepare_completion` turn one into a `Prepared` job (prompt token ids,
`SamplingParams`, `SpeculationConfig`, prediction text), refusing what we cannot serve with a
400 that names the parameter. A `Dialect` builds the JSON bodies and SSE chunks of its endpoint.
Everything here is pure apart from tokenizer calls, so it runs off the event loop.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ..config import SamplingParams, SpeculationConfig
from ..engine.constrain import CompiledGuide, ConstraintError, GrammarBusy, PendingGuide
from ..engine.stats import RequestOutput, TokenLogprob
from ..errors import ContextLengthError, InvalidRequestError
from .structured import (
    GUIDED_FIELDS,
    ToolSetup,
    check_guided,
    check_n,
    extension_guide,
    json_whitespace,
    response_format_guide,
    tool_guide,
    tool_setup,
)
from .tools import ToolStreamSplitter, check_message_tool_calls, parse_tool_calls

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# OpenAI's documented limits (API reference): "Up to 4 sequences" for stop; logit_bias values
# "from -100 to 100"; metadata is a "set of 16 key-value pairs", keys at most 64 characters,
# values at most 512; safety_identifier at most 64 characters; top_logprobs 0..20.
MAX_STOP = 4
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MAX_SAFETY_IDENTIFIER = 64


# -- errors ---------------------------------------------------------------------------------------
class APIError(Exception):
    """An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def unsupported(param: str, what: str) -> APIError:
    return APIError(400, f"{param}: {what} is not supported by this server", param=param,
                    code="unsupported_parameter")


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
        return bad_request(str(exc))
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


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long",
                 "string_too_short", "string_too_long", "literal_error"}


def _validation_error(e: ValidationError) -> APIError:
    """The most telling error: a value out of range beats the type mismatch of another union member
    (five stop strings are "at most 4 items", not "should be a valid string")."""
    errors = e.errors(include_url=False)
    err = next((x for x in errors if x["type"] in _RANGE_ERRORS), errors[0])
    if err["type"] == "json_invalid":
        return bad_request(f"the request body is not valid JSON ({err['msg']})", None, "invalid_json")
    param = _param_path(err["loc"])
    if param is None:
        return bad_request("the request body must be a JSON object", None, "invalid_type")
    if err["type"] == "missing":
        return bad_request(f"missing required parameter {param!r}", param, "missing_required_parameter")
    code = "invalid_value" if err["type"] in _RANGE_ERRORS else "invalid_type"
    return bad_request(f"{param}: {err['msg']}", param, code)


# -- request models -------------------------------------------------------------------------------
def _integral(value: Any) -> Any:
    """2.0 -> 2: JSON Schema's "integer" admits numbers with a zero fraction, so we do too."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_integral)]  # a strict int that also takes 2.0 (never true or "2")


class _Strict(BaseModel):
    """Wrong JSON types are errors (no "1" -> 1 coercion); unknown fields are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class _Open(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ContentPart(_Open):
    type: str
    text: str | None = None


Content = str | list[ContentPart]


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None


class Prediction(_Strict):
    type: Literal["content"]
    content: Content


class StreamOptions(_Strict):
    include_usage: bool | None = False


class SpeculationRequest(_Strict):
    """Non-standard: `{"method": "auto|none|prediction|ngram|draft", "num_speculative_tokens": K}`."""

    method: str | None = None
    num_speculative_tokens: Int | None = Field(None, ge=1, le=256)


class ResponseFormat(_Open):
    type: str


class _Common(_Strict):
    """Fields shared by chat and completions requests."""

    model: str
    max_tokens: Int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: Int | None = Field(None, ge=-1)  # extension (extra_body); -1 or 0 = off
    seed: Int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # OpenAI: a 64-bit integer
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: Int | None = Field(None, ge=1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    metadata: Annotated[dict[Annotated[str, Field(max_length=MAX_METADATA_KEY)],
                             Annotated[str, Field(max_length=MAX_METADATA_VALUE)]],
                        Field(max_length=MAX_METADATA_PAIRS)] | None = None  # accepted and ignored
    safety_identifier: str | None = Field(None, max_length=MAX_SAFETY_IDENTIFIER)  # accepted and ignored
    speculation: SpeculationRequest | None = None  # extension (extra_body)
    ignore_eos: bool | None = False  # extension (extra_body), as in vLLM
    structured_outputs: Any = None  # extension (extra_body), vLLM's: {json | regex | grammar | choice}
    guided_json: Any = None  # vLLM's older names for the same
    guided_regex: Any = None
    guided_grammar: Any = None
    guided_choice: Any = None
    strict_whitespace: bool | None = None  # extension (extra_body): JSON outputs in one layout (structured.py)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: Int | None = Field(None, ge=0, le=20)
    prediction: Prediction | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    response_format: ResponseFormat | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[Int] | list[list[Int]]
    logprobs: Int | None = Field(None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None
    best_of: Int | None = Field(None, ge=1)
    prediction: Prediction | None = None  # extension: Predicted Outputs on completions too


# -- request -> engine ------------------------------------------------------------------------
@dataclass
class Prepared:
    """A validated request, ready for the worker."""

    prompt_ids: list[int]
    params: SamplingParams
    speculation: SpeculationConfig
    prediction: str | None
    stream: bool
    include_usage: bool
    guide: CompiledGuide | PendingGuide | None = None  # structured output / forced tool call grammar
    tools: ToolSetup | None = None  # chat requests with tools: parse <tool_call> blocks
    n: int = 1  # independent choices


def content_text(content: Content | None, param: str) -> str:
    """A string, or the concatenated text of an array of text parts; other parts are refused."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise unsupported(f"{param}[{j}]", f"content part type {part.type!r} (only 'text' parts)")
        texts.append(part.text)
    return "".join(texts)


def _refuse_common(req: _Common) -> None:
    if req.logit_bias:
        raise unsupported("logit_bias", "logit_bias")


def _refuse_chat(req: ChatCompletionRequest) -> None:
    """Refuse the chat features we do not implement, naming the parameter."""
    _refuse_common(req)
    if req.functions or req.function_call not in (None, "none"):
        raise unsupported("functions" if req.functions else "function_call", "function calling")
    if req.audio is not None or "audio" in (req.modalities or ()):
        raise unsupported("audio" if req.audio is not None else "modalities", "audio output")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")


def speculation_config(req: SpeculationRequest | None, default: SpeculationConfig, has_draft: bool,
                       ) -> SpeculationConfig:
    """The server's default speculation, overridden field by field by the request's object."""
    if req is None:
        spec = default
    else:
        k = req.num_speculative_tokens if req.num_speculative_tokens is not None else default.num_speculative_tokens
        try:
            spec = SpeculationConfig(method=req.method or default.method, num_speculative_tokens=k)
        except ValueError as e:
            raise bad_request(str(e), "speculation.method") from None
    if spec.method == "draft" and not has_draft:
        raise bad_request("speculation method 'draft' needs a draft model; start the server with --draft-model",
                          "speculation.method")
    return spec


def sampling_params(req: _Common, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """OpenAI defaults: temperature 1, top_p 1, no penalties."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise bad_request("stop strings must be non-empty", "stop")
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=max(0, req.top_k or 0), seed=req.seed,
            stop=tuple(stop), presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0, logprobs=logprobs, ignore_eos=bool(req.ignore_eos))
    except ValueError as e:
        raise bad_request(str(e)) from None


def _max_tokens(requested: int | None, default: int | None, prompt_len: int, max_context: int,
                prompt_param: str) -> int:
    """Check prompt + max_tokens against the context; fill the default (capped to what fits)."""
    room = max_context - prompt_len
    if room <= 0:
        raise bad_request(f"This model's maximum context length is {max_context} tokens, but the "
                          f"{prompt_param} has {prompt_len} tokens. Please shorten it.", prompt_param,
                          "context_length_exceeded")
    if requested is None:
        return room if default is None else min(default, room)
    if prompt_len + requested > max_context:
        raise bad_request(f"This model's maximum context length is {max_context} tokens. However, you requested "
                          f"{prompt_len + requested} tokens ({prompt_len} in the {prompt_param}, {requested} for "
                          f"the completion). Please reduce the length of the {prompt_param} or max_tokens.",
                          "max_tokens", "context_length_exceeded")
    return requested


def _prediction_text(pred: Prediction | None, llm) -> str | None:
    """The prediction's text; refused when it alone is longer than the context."""
    if pred is None:
        return None
    text = content_text(pred.content, "prediction.content")
    if text and len(llm.encode(text)) > llm.max_context:
        raise bad_request(f"the prediction is longer than the model's context length ({llm.max_context} tokens)",
                          "prediction.content", "context_length_exceeded")
    return text or None


def _chat_message(m: ChatMessage, i: int) -> dict:
    """One OpenAI message as the chat template wants it, tool calls and tool results included."""
    if m.role == "function":
        raise unsupported(f"messages[{i}].role", "legacy 'function' messages (use role 'tool')")
    out = {"role": "system" if m.role == "developer" else m.role,
           "content": content_text(m.content, f"messages[{i}].content")}
    if m.tool_calls:
        out["tool_calls"] = check_message_tool_calls(m.tool_calls, f"messages[{i}].tool_calls")
    if m.role == "tool":
        out["tool_call_id"] = (m.model_extra or {}).get("tool_call_id")
    return out


def _extension_fields(req: _Common) -> dict:
    return {k: getattr(req, k) for k in ("structured_outputs", *GUIDED_FIELDS)}


def _compile(spec, llm, req: _Common) -> PendingGuide | None:
    """Start compiling the request's grammar (on the grammar threads); the server awaits it before
    queueing the request, so a bad or too slow one is a 400 and never holds up the prep thread."""
    check_guided(spec, req.ignore_eos)
    spec = json_whitespace(spec, req.strict_whitespace)
    return None if spec is None else llm.compile_guide(spec, wait=False)


def prepare_chat(req: ChatCompletionRequest, llm) -> Prepared:
    """Validate a chat request against the model and turn it into a job."""
    _refuse_chat(req)
    if not req.messages:
        raise bad_request("messages must contain at least one message", "messages", "empty_array")
    messages = [_chat_message(m, i) for i, m in enumerate(req.messages)]
    tools = tool_setup(req.tools, req.tool_choice, req.parallel_tool_calls)
    spec = tool_guide(tools) or response_format_guide(req.response_format) or extension_guide(_extension_fields(req))
    try:
        prompt_ids = llm.apply_chat_template(messages, tools.tools)
    except (InvalidRequestError, ContextLengthError):
        raise
    except Exception as e:  # a chat template that refuses these messages (jinja2 raise_exception)
        raise bad_request(f"messages: the model's chat template rejected them: {e}", "messages") from None
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = _max_tokens(requested, None, len(prompt_ids), llm.max_context, "messages")
    top_n = (req.top_logprobs or 0) if req.logprobs else None
    return Prepared(prompt_ids, sampling_params(req, max_tokens, top_n),
                    speculation_config(req.speculation, llm.speculation, llm.has_draft_model),
                    _prediction_text(req.prediction, llm), bool(req.stream),
                    bool(req.stream_options and req.stream_options.include_usage),
                    _compile(spec, llm, req), tools if tools.parse_calls else None, check_n(req.n))


def _completion_prompt_ids(prompt, llm) -> list[int]:
    """One prompt: a string, a list of token ids, or a batch of exactly one of those."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise unsupported("prompt", "a batch of several prompts (send one request per prompt)")
        prompt = prompt[0]
    try:
        return llm.prompt_ids(prompt)
    except InvalidRequestError as e:
        code = "empty_prompt" if "empty" in str(e) else "invalid_value"
        raise bad_request(str(e), "prompt", code) from None


def prepare_completion(req: CompletionRequest, llm) -> Prepared:
    """Validate a completions request against the model and turn it into a job."""
    _refuse_common(req)
    if req.echo:
        raise unsupported("echo", "echo")
    if req.suffix:
        raise unsupported("suffix", "suffix (fill-in-the-middle)")
    if req.best_of not in (None, 1):
        raise unsupported("best_of", f"best_of={req.best_of} (server-side ranking of extra samples; "
                          "ask for n choices and rank them yourself)")
    prompt_ids = _completion_prompt_ids(req.prompt, llm)
    max_tokens = _max_tokens(req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, len(prompt_ids), llm.max_context,
                             "prompt")
    return Prepared(prompt_ids, sampling_params(req, max_tokens, req.logprobs),
                    speculation_config(req.speculation, llm.speculation, llm.has_draft_model),
                    _prediction_text(req.prediction, llm), bool(req.stream),
                    bool(req.stream_options and req.stream_options.include_usage),
                    _compile(extension_guide(_extension_fields(req)), llm, req), None, check_n(req.n))


# -- engine -> responses --------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


class TokenNamer:
    """Token id -> (text, UTF-8 bytes) as OpenAI's logprobs show them; cached per id."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None) if backend is not None else None
        self.byte_level = decoder is not None and b"ByteLevel" in decoder.__getstate__()
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, tid: int) -> tuple[str, list[int]]:
        if tid not in self.cache:
            self.cache[tid] = self._name(tid)
        return self.cache[tid]

    def _name(self, tid: int) -> tuple[str, list[int]]:
        piece = self.tok.convert_ids_to_tokens(tid)
        if self.byte_level and piece and all(c in _BYTE_OF_CHAR for c in piece):
            raw = bytes(_BYTE_OF_CHAR[c] for c in piece)
            return raw.decode("utf-8", errors="replace"), list(raw)
        if piece and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            raw = bytes([int(piece[3:5], 16)])  # SentencePiece byte fallback
            return raw.decode("utf-8", errors="replace"), list(raw)
        text = self.tok.decode([tid])
        return text, list(text.encode("utf-8"))


def usage(outputs: RequestOutput | list[RequestOutput]) -> dict:
    """OpenAI usage, with Predicted Outputs' accepted / rejected prediction tokens.

    n choices: the prompt counts once (as OpenAI bills it), completion tokens are summed."""
    outputs = outputs if isinstance(outputs, list) else [outputs]
    prompt = outputs[0].stats.prompt_tokens
    completion = sum(o.stats.output_tokens for o in outputs)
    preds = [o.stats.by_source["prediction"] for o in outputs]
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": sum(p.accepted for p in preds),
                                      "rejected_prediction_tokens": sum(p.rejected for p in preds)},
    }


def speculation(outputs: RequestOutput | list[RequestOutput]) -> dict | list[dict]:
    """The speculation stats: one object, or one per choice when n > 1."""
    if isinstance(outputs, list):
        return outputs[0].stats.to_dict() if len(outputs) == 1 else [o.stats.to_dict() for o in outputs]
    return outputs.stats.to_dict()


def finish_reason(output: RequestOutput, tool_calls: bool = False) -> str:
    if output.finish_reason == "length":
        return "length"
    return "tool_calls" if tool_calls else "stop"


@dataclass
class ResponseContext:
    """What every chunk and body of one response shares."""

    id: str
    model: str
    namer: TokenNamer
    include_usage: bool = False
    logprobs: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    text_offset: dict = field(default_factory=dict)  # completions logprobs: chars described, per choice
    tools: ToolSetup | None = None  # parse <tool_call> blocks out of the output
    n: int = 1
    splitters: dict = field(default_factory=dict)  # choice index -> ToolStreamSplitter

    def splitter(self, index: int) -> ToolStreamSplitter:
        return self.splitters.setdefault(index, ToolStreamSplitter())


class Dialect:
    """Builds one endpoint's JSON bodies and SSE chunks. Subclasses: chat and completions."""

    name = ""
    request_model: type[_Common]
    id_prefix = ""

    def prepare(self, req, llm) -> Prepared:
        raise NotImplementedError

    def context(self, model: str, namer: TokenNamer, prepared: Prepared) -> ResponseContext:
        return ResponseContext(f"{self.id_prefix}{uuid.uuid4().hex}", model, namer, prepared.include_usage,
                               prepared.params.logprobs is not None, tools=prepared.tools, n=prepared.n)

    def opening_chunks(self, ctx: ResponseContext) -> list[dict]:
        return []

    def _chunk(self, ctx: ResponseContext, choices: list[dict], **extra) -> dict:
        body = {"id": ctx.id, "object": self.chunk_object, "created": ctx.created, "model": ctx.model,
                "system_fingerprint": None, "choices": choices}
        if ctx.include_usage:
            body["usage"] = None
        body.update(extra)
        return body

    def usage_chunk(self, ctx: ResponseContext, outputs) -> dict:
        return self._chunk(ctx, [], usage=usage(outputs), speculation=speculation(outputs))


class ChatDialect(Dialect):
    name = "chat"
    request_model = ChatCompletionRequest
    id_prefix = "chatcmpl-"
    chunk_object = "chat.completion.chunk"

    def prepare(self, req, llm) -> Prepared:
        return prepare_chat(req, llm)

    def _logprobs(self, ctx: ResponseContext, lps: list[TokenLogprob] | None) -> dict | None:
        if not ctx.logprobs or lps is None:
            return None
        return {"content": [self._entry(ctx, lp) for lp in lps], "refusal": None}

    @staticmethod
    def _entry(ctx: ResponseContext, lp: TokenLogprob) -> dict:
        text, raw = ctx.namer(lp.token_id)
        top = []
        for tid, val in lp.top:
            t, b = ctx.namer(tid)
            top.append({"token": t, "logprob": val, "bytes": b})
        return {"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top}

    def opening_chunks(self, ctx):
        delta = {"role": "assistant", "content": ""}
        return [self._chunk(ctx, [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
                for i in range(ctx.n)]

    def delta_chunk(self, ctx, text: str, lps, index: int = 0) -> dict:
        if ctx.tools is not None:  # hold back what may be a <tool_call> block
            text = ctx.splitter(index).feed(text)
        delta = {"content": text} if text else {}
        return self._chunk(ctx, [{"index": index, "delta": delta, "logprobs": self._logprobs(ctx, lps),
                                  "finish_reason": None}])

    def finish_chunks(self, ctx, output: RequestOutput, index: int = 0) -> list[dict]:
        """Held-back content, then one delta per tool call (id + name, then its arguments), then the finish."""
        chunks, calls = [], []
        if ctx.tools is not None:
            rest, calls = ctx.splitter(index).finish()
            calls = calls if ctx.tools.parallel else calls[:1]
            if rest:
                chunks.append(self._delta(ctx, index, {"content": rest}))
            for j, c in enumerate(calls):
                head = {"index": j, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
                chunks.append(self._delta(ctx, index, {"tool_calls": [head]}))
                chunks.append(self._delta(ctx, index, {"tool_calls": [{"index": j, "function": {
                    "arguments": c.arguments}}]}))
        done = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish_reason(output, bool(calls))}
        chunks.append(self._chunk(ctx, [done], speculation=output.stats.to_dict()))
        return chunks

    def _delta(self, ctx, index: int, delta: dict) -> dict:
        return self._chunk(ctx, [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def _choice(self, ctx, index: int, output: RequestOutput) -> dict:
        content, calls = output.text, []
        if ctx.tools is not None:
            content, calls = parse_tool_calls(output.text)
            calls = calls if ctx.tools.parallel else calls[:1]
        message = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        return {"index": index, "message": message, "logprobs": self._logprobs(ctx, output.logprobs),
                "finish_reason": finish_reason(output, bool(calls))}

    def response(self, ctx, outputs) -> dict:
        outputs = outputs if isinstance(outputs, list) else [outputs]
        return {"id": ctx.id, "object": "chat.completion", "created": ctx.created, "model": ctx.model,
                "system_fingerprint": None, "choices": [self._choice(ctx, i, o) for i, o in enumerate(outputs)],
                "usage": usage(outputs), "speculation": speculation(outputs)}


class CompletionDialect(Dialect):
    name = "completions"
    request_model = CompletionRequest
    id_prefix = "cmpl-"
    chunk_object = "text_completion"

    def prepare(self, req, llm) -> Prepared:
        return prepare_completion(req, llm)

    def _logprobs(self, ctx: ResponseContext, lps: list[TokenLogprob] | None, index: int = 0) -> dict | None:
        """OpenAI's legacy shape: parallel lists plus char offsets into the generated text."""
        if not ctx.logprobs or lps is None:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in lps:
            text, _ = ctx.namer(lp.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({ctx.namer(t)[0]: v for t, v in lp.top})
            out["text_offset"].append(ctx.text_offset.get(index, 0))
            ctx.text_offset[index] = ctx.text_offset.get(index, 0) + len(text)
        return out

    def delta_chunk(self, ctx, text: str, lps, index: int = 0) -> dict:
        return self._chunk(ctx, [{"index": index, "text": text, "logprobs": self._logprobs(ctx, lps, index),
                                  "finish_reason": None}])

    def finish_chunks(self, ctx, output: RequestOutput, index: int = 0) -> list[dict]:
        return [self._chunk(ctx, [{"index": index, "text": "", "logprobs": None,
                                   "finish_reason": finish_reason(output)}], speculation=output.stats.to_dict())]

    def response(self, ctx, outputs) -> dict:
        outputs = outputs if isinstance(outputs, list) else [outputs]
        choices = [{"index": i, "text": o.text, "logprobs": self._logprobs(ctx, o.logprobs, i),
                    "finish_reason": finish_reason(o)} for i, o in enumerate(outputs)]
        return {"id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
                "system_fingerprint": None, "choices": choices, "usage": usage(outputs),
                "speculation": speculation(outputs)}


CHAT, COMPLETIONS = ChatDialect(), CompletionDialect()
