"""No request is lost: every request the engine took is answered once, whatever fails around it.

Engine internals are driven in-process on a tiny random model (transformers), stepped as the
server's worker steps them (`step_as_worker`: a step that raises fails what is in flight).
"""

from __future__ import annotations

import pytest
from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve import SamplingParams, SpeculationConfig
from specserve.backends.transformers import TransformersBackend
from specserve.config import EngineLimits
from specserve.engine.core import EngineFault
from specserve.engine.request import PREFILL
from specserve.errors import ContextLengthError
from specserve.llm import LLM

PLAIN = SpeculationConfig(method="none")
ENTRY = "import os\nimport sys\n\nprint('hello world')\n" * 2  # a finished request's prompt: a prefix-cache entry
SHARED = "class UserController:\n    def get_user(self, user_id):\n        return self.db.find(user_id)\n" * 2
OTHER = "def add(a, b):\n    return a + b\n" * 3
MAX_STEPS = 200  # a request that is never answered fails the test, never hangs it


class FailingFree(TransformersBackend):
    """A backend whose next `free_sequence` raises once (a backend in trouble mid-step)."""

    armed = False

    def free_sequence(self, seq: int) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("free_sequence failed")
        super().free_sequence(seq)


def tight_llm(backend) -> LLM:
    """Three requests at once in 110 cells, prefill chunks of at most 20 tokens, a prefix cache of
    one entry, no host tier; prices pinned (no measuring pass frees a sequence of its own)."""
    limits = EngineLimits(
        max_num_seqs=3, kv_cache_tokens=110, max_num_batched_tokens=20, min_prefill_chunk=4, host_cache_bytes=0
    )
    llm = LLM.from_backends(backend, tiny_tokenizer(), name="tiny", speculation="none", limits=limits)
    steady_prices(llm)
    return llm


def make(llm: LLM, text: str, max_tokens: int = 8):
    ids = tiny_tokenizer().encode(text)
    return llm.engine.request(ids, SamplingParams(max_tokens=max_tokens, temperature=0), PLAIN)


def step_as_worker(core) -> None:
    """One step as EngineWorker._serve takes it: an exception out of the step fails what is in flight."""
    try:
        core.step()
    except Exception as e:  # noqa: BLE001 - the worker's own recovery
        core.fail_all(e)


def run_out(core, requests) -> None:
    for _ in range(MAX_STEPS):
        if all(r.finished for r in requests) or not core.has_work():
            return
        step_as_worker(core)


def test_a_request_held_for_a_running_prefill_is_answered_when_the_admission_after_it_fails():
    """B waits for A's prefill (same prompt: it will copy A's cells), C behind it needs a cached
    entry evicted, and freeing that entry fails. The step raised with B set aside in a local list
    of _admit, out of the queue and out of the batch: the worker failed everything it could see,
    and B was never answered (the server's client waited for its deadline, or for ever)."""
    backend = FailingFree(tiny_model("qwen2", 0), max_sequences=5)
    llm = tight_llm(backend)
    core = llm.engine.core
    entry = make(llm, ENTRY, 4)
    core.add(entry)
    run_out(core, [entry])
    assert core.prefix.entries == 1  # its 27 cells stay cached
    a = make(llm, SHARED)
    core.add(a)
    core.step()
    assert a.phase == PREFILL and a.cached < len(a.prompt_ids) - 1  # its prompt takes several steps
    b, c = make(llm, SHARED), make(llm, OTHER)  # c fits beside a only once the entry goes
    core.add(b)
    core.add(c)
    backend.armed = True
    run_out(core, [a, b, c])
    assert not backend.armed  # the fault fired
    for r in (a, b, c):
        assert r.finished, f"request {r.id} was never answered"


class FailingSave(TransformersBackend):
    """A backend whose copies out of the cells fail (memory short for the copy's buffer)."""

    saves_tried = 0

    def save_sequence(self, seq: int):
        self.saves_tried += 1
        raise MemoryError("no memory for the copy")


