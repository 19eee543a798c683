"""Incremental detokenization and stopping, one committed token at a time.

Plain and speculative decoding both push their committed tokens through `OutputBuilder`
token by token, so EOS, stop strings and max_tokens that land inside an accepted draft cut
the output exactly where plain decoding would have stopped.
"""

from __future__ import annotations

from ..config import SamplingParams

PROMPT_CONTEXT = 5  # prompt tokens decoded alongside the output so leading spaces come out right


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Decodes a short window [prefix, end) and diffs it against [prefix, read): the prefix tokens
    give the tokenizer the context it needs (spaces, multi-byte characters split across tokens).
    """

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-PROMPT_CONTEXT:])
        self.prefix = 0
        self.read = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
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

    def add(self, token_id: int) -> bool:
        """Commit one token. Returns True when the request is finished (stop or length)."""
        assert self.finish_reason is None
        self.token_ids.append(token_id)
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
        hits = [i for i in (self.text.find(s, start) for s in self.params.stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
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
