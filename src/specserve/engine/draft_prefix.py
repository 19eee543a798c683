"""The draft model's side of the prefix cache.

A draft model keeps its own KV cache, one sequence per request. Without this, a request that
starts from a cached target prefix (a conversation's next turn, the n > 1 choices of one
prompt) would still feed its whole prompt to the draft model before its first step: on a CPU
that is a third of a cold prefill again for the default 0.5B / 1.5B pair.

So the draft sequence follows the target's. When a finished request's target sequence becomes
a prefix-cache entry, its draft sequence is kept beside it (cut to the committed tokens it
holds) and freed with it. When a request starts from a cached prefix, its draft sequence takes
over the same prefix of the entry's (or of the running source request's) draft sequence with
the backend's `copy_prefix`, and its draft proposer is told which tokens it already holds; only
the rest is fed. When the target entry leaves the cells for the host tier, a copy of its draft
sequence goes with it and is restored beside it. Drafts only: verification decides every token
either way.
"""

from __future__ import annotations

from ..backends.base import SavedSequence
from ..proposers.draft_model import DraftModelProposer
from .prefix_cache import Hit, common_prefix


def draft_proposer(req) -> DraftModelProposer | None:
    """The request's draft-model proposer, if its chain has one."""
    return next((p for p in req.chain if isinstance(p, DraftModelProposer)), None)


class DraftPrefixes:
    """Draft-model sequences kept beside the target's prefix-cache entries."""

    def __init__(self, backend):
        self.backend = backend
        self.held: dict[int, tuple[int, list[int]]] = {}  # target entry seq -> (draft seq, tokens it holds)

    def keep(self, target_seq: int, req, valid: int) -> None:
        """A finished request's target sequence became an entry holding `valid` of req.tokens:
        keep its draft sequence too (cut to the tokens both hold), instead of freeing it."""
        proposer, runner = draft_proposer(req), getattr(req, "draft_runner", None)
        if proposer is None or runner is None or runner.seq is None:
            return
        n = common_prefix(proposer.fed[: runner.length], req.tokens, valid)
        runner.truncate(n)
        self.held[target_seq] = (runner.seq, list(req.tokens[:n]))
        runner.seq = None  # the entry owns it now: closing the runner must not free it

    def free(self, target_seq: int) -> None:
        """The entry left the cache: its draft sequence goes too."""
        held = self.held.pop(target_seq, None)
        if held is not None:
            self.backend.free_sequence(held[0])

    def save(self, target_seq: int) -> tuple[SavedSequence, list[int]] | None:
        """A copy of the draft sequence kept beside a target entry that leaves the cells for the
        host tier (host_cache.py), with the tokens it holds; None when there is none to save."""
        held = self.held.get(target_seq)
        if held is None or not hasattr(self.backend, "save_sequence"):
            return None
        copy = self.backend.save_sequence(held[0])
        return None if copy is None else (copy, held[1])

    def restore(self, req, saved: tuple[SavedSequence, list[int]], limit: int) -> int:
        """Before `req` is admitted from a restored host entry: give its draft sequence the saved
        draft cells, cut to the prompt's share (at most `limit` tokens). Returns the tokens given."""
        copy, tokens = saved

        def fill(seq: int, n: int) -> bool:
            if not self.backend.restore_sequence(seq, copy):
                return False
            self.backend.truncate(seq, n)
            return True

        return self._give(req, tokens, limit, fill)

    def share(self, req, hit: Hit, running) -> int:
        """Before `req` is admitted from `hit`: give its draft sequence the prefix the source's
        draft sequence holds. Returns the tokens shared (0 when there is nothing to share).
        A running source whose draft model has not read the prompt yet (it reads it on its first
        proposal: n > 1 choices start together) is remembered, and `catch_up` shares it later."""
        source = self._source(hit.seq, running)
        n = 0
        if source is not None:
            src, fed = source

            def fill(seq: int, n: int) -> bool:
                self.backend.copy_prefix(src, seq, n)
                return True

            n = self._give(req, fed, hit.length, fill)
        req.draft_source = hit if n == 0 and not hit.entry and draft_proposer(req) is not None else None
        return n

    def catch_up(self, req, running) -> None:
        """Before `req` drafts: take the prefix of the running request it was admitted from, if
        that one's draft model has read it since (it drafts earlier in the same step) and `req`'s
        own has fed nothing yet, instead of reading the same prompt again."""
        hit, runner = getattr(req, "draft_source", None), getattr(req, "draft_runner", None)
        if hit is None or runner is None:
            return
        if runner.length or self.share(req, hit, running):
            req.draft_source = None

    def _give(self, req, tokens: list[int], limit: int, fill) -> int:
        """Give req's (empty) draft sequence the first n tokens it shares with `tokens` (at most
        `limit`): `fill(seq, n)` puts their cells there, False when it could not; the proposer
        then feeds only the rest. Returns n (0: nothing given)."""
        proposer, runner = draft_proposer(req), getattr(req, "draft_runner", None)
        if proposer is None or runner is None:
            return 0
        n = common_prefix(tokens, req.prompt_ids, limit)
        if n == 0 or not fill(runner._seq(), n):
            return 0
        proposer.adopt_prefix(req.prompt_ids[:n])
        return n

    def _source(self, target_seq: int, running) -> tuple[int, list[int]] | None:
        """(draft seq, the tokens it holds) behind a target sequence: an entry's, or a running
        request's (the tokens its draft proposer fed, as far as its cache holds them)."""
        if target_seq in self.held:
            return self.held[target_seq]
        owner = next((r for r in running if r.seq == target_seq), None)
        proposer = draft_proposer(owner) if owner is not None else None
        runner = getattr(owner, "draft_runner", None)
        if proposer is None or runner is None or runner.seq is None:
            return None
        return runner.seq, proposer.fed[: runner.length]
