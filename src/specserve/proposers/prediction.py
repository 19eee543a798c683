"""Predicted Outputs drafter: propose the next tokens of a reference text the caller gave us.

While the output follows the prediction token for token, we simply walk a pointer along the
prediction's tokens and propose long drafts (K doubles up to k_max). When the output diverges
(an inserted, changed or deleted line), we *re-anchor*: find the longest tail of the output
text that occurs in the prediction text, nearest to where the output last followed it, and resume
right after it.
Anchoring works on text, not tokens, because the same text may tokenize differently in context
than on its own; when the anchor falls inside a prediction token, the rest of that token's text
is re-tokenized into a short *bridge* that the output must write before the prediction's own
tokens. Nothing is drafted from such an anchor: the output's last token already says it did not
go on with that prediction token (else the model would have written it whole), so the next
token decides whether the output follows the bridge or leaves again.

Two refinements use what the request has shown so far:
- *edits are learned* (substitutions.py): at a re-anchor, the prediction text the output skipped
  and the text it wrote instead give substitutions (`UserService` -> `UserRepository`) that
  rewrite the rest of the prediction, so a rename is drafted right at every later occurrence;
  a substitution whose text verification rejects is dropped. The pointer, the anchors and the
  drafts all work on this *working text*; the caller's prediction is kept to rebuild it.
- *K comes from prices* when the engine has measured them (governor.CostModel): the draft
  length that maximises expected committed tokens per unit of cost, with the chance of
  following the prediction one more token taken from the request's own divergences so far
  (so K may pass 128 where the curve makes a longer pass cheaper per token). Edits cluster,
  so the odds depend on the run's age (tokens followed since its anchor): a run younger than
  YOUNG_RUN often leaves again within a few tokens (new code written like old code re-anchors
  again and again), while one that has come clear of the edit tends to go on. Each age has its
  own counts, so a dozen hops inside one inserted function do not shorten the drafts over the
  unchanged file after it. An anchor
  not yet confirmed (shorter than TRUST_CHARS, or the very start) drafts a short probe first
  (`probe_length`: k_init tokens, fewer where such a pass costs over PROBE_COST plain steps):
  short anchors are often wrong, and a wrong long draft wastes a pass of its length.
  Without prices K doubles from k_init up to FALLBACK_K_MAX, as it always did.
- *new text is looked up* (`PredictionLookup`, under `prediction` and `auto`): while the output
  writes text the prediction does not hold (no anchor), short drafts continue the output's latest
  n-gram from where it last occurred in the prediction or the output (a new line often reuses a
  name or call just written). These drafts are n-gram drafts, reported under "ngram", not as
  prediction tokens. With prices they are drafted only at a K that beats a plain step at the
  acceptance they have shown (so on a CPU where verifying is dear they sit out). Under `auto`, when
  it has nothing, the chain's own n-gram source looks over the prompt, which holds the file.
"""

from __future__ import annotations

from bisect import bisect_left

from ..engine.detokenize import IncrementalDetokenizer
from ..engine.governor import CostModel, Governor
from .base import AdaptiveK, Draft, ProposerContext, register
from .ngram import NgramProposer
from .substitutions import Span, learn, rewrite

TAIL_TOKENS = 48  # how much recent output (in tokens) is decoded to look for an anchor
FALLBACK_K_MAX = 128  # K's ceiling when no prices are known (a verified token's cost is unknown)
PRIOR = (1.0, 256.0)  # (divergences, followed tokens) assumed before the request has shown any
PRIOR_YOUNG = (1.0, 16.0)  # the same for a young run (the output that just came back soon leaves again)
YOUNG_RUN = 32  # tokens followed since the anchor before a run is priced with the odds of older runs
FAR_CHARS = 2000  # chars: a next occurrence this far ahead loses to one behind; a short anchor this far off is refused
PROBE_COST = 3.0  # one-token steps: the most an unconfirmed anchor's first draft may cost
TRUST_CHARS = 16  # an anchor this long is trusted at once; a shorter one is probed first (probe_length)


