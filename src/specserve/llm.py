"""The user-facing Python API, shaped like vLLM's.

from specserve import LLM, SamplingParams
llm = LLM()                                   # default Qwen2.5-Coder 1.5B + 0.5B draft packs
out = llm.generate("def fib(n):", SamplingParams(max_tokens=64))
out = llm.chat([{"role": "user", "content": "..."}], params, prediction=old_code)
print(out.text, out.stats.acceptance_rate, out.stats.by_source["prediction"].accepted)
print(out[0].outputs[0].text)                 # vLLM's shapes read too (engine/completion.py)
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable, Sequence

from .chat import template_messages, template_supports_tools
from .config import EngineLimits, LoadOptions, SamplingParams, SpeculationConfig, is_integer, loads_draft_model
from .engine import Engine, Generation
from .engine.constrain import CompiledGuide, GrammarSpec, PendingGuide, factory_for
from .engine.core import check_token_ids
from .engine.stats import RequestOutput
from .engine.tokenizer import per_thread
from .errors import InvalidRequestError, ModelLoadError
from .fim import fim_prompt_ids
from .literal import encode_marked, mark_specials, special_texts
from .models.loader import eos_ids, load


class ContextCutWarning(UserWarning):
    """A request's max_tokens is more than the context leaves after its prompt: the answer is cut."""


def _warn_if_cut(req) -> None:
    """Say so when a request the engine took cannot write all its max_tokens: the answer stops at
    the context's end (as vLLM's LLM cuts it, with finish_reason "length"), which without a word
    looked like the model stopping early. The server refuses such a request instead (a 400), as
    OpenAI does; the CLI refuses an explicit --max-tokens. (A prompt longer than the context, or a
    request a smaller KV cache cannot hold, is refused before this.) A prompt may fill the context
    and still get one token."""
    prompt_len, context, asked = len(req.prompt_ids), req.max_context, req.params.max_tokens
    room = max(1, context - prompt_len)
    if asked > room:
        warnings.warn(
            f"max_tokens={asked} does not fit: the context holds {context} tokens and the prompt "
            f"has {prompt_len}, so the answer stops after at most {room} (finish_reason 'length')",
            ContextCutWarning,
            stacklevel=4,
        )


