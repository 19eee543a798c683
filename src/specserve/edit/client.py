"""Edit a file with an LLM through any OpenAI-compatible server, with Predicted Outputs.

The original file is sent as the `prediction`: an unchanged line costs the server almost
nothing to write, so a small edit of a long file comes back several times faster. Greedy
(temperature 0) so the same request gives the same edit. The official `openai` SDK does the
talking, so this works against specserve, OpenAI, or anything else that speaks the protocol.
A prompt that begins the answer for the model (`EditPrompt.opening`) sends it as a last assistant
turn with vLLM's `continue_final_message`; a server that refuses that field is asked again
without it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlparse

from ..errors import SpecServeError
from .prompts import DEFAULT_PROMPT, EditAsk, EditPrompt, ask_for

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
_FENCE = re.compile(r"\A\s*(?P<fence>```|~~~)[^\n`]*\n(?P<body>.*?)\n?[ \t]*(?P=fence)[ \t]*\s*\Z", re.S)


class EditError(SpecServeError):
    """The edit could not be completed (server unreachable, truncated answer, ...)."""


@dataclass
class EditResult:
    """The server's answer to one edit request, with its speculation figures."""

    code: str  # the updated file (fence stripped, trailing newline matched to the original)
    raw: str  # the answer as streamed
    finish_reason: str | None
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    elapsed: float = 0.0  # request sent -> last chunk, seconds
    time_to_first_token: float | None = None
    speculation: dict | None = None  # specserve's non-standard stats object, when the server sends it
    extra: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True only when the model finished on its own: anything else may be a truncated file."""
        return self.finish_reason == "stop"

    @property
    def tokens_per_second(self) -> float:
        """The decode rate: specserve's own (`speculation.tokens_per_second`, output tokens over the
        time after the prefill, each token timed with the step that wrote it) when the server sends
        it, else the tokens after the first chunk over the time after it, the first chunk taken as
        one token (as a server that streams a token a chunk sends it). It was every completion
        token over the time after the first chunk: the first chunk's tokens counted without their
        time, and a specserve chunk is a step (a prediction's first commits up to 9 tokens)."""
        measured = self.speculation.get("tokens_per_second") if isinstance(self.speculation, dict) else None
        if isinstance(measured, (int, float)):
            return measured
        ttft = self.time_to_first_token or 0.0
        t = self.elapsed - ttft
        return (self.completion_tokens - 1) / t if t > 0 and self.completion_tokens > 1 else 0.0


def strip_fence(text: str, original: str = "") -> str:
    """The answer as the file's text: a ``` (or ~~~) fence around it removed, CRLF line ends and
    a byte-order mark taken out (the model saw neither: files.py puts the file's own back), and
    the original's trailing newlines (none, one, or a blank last line) kept.

    A file that itself opens with a fence (Markdown beginning with a code block) and an answer
    that opens with the same line is the file, not a wrapped answer: nothing is stripped.

    A '\r\n' is the file's own when the original (as the model saw it) has one: a line that ends in
    a stray CR before its line end (CR CR LF in a CRLF file) keeps that CR."""
    text = (text if "\r\n" in original else text.replace("\r\n", "\n")).removeprefix("\ufeff")
    m = _FENCE.match(text)
    first = next((ln.strip() for ln in original.splitlines() if ln.strip()), "")
    opens_like_file = first.startswith(("```", "~~~")) and text.lstrip().split("\n", 1)[0].strip() == first
    code = m.group("body") if m and not opens_like_file else text
    if code.strip():
        ending = original[len(original.rstrip("\n")) :] if original.strip() else code[len(code.rstrip("\n")) :] or "\n"
        code = code.rstrip("\n") + ending
    return code


NO_KEY = "sk-no-key-needed"  # what a client sends when no key is configured (the SDK requires one)


def make_client(base_url: str | None = None, api_key: str | None = None):
    """An `openai.OpenAI` client; local servers get a dummy key when none is configured."""
    import openai

    base_url = server_url(base_url)
    api_key = api_key or os.environ.get("OPENAI_API_KEY") or NO_KEY
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=3600.0)


def server_url(base_url: str | None) -> str:
    """The server's URL: `base_url`, else $OPENAI_BASE_URL, else the local default. One that is not
    http(s) is an EditError naming where it came from: `--base-url localhost:8000/v1` was a bare
    "Connection error." once the client had tried it."""
    source, url = ("--base-url", base_url) if base_url else ("$OPENAI_BASE_URL", os.environ.get("OPENAI_BASE_URL"))
    url = url or DEFAULT_BASE_URL
    if urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
        raise EditError(f"{source} {url} is not an http:// or https:// URL (such as {DEFAULT_BASE_URL})")
    return url


def default_model(client) -> str:
    """The first model the server lists, else the default target pack's name."""
    try:
        models = client.models.list().data
    except Exception:  # noqa: BLE001 - listing is a convenience; the edit request reports real errors
        return DEFAULT_MODEL
    return models[0].id if models else DEFAULT_MODEL


