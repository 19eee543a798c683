"""A message's text is text: a control token's spelling inside it (`<|im_end|>` in a file being
edited, in a user's question about chat templates) is tokenized as the characters it is, never as
the control token.

A chat template renders the messages into one string, and tokenizing that string the usual way
(`tokenizer.encode`, which splits out every special token's text) turned such a spelling into the
real token: the user's turn ended where the text said `<|im_end|>`, and a model asked to repeat the
text could not write it back (Qwen2.5-Coder repeating `END = "<|im_end|>"` wrote `END = "END"`;
the same file under `specserve edit` lost the text). OpenAI's API reads message content as text;
Hugging Face's `apply_chat_template` and vLLM did not (transformers issue 29279).

Every string the client wrote is text, not only a message's content: an earlier call's arguments
and a tool's description or schema reach the prompt through the template's `tojson`.

How: each special token's text in those strings is replaced by a marker before the template runs (a
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


def mark_specials(value, specials: list[str]) -> tuple:
    """(`value` with each special token's text in any string it holds replaced by a marker,
    {marker: the text}); `value` unchanged and {} when no string holds one.

    `value` is what the template is given: the messages, or (messages, tools). Every string in it is
    the client's text, wherever it sits: a message's content, an earlier call's arguments (and
    their keys), a tool's description and parameters schema. The template writes the last ones with
    `tojson`, not as content, and marking only the content left a `<|im_end|>` in a call's
    arguments or a tool's description a real end of turn in the prompt."""
    texts = list(_strings(value))
    if not specials or not any(s in text for s in specials for text in texts):
        return value, {}
    mark = next((chr(c) for c in _PRIVATE_USE if not any(chr(c) in text for text in texts)), None)
    if mark is None:  # text holding all 6400 private-use characters: left as the template reads it
        return value, {}
    pattern = _alternation(specials)
    marks: dict[str, str] = {}

    def marker(m: re.Match) -> str:
        key = f"{mark}{specials.index(m.group())}{mark}"
        marks[key] = m.group()
        return key

    return _map_strings(value, lambda text: pattern.sub(marker, text)), marks


def _strings(value):
    """Every string in a JSON-like value (dict keys included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _map_strings(value, fn):
    """A JSON-like value with `fn` applied to every string in it (dict keys included); lists,
    tuples and dicts are copied, anything else is kept as it is."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {_map_strings(key, fn): _map_strings(item, fn) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_map_strings(item, fn) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


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