def priced_k(prices, follow: float, k_max: int) -> int:
    """The draft length that maximises expected committed tokens per unit of cost,
    (1 - f^(K+1)) / (1 - f) / target(1 + K), when each next token follows the prediction with
    probability f. Evaluated on a grid (every K to 16, then coarser), so it costs ~60 prices."""
    best_k, best = 1, -1.0
    for k in _grid(k_max):
        value = (1 - follow ** (k + 1)) / (1 - follow) / prices.target(k + 1)
        if value > best:
            best_k, best = k, value
    return best_k


def probe_length(prices, k_init: int) -> int:
    """K for the first draft from an anchor not yet confirmed: at most k_init, and no longer than
    a pass costing PROBE_COST one-token steps. Such drafts are right about 40% of the time, so a
    long one pays only where verifying is nearly free (a GPU), not on a CPU (8 tokens cost 6.6
    steps on the 2-core curve)."""
    limit = PROBE_COST * prices.target(1)
    return max([1] + [k for k in range(1, k_init + 1) if prices.target(k + 1) <= limit])


def _follow_odds(divergences: int, followed: int, prior: tuple[float, float]) -> float:
    """The chance that the output follows the prediction one more token, from the divergences
    and followed tokens seen, each with its prior count added."""
    return 1.0 - (divergences + prior[0]) / (followed + prior[1])


def _grid(k_max: int) -> list[int]:
    ks, k = [], 1
    while k <= k_max:
        ks.append(k)
        k += 1 if k < 16 else 4 if k < 64 else 16 if k < 256 else 64
    return ks if ks and ks[-1] == k_max else ks + [k_max]


