"""A message's text is text: a control token's spelling inside it (`<|im_end|>` in a file being
edited, in a user's question about chat templates) is tokenized as the characters it is, never as
the control token.

A chat template renders the messages into one string, and tokenizing that string the usual way
(`tokenizer.encode`, which splits out every special token's text) turned such a spelling into the
real token: the user's turn ended where the text said `<|im_end|>`, and a model asked to repeat the
text could not write it back (Qwen2.5-Coder repeating `END = "<|im_end|>"` wrote `END = "END"`;
the same file under `specserve edit` lost the text). OpenAI's API reads message content as text;
Hugging Face's `apply_chat_template` and vLLM did not (transformers issue 29279).

How: each special token's text in the content is replaced by a marker before the template runs (a
private-use character that no message holds, the token's index, the character again); the
rendered string is cut at the special tokens the template wrote, and each piece between them,
markers put back, is encoded with the special tokens' splitting off. Without a marker in the
rendered string nothing changes: the usual encode. A tokenizer for which encoding piece by piece
is not the usual encode (a SentencePiece one that prefixes the first piece's first word with a
space) keeps the usual encode too: found by encoding the same string both ways.

Special here means the tokens the tokenizer marks special (control tokens). Tokens added but not
special (Qwen3's `<think>`, Qwen2.5's `<tool_call>`) are ordinary vocabulary, split out by the
tokenizer either way, as in a completion's text, so a template that looks for them still finds them.
"""

from __future__ import annotations

import re

_PRIVATE_USE = range(0xE000, 0xF900)


def special_texts(tokenizer) -> list[str]:
    """The spellings of the tokenizer's special (control) tokens, longest first."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {t.content for t in added.values() if getattr(t, "special", False) and t.content}
    return sorted(texts, key=len, reverse=True)


def mark_specials(messages: list[dict], specials: list[str]) -> tuple[list[dict], dict[str, str]]:
    """(messages with each special token's text in a string content replaced by a marker,
    {marker: the text}); the messages unchanged and {} when no content holds one."""
    contents = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    if not specials or not any(s in c for s in specials for c in contents):
        return messages, {}
    mark = next((chr(c) for c in _PRIVATE_USE if not any(chr(c) in text for text in contents)), None)
    if mark is None:  # content holding all 6400 private-use characters: left as the template reads it
        return messages, {}
    pattern = _alternation(specials)
    marks: dict[str, str] = {}

    def marker(m: re.Match) -> str:
        key = f"{mark}{specials.index(m.group())}{mark}"
        marks[key] = m.group()
        return key

    marked = [
        {**m, "content": pattern.sub(marker, m["content"])} if isinstance(m.get("content"), str) else m
        for m in messages
    ]
    return marked, marks


def encode_marked(tokenizer, text: str, specials: list[str], marks: dict[str, str]) -> list[int]:
    """`text` (a template rendered from `mark_specials`' messages) as token ids: the special tokens
    the template wrote as themselves, each marker as its text's characters. The usual encode of the
    text with its markers put back when this tokenizer encodes a string differently piece by piece
    (or, should a template cut a marker, leaves a marker character behind)."""
    restored = _restore(text, marks)
    usual = list(tokenizer.encode(restored, add_special_tokens=False))
    pattern = _alternation(specials)
    if any(key[0] in restored for key in marks) or _by_pieces(tokenizer, restored, pattern, {}) != usual:
        return usual
    return _by_pieces(tokenizer, text, pattern, marks)


def _by_pieces(tokenizer, text: str, pattern: re.Pattern, marks: dict[str, str]) -> list[int]:
    """`text` cut at `pattern`'s special tokens, each one its id and each piece between them (its
    markers restored) encoded with no special token split out."""
    ids: list[int] = []
    at = 0
    for m in pattern.finditer(text):
        ids += _plain(tokenizer, _restore(text[at : m.start()], marks))
        ids.append(tokenizer.convert_tokens_to_ids(m.group()))
        at = m.end()
    return ids + _plain(tokenizer, _restore(text[at:], marks))


def _plain(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)) if text else []


def _restore(text: str, marks: dict[str, str]) -> str:
    for key, value in marks.items():
        text = text.replace(key, value)
    return text


def _alternation(texts: list[str]) -> re.Pattern:
    return re.compile("|".join(map(re.escape, texts)))  # longest first: a special that is a prefix of another loses
