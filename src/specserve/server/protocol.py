"""OpenAI requests mapped onto the engine: a validated body becomes a `Prepared` job.

`prepare_chat` / `prepare_completion` turn a parsed request (`schemas.py`) into the prompt token
ids, `SamplingParams`, `SpeculationConfig`, prediction text and compiled grammar the worker runs,
refusing what we cannot serve with a 400 that names the parameter (`errors.py`). Everything here
is pure apart from tokenizer calls and grammar compilation, so it runs off the event loop.
Responses are built in `responses.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..config import SamplingParams, SpeculationConfig
from ..engine.constrain import CompiledGuide, ConstraintError, GrammarSpec, PendingGuide
from ..errors import ContextLengthError, InvalidRequestError
from .errors import APIError, bad_request, not_a_string, unsupported
from .schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    Content,
    Prediction,
    SpeculationRequest,
    _Common,
)
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
from .tools import check_message_tool_calls, check_tool_results

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_BATCH_CHOICES = 64  # completions: prompts x n per request (each choice is a full generation)


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
    request_fields: dict = field(default_factory=dict)  # fields the answer repeats (Responses) or keeps (chat metadata)
    history: list[dict] | None = None  # the conversation's messages, kept with the answer (Responses; chat store: true)
    input_items: list[dict] | None = None  # the Responses API: the input as GET .../input_items lists it
    echo_texts: list[str] | None = None  # completions `echo`: each prompt's text, which its answers begin with
    echo_hidden: list[int] | None = None  # ... and how many of its first tokens that text leaves out (a BOS added)
    batch: list[list[int]] | None = None  # completions with several prompts: each one's ids (prompt_ids: the first)
    scores_only: bool = False  # completions `max_tokens: 0` with echo: the prompt and its logprobs, no completion

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt of the request; each gets `n` choices, numbered prompt by prompt."""
        return self.batch or [self.prompt_ids]


