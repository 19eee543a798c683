"""The engine core: every running request advances together, one step at a time.

    step():  retire    cancelled requests leave and free their caches
             admit     waiting requests join while the cache has room for them
             compact   a lone request left above cells since freed moves down (llama.cpp)
             schedule  prefill chunks, each decoding request's draft, trimmed to what pays
             run       one target forward over all of it (ragged: 1 + K tokens per decoding
                       request, a chunk per prefilling one)
             commit    each request verifies its rows, commits, streams; proposers observe
             retire    finished requests leave

Requests are added from any thread; `step()` runs on whichever thread drives the engine (the
caller's for `LLM.generate`, the worker's for the server), one at a time under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

from ..backends import Backend, SeqInput, SequenceRunner
from ..backends.compute import on_compute_thread
from ..config import AGREEMENT_TEXT, SPARE_CELLS, EngineLimits
from ..errors import ContextLengthError, InvalidRequestError, ModelLoadError
from ..hardware import available_memory
from ..proposers.base import ProposerContext, build_chain, largest_draft
from .constrain import GrammarDeadEnd
from .draft_prefix import DraftPrefixes
from .governor import ContextCost, CostModel, Governor, measure_context_cost
from .host_cache import HostCache, default_budget
from .host_store import FolderInUse, HostStore, store_key
from .prefix_cache import ENTRY_RENT_TOKENS, SAVED_ENTRY_RENT_TOKENS, Hit, Owner, PrefixCache, common_prefix
from .prices import measured
from .request import DECODE, FINISHED, PREFILL, Request
from .scheduler import Scheduler, StepPlan
from .tokenizer import warm

log = logging.getLogger("specserve.engine")


def check_token_ids(ids, vocab_size: int, what: str) -> None:
    """Refuse token ids the model does not have before a request is queued: in a step, one bad id
    fails the backend's whole pass, and every request in it."""
    if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
        raise InvalidRequestError(f"{what} token ids must be integers in [0, {vocab_size})", what)


class EngineFault(RuntimeError):
    """An exception raised inside a step (a backend, a proposer, a grammar, a bug in the engine):
    the requests of that step fail with it. Requests are validated before they are queued, so
    nothing raised in a step is the caller's fault, whatever its type (a backend's ValueError
    included): the server answers 500. The one exception is a grammar that dead-ends mid-answer
    (constrain.GrammarDeadEnd), the caller's grammar at fault: it is not wrapped, and is a 400.
    The original exception is `__cause__`."""

    def __init__(self, error: BaseException, message: str | None = None):
        super().__init__(message or f"the engine failed: {type(error).__name__}: {error}")
        self.__cause__ = error


@dataclass(frozen=True)
class StepInfo:
    """What one step did, for metrics: requests in it, tokens fed, cache use, queue depth."""

    decoding: int
    prefilling: int
    tokens: int
    seconds: float
    cache_used: float  # share of cache cells reserved by running requests
    waiting: int
    # per draft source: [proposed, accepted, steps] of the requests this step verified. Counted
    # here, not from each answer, so a request whose client hung up still counts its drafts.
    speculation: dict[str, list[int]] = field(default_factory=dict)

    @property
    def draft_tokens(self) -> int:
        """Draft tokens the pass verified (none when it failed)."""
        return sum(counts[0] for counts in self.speculation.values())


def _count_step(tally: dict[str, list[int]], step: tuple[str, int, int] | None) -> None:
    """Add one request's verified step, (source, proposed, accepted), to a step's tally."""
    if step is not None:
        source, proposed, accepted = step
        counts = tally.setdefault(source, [0, 0, 0])
        counts[0] += proposed
        counts[1] += accepted
        counts[2] += 1


