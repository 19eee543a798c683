"""`POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`, with vLLM's shapes.

Clients count tokens before they send (to fit a context, to budget `max_tokens`) with the very
tokenizer and chat template the server uses, instead of guessing with another one. An
evaluation harness (lm-eval's `local-completions`) uses all three as its tokenizer when the
server offers them, so it needs no copy of the model's tokenizer files.
"""

from __future__ import annotations

from .errors import bad_request
from .protocol import chat_prompt_ids, continues_final_message
from .schemas import DetokenizeRequest, TokenizeRequest
from .structured import tool_setup


def tokenize(req: TokenizeRequest, llm) -> dict:
    """{"count", "max_model_len", "tokens", "token_strs"} for a prompt or chat messages (token_strs:
    with return_token_strs, each token as the vocabulary spells it, as vLLM answers)."""
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of prompt and messages", "prompt" if req.prompt is not None else "messages")
    if req.messages is not None:
        if not req.messages:
            raise bad_request("messages must contain at least one message", "messages", "empty_array")
        ids = chat_prompt_ids(req.messages, tool_setup(req.tools, None, None), continues_final_message(req), llm)
    elif req.add_special_tokens is False:
        ids = llm.encode(req.prompt)
    else:
        ids = list(llm.tokenizer.encode(req.prompt))
    strs = llm.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": llm.max_context, "tokens": ids, "token_strs": strs}


def detokenize(req: DetokenizeRequest, llm) -> dict:
    """{"prompt": the text of the token ids}."""
    if any(not 0 <= t < llm.vocab_size for t in req.tokens):
        raise bad_request(f"tokens must be token ids in [0, {llm.vocab_size})", "tokens")
    return {"prompt": llm.tokenizer.decode(req.tokens)}


SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


def tokenizer_info(llm) -> dict:
    """The tokenizer's special tokens (text, or null), its chat template and the context length."""
    tok = llm.tokenizer
    tok = tok.thread_copy() if hasattr(tok, "thread_copy") else tok  # the tokenizer itself, not its per-thread wrapper
    info = {name: _text(getattr(tok, name, None)) for name in SPECIAL}
    return info | {
        "chat_template": getattr(tok, "chat_template", None),
        "model_max_length": llm.max_context,
        "tokenizer_class": type(tok).__name__,
    }


def _text(token) -> str | None:
    """A special token as text (transformers may hold an AddedToken object)."""
    return None if token is None else str(token)