class PredictionProposer:
    name = "prediction"
    prior = PRIOR  # (divergences, followed tokens) before the request has shown any, for runs YOUNG_RUN or older
    prior_young = PRIOR_YOUNG  # the same for younger runs

    def __init__(
        self,
        tokenizer,
        prediction: str | list[int],
        prompt_len: int,
        k_init: int = 8,
        k_max: int = 128,
        min_anchor_chars: int = 4,
        prices=None,
        learn_edits: bool = True,
        lookup: bool = False,
    ):
        self.tok = tokenizer
        self.prompt_len = prompt_len
        self.k_max = k_max
        self.k = AdaptiveK(k_init, 1, min(k_max, FALLBACK_K_MAX))
        self.k_init = k_init
        self.trusted = False  # whether the current anchor has been confirmed (then K comes from the prices alone)
        self.prices = prices or (lambda: None)  # () -> CostModel | None (measured by the engine, maybe later)
        self.min_anchor_chars = min_anchor_chars
        self.need = min_anchor_chars  # anchor length required now: doubles after each wasted draft
        if isinstance(prediction, str):
            self.set_text(prediction)
        else:
            self.ids = list(prediction)
            self.text, self.starts = _decode_with_starts(tokenizer, self.ids)
            self.orig = self.text
        self.pos = 0  # next prediction token we expect the output to produce
        self.bridge: list[int] = []  # tokens expected before ids[pos] (re-tokenized partial token)
        self.char_pos = 0  # where in self.text the output currently is
        self.anchored = True  # False after a divergence that found no anchor yet
        # Edit learning: the working text (self.text) is the caller's prediction (self.orig) with
        # the learned substitutions applied after the point where each was learned.
        self.learn_edits = learn_edits and bool(getattr(tokenizer, "is_fast", False))  # needs offsets
        self.subs: dict[str, str] = {}  # old -> new, in the order learned
        self.spans: list[Span] = []  # rewritten regions of the working text, in order
        self.out_text = ""  # the output so far, decoded
        self._detok: IncrementalDetokenizer | None = None
        # (working char, output char) where the output last followed the prediction (an anchor
        # counts once the output has followed on from it: a wrong anchor must not move it)
        self.sync = self.base = (0, 0)
        self.age = YOUNG_RUN  # tokens followed since the current anchor (the start is no edit's neighbour)
        # [divergences, followed tokens] of confirmed anchors' drafts, counted apart for runs
        # younger than YOUNG_RUN and older ones (a divergence counts at the age it happened)
        self.young, self.old = [0, 0], [0, 0]
        self.lookup = PredictionLookup(self.ids, prompt_len, self.prices) if lookup else None

    def set_text(self, text: str) -> None:
        """Follow `text` (tokenized with character offsets) from its start."""
        self.text = self.orig = text
        self.ids, self.starts = _tokenize(self.tok, text)

    def prefill(self, prompt_ids: list[int]) -> None:
        pass  # the prediction was tokenized in __init__

    # -- drafting -------------------------------------------------------------------------
    def expected(self, n: int) -> list[int]:
        """The next n tokens we expect, if the output keeps following the prediction."""
        head = self.bridge[:n]
        return head + self.ids[self.pos : self.pos + n - len(head)]

    def propose(self, tokens: list[int], max_k: int) -> Draft | None:
        if not self.anchored or self.bridge:
            # A bridge: the anchor ends inside a prediction token, and a draft from there was
            # rejected at its first token in 97-100% of cases on the replay corpus.
            return self.lookup.propose(tokens, max_k) if self.lookup is not None else None
        draft = self.expected(self.draft_length(max_k))
        return Draft(draft, self.name) if draft else None

    def draft_length(self, max_k: int) -> int:
        """K for this step: from the prices and this request's divergences when prices are known."""
        prices = self.prices()
        if prices is None:
            return min(self.k.k, max_k)
        if max_k <= 0:
            return 0
        if self.age < YOUNG_RUN:  # the output came back lately: edits cluster
            follow = _follow_odds(*self.young, self.prior_young)
        else:
            follow = _follow_odds(*self.old, self.prior)
        k = priced_k(prices, follow, min(self.k_max, max_k))
        return k if self.trusted else min(k, probe_length(prices, self.k_init))

    # -- following the output ---------------------------------------------------------------
    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
        committed = num_accepted + 1 if draft is not None else 1
        new = tokens[-committed:]
        self._hear(tokens)
        if self.lookup is not None:
            self.lookup.observe(tokens, draft, num_accepted)
        if draft is not None and draft.source == self.name:
            self.k.update(len(draft.token_ids), num_accepted)
            # A draft rejected at its first token means the anchor was wrong: trust only longer
            # anchors until one works, so noisy output lets the n-gram / draft model take over.
            self.need = self.min_anchor_chars if num_accepted else min(2 * self.need, 64)
            if num_accepted < len(draft.token_ids) and self._drop_rejected(num_accepted):
                self.anchored = False  # the working text changed under the pointer: find it again
        if self.anchored:
            expected = self.expected(len(new))
            same = next((i for i, (a, b) in enumerate(zip(new, expected)) if a != b), min(len(new), len(expected)))
            self._advance(same)  # up to where the output left the prediction (if it did)
            if draft is not None and draft.source == self.name and self.trusted:
                self._count(same, left=same < len(new))  # a wrong anchor is not the output leaving
            self.age += same
            if same == len(new):
                self.trusted = True
                return
        self._reanchor(tokens)

    def _count(self, followed: int, left: bool) -> None:
        """Add a verified draft to the odds: its followed tokens to the ages they were written
        at, and its divergence (left) to the age the run had when it left."""
        young = min(followed, max(0, YOUNG_RUN - self.age))
        self.young[1] += young
        self.old[1] += followed - young
        if left:
            (self.young if self.age + followed < YOUNG_RUN else self.old)[0] += 1

    def _hear(self, tokens: list[int]) -> None:
        """Append the newly committed tokens' text to out_text."""
        if self._detok is None:
            self._detok = IncrementalDetokenizer(self.tok, tokens[: self.prompt_len])
            self._heard = self.prompt_len
        for tok in tokens[self._heard :]:
            self.out_text += self._detok.add(tok)
        self._heard = len(tokens)

    def _advance(self, n: int) -> None:
        used = min(n, len(self.bridge))
        self.bridge = self.bridge[used:]
        self.pos = min(len(self.ids), self.pos + n - used)
        self.char_pos = self.starts[self.pos] if self.pos < len(self.ids) else len(self.text)
        if n and not self.bridge:  # the output wrote what the prediction has between the two points
            p, o = self.base
            self.base = self.sync = (self.char_pos, o + self.char_pos - p)

    def _reanchor(self, tokens: list[int]) -> None:
        out = tokens[self.prompt_len :]
        tail = self.tok.decode(out[-TAIL_TOKENS:], skip_special_tokens=True).rstrip("\ufffd")
        found = self._find_anchor(tail)
        if found is None:
            self.anchored = False
            return
        end, length = found
        p0, o0 = self.sync
        if self.learn_edits and p0 <= end and self.out_text.endswith(tail[-length:]):
            # text[p0:end] was replaced by out_text[o0:]; both end with the anchor
            learned = learn(self.text, p0, end, self.out_text, o0, len(self.out_text))
            for old, new in learned:
                self.subs.pop(old, None)
                self.subs[old] = new
            if learned:
                self._rebuild(end)
        self.base = (end, len(self.out_text))  # becomes the sync point once the output follows on from it
        self.trusted = length >= TRUST_CHARS
        idx = bisect_left(self.starts, end)  # first token starting at or after the anchor
        nxt = self.starts[idx] if idx < len(self.starts) else len(self.text)
        self.bridge = _tokenize(self.tok, self.text[end:nxt])[0] if nxt > end else []
        self.pos, self.char_pos, self.anchored = idx, end, True
        self.k.restart()
        self.age = 0

    def _find_anchor(self, tail: str) -> tuple[int, int] | None:
        """(char offset in the prediction right after the longest tail of `tail` found in it, the
        tail's length), or None when no tail long enough occurs. Of its occurrences, the nearest
        at or after where the output last followed the prediction (the sync point: an anchor the
        output has not followed yet does not move it), unless that is over FAR_CHARS ahead and one
        behind is nearer. A short anchor (under TRUST_CHARS) more than FAR_CHARS from the sync
        point is refused: on the replay corpus nine in ten such were chance matches in new text."""
        lo, hi = 0, len(tail)  # invariant: tail[-lo:] occurs (lo == 0 trivially)
        while lo < hi:  # occurrence is monotone in suffix length: binary search the longest
            mid = (lo + hi + 1) // 2
            if tail[-mid:] in self.text:
                lo = mid
            else:
                hi = mid - 1
        suffix = tail[-lo:]
        if lo == 0 or (lo < self.need and lo < len(tail)) or len("".join(suffix.split())) < 3:
            return None  # too short, or only whitespace/indentation: it would match almost anywhere
        here = self.sync[0]
        start = self.text.find(suffix, max(0, here - lo))  # nearest at or after the sync point
        if start < 0:
            start = self.text.rfind(suffix)
        elif start - here > FAR_CHARS:  # far ahead: a nearer occurrence behind is likelier
            back = self.text.rfind(suffix, 0, max(0, here - lo))
            if back >= 0 and here - back < start - here:
                start = back
        if lo < TRUST_CHARS and abs(start + lo - here) > FAR_CHARS:
            return None
        return start + lo, lo

    # -- learned edits --------------------------------------------------------------------------
    def _drop_rejected(self, i: int) -> bool:
        """Draft token i was rejected: drop the substitutions whose rewritten text it drafted
        (True if any was dropped)."""
        if not self.spans:
            return False
        if i < len(self.bridge):
            c0, c1 = self.char_pos, self._start(self.pos)
        else:
            j = self.pos + i - len(self.bridge)
            c0, c1 = self._start(j), self._start(j + 1)
        hit = [s for s in self.spans if s.w0 < max(c1, c0 + 1) and s.w1 > c0 and s.old in self.subs]
        for s in hit:
            del self.subs[s.old]
        if hit:
            self._rebuild(min(s.w0 for s in hit))
        return bool(hit)

    def _start(self, j: int) -> int:
        return self.starts[j] if j < len(self.starts) else len(self.text)

    def _rebuild(self, at: int) -> None:
        """Re-derive the working text after char `at` from the caller's prediction with the
        substitutions now in force, and re-tokenize it (the pointer is set by the caller)."""
        for s in self.spans:
            if s.w0 < at < s.w1:
                at = s.w0
        w_end = o_end = 0
        for s in self.spans:  # the original offset of `at`: after the last span that ends before it
            if s.w1 <= at:
                w_end, o_end = s.w1, s.o1
        rest, spans = rewrite(self.orig, o_end + at - w_end, self.subs)
        self.spans = [s for s in self.spans if s.w1 <= at] + [
            Span(s.w0 + at, s.w1 + at, s.o0, s.o1, s.old) for s in spans
        ]
        self.text = self.text[:at] + rest
        self.ids, self.starts = _tokenize(self.tok, self.text)
        self.char_pos = min(self.char_pos, at)