def test_a_prefix_cache_entry_that_cannot_be_saved_is_dropped_and_fails_no_request():
    """Two requests run; the shorter one ends, and keeping its prefix evicts the older entry,
    whose copy to the host tier fails. The failed save escaped the step: the running request
    failed with it (the worker's fail_all; LLM.generate raised it), though the cache only lost
    an entry it could prefill again."""
    backend = FailingSave(tiny_model("qwen2", 0), max_sequences=4)  # one entry slot beside 2 requests and the spare
    limits = EngineLimits(max_num_seqs=2, max_num_batched_tokens=256, host_cache_bytes=64 << 20)
    llm = LLM.from_backends(backend, tiny_tokenizer(), name="tiny", speculation="none", limits=limits)
    steady_prices(llm)
    core = llm.engine.core
    first = make(llm, ENTRY, 4)
    core.add(first)
    run_out(core, [first])
    assert core.prefix.entries == 1
    short, long = make(llm, OTHER, 2), make(llm, SHARED, 12)
    core.add(short)
    core.add(long)
    run_out(core, [short, long])
    assert backend.saves_tried  # the eviction tried to save the entry
    for r in (first, short, long):
        assert r.finished and r.error is None, f"request {r.id} failed: {r.error}"
    assert len(long.output.token_ids) == 12
    assert core.prefix.entries == 1 and core.host.stats()["entries"] == 0  # the newest entry stays; none was saved


