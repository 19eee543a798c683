"""OpenAI response bodies and SSE chunks: one `Dialect` per endpoint (chat, completions).

A dialect knows its request model and how to prepare it (`protocol.py`), and builds the JSON
bodies, stream chunks, usage (with Predicted Outputs' accepted / rejected prediction tokens),
logprobs and tool-call deltas of its endpoint from the engine's `RequestOutput`s.
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from dataclasses import dataclass, field

from ..engine.stats import RequestOutput, TokenLogprob
from .logprobs import TokenNamer
from .protocol import Prepared, prepare_chat, prepare_completion
from .schemas import ChatCompletionRequest, CompletionRequest, _Common
from .structured import ToolSetup
from .tools import ToolStreamSplitter, parse_tool_calls


def usage(outputs: RequestOutput | list[RequestOutput], n: int = 1, scores_only: bool = False) -> dict:
    """OpenAI usage, with Predicted Outputs' accepted / rejected prediction tokens.

    n choices per prompt: each prompt counts once (as OpenAI bills it), completion tokens are
    summed. scores_only: the answers hold no completion (a scored prompt), so none are counted."""
    outputs = outputs if isinstance(outputs, list) else [outputs]
    firsts = outputs[::n]  # one choice of each prompt
    prompt = sum(o.stats.prompt_tokens for o in firsts)
    completion = 0 if scores_only else sum(o.stats.output_tokens for o in outputs)
    preds = [] if scores_only else [o.stats.by_source["prediction"] for o in outputs]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(o.stats.cached_tokens for o in firsts)},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": sum(p.accepted for p in preds),
            "rejected_prediction_tokens": sum(p.rejected for p in preds),
        },
    }


def speculation(outputs: RequestOutput | list[RequestOutput]) -> dict | list[dict]:
    """The speculation stats: one object, or one per choice when n > 1."""
    if isinstance(outputs, list):
        return outputs[0].stats.to_dict() if len(outputs) == 1 else [o.stats.to_dict() for o in outputs]
    return outputs.stats.to_dict()


def finish_reason(output: RequestOutput, tool_calls: bool = False, named: bool = False) -> str:
    """OpenAI's reason: "length" when cut, "tool_calls" when the answer is calls the model chose
    (tool_choice "auto" or "required"), "stop" otherwise, a call to the function tool_choice named
    included (that is OpenAI's own answer, streamed or not)."""
    if output.finish_reason == "length":
        return "length"
    return "tool_calls" if tool_calls and not named else "stop"


@dataclass
class ResponseContext:
    """What every chunk and body of one response shares."""

    id: str
    model: str
    namer: TokenNamer
    include_usage: bool = False
    logprobs: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    text_offset: dict = field(default_factory=dict)  # completions logprobs, per choice: (chars decoded, UTF-8 decoder)
    echo_texts: list[str] | None = None  # completions echo: each prompt, which its answers begin with
    echo_hidden: list[int] | None = None  # completions echo: each prompt's first tokens its text leaves out (a BOS)
    scores_only: bool = False  # completions max_tokens 0: the echoed prompt alone, its generated token left out
    tools: ToolSetup | None = None  # parse <tool_call> blocks out of the output
    n: int = 1
    splitters: dict = field(default_factory=dict)  # choice index -> ToolStreamSplitter
    fingerprint: str | None = None  # system_fingerprint: the server's configuration (server/fingerprint.py)
    end_ids: frozenset[int] = frozenset()  # the tokens that end an answer (none with ignore_eos): see listed

    def listed(self, lps: list[TokenLogprob] | None) -> list[TokenLogprob] | None:
        """The logprobs an answer shows: all but that of the end-of-text token that ended it. OpenAI
        lists none for that token (vLLM does): its text is not in the answer, so the entries would not
        spell the text. It is only ever the last one, and usage's completion_tokens still counts it."""
        if lps and lps[-1].token_id in self.end_ids:
            return lps[:-1]
        return lps

    def splitter(self, index: int) -> ToolStreamSplitter:
        return self.splitters.setdefault(index, ToolStreamSplitter(self.tools.names if self.tools else ()))


class Dialect:
    """Builds one endpoint's JSON bodies and SSE chunks. Subclasses: chat and completions."""

    name = ""
    request_model: type[_Common]
    id_prefix = ""
    # whether response(), finish_chunks() and error_event() may wait on another process (a store shared
    # by the Ray replicas): the app then builds a finished or failed answer off its event loop (store_calls.py)
    blocking = False

    def prepare(self, req, llm) -> Prepared:
        raise NotImplementedError

    async def preparer(self, req):
        """What prepares `req` on the prep thread, called as (req, llm): `prepare`, unless preparing
        reads from another process (then it reads it first, off the loop and the prep thread)."""
        return self.prepare

    def param(self, name: str | None) -> str | None:
        """What this endpoint's request calls a field that an error names (chat's names here)."""
        return name

    def message(self, text: str) -> str:
        """An error's message in this endpoint's field names (chat's here)."""
        return text

    def context(self, model: str, namer: TokenNamer, prepared: Prepared) -> ResponseContext:
        return ResponseContext(
            f"{self.id_prefix}{uuid.uuid4().hex}",
            model,
            namer,
            prepared.include_usage,
            prepared.params.logprobs is not None,
            tools=prepared.tools,
            n=prepared.n,
            echo_texts=prepared.echo_texts,
            echo_hidden=prepared.echo_hidden,
            scores_only=prepared.scores_only,
        )

    def opening_chunks(self, ctx: ResponseContext) -> list[dict]:
        return []

    def echo_chunks(self, ctx: ResponseContext, index: int, prompt_ids: list[int], prompt_lps) -> list[dict]:
        """What a stream sends for a choice before its first token (completions' echoed prompt)."""
        return []

    def delta_chunks(self, ctx: ResponseContext, text: str, lps, index: int = 0) -> list[dict]:
        """What one step's new text is streamed as (one chunk here; typed events for Responses)."""
        return [self.delta_chunk(ctx, text, lps, index)]

    def sse(self, chunk: dict) -> str:
        """One server-sent event."""
        return f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'))}\n\n"

    done_line = "data: [DONE]\n\n"  # what ends a stream

    def error_event(self, ctx: ResponseContext, e) -> dict:
        """An error after the headers went out: OpenAI's error body as an event."""
        return e.body()

    def _chunk(self, ctx: ResponseContext, choices: list[dict], **extra) -> dict:
        body = {
            "id": ctx.id,
            "object": self.chunk_object,
            "created": ctx.created,
            "model": ctx.model,
            "system_fingerprint": ctx.fingerprint,
            "choices": choices,
        }
        if ctx.include_usage:
            body["usage"] = None
        body.update(extra)
        return body

    def usage_chunk(self, ctx: ResponseContext, outputs) -> dict:
        return self._chunk(ctx, [], usage=usage(outputs, ctx.n), speculation=speculation(outputs))


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
        return {"content": [self.entry(ctx, lp) for lp in lps], "refusal": None}

    @staticmethod
    def entry(ctx: ResponseContext, lp: TokenLogprob) -> dict:
        """One token's logprob as chat (and the Responses API's output_text) describes it."""
        text, raw = ctx.namer(lp.token_id)
        top = []
        for tid, val in lp.top:
            t, b = ctx.namer(tid)
            top.append({"token": t, "logprob": val, "bytes": b})
        return {"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top}

    def opening_chunks(self, ctx):
        """The role chunk of each choice. With tools its content is null, as OpenAI opens a tool
        call's stream: an answer of calls only then has content null streamed too (the SDK's
        stream helper joined "" from here, where the answer without stream had null)."""
        delta = {"role": "assistant", "content": None if ctx.tools is not None else ""}
        return [
            self._chunk(ctx, [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
            for i in range(ctx.n)
        ]

    def delta_chunk(self, ctx, text: str, lps, index: int = 0) -> dict:
        if ctx.tools is not None:  # hold back what may be a <tool_call> block
            text = ctx.splitter(index).feed(text)
        delta = {"content": text} if text else {}
        return self._chunk(
            ctx, [{"index": index, "delta": delta, "logprobs": self._logprobs(ctx, lps), "finish_reason": None}]
        )

    def finish_chunks(self, ctx, output: RequestOutput, index: int = 0) -> list[dict]:
        """Held-back content, then one delta per tool call (id + name, then its arguments), then the finish."""
        chunks, calls = [], []
        if ctx.tools is not None:
            rest, calls = ctx.splitter(index).finish(cut=output.finish_reason == "length")
            calls = ctx.tools.kept(calls)
            if rest:
                chunks.append(self._delta(ctx, index, {"content": rest}))
            for j, c in enumerate(calls):
                head = {"index": j, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
                chunks.append(self._delta(ctx, index, {"tool_calls": [head]}))
                chunks.append(
                    self._delta(ctx, index, {"tool_calls": [{"index": j, "function": {"arguments": c.arguments}}]})
                )
        done = {"index": index, "delta": {}, "logprobs": None, "finish_reason": self._reason(ctx, output, calls)}
        chunks.append(self._chunk(ctx, [done], speculation=output.stats.to_dict()))
        return chunks

    @staticmethod
    def _reason(ctx, output: RequestOutput, calls: list) -> str:
        return finish_reason(output, bool(calls), named=ctx.tools is not None and ctx.tools.named)

    def _delta(self, ctx, index: int, delta: dict) -> dict:
        return self._chunk(ctx, [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def _choice(self, ctx, index: int, output: RequestOutput) -> dict:
        content, calls = output.text, []
        if ctx.tools is not None:  # no text is null content, as its stream has (opening_chunks)
            content, calls = parse_tool_calls(output.text, ctx.tools.names, cut=output.finish_reason == "length")
            content, calls = content or None, ctx.tools.kept(calls)
        message = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(ctx, ctx.listed(output.logprobs)),
            "finish_reason": self._reason(ctx, output, calls),
        }

    def response(self, ctx, outputs) -> dict:
        outputs = outputs if isinstance(outputs, list) else [outputs]
        return {
            "id": ctx.id,
            "object": "chat.completion",
            "created": ctx.created,
            "model": ctx.model,
            "system_fingerprint": ctx.fingerprint,
            "choices": [self._choice(ctx, i, o) for i, o in enumerate(outputs)],
            "usage": usage(outputs, ctx.n),
            "speculation": speculation(outputs),
        }


class CompletionDialect(Dialect):
    name = "completions"
    request_model = CompletionRequest
    id_prefix = "cmpl-"
    chunk_object = "text_completion"

    def prepare(self, req, llm) -> Prepared:
        return prepare_completion(req, llm)

    def _logprobs(
        self, ctx: ResponseContext, lps: list[TokenLogprob] | None, index: int = 0, prompt: tuple | None = None
    ) -> dict | None:
        """OpenAI's legacy shape: parallel lists plus char offsets into the text. With echo
        (`prompt`: the echoed prompt's token ids and their logprobs) the prompt's tokens come first,
        the first of them with no logprob (null), as OpenAI scores an echoed prompt."""
        if not ctx.logprobs or lps is None:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if prompt is not None:
            hidden = ctx.echo_hidden[index // ctx.n]
            for j, (tid, lp) in enumerate(zip(*prompt)):
                self._entry(ctx, out, index, tid, lp, written=j >= hidden)
        for lp in lps:
            self._entry(ctx, out, index, lp.token_id, lp)
        return out

    @staticmethod
    def _entry(
        ctx: ResponseContext, out: dict, index: int, token_id: int, lp: TokenLogprob | None, written: bool = True
    ) -> None:
        """One token's entry; written: its text is in the choice's text (not a BOS an echoed text leaves out)."""
        name, raw = ctx.namer.legacy(token_id), ctx.namer(token_id)[1]
        out["tokens"].append(name)
        out["token_logprobs"].append(lp.logprob if lp else None)
        # the k best, and the token itself when it is not among them (OpenAI: "up to logprobs+1 elements")
        out["top_logprobs"].append({ctx.namer.legacy(t): v for t, v in lp.top} | {name: lp.logprob} if lp else None)
        # where the token starts in the choice's text: a token that holds part of a character
        # (a byte piece) starts at that character, and the character counts once, not once per piece
        chars, decoder = ctx.text_offset.get(index) or (0, codecs.getincrementaldecoder("utf-8")("replace"))
        out["text_offset"].append(chars)
        if written:
            ctx.text_offset[index] = (chars + len(decoder.decode(bytes(raw))), decoder)

    def delta_chunk(self, ctx, text: str, lps, index: int = 0) -> dict:
        return self._chunk(
            ctx, [{"index": index, "text": text, "logprobs": self._logprobs(ctx, lps, index), "finish_reason": None}]
        )

    def delta_chunks(self, ctx, text: str, lps, index: int = 0) -> list[dict]:
        """A scored prompt (max_tokens 0) streams no completion: its one generated token is left out."""
        return [] if ctx.scores_only else [self.delta_chunk(ctx, text, lps, index)]

    def echo_chunks(self, ctx, index: int, prompt_ids: list[int], prompt_lps) -> list[dict]:
        """With echo, a choice's stream begins with its prompt's text (and, with logprobs, the
        prompt's tokens and scores), as the answer without stream begins with it."""
        if ctx.echo_texts is None:
            return []
        lps = self._logprobs(ctx, [], index, (prompt_ids, prompt_lps))
        text = ctx.echo_texts[index // ctx.n]
        return [self._chunk(ctx, [{"index": index, "text": text, "logprobs": lps, "finish_reason": None}])]

    def finish_chunks(self, ctx, output: RequestOutput, index: int = 0) -> list[dict]:
        reason = "length" if ctx.scores_only else finish_reason(output)
        return [
            self._chunk(
                ctx,
                [{"index": index, "text": "", "logprobs": None, "finish_reason": reason}],
                speculation=output.stats.to_dict(),
            )
        ]

    def usage_chunk(self, ctx: ResponseContext, outputs) -> dict:
        return self._chunk(ctx, [], usage=usage(outputs, ctx.n, ctx.scores_only), speculation=speculation(outputs))

    def response(self, ctx, outputs) -> dict:
        outputs = outputs if isinstance(outputs, list) else [outputs]
        echo, scored = ctx.echo_texts is not None, ctx.scores_only
        choices = [
            {
                "index": i,
                "text": (ctx.echo_texts[i // ctx.n] if echo else "") + ("" if scored else o.text),
                "logprobs": self._logprobs(
                    ctx,
                    [] if scored else ctx.listed(o.logprobs),
                    i,
                    (o.prompt_token_ids, o.prompt_token_logprobs) if echo else None,
                ),
                "finish_reason": "length" if scored else finish_reason(o),
            }
            for i, o in enumerate(outputs)
        ]
        return {
            "id": ctx.id,
            "object": "text_completion",
            "created": ctx.created,
            "model": ctx.model,
            "system_fingerprint": ctx.fingerprint,
            "choices": choices,
            "usage": usage(outputs, ctx.n, ctx.scores_only),
            "speculation": speculation(outputs),
        }


CHAT, COMPLETIONS = ChatDialect(), CompletionDialect()