class PredictionLookup(NgramProposer):
    """n-gram lookup over the prediction's tokens followed by the output so far: drafts for new
    text, where the prediction has no anchor. K adapts from k_init up to k_max without prices;
    with them it is the governor's best K for this source at the acceptance it has shown (a prior
    of 1 in 2), or 0 when none beats a plain step."""

    def __init__(self, prediction_ids: list[int], prompt_len: int, prices, k_init: int = 2, k_max: int = 8):
        super().__init__(n_min=2, n_max=4, k_init=k_init, k_max=k_max)
        self.context = list(prediction_ids)  # [prediction | output so far]: only ever appended to
        self.base = len(self.context)
        self.prompt_len = prompt_len
        self.prices = prices
        self.governor = Governor(CostModel())  # counts this source's acceptance; priced once prices are known

    def propose(self, tokens: list[int], max_k: int) -> Draft | None:
        out = tokens[self.prompt_len :]
        self.context += out[len(self.context) - self.base :]
        k = self.draft_length(max_k)
        return super().propose(self.context, k) if k > 0 else None

    def draft_length(self, max_k: int) -> int:
        prices = self.prices()
        if prices is None:
            return min(self.k.k, max_k)
        self.governor.prices = prices
        return self.governor.best_k(self.name, min(self.k.k_max, max_k))

    def observe(self, tokens: list[int], draft: Draft | None, num_accepted: int) -> None:
        if draft is not None and draft.source == self.name:
            super().observe(tokens, draft, num_accepted)
            self.governor.record(self.name, 1 + len(draft.token_ids), num_accepted + 1)