def refactor_with_predicted_outputs(
    original_code: str,
    instruction: str,
    client=None,
    model: str | None = None,
    language: str = "",
    max_tokens: int | None = None,
    on_delta: Callable[[str], None] | None = None,
    prompt: str | EditPrompt = DEFAULT_PROMPT,
    messages: list[dict] | None = None,
    prediction: str | None = None,
) -> EditResult:
    """Ask the model to apply `instruction` to `original_code`, with the code as the prediction.

    Streams the answer (on_delta gets each text delta) and returns when the stream ends.
    The caller decides what to do with an incomplete answer: check `result.complete`.
    `prompt`: which of PROMPTS lays out the request; `messages` and `prediction`, when given,
    replace the prompt's messages and the file as the prediction (the feedback request).
    """
    import openai

    client = client or make_client()
    model = model or default_model(client)
    ask = EditAsk(messages, "", original_code if prediction is None else prediction)
    if messages is None:
        ask = ask_for(original_code, instruction, language, prompt)
    try:
        try:
            result = _stream(client, model, ask, max_tokens, on_delta)
        except openai.BadRequestError as e:
            if not (ask.opening and _refuses_opening(e)):
                raise
            # A server without vLLM's continue_final_message (OpenAI's own): the model begins the answer.
            ask = EditAsk(ask.messages[:-1], "", original_code)
            result = _stream(client, model, ask, max_tokens, on_delta)
    except openai.APIConnectionError as e:
        raise EditError(
            f"cannot reach the server at {client.base_url}: {e} Start one (specserve serve), "
            "or point --base-url (or $OPENAI_BASE_URL) at yours"
        ) from e
    except openai.APIStatusError as e:
        raise EditError(_refusal(e, str(client.base_url), client.api_key == NO_KEY)) from e
    except openai.APIError as e:  # an error event in the stream: the server failed while answering
        raise EditError(f"the server stopped answering: {e.message}; nothing written") from e
    result.code = strip_fence(result.raw, original_code)
    return result


def _stream(client, model: str, ask: EditAsk, max_tokens: int | None, on_delta) -> EditResult:
    """Send one edit request and read its stream; the answer is the opening and what follows it."""
    kwargs: dict = {"max_tokens": max_tokens} if max_tokens else {}
    if ask.opening:
        kwargs["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=ask.messages,
        temperature=0,
        prediction={"type": "content", "content": ask.prediction},
        stream=True,
        stream_options={"include_usage": True},
        **kwargs,
    )
    if ask.opening and on_delta:
        on_delta(ask.opening)
    result = _collect(stream, model, t0, on_delta)
    result.raw = ask.opening + result.raw
    return result


def _refuses_opening(e) -> bool:
    """Whether a 400 is about the parameters that continue the opened answer."""
    message = _api_message(e)
    return "continue_final_message" in message or "add_generation_prompt" in message


def _collect(stream, model: str, t0: float, on_delta) -> EditResult:
    """Read a chat-completion stream into an EditResult."""
    parts: list[str] = []
    result = EditResult(code="", raw="", finish_reason=None, model=model)
    for chunk in stream:
        for choice in chunk.choices:
            text = choice.delta.content or ""
            if text:
                if result.time_to_first_token is None:
                    result.time_to_first_token = time.perf_counter() - t0
                parts.append(text)
                if on_delta:
                    on_delta(text)
            if choice.finish_reason:
                result.finish_reason = choice.finish_reason
        if chunk.usage is not None:
            _read_usage(result, chunk.usage)
        spec = (chunk.model_extra or {}).get("speculation")
        if spec:
            result.speculation = spec
        result.model = chunk.model or result.model
    result.elapsed = time.perf_counter() - t0
    result.raw = "".join(parts)
    return result


def _read_usage(result: EditResult, usage) -> None:
    result.prompt_tokens = usage.prompt_tokens or 0
    result.completion_tokens = usage.completion_tokens or 0
    details = usage.completion_tokens_details
    if details is not None:
        result.accepted_prediction_tokens = details.accepted_prediction_tokens or 0
        result.rejected_prediction_tokens = details.rejected_prediction_tokens or 0


def _refusal(e, base_url: str, no_key: bool = False) -> str:
    """The one line for a request the server answered with an error status. A 404 that is not
    about the model, from a base URL that does not end in /v1, says so: `--base-url
    http://127.0.0.1:8000` (the server's address, as `specserve serve` prints it) got only
    "Invalid URL (POST /chat/completions)", since OpenAI's clients add no /v1 themselves. A 401
    when no key was given says where to give one: the placeholder key sent instead was answered
    "incorrect API key provided", which reads as if the user had given a wrong one."""
    message = f"the server refused the request ({e.status_code}): {_api_message(e)}"
    if e.status_code == 401 and no_key:
        return message + "; no key was given: pass the server's key with --api-key (or $OPENAI_API_KEY)"
    base = base_url.rstrip("/")
    if e.status_code == 404 and not base.endswith("/v1") and getattr(e, "code", None) != "model_not_found":
        message += f"; an OpenAI-compatible base URL ends in /v1: try --base-url {base}/v1"
    return message


def _api_message(e) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    err = body.get("error", body) if isinstance(body, dict) else {}
    return (err.get("message") if isinstance(err, dict) else None) or str(e)
