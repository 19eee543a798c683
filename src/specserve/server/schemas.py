"""The OpenAI request bodies as strict pydantic models (wrong JSON types are a 400, as OpenAI does).

Parsing only: what a valid body means for the engine is `protocol.py`. The models also give the
OpenAPI document its request schemas (`openapi.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ..config import SEED_MAX, SEED_MIN, is_integer

# OpenAI's documented limits (API reference): "Up to 4 sequences" for stop; logit_bias values
# "from -100 to 100"; metadata is a "set of 16 key-value pairs", keys at most 64 characters,
# values at most 512; safety_identifier at most 128 characters (64 in older docs, the openai SDK's
# docstrings say 128 on chat and Responses); top_logprobs 0..20.
MAX_STOP = 4
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MAX_SAFETY_IDENTIFIER = 128


def _integral(value: Any) -> Any:
    """2.0 -> 2: JSON Schema's "integer" admits numbers with a zero fraction, so we do too."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_integral)]  # a strict int that also takes 2.0 (never true or "2")


# OpenAI's metadata: at most 16 pairs, keys at most 64 characters, values at most 512.
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=MAX_METADATA_KEY)], Annotated[str, Field(max_length=MAX_METADATA_VALUE)]],
    Field(max_length=MAX_METADATA_PAIRS),
]


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

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        """Only an assistant message may leave `content` out (it may carry tool calls instead), as
        OpenAI's API says: a user message without it was templated as an empty turn, a 200."""
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self


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
    top_p: float | None = Field(None, ge=0.0, le=1.0)  # 0: the most probable token only
    top_k: Int | None = Field(None, ge=-1)  # extension (extra_body); -1 or 0 = off
    seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)  # OpenAI: a 64-bit integer
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: Int | None = Field(None, ge=1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    metadata: Metadata | None = None  # kept with a stored chat completion; else accepted and ignored
    safety_identifier: str | None = Field(None, max_length=MAX_SAFETY_IDENTIFIER)  # accepted and ignored
    speculation: SpeculationRequest | str | None = None  # extension (extra_body); "ngram" = {"method": "ngram"}
    ignore_eos: bool | None = False  # extension (extra_body), as in vLLM
    structured_outputs: Any = None  # extension (extra_body), vLLM's: {json | regex | grammar | choice}
    guided_json: Any = None  # vLLM's older names for the same
    guided_regex: Any = None
    guided_grammar: Any = None
    guided_choice: Any = None
    strict_whitespace: bool | None = None  # extension (extra_body): JSON outputs in one layout (structured.py)
    response_format: ResponseFormat | None = None  # chat's; on completions too, as in vLLM
    # vLLM's sampling fields (extra_body) that this server does not implement: refused unless at
    # their defaults (protocol.refuse_unserved_sampling), never dropped as unknown fields are
    repetition_penalty: float | None = None
    min_p: float | None = None
    min_tokens: Int | None = None
    stop_token_ids: list[Int] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[Int] | None = None


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
    web_search_options: Any = None  # refused: the answer would not come from a search
    parallel_tool_calls: bool | None = None
    store: bool | None = False  # true: kept for GET /v1/chat/completions/{id} and friends (chat_store.py)
    # extensions (extra_body), as in vLLM: go on writing the last, assistant, message (an answer
    # begun for the model) instead of answering it; the response holds only what follows it
    continue_final_message: bool | None = False
    add_generation_prompt: bool | None = None


class ChatCompletionUpdateRequest(_Strict):
    """`POST /v1/chat/completions/{id}`: a stored completion's new metadata (null: none)."""

    metadata: Metadata | None


_PROMPT_SHAPES = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def _is_token(value: Any) -> bool:
    return is_integer(_integral(value))  # as `Int` takes it: 2 and 2.0, never true


def _prompt_shape(value: Any) -> Any:
    """Name the shapes a prompt may take: pydantic's own error for `[true, 5]` or `["a", [5]]` was
    "Input should be a valid string", which names the first of four shapes and none of the fault."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        kinds = {_prompt_item(v) for v in value}
        nested = kinds == {"tokens"} and not all(_is_token(t) for v in value for t in v)
        if len(kinds) <= 1 and "other" not in kinds and not nested:
            return value
    raise ValueError(f"must be {_PROMPT_SHAPES}, not a mix of them or other values")


def _prompt_item(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    if _is_token(value):
        return "token"
    return "tokens" if isinstance(value, list) else "other"


class CompletionRequest(_Common):
    prompt: Annotated[str | list[str] | list[Int] | list[list[Int]], BeforeValidator(_prompt_shape)]
    max_tokens: Int | None = Field(None, ge=0)  # 0 with echo: score the prompt, write nothing (OpenAI's legacy API)
    logprobs: Int | None = Field(None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None
    best_of: Int | None = Field(None, ge=1)
    prediction: Prediction | None = None  # extension: Predicted Outputs on completions too


def _input_shape(value: Any) -> Any:
    """Name the shapes a Responses `input` takes: pydantic's own error for `5`, `null` or `["hi"]`
    was "Input should be a valid string", the first shape and not the fault."""
    if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    raise ValueError('must be a string or an array of input items (objects such as {"role": "user", "content": "..."})')


class ResponsesRequest(_Strict):
    """OpenAI's Responses API body (`POST /v1/responses`), the part this server serves;
    `responses_api.py` turns it into a chat request. Items stay loosely typed here and are
    checked there, so an error can name the exact item (`input[2].content[0].type`)."""

    model: str
    input: Annotated[str | list[dict[str, Any]], BeforeValidator(_input_shape)]
    instructions: str | None = None
    max_output_tokens: Int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)  # 0: the most probable token only
    stream: bool | None = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    metadata: Metadata | None = None  # returned as sent
    store: bool | None = None  # false: the response is not kept for previous_response_id
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None  # a prompt template stored at OpenAI: refused, as this server has none
    reasoning: Any = None  # accepted and ignored: the packs are not reasoning models
    include: list[str] | None = None  # "message.output_text.logprobs" is served; the rest accepted and ignored
    top_logprobs: Int | None = Field(None, ge=0, le=20)  # with that include: alternatives per token
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = Field(None, max_length=MAX_SAFETY_IDENTIFIER)
    prompt_cache_key: str | None = None  # accepted and ignored: the prefix cache matches by tokens
    # repeated in the answer; it bounds calls to OpenAI's built-in tools, which this server refuses
    max_tool_calls: Int | None = Field(None, ge=0)
    # extensions (extra_body), as on chat completions
    prediction: Prediction | None = None
    speculation: SpeculationRequest | str | None = None
    seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    top_k: Int | None = Field(None, ge=-1)


class InputTokensRequest(ResponsesRequest):
    """`POST /v1/responses/input_tokens`: the fields of a Responses request, whose input is counted.
    OpenAI's makes every field optional (a `previous_response_id` alone counts that conversation)."""

    model: str | None = None
    input: Annotated[str | list[dict[str, Any]], BeforeValidator(_input_shape)] = []


class TokenizeRequest(_Strict):
    """vLLM's `POST /tokenize`: a prompt, or chat messages through the model's template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = True
    return_token_strs: bool | None = False  # also each token's string (the vocabulary's spelling)
    tools: list[Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = False


class DetokenizeRequest(_Strict):
    """vLLM's `POST /detokenize`: token ids back to text."""

    model: str | None = None
    tokens: list[Int]