class Faulty(TransformersBackend):
    """A backend whose chosen call raises once, when `arm`'s condition holds for its arguments (a
    backend in trouble with one sequence); `on_new` runs at each `new_sequence`."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.faults: dict[str, object] = {}
        self.fired: list[str] = []
        self.on_new = None

    def arm(self, method: str, when) -> None:
        self.faults[method] = when

    def _fault(self, method: str, *args) -> None:
        when = self.faults.get(method)
        if when is not None and when(*args):
            del self.faults[method]
            self.fired.append(method)
            raise RuntimeError(f"{method} failed")

    def free_sequence(self, seq: int) -> None:
        self._fault("free_sequence", seq)
        super().free_sequence(seq)

    def truncate(self, seq: int, length: int) -> None:
        self._fault("truncate", seq, length)
        super().truncate(seq, length)

    def length(self, seq: int) -> int:
        self._fault("length", seq)
        return super().length(seq)

    def new_sequence(self) -> int:
        if self.on_new is not None:
            self.on_new()
        return super().new_sequence()


def faulty_llm(**limits) -> tuple[LLM, Faulty]:
    """An engine of three requests on a Faulty backend (five sequence ids: one prefix-cache entry
    slot beside them and the spare one), no host tier, prices pinned."""
    backend = Faulty(tiny_model("qwen2", 0), max_sequences=5)
    limits = EngineLimits(**({"max_num_seqs": 3, "host_cache_bytes": 0} | limits))
    llm = LLM.from_backends(backend, tiny_tokenizer(), name="tiny", speculation="none", limits=limits)
    steady_prices(llm)
    return llm, backend


def long_make(llm: LLM, text: str, max_tokens: int):
    """A request that writes exactly max_tokens tokens."""
    ids = tiny_tokenizer().encode(text)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return llm.engine.request(ids, params, PLAIN)


def final_events(r) -> list[str]:
    return [e.finish_reason for e in r.events if e.finish_reason is not None]


def answered(r, tokens: int) -> None:
    """The request ended once, with its whole answer and no error."""
    assert r.finished and r.error is None, f"request {r.id} failed: {r.error}"
    assert len(r.output.token_ids) == tokens
    assert final_events(r) == ["length"]


def test_a_finished_request_whose_sequence_cannot_be_freed_keeps_its_answer_and_fails_no_other():
    """The short request ends and its free raises at its retirement: the step raised, and the
    worker failed the long one beside it. Now the sequence is retired: its cells leave the cache
    (admission must not promise them again), and later requests run."""
    llm, backend = faulty_llm(prefix_caching=False)
    core = llm.engine.core
    short, long = long_make(llm, OTHER, 2), long_make(llm, SHARED, 12)
    backend.arm("free_sequence", lambda seq: seq == short.seq)
    cache = core.scheduler.cache_tokens
    core.add(short)
    core.add(long)
    run_out(core, [short, long])
    assert backend.fired == ["free_sequence"]
    answered(short, 2)
    answered(long, 12)
    held = backend.length(short.seq)  # still allocated in the backend: never freed again, never reused
    assert held > 0 and core.lost_sequences == 1
    assert core.scheduler.cache_tokens == cache - held and core.scheduler.reserved == 0
    later = long_make(llm, OTHER, 4)
    core.add(later)
    run_out(core, [later])
    answered(later, 4)
    assert later.seq != short.seq and short.seq in backend._caches


def test_a_queued_request_that_no_longer_fits_the_shrunk_cache_fails_instead_of_waiting_for_ever():
    """The first request's sequence cannot be freed: its cells are out of use, and the second,
    queued for them, can never fit. It ends with the context-length error, not a wait."""
    llm, backend = faulty_llm(prefix_caching=False, kv_cache_tokens=100)
    core = llm.engine.core
    first, big = long_make(llm, OTHER, 8), long_make(llm, SHARED, 30)  # 46 + 73 cells: one at a time
    backend.arm("free_sequence", lambda seq: seq == first.seq)
    core.add(first)
    core.add(big)
    run_out(core, [first, big])
    answered(first, 8)
    assert isinstance(big.error.__cause__, ContextLengthError), big.error
    assert final_events(big) == ["error"] and not core.has_work()


def test_an_evicted_entry_whose_free_fails_is_dropped_and_fails_no_request():
    """Admitting c evicts the cached entry, and freeing it raises: the step raised out of its
    admission, and the worker failed a, b and c though none was at fault."""
    llm, backend = faulty_llm(kv_cache_tokens=110, max_num_batched_tokens=20, min_prefill_chunk=4)
    core = llm.engine.core
    entry = long_make(llm, ENTRY, 4)
    core.add(entry)
    run_out(core, [entry])
    assert core.prefix.entries == 1
    a = long_make(llm, SHARED, 8)
    core.add(a)
    core.step()
    b, c = long_make(llm, SHARED, 8), long_make(llm, OTHER, 8)
    backend.arm("free_sequence", lambda seq: seq == entry.seq)
    core.add(b)
    core.add(c)
    run_out(core, [a, b, c])
    assert backend.fired == ["free_sequence"]
    for r in (a, b, c):
        answered(r, 8)
    assert entry.seq not in core.prefix.owners and core.lost_sequences == 1


def test_an_entry_released_after_its_sibling_copied_it_fails_no_request_when_its_free_fails():
    """`again` copies the entry `first` left and the entry is released (`_reused`); freeing it
    raises. That escaped the admission after `again` had joined the batch: both running requests
    failed."""
    llm, backend = faulty_llm()
    core = llm.engine.core
    first = long_make(llm, SHARED, 4)
    core.add(first)
    run_out(core, [first])
    assert core.prefix.entries == 1
    other, again = long_make(llm, OTHER, 12), long_make(llm, SHARED, 4)
    backend.arm("free_sequence", lambda seq: seq == first.seq)
    core.add(other)
    core.add(again)
    run_out(core, [other, again])
    assert backend.fired == ["free_sequence"]
    answered(other, 12)
    answered(again, 4)
    assert again.cached > 0 and first.seq not in core.prefix.owners


def test_a_finished_request_whose_sequence_cannot_be_cut_is_not_cached_and_fails_no_request():
    """Keeping the finished request's sequence as an entry cuts it first, and the cut raises: the
    step raised out of the retirement, failing the request beside it."""
    llm, backend = faulty_llm()
    core = llm.engine.core
    short, long = long_make(llm, SHARED, 3), long_make(llm, OTHER, 12)
    backend.arm("truncate", lambda seq, n: seq == short.seq and short not in core.scheduler.running)
    core.add(short)
    core.add(long)
    run_out(core, [short, long])
    assert backend.fired == ["truncate"]
    answered(short, 3)
    answered(long, 12)
    assert short.seq not in core.prefix.owners and short.seq not in backend._caches  # freed, not kept


def test_a_request_failing_in_its_commit_ends_with_its_error_when_its_sequence_cannot_be_freed():
    """`bad`'s commit raises (its cut after verification) and `_fail` frees its sequence, which
    raises too: out of `_fail`, out of the step, and the worker failed `good` with it."""
    llm, backend = faulty_llm()
    core = llm.engine.core
    bad, good = long_make(llm, SHARED, 12), long_make(llm, OTHER, 12)
    backend.arm("truncate", lambda seq, n: seq == bad.seq)
    backend.arm("free_sequence", lambda seq: seq == bad.seq)
    core.add(bad)
    core.add(good)
    run_out(core, [bad, good])
    assert sorted(backend.fired) == ["free_sequence", "truncate"]
    assert isinstance(bad.error, EngineFault) and "truncate failed" in str(bad.error)
    assert final_events(bad) == ["error"]
    answered(good, 12)
    assert bad.seq not in core.prefix.owners and core.lost_sequences == 1


def test_a_request_finished_in_a_commit_whose_cut_fails_keeps_its_answer_and_is_not_cached():
    """The cut after the finishing step raises: the request has its answer and keeps it, but its
    cells past the answer hold the step's draft (or a rejected token): it was kept as a
    prefix-cache entry all the same, for later prompts to copy."""
    llm, backend = faulty_llm()
    core = llm.engine.core
    done, other = long_make(llm, SHARED, 3), long_make(llm, OTHER, 12)
    backend.arm("truncate", lambda seq, n: seq == done.seq and done.finished)
    core.add(done)
    core.add(other)
    for _ in range(MAX_STEPS):  # until done leaves (later, other's own entry would evict it)
        if done.finished and done not in core.scheduler.running:
            break
        step_as_worker(core)
    assert backend.fired == ["truncate"]
    answered(done, 3)
    assert done.seq not in core.prefix.owners and done.seq not in backend._caches
    run_out(core, [other])
    answered(other, 12)


def test_num_waiting_counts_the_requests_an_admission_holds_aside_or_is_admitting():
    """b waits for a's prefill (set aside in the admission's own list) while c is admitted: other
    threads read num_waiting as 0 meanwhile (an admission may measure prices for seconds), and
    the server's queue-full check let that many more requests in."""
    llm, backend = faulty_llm(max_num_batched_tokens=20, min_prefill_chunk=4)
    core = llm.engine.core
    a = long_make(llm, SHARED, 4)
    core.add(a)
    core.step()
    assert a.phase == PREFILL
    seen = []
    backend.on_new = lambda: seen.append(core.num_waiting)
    b, c = long_make(llm, SHARED, 4), long_make(llm, OTHER, 4)
    core.add(b)
    core.add(c)
    core.step()
    assert seen == [2] and core.num_waiting == 1  # b, c while c is admitted; b after
    backend.on_new = None
    run_out(core, [a, b, c])
    for r in (a, b, c):
        answered(r, 4)


