"""Incremental detokenization and stopping, one committed token at a time.

Plain and speculative decoding both push their committed tokens through `OutputBuilder`
token by token, so EOS, stop strings and max_tokens that land inside an accepted draft cut
the output exactly where plain decoding would have stopped.

Why tokenizers' `DecodeStream` (for fast tokenizers). It runs the same algorithm as our
windowed decode below (decode [prefix, end), diff against [prefix, read), hold back a trailing
U+FFFD), in Rust, with the prompt's last tokens as context (`DecodeStream(ids=...)`). What we need
from a detokenizer, and how it fits:
  - exact text: checked in tests/test_detokenize.py against the full `tokenizer.decode` on random
    token sequences of SmolLM2's byte-level BPE, the tiny test tokenizer and a Llama-style
    SentencePiece one (random ids, spans of multilingual text cut anywhere, so multi-byte
    characters split across tokens), and against the windowed decode chunk for chunk; 600 such
    SmolLM2 sequences in one run: 0 differences. The prompt context is needed: without it a
    SentencePiece decoder strips the output's leading space (the test fails). One limit, shared
    with the windowed decode: a byte-fallback decoder turns a whole run of byte pieces that is not
    valid UTF-8 into U+FFFDs, valid characters in the run included, so there a window shows more
    of the text than the full decode does.
  - per-token text, for prediction offsets (`_decode_with_starts`: where each prediction token's
    text starts, used by the re-anchoring) and stop strings: `step` returns exactly the new text
    of each token (None while a character is incomplete), as our `add` does.
  - a flush at the end (a request cut by max_tokens inside a character): DecodeStream has none
    and does not expose its window, so we mirror its (prefix, read) bookkeeping, which costs no
    decode, and `flush` decodes that window the old way.
  - speed: 8 us a token instead of 52 us (SmolLM2, measured on a busy 2-core machine, same run).
It is not used where it would differ from `tokenizer.decode`: slow (Python) tokenizers have no
Rust tokenizer, and transformers' `clean_up_tokenization_spaces` (applied to non-BPE models when
the tokenizer asks) is a Python post-pass DecodeStream does not run. If a step raises (its
prefix check, "InvalidPrefix"), the request falls back to the windowed decode from there on.
"""

from __future__ import annotations

from bisect import bisect_left

from ..config import SamplingParams

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21
    DecodeStream = None

PROMPT_CONTEXT = 5  # prompt tokens decoded alongside the output so leading spaces come out right


def streams_exactly(tokenizer) -> bool:
    """Whether DecodeStream reproduces `tokenizer.decode(..., skip_special_tokens=True)`."""
    rust = getattr(tokenizer, "backend_tokenizer", None)
    if DecodeStream is None or rust is None:
        return False
    cleans = getattr(tokenizer, "clean_up_tokenization_spaces", False)
    return not cleans or type(rust.model).__name__ == "BPE"  # transformers skips the clean-up for BPE


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Decodes a short window [prefix, end) and diffs it against [prefix, read): the prefix tokens
    give the tokenizer the context it needs (spaces, multi-byte characters split across tokens).
    With a fast tokenizer the window is decoded by tokenizers' DecodeStream (see the module
    docstring); `prefix` and `read` are kept either way, for `flush`.

    The tokenizer is looked up on every call (not bound at construction): a detokenizer may be
    built on one thread and used on another, and each thread has its own copy (engine/tokenizer.py).
    """

    def __init__(self, tokenizer, prompt_ids: list[int], stream: bool | None = None):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-PROMPT_CONTEXT:])
        self.prefix = 0
        self.read = len(self.ids)
        use = streams_exactly(tokenizer) if stream is None else stream
        self.stream = DecodeStream(ids=self.ids or None, skip_special_tokens=True) if use else None

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self.stream is not None:
            try:
                chunk = self.stream.step(self.tok.backend_tokenizer, token_id)
            except Exception:  # noqa: BLE001 - its prefix check; the windowed decode below has none
                self.stream = None
            else:
                if chunk is None:
                    return ""  # an incomplete character (or a skipped special token)
                self.prefix, self.read = self.read, len(self.ids)
                return chunk
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""  # an incomplete character: wait for the next token

    def flush(self) -> str:
        """Whatever is still pending at the end (may hold a replacement character)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        self.stream = None  # nothing more comes after a flush
        return after[len(before) :]


class OutputBuilder:
    """Accumulates committed tokens and text; decides when and why the request finishes."""

    def __init__(self, tokenizer, prompt_ids: list[int], params: SamplingParams, eos_ids: set[int]):
        self.params = params
        self.eos_ids = set() if params.ignore_eos else set(eos_ids)
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.token_ids: list[int] = []
        self.text = ""
        self.released = 0  # chars of text already handed to the caller
        self.finish_reason: str | None = None
        self.holdback = max((len(s) for s in params.stop), default=1) - 1
        self.hit_stop_string = False
        self.stop_reason: str | None = None  # the stop string that ended the text (vLLM's stop_reason)
        self.starts: list[int] = []  # where each token's text starts in `text` (before any cut)

    @property
    def kept_tokens(self) -> int:
        """How many of the tokens have their text in the answer: all of them, but after a stop
        string cut the text those whose text starts at or past the cut, which lie wholly inside the
        stop string (or after it, in the same step). A token that straddles the cut wrote part of
        the answer and is kept, as vLLM keeps every token up to the one that ends the stop string."""
        if not self.hit_stop_string:
            return len(self.token_ids)
        return bisect_left(self.starts, len(self.text))  # starts never decrease

    @property
    def released_tokens(self) -> int:
        """How many tokens a stream may show logprobs for now: those whose text starts in the text
        released so far (a token in the held-back tail may turn out to be part of a stop string),
        all of them without stop strings, and the kept ones once finished."""
        if self.finish_reason is not None:
            return self.kept_tokens
        if not self.params.stop:
            return len(self.token_ids)
        return bisect_left(self.starts, self.released)

    def add(self, token_id: int) -> bool:
        """Commit one token. Returns True when the request is finished (stop or length)."""
        assert self.finish_reason is None
        self.token_ids.append(token_id)
        self.starts.append(len(self.text))
        if token_id in self.eos_ids:
            self.finish_reason = "stop"
            return True
        searched_from = max(0, len(self.text) - self.holdback)
        self.text += self.detok.add(token_id)
        if self.params.stop and self._cut_at_stop(searched_from):
            return True
        if len(self.token_ids) >= self.params.max_tokens:
            self.finish_reason = "length"
            return True
        return False

    def _cut_at_stop(self, start: int) -> bool:
        hits = [(i, s) for s in self.params.stop if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return False
        cut, self.stop_reason = min(hits, key=lambda hit: hit[0])  # the earliest; the first listed at a tie
        self.text = self.text[:cut]
        self.finish_reason = "stop"
        self.hit_stop_string = True
        return True

    def finish(self, reason: str) -> None:
        """End for a reason outside the tokens (context full, cancelled)."""
        if self.finish_reason is None:
            self.finish_reason = reason

    def release(self) -> str:
        """New text safe to show: all of it once finished, else minus a possible stop-string prefix."""
        if self.finish_reason is not None:
            if not self.hit_stop_string:
                self.text += self.detok.flush()  # a no-op once flushed
            end = len(self.text)
        else:
            end = max(self.released, len(self.text) - self.holdback)
        delta = self.text[self.released : end]
        self.released = end
        return delta
