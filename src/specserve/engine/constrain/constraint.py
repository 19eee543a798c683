"""One request's grammar state (`Constraint`), consulted at three points of every engine step.

    draft = constraint.cut(draft)       # (a) keep the longest draft prefix the grammar allows
    logits = target.forward(...)        #     [K+1, V]
    logits = constraint.mask(logits)    # (b) row i: only tokens the grammar allows after draft[:i]
    ...verify, commit...
    constraint.advance(committed)       # (c) move the matcher over the committed tokens

(a) and (b) are computed together in `cut`: the matcher walks the draft token by token,
filling one bitmask row per position, then rolls back. Row i is therefore exactly the mask
plain decoding would apply after committing draft[:i], so speculation verifies against the
*constrained* target distribution, the same one plain decoding samples from: greedy output is
identical and rejection sampling stays lossless with respect to it. When the grammar is
complete, only the stop tokens (EOS) are allowed: the constraint forces the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .errors import GrammarDeadEnd
from .library import xgrammar

if TYPE_CHECKING:
    import xgrammar as xgr


def _allows_any(bitmask: torch.Tensor, vocab_size: int, banned: torch.Tensor | None) -> bool:
    """Whether a [W] int32 token bitmask row allows any token below vocab_size that is not banned."""
    words = bitmask.numpy().view(np.uint32)  # [W]
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)  # [V]
    if banned is not None:
        bits &= ~banned.numpy()[:vocab_size]
    return bool(bits.any())


def next_allows_any(matcher, vocab_size: int, banned: torch.Tensor | None) -> bool:
    """Whether the matcher's next token may be any token at all (one below vocab_size, not banned)."""
    row = xgrammar().allocate_token_bitmask(1, vocab_size)  # [1, W]
    matcher.fill_next_token_bitmask(row, 0)
    return _allows_any(row[0], vocab_size, banned)


class Constraint:
    """One request's grammar state: cut drafts, mask verification rows, advance on commit."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int, banned: torch.Tensor | None = None):
        self.matcher = xgrammar().GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.banned = banned  # [V] bool, or None
        self._rows: torch.Tensor | None = None  # [K+1, ceil(V/32)] int32 bitmask of the last cut

    def cut(self, draft_ids: list[int], sampled: bool = False) -> list[int]:
        """The draft to verify, and the masks of its K+1 rows (kept for `mask`).

        Deterministic draft: the longest prefix the grammar accepts. For it, rejecting the first
        disallowed token x and sampling the bonus from the masked p are the same law, because
        the residual of p against one-hot(x) is p itself when p(x) = 0.
        Sampled draft (sampled=True, q a full distribution): that first disallowed token is kept,
        so verification rejects it (p(x) = 0) and samples the *residual* max(0, p - q): sampling
        from p there instead would not be lossless (see tests/test_structured_lossless.py).
        """
        m = self.matcher
        rows = xgrammar().allocate_token_bitmask(len(draft_ids) + 1, self.vocab_size)  # [K+1, W]
        kept, walked = len(draft_ids), 0
        for i, tok in enumerate(draft_ids):
            self._fill(rows, i)
            if m.is_terminated():  # draft[:i] ended with a stop token: nothing after it counts
                kept = i
                break
            if (self.banned is not None and self.banned[tok]) or not m.accept_token(tok):
                kept = i + 1 if sampled else i
                break
            walked += 1
        if kept == walked:
            self._fill(rows, kept)
        else:  # the row after a disallowed token is never committed: any valid distribution
            rows[kept] = -1
        if walked:
            m.rollback(walked)
        self._rows = rows[: kept + 1]
        return draft_ids[:kept]

    def _fill(self, rows: torch.Tensor, i: int) -> None:
        """Row i of the bitmask: the grammar's allowed tokens, or all of them once it has ended
        (a row after a stop token is never committed, but must stay a valid distribution)."""
        if self.matcher.is_terminated():
            rows[i] = -1  # every bit set
        else:
            self.matcher.fill_next_token_bitmask(rows, i)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [K+1, V] -> a copy with disallowed tokens at -inf (rows from the last `cut`)."""
        out = logits.float().clone()  # [K+1, V]
        if out.shape[-1] != self.vocab_size:
            raise ValueError(f"logits have {out.shape[-1]} columns, the grammar {self.vocab_size}")
        xgrammar().apply_token_bitmask_inplace(out, self._rows[: out.shape[0]], vocab_size=self.vocab_size)
        if self.banned is not None:
            out.masked_fill_(self.banned, float("-inf"))  # [V] broadcast over rows
        return out

    def advance(self, token_ids: list[int]) -> None:
        """Move the matcher over committed tokens (each was allowed by its row's mask)."""
        for tok in token_ids:
            if self.matcher.is_terminated():
                return
            if not self.matcher.accept_token(tok):
                if not next_allows_any(self.matcher, self.vocab_size, self.banned):
                    raise GrammarDeadEnd(
                        "the structured-output constraint allows no token after the text so far: no text "
                        "satisfies it from there"
                    )
                raise RuntimeError(f"token {tok} was committed but the grammar rejects it")

    @property
    def finished(self) -> bool:
        """Whether the grammar has ended (a stop token was accepted): nothing more may follow."""
        return self.matcher.is_terminated()