def content_text(content: Content | None, param: str, assistant: bool = False) -> str:
    """A string, or the concatenated text of an array of text parts; other parts are refused. An
    assistant turn's `refusal` parts (OpenAI allows them there) are their refusal's text."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if assistant and part.type == "refusal":
            texts.append(refusal_text(part.model_extra or {}, f"{param}[{j}]"))
            continue
        if part.type != "text":
            raise unsupported(f"{param}[{j}]", f"content part type {part.type!r}", "send only 'text' parts")
        if part.text is None:  # was "content part type 'text' (only 'text' parts) is not supported"
            raise not_a_string(None, f"{param}[{j}].text")
        texts.append(part.text)
    return "".join(texts)


def refusal_text(part: dict, param: str) -> str:
    """The text of a `{"type": "refusal", "refusal": ...}` content part."""
    if not isinstance(part.get("refusal"), str):
        raise not_a_string(part.get("refusal"), f"{param}.refusal")
    return part["refusal"]


def _refuse_chat(req: ChatCompletionRequest) -> None:
    """Refuse the chat features we do not implement, naming the parameter."""
    if req.functions or req.function_call not in (None, "none"):
        # "function calling is not supported" read as if tool calls were not served either
        param = "functions" if req.functions else "function_call"
        instead = "send tools and tool_choice, which replace functions and function_call"
        raise unsupported(param, "legacy function calling", instead)
    if req.audio is not None or "audio" in (req.modalities or ()):
        raise unsupported("audio" if req.audio is not None else "modalities", "audio output")
    if req.web_search_options is not None:  # served without a search, the model made its results up
        raise unsupported("web_search_options", "web search")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")


def check_stream_options(req: _Common) -> bool:
    """Whether the stream ends with a usage chunk. `stream_options` without `stream` is a 400, as
    OpenAI ("The 'stream_options' parameter is only allowed when 'stream' is enabled.") and vLLM
    answer it; it used to be accepted and ignored."""
    if req.stream_options is not None and not req.stream:
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    return bool(req.stream_options and req.stream_options.include_usage)


def speculation_config(
    req: SpeculationRequest | str | None,
    default: SpeculationConfig,
    has_draft: bool,
) -> SpeculationConfig:
    """The server's default speculation, overridden field by field by the request's object (a
    string is shorthand for `{"method": <string>}`, as `LLM(speculation="ngram")` takes it)."""
    if isinstance(req, str):
        try:
            spec = SpeculationConfig(method=req, num_speculative_tokens=default.num_speculative_tokens)
        except ValueError as e:
            raise bad_request(str(e), "speculation") from None
    elif req is None:
        spec = default
    else:
        k = req.num_speculative_tokens if req.num_speculative_tokens is not None else default.num_speculative_tokens
        try:
            spec = SpeculationConfig(method=req.method or default.method, num_speculative_tokens=k)
        except ValueError as e:
            raise bad_request(str(e), "speculation.method") from None
    if spec.method == "draft" and not has_draft:
        raise bad_request(
            "speculation method 'draft' needs a draft model; start the server with --draft-model",
            "speculation" if isinstance(req, str) else "speculation.method",
        )
    return spec


# vLLM's sampling fields we do not implement: each one's values that change nothing (vLLM's
# defaults, which clients send), and what to use instead
UNSERVED_SAMPLING = {
    "repetition_penalty": ((None, 1.0), "presence_penalty or frequency_penalty"),
    "min_p": ((None, 0.0), "top_p or top_k"),
    "min_tokens": ((None, 0), None),
    "stop_token_ids": ((None, []), "stop strings"),
    "bad_words": ((None, []), "logit_bias with -100"),
    "allowed_token_ids": ((None,), "logit_bias or structured_outputs"),
}


def refuse_unserved_sampling(req: _Common) -> None:
    """A vLLM sampling field that would change the output is a 400 naming it: ignored, as unknown
    fields are, the answer was sampled from another distribution than the one asked for."""
    for name, (defaults, instead) in UNSERVED_SAMPLING.items():
        value = getattr(req, name)
        if value not in defaults:
            raise unsupported(name, f"vLLM's sampling field {name}={value!r}", instead and f"use {instead}")


def sampling_params(req: _Common, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """OpenAI defaults: temperature 1, top_p 1, no penalties."""
    refuse_unserved_sampling(req)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise bad_request("stop strings must be non-empty", "stop")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(0, req.top_k or 0),
            seed=req.seed,
            stop=tuple(stop),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logprobs=logprobs,
            ignore_eos=bool(req.ignore_eos),
            logit_bias=_logit_bias(req.logit_bias),
        )
    except ValueError as e:
        raise bad_request(str(e)) from None


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias maps token ids written as JSON strings ("50256") to a bias; the
    range of ids is checked against the model when the request is made."""
    out = {}
    for key, value in (bias or {}).items():
        if not key.strip().isdigit():
            raise bad_request(f"logit_bias keys must be token ids (non-negative integers), got {key!r}", "logit_bias")
        out[int(key)] = value
    return out


def _max_tokens(
    requested: int | None,
    default: int | None,
    prompt_len: int,
    max_context: int,
    prompt_param: str,
    max_param: str = "max_tokens",
) -> int:
    """Check prompt + max_tokens against the context; fill the default (capped to what fits).
    max_param: the field the request set its maximum with, which the error names."""
    room = max_context - prompt_len
    if room <= 0:
        raise _prompt_too_long(prompt_len, max_context, prompt_param)
    if requested is None:
        return room if default is None else min(default, room)
    if prompt_len + requested > max_context:
        raise bad_request(
            f"This model's maximum context length is {max_context} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the {prompt_param}, {requested} for "
            f"the completion). Please reduce the length of the {prompt_param} or {max_param}.",
            max_param,
            "context_length_exceeded",
        )
    return requested


def _scored_max_tokens(prompt_len: int, max_context: int) -> int:
    """The max_tokens a scored prompt (`max_tokens: 0`) runs with: 1, the token the engine writes
    and the answer leaves out. That token is never cached, so the prompt may fill the whole
    context (it was refused as prompt + 1 token over it, where evaluation harnesses score
    windows of exactly the context length)."""
    if prompt_len > max_context:
        raise _prompt_too_long(prompt_len, max_context, "prompt")
    return 1


