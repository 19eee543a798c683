"""Fill-in-the-middle prompts: the code before and after the cursor, for the model to join.

Code models trained for infilling (Qwen2.5-Coder, StarCoder, DeepSeek-Coder) read the text
before the gap and the text after it between three special tokens, and then write the middle:

    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>   -> the middle, then an end token

Editors ask for it through OpenAI's completions `suffix` field (the prompt is the prefix). The
families differ only in the names of the three tokens, so a model's format is found by looking
them up in its vocabulary; a model without them has no infilling, and a request for one is
refused rather than answered with a guess. The end of the middle is one of the model's
end-of-generation tokens (Qwen's GGUFs list `<|endoftext|>`, `<|fim_pad|>`, `<|file_sep|>`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FimFormat:
    """The three marker tokens of one family's prefix-suffix-middle layout."""

    family: str
    prefix: str
    suffix: str
    middle: str


FORMATS = (
    FimFormat("Qwen2.5-Coder", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    FimFormat("StarCoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    FimFormat("DeepSeek-Coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)


def _token_id(tokenizer, token: str) -> int | None:
    """The id of a token the vocabulary holds whole, else None (never the unknown token's)."""
    tid = tokenizer.convert_tokens_to_ids(token)
    return None if tid is None or tid == tokenizer.unk_token_id else tid


def fim_format(tokenizer) -> FimFormat | None:
    """The first known format whose three markers are all tokens of this vocabulary."""
    for fmt in FORMATS:
        if all(_token_id(tokenizer, t) is not None for t in (fmt.prefix, fmt.suffix, fmt.middle)):
            return fmt
    return None


def fim_prompt_ids(tokenizer, prefix: str, suffix: str) -> list[int]:
    """Token ids of an infilling prompt; raises ValueError when the model has no FIM tokens.

    The two texts are encoded apart, without special tokens, so the markers are always the
    single marker tokens; a tokenizer that starts every text with BOS gets its BOS first."""
    fmt = fim_format(tokenizer)
    if fmt is None:
        raise ValueError(
            "this model has no fill-in-the-middle tokens (known: "
            + ", ".join(f"{f.family} {f.prefix}" for f in FORMATS)
            + "); send the prompt without a suffix"
        )
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False) if text else []  # noqa: E731
    bos = tokenizer.bos_token_id
    head = [bos] if bos is not None and tokenizer.encode("a")[:1] == [bos] else []
    return [
        *head,
        _token_id(tokenizer, fmt.prefix),
        *encode(prefix),
        _token_id(tokenizer, fmt.suffix),
        *encode(suffix),
        _token_id(tokenizer, fmt.middle),
    ]