def _unicode_text(text: str, what: str, param: str | None = None) -> str:
    """`text` as given; an InvalidRequestError for a lone surrogate in it (U+D800..U+DFFF, what
    Python makes of a "\\ud800" escape or of bytes that are not UTF-8), which has no UTF-8 form:
    the tokenizer raised a TypeError about its input types ("TextEncodeInput must be ...")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"{what} is not valid Unicode text: a lone surrogate U+{ord(text[e.start]):04X} at character {e.start}",
            param or what,
        ) from None
    return text


def _check_messages(messages) -> None:
    """Chat messages as the template reads them: a list of dicts, each with a string `role` and
    text `content` (a string or text parts; an assistant's may be None, beside its tool calls). A
    KeyError or a jinja error from deep in the template told a Python user nothing."""
    if not isinstance(messages, (list, tuple)):
        raise InvalidRequestError(f"messages must be a list of dicts, got {type(messages).__name__}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] must be a dict with a string 'role'", "messages")
        content = m.get("content")
        if not (isinstance(content, (str, list)) or (content is None and m["role"] == "assistant")):
            raise InvalidRequestError(f"messages[{i}] needs 'content': a string or a list of text parts", "messages")
        for j, call in enumerate(m.get("tool_calls") or ()):
            _check_function(call, f"messages[{i}].tool_calls[{j}]", "{'function': {'name': ..., 'arguments': ...}}")
        if isinstance(content, list) and not all(
            isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            for part in content
        ):
            raise InvalidRequestError(
                f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}})", "messages"
            )
        for j, text in enumerate([content] if isinstance(content, str) else [p["text"] for p in content or ()]):
            _unicode_text(
                text, f"messages[{i}].content" + (f"[{j}].text" if isinstance(content, list) else ""), "messages"
            )


def _check_function(item, where: str, shape: str) -> None:
    """A tool definition or an earlier tool call: a dict whose 'function' is a dict with a string
    'name' (a KeyError or "string indices must be integers" from chat.py told a user nothing)."""
    fn = item.get("function") if isinstance(item, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequestError(f"{where} must be {shape}", where.split("[")[0])


def _check_tools(tools) -> None:
    """OpenAI tool definitions, as vLLM's chat(tools=...) takes them."""
    if tools is None:
        return
    if not isinstance(tools, (list, tuple)):
        raise InvalidRequestError(f"tools must be a list of tool definitions, got {type(tools).__name__}", "tools")
    for i, tool in enumerate(tools):
        _check_function(tool, f"tools[{i}]", "{'type': 'function', 'function': {'name': ..., 'parameters': ...}}")


def _text_content(messages: list[dict]) -> list[dict]:
    """Each message's text parts joined into one string, as the server does (content_text): a chat
    template, and the transcript of a model without one, printed the list as Python's repr."""
    return [
        {**m, "content": "".join(part["text"] for part in m["content"])} if isinstance(m.get("content"), list) else m
        for m in messages
    ]


def _is_batch(prompts) -> bool:
    """A list of prompts (texts or token-id sequences), as opposed to one prompt's token ids
    (whose items are numbers: numpy's too)."""
    return (
        isinstance(prompts, (list, tuple))
        and bool(prompts)
        and (isinstance(prompts[0], (str, dict)) or hasattr(prompts[0], "__len__"))
    )


def _unpack_prompt(prompt) -> str | Sequence[int]:
    """vLLM's dict prompts ({"prompt": text} or {"prompt_token_ids": ids}) as text or ids; text and
    ids pass through. Anything else is refused by name: None, a number or a dict's keys were
    read as token ids ("'NoneType' object is not iterable", "token ids must be integers")."""
    if isinstance(prompt, dict):
        keys = set(prompt) & {"prompt", "prompt_token_ids"}
        if len(keys) != 1 or set(prompt) - keys:
            raise InvalidRequestError(
                f"a dict prompt holds 'prompt' (text) or 'prompt_token_ids', got keys {sorted(prompt)}", "prompt"
            )
        prompt = prompt[keys.pop()]
    if isinstance(prompt, str) or (hasattr(prompt, "__iter__") and not isinstance(prompt, (dict, bytes))):
        return prompt
    raise InvalidRequestError(
        f"a prompt is text, a list of token ids, or a dict with 'prompt' or 'prompt_token_ids', "
        f"got {type(prompt).__name__}",
        "prompt",
    )


def _is_conversations(messages) -> bool:
    """A batch of conversations (vLLM's chat takes a list of message lists), not one conversation."""
    return isinstance(messages, (list, tuple)) and bool(messages) and isinstance(messages[0], (list, tuple))


def _continues(continue_final_message: bool, add_generation_prompt: bool | None) -> bool:
    """Whether the answer goes on writing the last message. vLLM's add_generation_prompt is taken
    where it agrees (it was a TypeError); a pairing that opens no answer, or two, is refused."""
    go_on = bool(continue_final_message)
    if add_generation_prompt is not None and bool(add_generation_prompt) == go_on:
        raise InvalidRequestError(
            f"add_generation_prompt={add_generation_prompt} with continue_final_message={go_on} "
            "(exactly one of the two opens the answer)",
            "add_generation_prompt",
        )
    return go_on


def _vllm_speculation(config: dict | None, draft_model: str | None, speculation) -> tuple:
    """(draft_model, speculation) with vLLM's `speculative_config` read into them (it was a
    TypeError); given beside our own draft_model or speculation, it is refused as ambiguous."""
    if config is None:
        return draft_model, speculation
    if draft_model is not None or speculation != "auto":
        raise InvalidRequestError(
            "give speculative_config (vLLM's) or draft_model/speculation (ours), not both", "speculative_config"
        )
    try:
        spec, model = SpeculationConfig.from_vllm(config)
    except ValueError as e:
        raise InvalidRequestError(str(e), "speculative_config") from None
    return (model or "none"), spec


def _per_prompt(value, n: int, what: str, listed: bool) -> list:
    """`value` for each of n prompts: the list itself when one is given per prompt, else n copies."""
    if not listed:
        return [value] * n
    if len(value) != n:
        raise InvalidRequestError(f"{what} is a list of {len(value)} for {n} prompts: give one per prompt, or one")
    return list(value)


# apply_chat_template's own arguments: given again in chat_template_kwargs they were a TypeError
# from transformers ("got multiple values") or overrode what this API sets.
_RENDERER_ARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def _check_template_kwargs(kwargs) -> dict:
    """vLLM's chat_template_kwargs: extra variables for the chat template (as enable_thinking), a
    dict with string keys that are not the renderer's own arguments. {} when None."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise InvalidRequestError(
            f"chat_template_kwargs must be a dict, got {type(kwargs).__name__}", "chat_template_kwargs"
        )
    if not all(isinstance(k, str) for k in kwargs):
        raise InvalidRequestError("chat_template_kwargs needs string keys", "chat_template_kwargs")
    clash = sorted(set(kwargs) & _RENDERER_ARGS)
    if clash:
        raise InvalidRequestError(
            f"chat_template_kwargs may not set {', '.join(clash)}: give it as the argument of that name",
            "chat_template_kwargs",
        )
    return dict(kwargs)


def _given_template(template) -> str | None:
    """vLLM's chat_template argument: a Jinja template in place of the model's (None: the model's)."""
    if template is None or (isinstance(template, str) and template):
        return template
    raise InvalidRequestError(
        f"chat_template must be a Jinja template (text), got {type(template).__name__}", "chat_template"
    )


def _vllm_alias(ours, theirs, our_name: str, their_name: str):
    """An argument given under our name or under vLLM's (`max_model_len` for max_context,
    `sampling_params` for params: a vLLM script's keyword was a TypeError); both at once is
    ambiguous, an error naming vLLM's."""
    if theirs is None:
        return ours
    if ours is not None:
        raise InvalidRequestError(f"give {our_name} or {their_name} (vLLM's name), not both", their_name)
    return theirs


class LLM:
    """A target model, an optional draft model, and the speculative engine over them.

    model: pack name, local folder, .gguf file or hub id; None = the default target pack.
    draft_model: same kinds; None = the default draft pack when `model` is also None,
    otherwise no draft model; "none" = no draft model.
    backend: "auto" (GGUF packs and .gguf files on llama.cpp, unless a torch `dtype` is asked
    for; HF folders and hub ids on transformers), "llama.cpp" or "transformers".
    dtype: torch dtype for the transformers backend (None = bfloat16).
    threads: llama.cpp CPU threads (None = every core this process may use). gpu_layers: llama.cpp
    layers on the GPU of a GPU build (None = all, 0 = CPU only; `exact` keeps them on the CPU).
    exact: llama.cpp's batch-invariant kernels: greedy speculation equals plain decoding bit for
    bit on quantized GGUFs too, at about half the verification throughput on a CPU.
    max_num_seqs / kv_cache_tokens: how many requests decode together, and the cache cells
    they share (see config.EngineLimits); `generate([...])` and the server batch up to that.
    speculative_config: vLLM's dict ({"method": "ngram", "num_speculative_tokens": 5,
    "prompt_lookup_max": 4} or {"model": draft, ...}), instead of draft_model and speculation.
    max_model_len: vLLM's name for max_context.
    """

    def __init__(
        self,
        model: str | None = None,
        draft_model: str | None = None,
        dtype: str | None = None,
        device: str | None = None,
        speculation: str | SpeculationConfig = "auto",
        max_context: int | None = None,
        backend: str = "auto",
        threads: int | None = None,
        exact: bool = False,
        gpu_layers: int | None = None,
        max_num_seqs: int = 8,
        kv_cache_tokens: int | None = None,
        options: LoadOptions | None = None,
        limits: EngineLimits | None = None,
        speculative_config: dict | None = None,
        max_model_len: int | None = None,
    ):
        draft_model, speculation = _vllm_speculation(speculative_config, draft_model, speculation)
        max_context = _vllm_alias(max_context, max_model_len, "max_context", "max_model_len")
        options = options or LoadOptions(
            backend=backend,
            dtype=dtype,
            device=device,
            max_context=max_context,
            threads=threads,
            exact=exact,
            gpu_layers=gpu_layers,
        )
        limits = limits or EngineLimits(max_num_seqs=max_num_seqs, kv_cache_tokens=kv_cache_tokens)
        target = load(model, "target", options, limits)
        draft = None
        if loads_draft_model(model, draft_model):
            draft = load(draft_model, "draft", options, limits)  # None: the default draft pack
        try:
            self._init(
                target.backend,
                target.tokenizer,
                draft.backend if draft else None,
                target.name,
                SpeculationConfig.coerce(speculation),
                target.eos_token_ids,
                limits,
            )
        except ModelLoadError as e:  # name both files: the engine only knows the two backends
            raise ModelLoadError(f"{draft.name} cannot draft for {target.name}: {e}") from None
        self.draft_model_name = draft.name if draft else None
        if self.speculation.method != "none":
            self.engine.prices()  # measured (or read from the price cache) now, so no request waits for it

    @classmethod
    def from_options(
        cls,
        model: str | None,
        draft_model: str | None,
        options: LoadOptions,
        speculation: str | SpeculationConfig = "auto",
        limits: EngineLimits | None = None,
    ) -> LLM:
        """LLM(...) with the model flags shared by the CLI commands."""
        return cls(model, draft_model, speculation=speculation, options=options, limits=limits)

    @classmethod
    def from_models(
        cls,
        model,
        tokenizer,
        draft_model=None,
        name: str = "model",
        speculation: str | SpeculationConfig = "auto",
        max_context: int | None = None,
    ) -> LLM:
        """Wrap already-loaded transformers models (tests, notebooks)."""
        from .backends.transformers import TransformersBackend

        draft = TransformersBackend(draft_model, max_context) if draft_model is not None else None
        return cls.from_backends(
            TransformersBackend(model, max_context), tokenizer, draft, name, speculation, eos_ids(model, tokenizer)
        )

    @classmethod
    def from_backends(
        cls,
        target,
        tokenizer,
        draft=None,
        name: str = "model",
        speculation: str | SpeculationConfig = "auto",
        eos_token_ids: set[int] | None = None,
        limits: EngineLimits | None = None,
    ) -> LLM:
        """Wrap already-built backends (tests, notebooks); EOS defaults to the tokenizer's."""
        self = cls.__new__(cls)
        eos = eos_token_ids if eos_token_ids is not None else {tokenizer.eos_token_id} - {None}
        self._init(target, tokenizer, draft, name, SpeculationConfig.coerce(speculation), eos, limits)
        self.draft_model_name = "draft" if draft is not None else None
        return self

    def _init(
        self,
        target,
        tokenizer,
        draft,
        name: str,
        speculation: SpeculationConfig,
        eos: set[int],
        limits: EngineLimits | None,
    ) -> None:
        self.model_name = name
        self._closed = False
        self.tokenizer = tokenizer = per_thread(tokenizer)  # one copy per thread (engine/tokenizer.py)
        self.speculation = speculation
        self.target_backend, self.draft_backend = target, draft
        self.engine = Engine(target, tokenizer, draft, eos, limits)
        self.max_context = self._usable_context(target.max_context, self.engine.core.scheduler.cache_tokens)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """End every request in flight, write the prefix cache's host tier to its folder (where
        `host_cache_dir` names one) and release it, and free the models (llama.cpp's context and
        weights at once; torch's when nothing else holds them). Later calls are refused. Before,
        only collecting the LLM freed them, and a host tier was never saved nor its folder let go."""
        if self._closed:
            return
        self._closed = True
        core = self.engine.core
        core.abort_all()
        try:
            with core.lock:
                core.save_host_cache()
        finally:
            self.engine.clear_prefix_cache()  # frees the cached prefixes' sequences while the backends live
            if core.host_store is not None:
                core.host_store.close()
            for backend in (self.target_backend, self.draft_backend):
                if hasattr(backend, "close"):
                    backend.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError("this LLM is closed: make a new one")

    @staticmethod
    def _usable_context(context: int, cells: int) -> int:
        """The tokens one request may hold: the model's context, or fewer where the KV cache is
        smaller (--kv-cache-tokens below --max-context). Advertising the full context there made
        every chat request without max_tokens fail: its default filled a context the cache lacks."""
        if cells >= context:
            return context
        print(
            f"warning: the KV cache holds {cells} tokens, fewer than the context of {context}: "
            f"a request may hold at most {cells} (raise --kv-cache-tokens to lift it)",
            file=sys.stderr,
        )
        return cells

    @property
    def backend_name(self) -> str:
        """Which backend runs the target: "llama.cpp" or "transformers"."""
        return self.target_backend.name

    @property
    def has_draft_model(self) -> bool:
        return self.draft_backend is not None

    # -- prompts ----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @functools.cached_property
    def added_prefix(self) -> list[int]:
        """The tokens the tokenizer puts in front of every text (a BOS, as Gemma's): found once, by
        encoding a probe with and without its special tokens, so that a prompt tokenized with them
        need not be tokenized again without. [] when it adds none, or adds tokens after the text too."""
        full, plain = self.tokenizer.encode("a"), self.encode("a")
        k = len(full) - len(plain)
        return full[:k] if k > 0 and full[k:] == plain else []

    def fim_prompt_ids(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt for the code around a gap (fim.py): generate from it and
        the output is the middle. Raises InvalidRequestError for a model without FIM tokens."""
        try:
            ids = fim_prompt_ids(self.tokenizer, prefix, suffix)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        return self.prompt_ids(ids)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
        chat_template: str | None = None,
    ) -> list[int]:
        """The target's chat template with the assistant turn opened, as token ids.

        tools: OpenAI tool definitions; given to the template's `tools` argument, or described in
        a system message when the template has no tools support (see chat.py).
        continue_final_message: the last message is an assistant turn the model goes on writing
        (an answer begun for it, as vLLM's parameter of that name): its text is not closed, and
        no new turn is opened.
        chat_template_kwargs: extra variables for the template (vLLM's argument of that name).
        chat_template: a Jinja template used in place of the model's (vLLM's argument)."""
        extra = _check_template_kwargs(chat_template_kwargs)
        if not messages:
            raise InvalidRequestError("messages must not be empty")
        _check_messages(messages)
        _check_tools(tools)
        messages = _text_content(messages)
        if continue_final_message and messages[-1].get("role") != "assistant":
            raise InvalidRequestError(
                "continue_final_message needs the last message to be the assistant's", "continue_final_message"
            )
        template = _given_template(chat_template) or getattr(self.tokenizer, "chat_template", None)
        if extra and not template:  # the plain transcript below has no variables to set
            raise InvalidRequestError(
                "chat_template_kwargs: this model has no chat template to give them to", "chat_template_kwargs"
            )
        if tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            messages = template_messages(messages, tools, template)
        native = tools if tools and template and template_supports_tools(template) else None
        (messages, native), marks = mark_specials((messages, native), self.special_texts)
        if template:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=native,
                add_generation_prompt=not continue_final_message,
                continue_final_message=continue_final_message,
                tokenize=False,
                chat_template=template,
                **extra,
            )
        else:  # base models: plain role-prefixed transcript
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
            if continue_final_message:
                text = text[: -len("\nassistant: ")]
        _unicode_text(text, "the rendered chat prompt", "messages")  # a tool's or tool call's text
        if marks:  # a control token's spelling in a message is text (literal.py)
            return encode_marked(self.tokenizer, text, self.special_texts, marks)
        return self.encode(text)

    @functools.cached_property
    def special_texts(self) -> list[str]:
        """The spellings of the tokenizer's control tokens, which a message's text may hold as text."""
        return special_texts(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    def prompt_ids(self, prompt: str | Sequence[int] | dict) -> list[int]:
        """Text (tokenized with the tokenizer's special tokens) or token ids, validated; vLLM's
        dict prompts too."""
        prompt = _unpack_prompt(prompt)
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(_unicode_text(prompt, "prompt"))
        else:
            ids = self._token_ids(prompt, "prompt")
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        return ids

    def _token_ids(self, ids: Sequence[int], what: str) -> list[int]:
        """Token ids as plain ints, validated: numpy's integers are taken, floats (1.5 was read
        as 1) and bools refused."""
        ids = list(ids)
        if not all(is_integer(t) for t in ids):
            raise InvalidRequestError(f"{what} token ids must be integers in [0, {self.vocab_size})", what)
        ids = [int(t) for t in ids]
        check_token_ids(ids, self.vocab_size, what)
        return ids

    # -- generation -------------------------------------------------------------------------
    def _factory(self):
        return factory_for(self.tokenizer, self.vocab_size, self.engine.eos_token_ids)

    def compile_guide(self, spec: GrammarSpec, wait: bool = True) -> CompiledGuide | PendingGuide:
        """Compile a grammar for this model's vocabulary (raises ConstraintError when it cannot, or
        when it takes longer than the time limit). wait=False: a PendingGuide, compiling on the
        grammar threads (the server awaits it on its event loop; see engine/constrain/pool.py)."""
        pending = self._factory().submit(spec)
        return pending.result() if wait else pending

    def constraint(self, guide: GrammarSpec | CompiledGuide | PendingGuide | None):
        """A fresh grammar Constraint for one request (None: unconstrained)."""
        return None if guide is None else self._factory()(guide)

    def request(
        self,
        prompt: str | Sequence[int] | dict,
        params: SamplingParams | None = None,
        prediction: str | list[int] | None = None,
        speculation: str | SpeculationConfig | None = None,
        should_cancel: Callable[[], bool] | None = None,
        guide: GrammarSpec | CompiledGuide | None = None,
        on_event=None,
    ):
        """A validated engine Request (not yet queued): what `stream`, `generate` and the server run."""
        self._check_open()
        if params is not None and not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params is not None and params.n != 1:  # generate and chat split n; one request is one sample
            raise InvalidRequestError(f"n={params.n}: one request (a stream) is one sample; use generate or chat", "n")
        if prediction is not None and not isinstance(prediction, (str, list, tuple)):
            raise InvalidRequestError(f"prediction must be text or token ids, got {type(prediction).__name__}")
        if prediction is not None and not isinstance(prediction, str):  # True was token 1, numpy ids refused
            prediction = self._token_ids(prediction, "prediction")
        elif prediction is not None:
            _unicode_text(prediction, "prediction")
        spec = self.speculation if speculation is None else SpeculationConfig.coerce(speculation)
        req = self.engine.request(
            self.prompt_ids(prompt),
            params or SamplingParams(),
            spec,
            prediction,
            should_cancel,
            self.constraint(guide),
            on_event,
        )
        _warn_if_cut(req)
        return req

    def stream(
        self,
        prompt: str | Sequence[int] | dict,
        params: SamplingParams | None = None,
        prediction: str | list[int] | None = None,
        speculation: str | SpeculationConfig | None = None,
        should_cancel: Callable[[], bool] | None = None,
        guide: GrammarSpec | CompiledGuide | None = None,
    ) -> Generation:
        """Start one request; iterate it for StepEvents (text as soon as each step is accepted).

        guide: a structured-output grammar (JSON schema, regex, EBNF) the output must follow.
        should_cancel: asked before each step; True ends the request (finish_reason "abort"). If it
        raises, this request ends with that exception (iterating raises it); others run on.
        Iterating drives the engine: requests started from other threads advance with it.
        Its `.output` at the end is what `generate` gives (`prompt`, decoded tokens included).
        """
        req = self.request(prompt, params, prediction, speculation, should_cancel, guide)
        return Generation(self.engine.core, req, lambda out: self._finished([out], prompt))

    def generate(
        self,
        prompts,
        params: SamplingParams | None = None,
        prediction: str | list[int] | None = None,
        speculation: str | SpeculationConfig | None = None,
        guide: GrammarSpec | CompiledGuide | None = None,
        *,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool | Callable = True,
    ) -> RequestOutput | list[RequestOutput]:
        """One prompt (text or token ids) -> one RequestOutput; a list of prompts -> a list, run
        together (continuous batching, up to max_num_seqs at once; the rest join as others end).

        params / prediction may also be lists, one per prompt; an empty list gives []. sampling_params: vLLM's name for
        params. use_tqdm: vLLM's progress-bar switch, taken and unused (no bar is drawn).
        SamplingParams(n=k): k samples of a prompt, run together, in its RequestOutput's `outputs`."""
        params = _vllm_alias(params, sampling_params, "params", "sampling_params")
        if isinstance(prompts, (list, tuple)) and not prompts:  # vLLM's: no prompts, no outputs
            self._check_open()
            return []
        if _is_batch(prompts):
            n = len(prompts)
            params_each = _per_prompt(params, n, "params", isinstance(params, (list, tuple)))
            predictions = _per_prompt(prediction, n, "prediction", _is_batch(prediction))
            return self._run(prompts, params_each, predictions, speculation, guide)
        return self._run([prompts], [params], [prediction], speculation, guide)[0]

    def _run(self, prompts: list, params_each: list, predictions: list, speculation, guide) -> list[RequestOutput]:
        """Run the prompts together, SamplingParams(n=k) as k requests of its prompt (seeds derived
        by per_sample), and give one RequestOutput per prompt, its samples in `outputs`."""
        samples = [sp.per_sample() if isinstance(sp, SamplingParams) else [sp] for sp in params_each]
        reqs = [
            self.request(p, each, pr, speculation, guide=guide)
            for p, group, pr in zip(prompts, samples, predictions)
            for each in group
        ]
        outs = iter(self.engine.run(reqs))
        return [self._finished([next(outs) for _ in group], p) for group, p in zip(samples, prompts)]

    def _finished(self, samples: list[RequestOutput], prompt) -> RequestOutput:
        """One prompt's output (sample 0, the others in other_samples) with vLLM's fields that need
        the caller's prompt or the tokenizer: `prompt` (the text given, None for token ids) and the
        text of each token the logprobs and prompt logprobs name (vLLM's Logprob.decoded_token)."""
        prompt = prompt.get("prompt") if isinstance(prompt, dict) else prompt
        for out in samples:
            out.prompt = prompt if isinstance(prompt, str) else None
            lps = [*(out.logprobs or ()), *(lp for lp in out.prompt_token_logprobs or () if lp is not None)]
            named = {lp.token_id for lp in lps} | {t for lp in lps for t, _ in lp.top}
            out.token_text.update((t, self.tokenizer.decode([t])) for t in named)
        samples[0].other_samples = samples[1:]
        return samples[0]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | list[SamplingParams] | None = None,
        prediction: str | list[int] | None = None,
        speculation: str | SpeculationConfig | None = None,
        guide: GrammarSpec | CompiledGuide | None = None,
        tools: list[dict] | None = None,
        continue_final_message: bool = False,
        add_generation_prompt: bool | None = None,
        chat_template_kwargs: dict | None = None,
        chat_template: str | None = None,
        *,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool | Callable = True,
    ) -> RequestOutput | list[RequestOutput]:
        """Apply the target's chat template (with `tools` when given), then generate.

        messages: one conversation -> one RequestOutput; a list of conversations -> a list, run
        together as `generate([...])` runs prompts (params / prediction may be lists, one each).
        continue_final_message: go on writing the last (assistant) message rather than answer it.
        add_generation_prompt (vLLM's): accepted where it agrees, as the server takes it: True
        without continue_final_message, False with it (exactly one of the two opens the answer).
        chat_template_kwargs (vLLM's): extra variables for the chat template.
        chat_template (vLLM's): a Jinja template used in place of the model's.
        sampling_params / use_tqdm: as in `generate`."""
        params = _vllm_alias(params, sampling_params, "params", "sampling_params")
        go_on = _continues(continue_final_message, add_generation_prompt)
        if _is_conversations(messages):
            prompts = [self.apply_chat_template(m, tools, go_on, chat_template_kwargs, chat_template) for m in messages]
            return [self._rendered(out) for out in self.generate(prompts, params, prediction, speculation, guide)]
        prompt = self.apply_chat_template(messages, tools, go_on, chat_template_kwargs, chat_template)
        return self._rendered(self.generate(prompt, params, prediction, speculation, guide))

    def _rendered(self, out: RequestOutput) -> RequestOutput:
        """A chat answer's `prompt` (its samples' too): the rendered template, as vLLM's chat
        reports it (decoded from the prompt's tokens, control tokens spelled out)."""
        text = self.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
        for sample in (out, *out.other_samples):
            sample.prompt = text
        return out