def _prompt_too_long(prompt_len: int, max_context: int, prompt_param: str) -> APIError:
    """The 400 for a prompt that leaves the answer no room, in OpenAI's words."""
    return bad_request(
        f"This model's maximum context length is {max_context} tokens, but the "
        f"{prompt_param} {'have' if prompt_param == 'messages' else 'has'} {prompt_len} tokens. Please shorten it.",
        prompt_param,
        "context_length_exceeded",
    )


def _prediction_text(pred: Prediction | None, llm) -> str | None:
    """The prediction's text; refused when it alone is longer than the context."""
    if pred is None:
        return None
    text = content_text(pred.content, "prediction.content")
    if text and len(llm.encode(text)) > llm.max_context:
        raise bad_request(
            f"the prediction is longer than the model's context length ({llm.max_context} tokens)",
            "prediction.content",
            "context_length_exceeded",
        )
    return text or None


def _chat_message(m: ChatMessage, i: int) -> dict:
    """One OpenAI message as the chat template wants it, tool calls and tool results included."""
    if m.role == "function":
        raise unsupported(f"messages[{i}].role", "a legacy 'function' message", "send role 'tool' with a tool_call_id")
    out = {
        "role": "system" if m.role == "developer" else m.role,
        "content": content_text(m.content, f"messages[{i}].content", assistant=m.role == "assistant"),
    }
    refusal = (m.model_extra or {}).get("refusal")
    if m.role == "assistant" and m.content is None and refusal is not None:  # a refusal, replayed as it came
        out["content"] = refusal_text(m.model_extra, f"messages[{i}]")
    if m.tool_calls:
        out["tool_calls"] = check_message_tool_calls(m.tool_calls, f"messages[{i}].tool_calls")
    if m.role == "tool":
        out["tool_call_id"] = (m.model_extra or {}).get("tool_call_id")
    return out


def _extension_fields(req: _Common) -> dict:
    return {k: getattr(req, k) for k in ("structured_outputs", *GUIDED_FIELDS)}


def _output_guide(req: _Common) -> GrammarSpec | None:
    """The answer's constraint: OpenAI's response_format or vLLM's fields, never both (one would
    be dropped without a word)."""
    fmt = response_format_guide(req.response_format)
    extension = extension_guide(_extension_fields(req))
    if fmt is not None and extension is not None:
        raise ConstraintError(
            f"only one structured output constraint at a time (got response_format and {extension.param})",
            extension.param,
        )
    return fmt or extension


def _compile(spec, llm, req: _Common, compile_guide: bool = True) -> PendingGuide | None:
    """Start compiling the request's grammar (on the grammar threads); the server awaits it before
    queueing the request, so a bad or too slow one is a 400 and never holds up the prep thread.
    A stop string with a grammar is a 400: it would cut the answer before the grammar completes,
    and the cut answer (invalid JSON, a tool call without its arguments) came back as "stop".
    compile_guide=False: checked only (a token count has no answer to constrain)."""
    if spec is not None and req.stop:
        raise bad_request(
            f"stop strings do not go with {spec.param}: they would cut the constrained answer before it is "
            "complete (the grammar ends the answer by itself)",
            "stop",
        )
    check_guided(spec, req.ignore_eos)
    spec = json_whitespace(spec, req.strict_whitespace)
    return None if spec is None or not compile_guide else llm.compile_guide(spec, wait=False)