class EngineCore:
    """Owns the target (and draft) backend, the scheduler and every request in flight."""

    def __init__(
        self,
        target: Backend,
        tokenizer,
        draft: Backend | None = None,
        eos_token_ids: set[int] | None = None,
        limits: EngineLimits | None = None,
    ):
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise ModelLoadError(
                f"the draft model's vocabulary ({draft.vocab_size} tokens) differs from the target's "
                f"({target.vocab_size}); pick a draft model of the same family"
            )
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        warm(tokenizer)  # the thread that makes requests (the LLM API's caller)
        warm(tokenizer, on_compute_thread)  # where steps detokenize
        self.eos_token_ids = set(eos_token_ids or ())
        limits = limits or EngineLimits()
        # One sequence stays spare for measuring prices while others run (a one-sequence
        # backend measures before its request starts instead).
        # A draft model keeps a sequence beside each of the target's (running or cached): the
        # backend with fewer sequence ids bounds both.
        ids = min(target.max_sequences, draft.max_sequences) if draft is not None else target.max_sequences
        seqs = min(limits.max_num_seqs, max(1, ids - 1))
        self.limits = replace(limits, max_num_seqs=seqs)
        cache = self.limits.cache_tokens(target.max_context)
        if getattr(target, "cache_tokens", None):  # llama.cpp: cells allocated up front, a few kept spare
            cache = min(cache, target.cache_tokens - (SPARE_CELLS if target.max_sequences > 1 else 0))
        self.scheduler = Scheduler(self.limits, cache)
        # Prefix caching: sequence ids beyond the running requests' and the spare one hold
        # finished requests' prefixes (entries); running requests are shared in any case.
        entries = max(0, ids - 1 - self.limits.max_num_seqs)
        caching = self.limits.prefix_caching and hasattr(target, "copy_prefix")
        # entries leaving the cells are saved to host memory where the backend can copy them out
        budget = self.limits.host_cache_bytes
        budget = default_budget(available_memory()) if budget is None else budget
        saves = caching and budget > 0 and hasattr(target, "save_sequence")
        self.host = HostCache(budget) if saves else None
        self.host_store = None  # the host tier's folder on disk, where one is given
        self.host_store_refused: str | None = None  # why a folder that was given is not used
        if self.host is not None and self.limits.host_cache_dir:
            self._open_host_store(target, draft, budget)
        # on llama.cpp's unified cache every pass attends over every held cell: entries pay rent
        rent = None
        if getattr(target, "attends_every_cell", False):
            rent = SAVED_ENTRY_RENT_TOKENS if saves else ENTRY_RENT_TOKENS
        self.prefix = (
            PrefixCache(self._free_entry, entries, rent_limit=rent, spill=self._spill if saves else None)
            if caching
            else None
        )
        # llama.cpp: a lone request left above cells since freed is moved down (see _compact)
        self._relocates = getattr(target, "attends_every_cell", False) and hasattr(target, "relocate")
        shares_draft = self.prefix is not None and draft is not None and hasattr(draft, "copy_prefix")
        self.draft_prefixes = DraftPrefixes(draft) if shares_draft else None
        self._prices: CostModel | None = None
        self._context_cost: ContextCost | None = None  # bench reports only (context_cost)
        self._incoming: deque[Request] = deque()
        self._held: list[Request] = []  # requests a step's admission set aside (see _admit), still waiting
        self.lost_sequences = 0  # target sequences the backend failed to free, out of use for good (_lose)
        self.lock = threading.RLock()
        self.on_step = None  # optional callback(StepInfo), e.g. the server's metrics
        self._copies: bool | None = None  # whether copying cells out pays here (_price_copies)
        self._price_copies()

    def _open_host_store(self, target, draft, budget: int) -> None:
        """Read the host tier back from its folder, unless the models cannot be identified or
        another process holds the folder (its saves would delete ours: memory only, said why)."""
        key = store_key(target, draft)
        if key is None:
            self.host_store_refused = "the model was not loaded from files that identify it"
        else:
            try:
                self.host_store = HostStore(self.limits.host_cache_dir, key)
            except FolderInUse as e:
                self.host_store_refused = f"{e}; this one keeps its prefix cache in memory only"
        if self.host_store is None:
            log.warning("host cache folder ignored: %s", self.host_store_refused)
            return
        for e in self.host_store.load(budget):
            self.host.put(e.tokens, e.copy, e.draft)

    # -- requests in ------------------------------------------------------------------------------
    def make_request(
        self, prompt_ids, params, spec, prediction=None, constraint=None, should_cancel=None, on_event=None
    ) -> Request:
        """Validate a request and build its proposers (raises InvalidRequestError and the like
        here, on the caller's thread, before anything is queued)."""
        if params.logit_bias and params.logit_bias[-1][0] >= self.target.vocab_size:
            raise InvalidRequestError(
                f"logit_bias names token {params.logit_bias[-1][0]}, but the model's token ids "
                f"are in [0, {self.target.vocab_size})",
                "logit_bias",
            )
        if isinstance(prediction, (list, tuple)):
            check_token_ids(prediction, self.target.vocab_size, "prediction")
        if constraint is not None and params.ignore_eos:  # the server refuses it too (check_guided)
            raise InvalidRequestError(
                "ignore_eos cannot be combined with a grammar: the grammar ends the answer with EOS, and "
                "ignoring it would write on past the grammar's end with every token allowed",
                "ignore_eos",
            )
        req = Request(
            list(prompt_ids),
            params,
            spec,
            max_context=self.target.max_context,
            prediction=prediction,
            constraint=constraint,
            should_cancel=should_cancel,
            on_event=on_event,
        )
        if not self.scheduler.fits_ever(req):
            raise ContextLengthError(self._no_room(req))
        req.draft_runner = SequenceRunner(self.draft) if self.draft is not None else None
        req.chain = build_chain(
            ProposerContext(
                spec,
                params,
                len(req.prompt_ids),
                self.tokenizer,
                prediction,
                req.draft_runner,
                req.noise,
                prices=lambda: self._prices,
                prompt_ids=req.prompt_ids,
            )
        )
        return req

    def _no_room(self, req: Request) -> str:
        return (
            f"the request needs {req.reserve} cache cells (prompt + max_tokens - 1) but the "
            f"engine's cache holds {self.scheduler.cache_tokens}; lower max_tokens"
        )

    def add(self, req: Request) -> None:
        """Queue a request; it joins the running batch at a coming step. Any thread."""
        self._incoming.append(req)

    @property
    def num_waiting(self) -> int:
        """Requests queued for a place in the running batch, not counting those cancelled (their
        client left, or their deadline passed) that the next step will drop. Any thread. Those a
        step's admission holds aside, or is admitting (it may measure prices for seconds first),
        count too: they were missed, and the server's queue-full check let that many more in."""
        while True:
            try:  # snapshots: the stepping thread may move requests meanwhile
                queued = {
                    id(r): r for r in (*tuple(self._incoming), *tuple(self._held), *tuple(self.scheduler.waiting))
                }
                break
            except RuntimeError:  # "deque mutated during iteration": take them again
                continue
        return sum(not r.finished and not r.should_cancel() for r in queued.values())

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def cache_used(self) -> float:
        """Share of the cache cells reserved by running requests."""
        s = self.scheduler
        return s.reserved / s.cache_tokens if s.cache_tokens else 0.0

    def prefix_stats(self) -> dict | None:
        """The prefix cache's entries, cells, hit rate and prompt tokens saved, and its host
        tier's (None: off)."""
        if self.prefix is None:
            return None
        stats = self.prefix.stats()
        if self.host is not None:
            # copying: False where a copy costs more than a prefill here (_price_copies)
            stats["host"] = self.host.stats() | {"copying": self._copies}
        return stats

    def has_work(self) -> bool:
        return bool(self._incoming or self.scheduler.waiting or self.scheduler.running)

    # -- prices -----------------------------------------------------------------------------------
    def prices(self) -> CostModel:
        """What a pass costs on this machine, measured once on a spare sequence (governor.py), or
        read from the price cache (prices.py). Measured on the compute thread, torch ops included
        (the agreement's argmax over [T, V] rows): one such op on the caller's thread would give
        OpenMP a second team and slow every later step of the process (backends/compute.py)."""
        return on_compute_thread(self._measure_prices)

    def _measure_prices(self) -> CostModel:
        with self.lock:
            if self._prices is None:
                target, draft = SequenceRunner(self.target), SequenceRunner(self.draft) if self.draft else None
                try:
                    batched = self.target.batches_sequences

                    def calibrate() -> CostModel:  # only when the price cache has no entry for this setup
                        reference = self._agreement_ids() if draft is not None else []
                        return CostModel.calibrate(target, draft, batched, reference)

                    self._prices = measured(self.target, self.draft, batched, calibrate)
                finally:
                    target.close()
                    if draft is not None:
                        draft.close()
                self._price_copies()
            return self._prices

    def _price_copies(self) -> None:
        """Copy cells out and back (the host tier's saves and restores, `relocate`) only where
        that costs less than prefilling them again (`CostModel.copy_pays`). Until the prices
        are measured, a cache in host memory is trusted to copy cheaply and one on a GPU is not:
        llama.cpp copies GPU cells over the bus row by row (docs/gpu.md). Without copies, an
        entry leaving the cells is dropped, and pays the rent of an entry that cannot be saved."""
        prices, before = self._prices, self._copies
        if prices is not None and prices.copy is not None:
            self._copies = prices.copy_pays
        else:
            self._copies = not getattr(self.target, "on_gpu", False)
        if self.host is not None and not self._copies and before is not False:
            measured = (
                f"{prices.copy:.3g} one-token passes a cell" if prices is not None and prices.copy else "unmeasured"
            )
            log.info(
                "prefix cache: copying cells to host memory costs more than prefilling them here (%s): "
                "the host tier sits out",
                measured,
            )
        if self.host is not None and self.prefix is not None:
            self.prefix.spill = self._spill if self._copies else None
            if self.prefix.rent_limit is not None:  # a unified cache (see __init__)
                self.prefix.rent_limit = SAVED_ENTRY_RENT_TOKENS if self._copies else ENTRY_RENT_TOKENS

    @property
    def _compacts(self) -> bool:
        """Whether a lone request left above freed cells is moved down (`_compact`): a move is a copy."""
        return self._relocates and self._copies

    def _agreement_ids(self) -> list[int]:
        """The reference passage the draft model's agreement is measured on, as token ids (at most
        the cells kept spare for measuring; none where the tokenizer cannot encode it into ids
        both models know, as with the synthetic models of the statistical tests)."""
        try:
            ids = list(self.tokenizer.encode(AGREEMENT_TEXT, add_special_tokens=False))[:SPARE_CELLS]
        except Exception:  # noqa: BLE001 - a minimal tokenizer: measure no agreement, price as before
            return []
        vocab = min(self.target.vocab_size, self.draft.vocab_size)
        return ids if all(0 <= i < vocab for i in ids) else []

    @property
    def measured_prices(self) -> CostModel | None:
        """The prices if they are known already (never measures them)."""
        return self._prices

    def context_cost(self, cached: int) -> ContextCost:
        """Time what attention over `cached` tokens (at most half the context) adds to a pass
        (`governor.ContextCost`), and keep it for `measured_context_cost`. For benchmark reports,
        whose replays price long-context passes with it; serving never calls it."""
        return on_compute_thread(lambda: self._measure_context_cost(cached))

    def evict_entries(self) -> None:
        """Move every finished request's cached prefix out of the cells (to the host tier where
        copies pay), so that a sequence outside any request may hold up to what running requests
        do not reserve: a spare sequence is given only SPARE_CELLS of its own, and a benchmark's
        scoring pass over a whole context beside the entries ran out of cache ("llama_decode
        failed"). Call with the lock held, between steps."""
        while self.prefix is not None and self.prefix.evict():
            pass

    def _measure_context_cost(self, cached: int) -> ContextCost:
        with self.lock:
            self.evict_entries()
            runner = SequenceRunner(self.target)
            try:
                self._context_cost = measure_context_cost(runner, min(cached, self.target.max_context // 2))
            finally:
                runner.close()
            return self._context_cost

    @property
    def measured_context_cost(self) -> ContextCost | None:
        return self._context_cost

    def _needs_prices(self, req: Request) -> bool:
        """`auto` requests need them for their governor, a second running request for scheduling.
        A lone plain request never pays for the measurement."""
        return (req.spec.method == "auto" and bool(req.chain)) or bool(self.scheduler.running)

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> None:
        """Advance every running request by one step (see the module docstring), on the thread
        that runs every model computation (backends/compute.py: the torch ops of sampling and
        verification share its OpenMP team with the forwards)."""
        on_compute_thread(self._step)

    def _step(self) -> None:
        with self.lock:
            self._retire()
            self._admit()
            if self._compacts:
                self._compact()
            self._draft()
            plan = self.scheduler.plan(self._prices if self.num_running > 1 else None)
            if plan.empty:
                return
            info = self._info(plan)
            start = time.perf_counter()
            logits = self._run(plan)
            seconds = time.perf_counter() - start
            self.scheduler.observe(plan, self._prices, seconds)
            if logits is not None:
                self._commit(plan, logits, seconds, info.speculation)
            self._retire()
            if self.prefix is not None:  # what the pass fed (the plan's drafts are cleared by the commit)
                self.prefix.charge(info.tokens)
            if self.on_step is not None:
                self.on_step(replace(info, seconds=seconds))

    def _admit(self) -> None:
        sched = self.scheduler
        while self._incoming:
            sched.waiting.append(self._incoming.popleft())
        self._drop_cancelled()
        if self.prefix is not None:
            self._track_running()
        # requests waiting for a running prefill that will hold their prefix (num_waiting reads them)
        held: list[Request] = []
        self._held = held
        try:
            self._admit_waiting(held)
        finally:  # an error out of the loop (a bug) leaves them queued, not lost
            sched.waiting.extendleft(reversed(held))
            self._held = []

    def _admit_waiting(self, held: list[Request]) -> None:
        """Admit from the head of the queue while the batch and the cache have room; a request
        that will copy a running request's prefill moves to `held` (the caller queues it again)."""
        sched = self.scheduler
        while sched.waiting:
            req = sched.waiting[0]
            if self._awaits_prefill(req):
                held.append(sched.waiting.popleft())
                continue
            hit = self._make_room(req)
            if not sched.can_admit(req):
                if sched.running or sched.fits_ever(req):
                    break
                sched.waiting.popleft()  # the cache shrank since it was queued (_lose): it would wait for ever
                self._fail(req, ContextLengthError(self._no_room(req)))
                continue
            seq = None  # the request stays at the head of the queue (num_waiting) until it runs
            try:
                governor = None
                if self._needs_prices(req):  # measured before the request takes its sequence
                    prices = self.prices()
                    if req.spec.method == "auto" and req.chain:
                        governor = Governor(prices, prompt_len=len(req.prompt_ids))
                        req.chain = [q for q in req.chain if not governor.never_pays(q.name, largest_draft(q))]
                seq = self.target.new_sequence()
                cached, hit = self._start_from(req, seq, hit)
                req.admit(seq, governor, self.tokenizer, self.eos_token_ids, self.target.vocab_size, cached=cached)
            except Exception as e:  # noqa: BLE001 - this request fails; the others run on
                sched.waiting.popleft()
                self._fail(req, e)
                if seq is not None:  # the request never ran: its sequence goes back
                    self._free_sequence(seq, f"request {req.id}'s")
                continue
            sched.waiting.popleft()
            sched.start(req)
            if self.prefix is not None:
                self._reused(req, hit)
            req.above_others = len(sched.running) > 1 or bool(self.prefix is not None and self.prefix.entries)

    # -- prefix caching (prefix_cache.py) ---------------------------------------------------------
    def _valid(self, r: Request) -> int:
        """Tokens of r.tokens its sequence holds (between steps: the prompt's prefilled part, or
        every committed token but the pending one; a request finished inside an accepted draft
        also holds its last token)."""
        return min(self.target.length(r.seq), len(r.tokens))

    def _track_running(self) -> None:
        """Running requests' new full blocks join the index, so later prompts can share them."""
        for r in self.scheduler.running:
            self.prefix.track(r.seq, r.tokens, self._valid(r))

    def _awaits_prefill(self, req: Request) -> bool:
        """Whether a running request still prefilling will hold at least a block more of this
        prompt than is cached now (n > 1 choices, prompts with a common start arriving together):
        the request then waits for that prefill and copies it instead of computing it again."""
        if self.prefix is None or req.scores_prompt:
            return False
        have = (hit.length if (hit := self.prefix.match(req.prompt_ids)) else 0) + self.prefix.block
        limit = len(req.prompt_ids) - 1
        return any(
            r.phase == PREFILL
            and common_prefix(r.prompt_ids, req.prompt_ids, min(limit, len(r.prompt_ids) - 1))
            >= max(have, r.cached + 1)
            for r in self.scheduler.running
        )

    def _make_room(self, req: Request) -> Hit | None:
        """The cached prefix the request will start from; entries are evicted, least recently
        used first, while their cells keep out a request that would fit an empty cache."""
        p, s = self.prefix, self.scheduler
        if p is None:
            return None
        hit = None if req.scores_prompt else p.match(req.prompt_ids)
        if len(s.running) >= s.limits.max_num_seqs or s.reserved + req.reserve > s.cache_tokens:
            return hit  # it waits for running requests, not for the cache
        mine = hit.held if hit is not None and hit.entry else 0  # may go once copied (see _reused)
        while s.reserved + req.reserve + p.cells - mine > s.cache_tokens:
            if not p.evict(keep=hit.seq if mine else None):
                break
        return hit

    def _start_from(self, req: Request, seq: int, hit: Hit | None) -> tuple[int, Hit | None]:
        """Give the new request's empty sequence the longest cached prefix of its prompt: the
        cells of a running request or an entry (`hit`, shared), or a saved entry's cells restored
        from the host tier when that holds at least a block more. Returns (tokens cached, the
        cell hit used: None for a restore or nothing)."""
        have = hit.length if hit is not None else 0
        restores = self.host is not None and self._copies and not req.scores_prompt
        host = self.host.match(req.prompt_ids) if restores else None
        if host is not None and host.length >= have + self.host.block:
            p, s = self.prefix, self.scheduler
            if hit is not None and hit.entry and s.reserved + req.reserve + p.cells > s.cache_tokens:
                # the entry _make_room spared for this request is not used: its cells are needed
                # (and freed first, so that the restored cells do not lie above them)
                p.release(hit.seq, spill=True)
                hit = None
            stored = host.saved
            ok = self.target.restore_sequence(seq, stored.copy)
            self.host.restored(host, ok)
            if ok:  # the saved entry's answer may go on past this prompt's share
                self.target.truncate(seq, host.length)
                if self.draft_prefixes is not None and stored.draft is not None:
                    self.draft_prefixes.restore(req, stored.draft, host.length)
                return host.length, None
        keeps = getattr(self.target, "keeps_prefix", None)  # a sliding window may have lost the cells it needs
        if hit is None or (keeps is not None and not keeps(hit.seq, hit.length)):
            return 0, None
        self.target.copy_prefix(hit.seq, seq, hit.length)
        if self.draft_prefixes is not None:
            self.draft_prefixes.share(req, hit, self.scheduler.running)
        return hit.length, hit

    def _spill(self, owner: Owner) -> None:
        """An entry leaves the cells by rent or LRU: a copy of them goes to the host tier first. A
        copy that fails (no memory for its buffer) leaves without one, as an entry that cannot be
        saved does: the tier is a cache, and the failure was raised out of whatever evicted the
        entry (a request's retirement or admission, the step's rent), failing every running request."""
        try:
            self._save_entry(owner)
        except Exception:  # noqa: BLE001 - lose the copy, never a request
            log.warning("prefix cache: an entry leaving the KV cache could not be copied to host memory", exc_info=True)

    def _save_entry(self, owner: Owner) -> None:
        """Copy an entry's cells (and its draft sequence's) to the host tier."""
        copy = self.target.save_sequence(owner.seq)
        if copy is not None:
            draft = self.draft_prefixes.save(owner.seq) if self.draft_prefixes is not None else None
            self.host.put(owner.tokens[: owner.length], copy, draft)

    def host_snapshot(self) -> tuple[tuple[int, int, int], list]:
        """The host tier as it stands, least recently used first, and a mark that changes
        whenever its entries or their order do (the periodic writer skips an unchanged tier)."""
        with self.lock:
            h = self.host
            return (h.saves, h.restores, len(h.saved)), sorted(h.saved, key=lambda s: s.used)

    def save_host_cache(self) -> int | None:
        """Write the host tier to its folder, after copying in the entries still in the cells
        (the most recent ones). Returns the entries the folder holds; None without a folder."""
        if self.host_store is None:
            return None
        for owner in list(self.prefix.owners.values()):  # a host tier implies a prefix cache
            if not owner.live:
                self._spill(owner)
        return self.host_store.save(self.host_snapshot()[1])

    def _reused(self, req: Request, hit: Hit | None) -> None:
        """Book an admitted request's reuse; an entry it copied entirely (a conversation's next
        turn) or as its sibling (prefix_cache.py), or one whose cells are needed, goes: the
        request holds the shared cells now, and the entry's other cells would only tax it. A later
        choice of an n > 1 answer is not booked: usage counts an answer's prompt once."""
        p, s = self.prefix, self.scheduler
        if req.counts_reuse:
            p.record(req.cached, len(req.prompt_ids))
        p.track(req.seq, req.tokens, req.cached, parent=hit.seq if hit else None)
        if hit is not None and hit.entry and (hit.whole or hit.sibling or s.reserved + p.cells > s.cache_tokens):
            p.release(hit.seq, spill=not (hit.whole or hit.sibling))  # cells needed: save the rest

    def _compact(self) -> None:
        """Move a lone running request to the start of the cache once every sequence that held
        cells when it was admitted has gone (llama.cpp's `relocate`).

        On the unified cache a pass attends over every cell up to the highest one in use. A
        request admitted beside a prefix-cache entry is placed above it, and when the entry is
        released (rent, docs/design.md: "What an entry costs the others") the request would go on
        attending over the freed span for the rest of its life. Moving it costs one copy of its
        cache; it is done at most once per request, and only when no other sequence holds cells,
        so the cache has room for the copy."""
        running = self.scheduler.running
        if len(running) != 1 or not running[0].above_others:
            return
        if self.prefix is not None and self.prefix.entries:
            return
        req = running[0]
        req.above_others = False
        try:
            self.target.relocate(req.seq)
        except Exception as e:  # noqa: BLE001 - its cache is gone (a failed save moves nothing): it fails
            self._fail(req, e)

    def _free_entry(self, seq: int) -> None:
        """A prefix-cache entry left (the index has forgotten it): its target sequence and the draft
        sequence kept beside it are freed. A backend that fails to free them costs the engine
        those sequences (`_lose`), never a request: raised, the failure left whatever evicted the
        entry (an admission, a retirement, the step's rent) and failed every request in flight."""
        self._free_sequence(seq, "a prefix-cache entry's")
        if self.draft_prefixes is not None:
            try:
                self.draft_prefixes.free(seq)
            except Exception:  # noqa: BLE001 - the draft sequence is lost, not a request
                self._lose_draft("a prefix-cache entry's")

    def _free(self, r: Request, cache: bool = True) -> None:
        """A request left the batch: keep its sequence as a prefix-cache entry, or free it (always
        when not `cache`). Never raises: the request has its answer (or its error) already, and
        the others are not at fault."""
        if self.prefix is not None:
            if cache and r.error is None and self._keep(r):
                return
            self.prefix.drop(r.seq)
        self._free_sequence(r.seq, f"request {r.id}'s")

    def _keep(self, r: Request) -> bool:
        """Keep a finished request's sequence as a prefix-cache entry, cut to the tokens it holds
        (False: not kept). One the backend cannot cut is not kept: its cells past the cut may hold
        rejected draft tokens, and a later request copying them would read them."""
        try:
            n = self._valid(r)
            self.target.truncate(r.seq, n)
        except Exception:  # noqa: BLE001 - the entry is lost, not the answer
            log.warning("prefix cache: request %s's sequence could not be cut to its tokens", r.id, exc_info=True)
            return False
        if not self.prefix.keep(r.seq, r.tokens, n, prompt=len(r.prompt_ids)):
            return False
        if self.draft_prefixes is not None:
            try:
                self.draft_prefixes.keep(r.seq, r, n)
            except Exception:  # noqa: BLE001 - the entry stays without its draft cells: the draft reads them again
                log.warning("prefix cache: request %s's draft sequence could not be kept", r.id, exc_info=True)
        return True

    def _free_sequence(self, seq: int, whose: str) -> None:
        """Free a target sequence; one the backend fails to free is retired (`_lose`), not raised."""
        try:
            self.target.free_sequence(seq)
        except Exception:  # noqa: BLE001 - that sequence's fault, not the step's
            self._lose(seq, whose)

    def _lose(self, seq: int, whose: str) -> None:
        """The backend failed to free `seq` (called in the handler: the log line carries why).

        A backend keeps a sequence it did not free: llama.cpp leaves its id out of the free ids and
        its cells tagged, transformers keeps its cache. The engine never frees it again nor counts
        on it: the cells it holds leave the scheduler's cache, so admission does not promise them
        twice, and its id leaves the prefix cache's entry slots (entries, running requests and the
        spare sequence share the backend's ids). A backend that no longer knows the sequence has
        freed it after all: nothing is lost."""
        try:
            cells = self.target.length(seq)
        except Exception:  # noqa: BLE001
            log.warning("freeing %s sequence %d raised, but the backend freed it", whose, seq, exc_info=True)
            return
        self.scheduler.cache_tokens = max(0, self.scheduler.cache_tokens - cells)
        self._retire_id()
        log.warning(
            "the backend failed to free %s sequence %d: it is retired, never used again "
            "(%d cells and one sequence id out of use; %d lost in all)",
            whose,
            seq,
            cells,
            self.lost_sequences,
            exc_info=True,
        )

    def _lose_draft(self, whose: str) -> None:
        """The draft backend failed to free a sequence (called in the handler): as `_lose`, its id
        leaves the entry slots (the draft model has a sequence beside each of the target's)."""
        self._retire_id()
        log.warning("the draft model failed to free %s draft sequence: it is retired", whose, exc_info=True)

    def _retire_id(self) -> None:
        self.lost_sequences += 1
        if self.prefix is not None and self.prefix.max_entries > 0:
            self.prefix.max_entries -= 1

    def release(self, req: Request) -> None:
        """A request nobody will read again (its Generation was closed or collected): cancel it and
        free its sequence now, without a step (no other request may drive the engine for a while,
        and until then it held its cells and its place in the batch). Any thread."""
        req.dropped = True
        with self.lock:
            if req in self._incoming:
                self._incoming.remove(req)
                req.abort()
            self._drop_cancelled()
            self._retire()

    def _drop_cancelled(self) -> None:
        """Waiting requests whose client left (or whose deadline passed) leave the queue, wherever
        they sit in it."""
        sched = self.scheduler
        if any(r.should_cancel() for r in sched.waiting):
            keep = deque()
            for r in sched.waiting:
                if r.should_cancel():
                    r.abort()
                    self._close(r)
                else:
                    keep.append(r)
            sched.waiting = keep

    def _draft(self) -> None:
        """Every decoding request asks its proposers for this step's draft."""
        for r in list(self.scheduler.running):
            if r.phase == DECODE:
                try:
                    if self.draft_prefixes is not None:
                        self.draft_prefixes.catch_up(r, self.scheduler.running)
                    r.plan_draft()
                except Exception as e:  # noqa: BLE001 - a proposer failed: this request fails
                    self._fail(r, e)

    def _run(self, plan: StepPlan):
        inputs = [SeqInput(r.seq, r.step_tokens(), "all") for r in plan.decode]
        inputs += [
            SeqInput(r.seq, r.prompt_ids[r.cached : r.cached + n], "all" if r.scores_prompt else "none")
            for r, n in plan.prefill
        ]
        try:
            return self.target.forward(inputs)
        except Exception as e:  # noqa: BLE001 - every request of this pass fails; the engine lives on
            for r in plan.decode + [r for r, _ in plan.prefill]:
                self._fail(r, e)
            return None

    def _commit(self, plan: StepPlan, logits, seconds: float, tally: dict[str, list[int]]) -> None:
        """Each request takes its rows; tally gets each verified draft's source and counts."""
        for r, rows in zip(plan.decode, logits):
            try:
                r.stats.last_step = None
                keep = r.commit(rows, seconds)
                _count_step(tally, r.stats.last_step)
                # finished too: past the accepted tokens the cells hold draft tokens, and where the
                # last committed token replaced a rejected one, its cell holds the rejected token
                self.target.truncate(r.seq, keep)
            except Exception as e:  # noqa: BLE001
                self._fail(r, e)
        for (r, n), rows in zip(plan.prefill, logits[len(plan.decode) :]):
            try:
                r.prefilled(n, rows)
            except Exception as e:  # noqa: BLE001
                self._fail(r, e)

    def _retire(self) -> None:
        """Requests that finished or were cancelled leave the batch and free their caches."""
        for r in list(self.scheduler.running):
            if r.phase != FINISHED and r.should_cancel():
                r.abort()
            if r.phase == FINISHED:
                self.scheduler.stop(r)
                self._free(r)
                self._close(r)

    def _fail(self, req: Request, error: Exception) -> None:
        """The request ends with `error`, wrapped in an EngineFault (everything raised in a step is
        one), except a grammar's dead end, which is the caller's grammar at fault (a 400). A
        request that had finished keeps its answer, but not as a prefix-cache entry: what failed
        (its cut after the finishing step) leaves its cells in doubt."""
        req.fail(error if isinstance(error, (EngineFault, GrammarDeadEnd)) else EngineFault(error))
        if req in self.scheduler.running:
            self.scheduler.stop(req)
            self._free(req, cache=False)
        self._close(req)

    def _close(self, req: Request) -> None:
        """Free the request's draft sequence (never raises: the request has ended already)."""
        if getattr(req, "draft_runner", None) is not None:
            try:
                req.draft_runner.close()
            except Exception:  # noqa: BLE001
                self._lose_draft(f"request {req.id}'s")

    def abort_all(self) -> None:
        """End every request, queued or running (shutdown)."""
        with self.lock:
            while self._incoming:
                self.scheduler.waiting.append(self._incoming.popleft())
            while self.scheduler.waiting:
                req = self.scheduler.waiting.popleft()
                req.abort()
                self._close(req)
            for r in list(self.scheduler.running):
                r.abort()
            self._retire()

    def fail_all(self, error: Exception) -> None:
        """Fail every request in flight (after an unexpected error in a step, or when the thread
        that steps the engine dies): each one ends with the error, none is left waiting."""
        with self.lock:
            while self._incoming:
                self.scheduler.waiting.append(self._incoming.popleft())
            for r in list(self.scheduler.waiting) + list(self.scheduler.running):
                try:
                    self._fail(r, error)
                except Exception:  # noqa: BLE001 - freeing its cache failed: the request has its error already
                    log.exception("freeing a failed request's sequence failed")
            self.scheduler.waiting.clear()

    def _info(self, plan: StepPlan) -> StepInfo:
        # _admit has just dropped the cancelled requests: counting the queue is O(1) here, where
        # num_waiting's check of each one would make a step O(queue)
        waiting = len(self.scheduler.waiting) + len(self._incoming)
        return StepInfo(
            len(plan.decode),
            len(plan.prefill),
            plan.tokens,
            0.0,
            self.cache_used,
            waiting,
        )
