"""No request is lost: every request the engine took is answered once, whatever fails around it.

Engine internals are driven in-process on a tiny random model (transformers), stepped as the
server's worker steps them (`step_as_worker`: a step that raises fails what is in flight).
"""

from __future__ import annotations

from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve import SamplingParams, SpeculationConfig
from specserve.backends.transformers import TransformersBackend
from specserve.config import EngineLimits
from specserve.engine.request import PREFILL
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