def prepare_chat(req: ChatCompletionRequest, llm, compile_guide: bool = True) -> Prepared:
    """Validate a chat request against the model and turn it into a job (compile_guide=False: its
    grammar is checked but not compiled, for a count of its prompt that runs no job)."""
    _refuse_chat(req)
    if not req.messages:
        raise bad_request("messages must contain at least one message", "messages", "empty_array")
    tools = tool_setup(req.tools, req.tool_choice, req.parallel_tool_calls)
    spec, output = tool_guide(tools), _output_guide(req)
    if spec is not None and output is not None:  # a forced call is the answer's constraint already
        raise ConstraintError(
            f"only one constraint at a time: tool_choice forces a tool call, so {output.param} cannot apply",
            output.param,
        )
    spec = spec or output
    prompt_ids = chat_prompt_ids(req.messages, tools, continues_final_message(req), llm)
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    requested = getattr(req, max_param)
    max_tokens = _max_tokens(requested, None, len(prompt_ids), llm.max_context, "messages", max_param)
    top_n = (req.top_logprobs or 0) if req.logprobs else None
    return Prepared(
        prompt_ids,
        sampling_params(req, max_tokens, top_n),
        speculation_config(req.speculation, llm.speculation, llm.has_draft_model),
        _prediction_text(req.prediction, llm),
        bool(req.stream),
        check_stream_options(req),
        _compile(spec, llm, req, compile_guide),
        tools if tools.parse_calls else None,
        check_n(req.n),
    )


def chat_prompt_ids(messages: list[ChatMessage], tools: ToolSetup, go_on: bool, llm) -> list[int]:
    """The model's chat template over these messages (a 400 when the template refuses them).
    go_on: the last, assistant, message is continued rather than answered."""
    converted = [_chat_message(m, i) for i, m in enumerate(messages)]
    check_tool_results(converted)
    try:
        return llm.apply_chat_template(converted, tools.tools, go_on)
    except (InvalidRequestError, ContextLengthError):
        raise
    except Exception as e:  # noqa: BLE001  a chat template that refuses these messages (jinja2 raise_exception)
        raise bad_request(f"messages: the model's chat template rejected them: {e}", "messages") from None


def continues_final_message(req: ChatCompletionRequest) -> bool:
    """Whether the model goes on writing the last message (vLLM's `continue_final_message`; the
    template step refuses it after a message that is not the assistant's); `add_generation_prompt`
    is accepted only where it agrees (no new turn when continuing). A last assistant message with
    `"prefix": true` asks the same (DeepSeek's and Mistral's prefix completion, which aider sends)."""
    go_on = bool(req.continue_final_message) or prefix_message(req.messages)
    if req.add_generation_prompt is not None and req.add_generation_prompt == go_on:
        raise unsupported(
            "add_generation_prompt",
            f"add_generation_prompt={str(req.add_generation_prompt).lower()} with "
            f"continue_final_message={str(go_on).lower()}",
            "exactly one of the two opens the answer",
        )
    return go_on


def prefix_message(messages: list[ChatMessage]) -> bool:
    """Whether the last message carries `"prefix": true`: an assistant answer begun, which the
    model continues. The flag elsewhere (an earlier message, a user's) or not a boolean is a 400
    naming it; dropped as an unknown field, the begun answer was closed and a new one written."""
    last = len(messages) - 1
    for i, m in enumerate(messages):
        flag = (m.model_extra or {}).get("prefix")
        if flag is None or flag is False:
            continue
        param = f"messages[{i}].prefix"
        if flag is not True:
            raise bad_request(f"{param} must be a boolean", param, "invalid_type")
        if i != last or m.role != "assistant":
            raise bad_request(f"{param}: only the last message, an assistant one, can be continued", param)
    return last >= 0 and (messages[last].model_extra or {}).get("prefix") is True