def test_a_draft_sequence_that_cannot_be_freed_fails_no_request():
    """The short request ends, and closing its draft sequence raises (the draft model's free): out
    of the retirement, out of the step, and the long request beside it failed."""
    target, draft = (
        TransformersBackend(tiny_model("qwen2", 0), max_sequences=5),
        Faulty(tiny_model("qwen2", 1), max_sequences=5),
    )
    limits = EngineLimits(max_num_seqs=3, host_cache_bytes=0, prefix_caching=False)
    llm = LLM.from_backends(target, tiny_tokenizer(), draft, name="tiny", speculation="draft", limits=limits)
    steady_prices(llm)
    core = llm.engine.core
    ids = tiny_tokenizer().encode(OTHER), tiny_tokenizer().encode(SHARED)
    spec = SpeculationConfig(method="draft")
    short, long = (
        llm.engine.request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), spec)
        for p, n in zip(ids, (2, 12))
    )
    draft.arm("free_sequence", lambda seq: short.finished and seq == short.draft_runner.seq)
    core.add(short)
    core.add(long)
    run_out(core, [short, long])
    assert draft.fired == ["free_sequence"]
    answered(short, 2)
    answered(long, 12)
    assert core.lost_sequences == 1


def test_an_entry_whose_draft_sequence_cannot_be_freed_fails_no_request():
    """The short request's entry evicts the older one, and freeing the draft sequence kept beside
    it raises: out of the retirement, out of the step, and the long request beside it failed."""
    target, draft = (
        TransformersBackend(tiny_model("qwen2", 0), max_sequences=5),
        Faulty(tiny_model("qwen2", 1), max_sequences=5),
    )
    limits = EngineLimits(max_num_seqs=3, host_cache_bytes=0)  # one entry slot
    llm = LLM.from_backends(target, tiny_tokenizer(), draft, name="tiny", speculation="draft", limits=limits)
    steady_prices(llm)
    core = llm.engine.core
    spec = SpeculationConfig(method="draft")

    def request(text: str, n: int):
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        return llm.engine.request(tiny_tokenizer().encode(text), params, spec)

    first = request(ENTRY, 4)
    core.add(first)
    run_out(core, [first])
    kept = core.draft_prefixes.held[first.seq][0]  # the draft sequence beside first's entry
    short, long = request(OTHER, 2), request(SHARED, 12)
    draft.arm("free_sequence", lambda seq: seq == kept)
    core.add(short)
    core.add(long)
    run_out(core, [short, long])
    assert draft.fired == ["free_sequence"]
    answered(short, 2)
    answered(long, 12)
    assert first.seq not in core.prefix.owners and core.lost_sequences == 1