def _tokenize(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """(`text`'s token ids, where each token's text starts) as the output would write it: a control
    token's spelling (`<|im_end|>` in a file being edited) is its characters, since an output's text
    never holds a control token (the detokenizer skips them; a drafted one was a wasted draft, and
    an end-of-turn one an invitation to stop)."""
    enc = tokenizer(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    return list(enc["input_ids"]), _token_starts(enc["offset_mapping"])


def _token_starts(offsets) -> list[int]:
    """Start char of each token, made non-decreasing (byte-level pieces may share a char)."""
    starts, last = [], 0
    for s, _ in offsets:
        last = max(last, s)
        starts.append(last)
    return starts


def _decode_with_starts(tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """Decode ids and record where each token's text starts (incremental: one short decode per token)."""
    detok = IncrementalDetokenizer(tokenizer, [])
    starts, text = [], ""
    for tok in ids:
        starts.append(len(text))
        text += detok.add(tok)
    return text + detok.flush(), starts


@register("prediction")
def make_prediction(ctx: ProposerContext) -> PredictionProposer | None:
    if ctx.prediction is None or len(ctx.prediction) == 0:
        return None
    s = ctx.spec
    k_init = s.num_speculative_tokens or 8
    return PredictionProposer(
        ctx.tokenizer,
        ctx.prediction,
        ctx.prompt_len,
        k_init,
        max(k_init, s.prediction_k_max),
        s.prediction_min_anchor_chars,
        ctx.prices,
        s.prediction_learn_edits,
        lookup=True,  # new text: n-grams of [prediction | output]; under auto the chain's n-gram source follows
    )