def _prompts(prompt) -> list:
    """The request's prompts: one string or list of token ids, or a batch of several of those."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return prompt
    return [prompt]


def _completion_prompt_ids(prompt, llm, param: str = "prompt") -> list[int]:
    """The token ids of one prompt (a string or token ids); param: where it is in the request."""
    try:
        return llm.prompt_ids(prompt)
    except InvalidRequestError as e:
        code = "empty_prompt" if "empty" in str(e) else "invalid_value"
        raise bad_request(f"{param}: {e}" if param != "prompt" else str(e), param, code) from None


def _infill_prompt_ids(prompt, suffix: str, llm) -> list[int]:
    """A fill-in-the-middle prompt: the text prompt is the code before the gap (it may be
    empty: the gap is at the top of the file), `suffix` the code after it (fim.py)."""
    if not isinstance(prompt, str):
        raise bad_request("suffix needs a text prompt (the code before the gap), not token ids", "prompt")
    try:
        return llm.fim_prompt_ids(prompt, suffix)
    except InvalidRequestError as e:
        raise bad_request(str(e), "suffix") from None


def _echo(prompt, ids: list[int], llm) -> tuple[str, int]:
    """The text an echoed prompt is answered with: a text prompt as it was sent, token ids as
    their text; and how many of its first tokens that text leaves out (the ones the tokenizer
    puts in front of a text, as Gemma's BOS), whose text_offset stays at 0. `ids` are the prompt's
    tokens, tokenized once (encoding the text again without its special tokens, to count them,
    doubled the tokenizer's work on every echoed text prompt)."""
    if not isinstance(prompt, str):
        return llm.tokenizer.decode(ids), 0
    prefix = llm.added_prefix
    return prompt, len(prefix) if ids[: len(prefix)] == prefix else 0


def prepare_completion(req: CompletionRequest, llm) -> Prepared:
    """Validate a completions request against the model and turn it into a job. With a
    `suffix` the prompt and the suffix are the two sides of a gap the model fills. With `echo`
    the answer begins with the prompt, and `logprobs` then cover the prompt's tokens too (the
    first has none), as language-model evaluations ask for them."""
    if req.echo and req.suffix:
        raise unsupported("echo", "echo with suffix")
    if req.best_of is not None and req.best_of < (req.n or 1):  # OpenAI and vLLM refuse it (it was accepted)
        raise bad_request(f"best_of must be at least n, got n={req.n} and best_of={req.best_of}", "best_of")
    if req.best_of not in (None, 1):
        raise unsupported(
            "best_of",
            f"best_of={req.best_of}, the server's ranking of extra samples,",
            "ask for n choices and rank them yourself",
        )
    prompts, n = _prompts(req.prompt), check_n(req.n)
    if len(prompts) * n > MAX_BATCH_CHOICES:
        raise bad_request(
            f"{len(prompts)} prompts x n={n} is {len(prompts) * n} choices, more than this server's limit of "
            f"{MAX_BATCH_CHOICES} per request; send the prompts in smaller batches",
            "prompt",
        )
    ids = [
        _infill_prompt_ids(p, req.suffix, llm)
        if req.suffix
        else _completion_prompt_ids(p, llm, f"prompt[{i}]" if len(prompts) > 1 else "prompt")
        for i, p in enumerate(prompts)
    ]
    longest = max(len(i) for i in ids)
    scores_only = req.max_tokens == 0  # the engine writes one token, which the answer leaves out
    if scores_only and not req.echo:
        raise bad_request("max_tokens 0 writes nothing: it scores a prompt, with echo and logprobs", "max_tokens")
    if scores_only:
        max_tokens = _scored_max_tokens(longest, llm.max_context)
    else:
        max_tokens = _max_tokens(req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, longest, llm.max_context, "prompt")
    params = sampling_params(req, max_tokens, req.logprobs)
    if req.echo and req.logprobs is not None:
        params = replace(params, prompt_logprobs=req.logprobs)
    echo = [_echo(p, i, llm) for p, i in zip(prompts, ids)] if req.echo else None
    return Prepared(
        ids[0],
        params,
        speculation_config(req.speculation, llm.speculation, llm.has_draft_model),
        _prediction_text(req.prediction, llm),
        bool(req.stream),
        check_stream_options(req),
        _compile(_output_guide(req), llm, req),
        None,
        n,
        echo_texts=[text for text, _ in echo] if echo else None,
        echo_hidden=[hidden for _, hidden in echo] if echo else None,
        batch=ids if len(ids) > 1 else None,
        scores_only=scores_only,
    )