def test_a_draft_sequence_that_cannot_be_kept_leaves_its_entry_without_it_and_fails_no_request():
    """The short request's entry keeps its draft sequence, and the draft backend raises while it
    is kept (reading its length, to cut it to the tokens both hold): out of the retirement, out
    of the step, and the long request beside it failed. The entry stays without draft cells (a
    later draft reads the prompt again), and the draft sequence goes with the request."""
    target, draft = (
        TransformersBackend(tiny_model("qwen2", 0), max_sequences=5),
        Faulty(tiny_model("qwen2", 1), max_sequences=5),
    )
    limits = EngineLimits(max_num_seqs=3, host_cache_bytes=0)
    llm = LLM.from_backends(target, tiny_tokenizer(), draft, name="tiny", speculation="draft", limits=limits)
    steady_prices(llm)
    core = llm.engine.core
    spec = SpeculationConfig(method="draft")
    short, long = (
        llm.engine.request(
            tiny_tokenizer().encode(p), SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), spec
        )
        for p, n in ((SHARED, 5), (OTHER, 12))
    )
    draft.arm("length", lambda seq: short.finished and short not in core.scheduler.running)
    core.add(short)
    core.add(long)
    run_out(core, [short, long])
    assert draft.fired == ["length"]
    answered(short, 5)
    answered(long, 12)
    assert short.seq not in core.draft_prefixes.held and short.draft_runner.seq is None  # freed with the request


class CallerBug(Exception):
    """Raised by a caller's own callback."""


def _raises_after(calls: int, error: Exception):
    """A callback that returns normally `calls` times, then raises `error` every time."""
    seen = []

    def callback(*_args):
        seen.append(1)
        if len(seen) > calls:
            raise error
        return False

    return callback


@pytest.mark.parametrize(("callback", "calls"), [("should_cancel", 3), ("on_event", 1)])
def test_a_caller_s_callback_that_raises_ends_that_request_with_its_error_and_no_other(callback, calls):
    """`should_cancel` (LLM.stream's and LLM.request's own parameter) raised out of the step, and
    `on_event` (LLM.request's, the server's streams) inside the step's commit and again inside the
    failure handler: either way the worker failed every request in the batch with the caller's error."""
    llm = tight_llm(TransformersBackend(tiny_model("qwen2", 0), max_sequences=5))
    core = llm.engine.core
    ids = tiny_tokenizer().encode(OTHER)
    params = SamplingParams(max_tokens=8, temperature=0)
    bug = CallerBug(f"the caller's {callback} is broken")
    broken = llm.engine.request(ids, params, PLAIN, **{callback: _raises_after(calls, bug)})
    fine = make(llm, SHARED)
    core.add(broken)
    core.add(fine)
    run_out(core, [broken, fine])
    assert broken.finished and broken.error is bug  # its caller gets its own error back
    assert fine.finished and fine.error is None and len(fine.output.token_ids) == 8
