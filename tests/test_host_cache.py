"""The prefix cache's host tier (engine/host_cache.py): entries leaving llama.cpp's cells are
saved to host memory and restored, exactly, when a prompt starts like them (the engine's tests
run on transformers too, whose entries leave by LRU; its backend and folder:
test_host_cache_transformers.py).

- The store alone: the longest prefix, bounded by bytes (least recently used out), an earlier
  turn superseded by the next, a copy larger than the budget refused.
- The backend: a saved sequence, freed and restored under another id, goes on bit for bit like
  one fed the same tokens (the tiny f32 GGUF with batch-invariant kernels); a restore without
  room leaves the sequence empty.
- The engine: a conversation's next turn after its entry was evicted by rent prefills only the
  new part and writes what a cold run writes; without the tier it prefills everything; a failed
  restore falls back to prefilling.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import random
import subprocess
import sys
import threading

import pytest
from test_prefix_cache import FILE, GREEDY, LIMITS, fed_to, prefilled_tokens, same
from tiny import steady_prices, tiny_model, tiny_tokenizer
from tiny_gguf import write_tiny_gguf

from specserve import SamplingParams
from specserve.backends import SeqInput
from specserve.backends.base import SavedSequence
from specserve.backends.llamacpp import LlamaCppBackend
from specserve.backends.transformers import TransformersBackend
from specserve.config import SPARE_CELLS, EngineLimits
from specserve.engine import governor
from specserve.engine.client import EngineWorker
from specserve.engine.governor import CostModel
from specserve.engine.host_cache import GIB, HostCache, Saved, default_budget
from specserve.engine.host_store import INDEX, MAGIC, FolderInUse, HostStore, _file_name
from specserve.engine.prefix_cache import BLOCK, ENTRY_RENT_TOKENS, SAVED_ENTRY_RENT_TOKENS
from specserve.llm import LLM

CPU_COPY = 0.001  # a cell saved and restored, in passes: about what a CPU measures (cheaper than prefilling)


def copy_of(n_bytes: int, length: int) -> SavedSequence:
    return SavedSequence((ctypes.c_uint8 * n_bytes)(), length)


# -- the store alone ---------------------------------------------------------------------------
def test_the_longest_saved_prefix_is_found_and_the_budget_holds():
    host = HostCache(budget=1000)
    a, b = list(range(100)), list(range(40)) + [999] * 60
    assert host.put(a, copy_of(400, 100)) and host.put(b, copy_of(400, 100))
    hit = host.match(list(range(90)) + [5])
    assert hit.saved.tokens == a and hit.length == 90
    assert host.match(a).length == 99  # never the last prompt token
    assert host.match(list(range(40)) + [999] * 3 + [1]).saved.tokens == b
    assert host.match([7] + list(range(1, 50))) is None  # shares nothing
    assert host.match(list(range(BLOCK - 1)) + [5]) is None  # less than a block
    host.restored(host.match(a + [1]), ok=True)  # a was used last: b is the least recent
    assert host.put(list(range(500, 600)), copy_of(400, 100))  # 1200 bytes > 1000: b goes
    assert [s.tokens[0] for s in host.saved] == [0, 500] and host.bytes == 800
    assert not host.put(list(range(700, 800)), copy_of(1001, 100))  # larger than the whole budget
    assert host.stats()["restores"] == 1 and host.stats()["tokens_restored"] == 100


def test_a_later_turn_supersedes_the_earlier_one():
    host = HostCache(budget=10**6)
    turn1 = list(range(50))
    turn2 = turn1 + list(range(1000, 1030))
    assert host.put(turn1, copy_of(10, 50))
    assert host.put(turn2, copy_of(10, 80))
    assert [s.tokens for s in host.saved] == [turn2]  # it serves every prompt turn 1 served
    assert not host.put(turn1, copy_of(10, 50))  # already held, whole, by turn 2
    assert host.put(list(range(30)) + [5] * 30, copy_of(10, 60))  # a branch: both stay
    assert len(host.saved) == 2


def test_the_default_budget_is_a_quarter_of_free_memory_at_most():
    assert default_budget(None) == 4 * GIB
    assert default_budget(64 * GIB) == 4 * GIB
    assert default_budget(8 * GIB) == 2 * GIB


# -- the backend -------------------------------------------------------------------------------
def test_a_saved_sequence_restores_bit_for_bit(tmp_path):
    b = LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf", 0), max_sequences=4, batch_invariant=True)
    ids = tiny_tokenizer().encode(FILE)[:90]
    seq, other, ref = b.new_sequence(), b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(seq, ids[:60], "none")])
    b.forward([SeqInput(other, ids[::-1][:40], "none")])
    saved = b.save_sequence(seq)
    assert saved.length == 60 and saved.size > 0 and b.length(seq) == 60  # the sequence stays
    b.free_sequence(seq)
    again = b.new_sequence()
    with pytest.raises(ValueError):
        b.restore_sequence(other, saved)  # not empty
    assert b.restore_sequence(again, saved) and b.length(again) == 60
    (got,) = b.forward([SeqInput(again, ids[60:90], "all")])  # [30, V]
    b.forward([SeqInput(ref, ids[:60], "none")])
    (want,) = b.forward([SeqInput(ref, ids[60:90], "all")])
    assert (got == want).all()
    assert b.save_sequence(b.new_sequence()) is None  # an empty sequence has nothing to save


def test_a_restore_without_room_leaves_the_sequence_empty(tmp_path):
    b = LlamaCppBackend(
        write_tiny_gguf(tmp_path / "t.gguf", 0), max_sequences=3, cache_tokens=256, batch_invariant=True
    )
    cells = b._ll.llama_n_ctx(b._ctx)
    ids = tiny_tokenizer().encode(FILE * 8)
    assert len(ids) >= cells + 80
    seq, filler, dst = b.new_sequence(), b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(seq, ids[:80], "none")])
    saved = b.save_sequence(seq)
    b.free_sequence(seq)
    b.forward([SeqInput(filler, ids[80 : 80 + cells - 40], "none")])  # 40 cells left: no room for 80
    assert not b.restore_sequence(dst, saved)
    assert b.length(dst) == 0 and b._ll.llama_memory_seq_pos_max(b._mem, dst) == -1
    b.free_sequence(filler)
    assert b.restore_sequence(dst, saved) and b.length(dst) == 80


# -- the engine --------------------------------------------------------------------------------
def llamacpp_llm(folder, host_cache_bytes: int | None = None, host_cache_dir: str | None = None) -> LLM:
    limits = EngineLimits(**{**LIMITS.__dict__, "host_cache_bytes": host_cache_bytes, "host_cache_dir": host_cache_dir})
    target = LlamaCppBackend(
        write_tiny_gguf(folder / "t.gguf", 0),
        max_sequences=limits.max_num_seqs + 1,
        batch_invariant=True,
        prefix_sequences=4,
    )
    return tier_on(LLM.from_backends(target, tiny_tokenizer(), name="tiny", limits=limits))


def tier_on(llm: LLM) -> LLM:
    """Pin the LLM's prices (tiny.steady_prices), a cell's copy as cheap as on a CPU: timed on a
    tiny model, a copy that a loaded machine stalled priced copying above prefilling, and the host
    tier these tests need sat out (test_the_engine_tests_never_time_the_tier_off)."""
    return steady_prices(llm, copy=CPU_COPY)[0]


def transformers_llm(model=None, host_cache_bytes: int | None = None, host_cache_dir: str | None = None) -> LLM:
    """One entry slot beside the running requests: each finished request's entry pushes out the
    last (transformers has no rent: its per-sequence caches cost the others nothing)."""
    limits = dataclasses.replace(LIMITS, host_cache_bytes=host_cache_bytes, host_cache_dir=host_cache_dir)
    target = TransformersBackend(model or tiny_model("qwen2"), max_sequences=limits.max_num_seqs + 2)
    return tier_on(LLM.from_backends(target, tiny_tokenizer(), name="tiny", limits=limits))


@pytest.fixture(scope="module", params=["llama.cpp", "transformers"])
def llms(request, tmp_path_factory):
    """(with the host tier, without it, no prefix cache at all) on the same tiny GGUF, or the
    same tiny transformers model."""
    folder = tmp_path_factory.mktemp("gguf")

    def make(**kw) -> LLM:
        return llamacpp_llm(folder, **kw) if request.param == "llama.cpp" else transformers_llm(**kw)

    cold = make()
    cold.engine.core.prefix = cold.engine.core.host = None
    return make(), make(host_cache_bytes=0), cold


def evicted_turns(llm):
    """Turn 1, then an unrelated request: on llama.cpp it feeds more than the rent, on
    transformers its entry takes the only slot, and either way turn 1's entry leaves the cache.
    Returns (turn 1's prompt + answer, turn 2's prompt)."""
    llm.engine.clear_prefix_cache()
    if llm.engine.core.prefix.rent_limit is not None:
        llm.engine.core.prefix.rent_limit = SAVED_ENTRY_RENT_TOKENS  # the tier's rent, also without it
    turn1 = llm.encode(FILE + "Question one?")
    out1 = llm.generate(turn1, GREEDY)
    other = llm.encode("Something else entirely: " + FILE[::-1][:400])
    assert len(other) > SAVED_ENTRY_RENT_TOKENS
    llm.generate(other, GREEDY)
    assert not any(o.tokens[: len(turn1)] == turn1 for o in llm.engine.core.prefix.owners.values())
    return turn1 + out1.token_ids, turn1 + out1.token_ids + llm.encode("\nAnd a follow-up question:")


def test_the_next_turn_restores_an_evicted_entry(llms):
    warm, _, cold = llms
    assert warm.engine.core.prefix_stats()["host"]["copying"]  # a copy costs less than a prefill on a CPU
    held, turn2 = evicted_turns(warm)
    host = warm.engine.core.host
    assert host.stats()["entries"] >= 1
    before = host.stats()
    fed = prefilled_tokens(warm)
    out = warm.generate(turn2, GREEDY)
    same(out, cold.generate(turn2, GREEDY))
    assert out.cached_tokens in (len(held) - 1, len(held))  # the last answer token may never be fed
    assert fed[0] == len(turn2) - 1 - out.cached_tokens  # only the new part was prefilled
    after = warm.engine.core.prefix_stats()["host"]
    assert after["restores"] - before["restores"] == 1
    assert after["tokens_restored"] - before["tokens_restored"] == out.cached_tokens


def test_without_the_tier_an_evicted_entry_is_prefilled_again(llms):
    _, off, cold = llms
    assert off.engine.core.host is None
    _, turn2 = evicted_turns(off)
    out = off.generate(turn2, GREEDY)
    same(out, cold.generate(turn2, GREEDY))
    assert out.cached_tokens == 0


def test_a_failed_restore_prefills_instead(llms, monkeypatch):
    warm, _, cold = llms
    _, turn2 = evicted_turns(warm)
    core = warm.engine.core
    restore, calls = core.target.restore_sequence, []

    def fails_first(seq, saved):  # the host tier's restore fails; a later move (relocate) works
        calls.append(seq)
        return len(calls) > 1 and restore(seq, saved)

    monkeypatch.setattr(core.target, "restore_sequence", fails_first)
    failed = core.host.failed_restores
    fed = prefilled_tokens(warm)
    out = warm.generate(turn2, GREEDY)
    same(out, cold.generate(turn2, GREEDY))
    assert out.cached_tokens == 0 and fed[0] == len(turn2) - 1
    assert core.host.failed_restores == failed + 1


def test_a_branch_restores_only_the_shared_part(llms):
    """A prompt sharing the first half of a saved entry (an earlier turn edited) gets that half:
    the rest of the restored cells are cut before it prefills its own tokens."""
    warm, _, cold = llms
    held, _ = evicted_turns(warm)
    branch = held[: len(held) // 2] + warm.encode(" something else entirely")
    out = warm.generate(branch, GREEDY)
    same(out, cold.generate(branch, GREEDY))
    assert out.cached_tokens == len(held) // 2 >= BLOCK


def test_a_restore_frees_the_entry_it_was_preferred_to_when_its_cells_are_needed(tmp_path):
    """Admission spares the cell entry a prompt matches (it may be copied); when the host tier
    holds a longer prefix and the request restores that instead, the spared entry must still go
    if its cells are needed. Kept, it made a request that fits the empty cache overfill it:
    llama.cpp refused the prefill ("KV cache full") and the request failed with a 500."""
    tok, rng = tiny_tokenizer(), random.Random(0)
    path = write_tiny_gguf(tmp_path / "t.gguf", 0)

    def make(prefix_caching: bool) -> LLM:
        limits = EngineLimits(
            max_num_seqs=2, kv_cache_tokens=500, max_num_batched_tokens=1024, prefix_caching=prefix_caching
        )
        target = LlamaCppBackend(
            path, max_sequences=3, batch_invariant=True, cache_tokens=500 + SPARE_CELLS, prefix_sequences=2
        )
        return tier_on(LLM.from_backends(target, tok, name="tiny", limits=limits))

    def words(n: int) -> list[int]:
        return [rng.randrange(10, len(tok) - 10) for _ in range(n)]

    warm, cold = make(True), make(False)
    core, params = warm.engine.core, SamplingParams(max_tokens=20, ignore_eos=True)
    head = words(BLOCK)
    first = head + words(180)
    out1 = warm.generate(first, params)
    warm.generate(head + words(280), params)  # its prompt feeds more than the rent: the first goes to the host tier
    assert core.host.match(first) is not None and len(core.prefix.owners) == 1
    # the first answer's next turn, as long as the cache: it shares a block with the entry in the
    # cells and ~200 tokens with the saved one
    turn2 = first + out1.token_ids + words(490 - len(first) - len(out1.token_ids))
    req = warm.request(turn2, SamplingParams(max_tokens=10, ignore_eos=True))
    core.add(req)
    core.step()
    assert req.error is None and req.stats.cached_tokens == len(first) + len(out1.token_ids) - 1
    assert core.scheduler.reserved + core.prefix.cells <= core.scheduler.cache_tokens
    while not req.finished:
        core.step()
    assert req.error is None
    same(req.output, cold.generate(turn2, SamplingParams(max_tokens=10, ignore_eos=True)))


@pytest.mark.parametrize("kind", ["llama.cpp", "transformers"])
def test_the_draft_models_cache_is_saved_and_restored_beside_it(tmp_path, kind):
    """With a draft model, a saved entry carries the draft model's sequence too: the next turn,
    restored from host memory, feeds the draft model only the new part, and writes what a run
    without any cache writes."""

    def backend(name: str, seed: int, limits: EngineLimits):
        if kind == "transformers":  # one entry slot, as transformers_llm
            return TransformersBackend(tiny_model("qwen2", seed), max_sequences=limits.max_num_seqs + 2)
        return LlamaCppBackend(
            write_tiny_gguf(tmp_path / f"{name}-{limits.prefix_caching}.gguf", seed),
            max_sequences=limits.max_num_seqs + 1,
            batch_invariant=True,
            prefix_sequences=4,
        )

    def make(prefix_caching: bool) -> LLM:
        limits = EngineLimits(**{**LIMITS.__dict__, "prefix_caching": prefix_caching})
        t, d = backend("t", 0, limits), backend("d", 1, limits)
        return tier_on(LLM.from_backends(t, tiny_tokenizer(), d, name="tiny", speculation="draft", limits=limits))

    warm, cold = make(True), make(False)
    held, turn2 = evicted_turns(warm)
    (saved,) = [s for s in warm.engine.core.host.saved if s.tokens[:10] == held[:10]]
    assert saved.draft is not None and saved.size > saved.copy.size
    fed, cold_fed = fed_to(warm.engine.core.draft), fed_to(cold.engine.core.draft)
    out = warm.generate(turn2, GREEDY)
    assert out.stats.by_source["draft"].proposed > 0  # the draft model drafted
    same(out, cold.generate(turn2, GREEDY))
    assert out.cached_tokens >= len(held) - 1
    assert cold_fed[0] >= len(turn2) - 1  # without a cache the draft model is fed the whole prompt
    assert fed[0] < cold_fed[0] - out.cached_tokens + BLOCK  # restored, it was not fed turn 1 again


def test_the_engine_tests_never_time_the_tier_off(tmp_path, monkeypatch):
    """The engine tests here need the tier on. Timed, a copy that a loaded 2-core runner stalled
    (two of three 70 us copies preempted) priced copying above prefilling the tiny transformers
    model: the tier sat out, and three [transformers] tests failed once, then passed. Their LLMs'
    prices are pinned (tier_on); here every copy is timed as stalled for a second a cell."""
    monkeypatch.setattr(governor, "_time_copy", lambda runner: 1.0)
    for llm in (transformers_llm(), llamacpp_llm(tmp_path)):
        llm.engine.prices()
        assert llm.engine.core.prefix_stats()["host"]["copying"]


def test_the_short_rent_comes_with_the_tier(tmp_path):
    """An entry leaving the cells is cheap to bring back, so with the tier it pays rent for 64
    tokens, with --exact too (freed cells no longer take a running request's next tokens below its
    own: LLAMA_KV_CELL_ORDER); without the tier it keeps the long rent."""
    path = write_tiny_gguf(tmp_path / "t.gguf", 0)
    for exact, budget, rent in (
        (False, None, SAVED_ENTRY_RENT_TOKENS),
        (True, None, SAVED_ENTRY_RENT_TOKENS),
        (True, 0, ENTRY_RENT_TOKENS),
    ):
        target = LlamaCppBackend(path, max_sequences=3, batch_invariant=exact, prefix_sequences=2)
        limits = dataclasses.replace(LIMITS, host_cache_bytes=budget)
        llm = LLM.from_backends(target, tiny_tokenizer(), name="tiny", limits=limits)
        assert (llm.engine.core.host is not None) == (budget is None)
        assert llm.engine.core.prefix.rent_limit == rent, (exact, budget)


def test_where_a_copy_costs_more_than_a_prefill_the_tier_sits_out(tmp_path, monkeypatch):
    """On a GPU llama.cpp copies cells out over the bus row by row, dearer than prefilling them
    there (docs/gpu.md). Where the measured price of a copy (CostModel.copy) does not pay, an entry
    leaving the cells is dropped, not saved; the next turn prefills instead of restoring; entries
    keep the long rent, and a lone request is not moved (relocate copies too). Priced cheap, the
    tier is back. Unmeasured, a cache on a GPU is not trusted to copy cheaply."""
    llm = llamacpp_llm(tmp_path)
    core, curve = llm.engine.core, ((1, 1.0), (128, 45.0))  # prefilling a token: 0.35 plain passes
    llm.engine.use_prices(CostModel(curve, copy=1.0))
    assert core.prefix.rent_limit == ENTRY_RENT_TOKENS and not core._compacts
    saves = core.host.saves
    _, turn2 = evicted_turns(llm)
    assert core.host.saves == saves  # dropped, not copied out
    assert llm.generate(turn2, GREEDY).cached_tokens == 0

    llm.engine.use_prices(CostModel(curve, copy=0.001))
    assert core.prefix.rent_limit == SAVED_ENTRY_RENT_TOKENS and core._compacts
    held, turn2 = evicted_turns(llm)
    assert core.host.saves > saves
    assert llm.generate(turn2, GREEDY).cached_tokens >= len(held) - 1

    llm.engine.use_prices(None)
    assert core._copies  # host memory: trusted until measured
    monkeypatch.setattr(core.target, "on_gpu", True)
    llm.engine.use_prices(None)
    assert not core._copies and core.prefix.spill is None
    assert core.prefix_stats()["host"]["copying"] is False  # /health says so


# -- on disk, across restarts (--host-cache-dir) ---------------------------------------------------
def stored(start: int, n: int, draft: bool = False) -> Saved:
    """An entry of n tokens with random bytes as its copy (and a draft copy)."""
    tokens = list(range(start, start + n))
    copy = SavedSequence(bytearray(os.urandom(100 * n)), n)
    return Saved(tokens, copy, 0, (SavedSequence(bytearray(os.urandom(10 * n)), n), tokens) if draft else None)


def test_the_store_reads_back_what_it_wrote_newest_first_within_the_budget(tmp_path):
    store = HostStore(tmp_path, "key")
    old, mid, new = stored(0, 20), stored(100, 30, draft=True), stored(200, 40)  # 2000, 3300, 4000 bytes
    assert store.save([old, mid, new]) == 3
    back = store.load(budget=10**9)
    assert [e.tokens for e in back] == [old.tokens, mid.tokens, new.tokens]  # least recently used first
    assert bytes(back[1].copy.data) == bytes(mid.copy.data) and back[1].copy.length == 30
    assert bytes(back[1].draft[0].data) == bytes(mid.draft[0].data) and back[1].draft[1] == mid.tokens
    assert back[0].draft is None
    assert [e.tokens for e in store.load(budget=7300)] == [mid.tokens, new.tokens]
    assert [e.tokens for e in store.load(budget=6500)] == [old.tokens, new.tokens]  # mid does not fit
    # the folder holds exactly what was saved last; a damaged file is skipped, not fatal
    store.save([mid, new])
    files = sorted(store.folder.glob("*.kv"))
    assert len(files) == 2
    damaged = files[0]
    damaged.write_bytes(damaged.read_bytes()[:-7])
    assert len(store.load(budget=10**9)) == 1
    assert HostStore(tmp_path, "another key").load(budget=10**9) == []


def test_a_link_planted_where_a_file_is_written_is_not_followed(tmp_path):
    """The store wrote each file through a temp file of a name anyone could guess (pid and
    thread id), opened without O_EXCL: a symbolic link planted there made the write land in
    the file it pointed at. Temp files are now created exclusively, under a random name."""
    store, entry = HostStore(tmp_path, "key"), stored(0, 20)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in (INDEX, _file_name(entry.tokens)):  # every file the save writes
        (store.folder / f"{name}.{os.getpid()}-{threading.get_ident()}.tmp").symlink_to(victim)
    assert store.save([entry]) == 1
    assert victim.read_text() == "keep me"
    assert [e.tokens for e in store.load(budget=10**9)] == [entry.tokens]
    assert all(p.is_symlink() for p in store.folder.glob("*.tmp"))  # no temp file of its own left behind


def test_damaged_bytes_are_never_restored_and_are_written_afresh(tmp_path):
    """A file whose size and header are intact but whose bytes are not (a disk or copy fault)
    used to be restored as cells: a restarted server answered "" where a fresh one answered.
    Its checksum now fails, it is skipped, and saving the entry again rewrites it (before, a
    file of that name was kept as it was, so every restart read the damage again)."""
    store = HostStore(tmp_path, "key")
    entry = stored(0, 50, draft=True)
    store.save([entry])
    (path,) = store.folder.glob("*.kv")
    data = bytearray(path.read_bytes())
    data[-300:-200] = b"\x7f" * 100  # inside the draft's bytes: the size stays
    path.write_bytes(bytes(data))
    reader = HostStore(tmp_path, "key")
    assert reader.load(budget=10**9) == []
    reader.save([entry])
    (back,) = HostStore(tmp_path, "key").load(budget=10**9)
    assert bytes(back.copy.data) == bytes(entry.copy.data) and bytes(back.draft[0].data) == bytes(entry.draft[0].data)
    # a file of the first format has no checksum: not trusted
    header = {"tokens": entry.tokens, "length": 50, "size": entry.copy.size}
    path.write_bytes(b"specserve-kv 1\n" + json.dumps(header).encode() + b"\n" + bytes(entry.copy.data))
    assert MAGIC != b"specserve-kv 1\n" and HostStore(tmp_path, "key").load(budget=10**9) == []


def test_a_folder_that_cannot_be_locked_is_still_read(tmp_path, monkeypatch):
    """A read-only folder (or a file system without locks) used to be read and warned about on
    save; the lock must not turn it into a failed start."""
    writer = HostStore(tmp_path, "key")
    writer.save([stored(0, 20)])
    writer.close()
    real_open = os.open

    def refuse_lock(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse_lock)
    store = HostStore(tmp_path, "key")
    monkeypatch.undo()
    assert len(store.load(budget=10**9)) == 1
    store.close()


HOLD = """
import sys, time
from specserve.engine.host_store import HostStore
HostStore(sys.argv[1], sys.argv[2])
print("held", flush=True)
time.sleep(60)
"""


def test_a_folder_another_process_holds_is_left_to_it(tmp_path):
    """Each save makes the folder hold exactly the saver's entries: two servers on one folder
    deleted each other's. The second now finds the folder held, says by whom, and keeps its
    prefix cache in memory; the folder is free again once the holder stops."""
    gguf = write_tiny_gguf(tmp_path / "t.gguf", 0)

    def start() -> LLM:
        limits = dataclasses.replace(LIMITS, host_cache_dir=str(tmp_path / "kv"))
        target = LlamaCppBackend(gguf, max_sequences=limits.max_num_seqs + 1, batch_invariant=True, prefix_sequences=4)
        return LLM.from_backends(target, tiny_tokenizer(), name="tiny", limits=limits)

    llm = start()
    folder = llm.engine.core.host_store.folder
    llm.engine.core.host_store.close()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder.parent), folder.name], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(FolderInUse, match=f"in use by another process \\(pid {holder.pid}\\)"):
            HostStore(folder.parent, folder.name)
        core = start().engine.core
        assert core.host_store is None and core.host is not None
        assert f"pid {holder.pid}" in core.host_store_refused and "in memory only" in core.host_store_refused
    finally:
        holder.kill()
        holder.wait()
    HostStore(folder.parent, folder.name).close()


def test_a_restarted_engine_serves_the_next_turn_from_disk(tmp_path):
    """The engine writes its entries (those still in the cells included) when asked, as the
    server does when it stops; a new engine on the same model file reads them back, and the next
    turn prefills only its new part and answers as a cold run does. Another model file, or
    --exact against the default kernels, gets a folder of its own."""
    gguf = write_tiny_gguf(tmp_path / "t.gguf", 0)
    folder = tmp_path / "kv"

    def start(path=gguf, exact=True, host_cache_dir=str(folder)) -> LLM:
        limits = dataclasses.replace(LIMITS, host_cache_dir=host_cache_dir)
        target = LlamaCppBackend(path, max_sequences=limits.max_num_seqs + 1, batch_invariant=exact, prefix_sequences=4)
        return tier_on(LLM.from_backends(target, tiny_tokenizer(), name="tiny", limits=limits))

    written, turn1, answer = served_across_a_restart(start)
    # the entry that was still in the cells (its last token never fed)
    assert [len(e.tokens) for e in written] == [len(turn1) + len(answer) - 1]
    assert start(write_tiny_gguf(tmp_path / "u.gguf", 1)).engine.core.host.saved == []
    assert start(exact=False).engine.core.host.saved == []
    assert start().engine.save_prefix_cache() == 1  # an engine that served nothing keeps what it read


def served_across_a_restart(start) -> tuple[list[Saved], list[int], list[int]]:
    """Turn 1 on an engine from `start()` whose worker then stops (writing the tier to its
    folder, as the server does when it stops); a second engine reads it back, and turn 2 prefills
    only its new part and answers as a cold run (`start(host_cache_dir=None)`, no cache) does.
    Returns (what the folder held, turn 1's prompt, turn 1's answer)."""
    first = start()
    turn1 = first.encode(FILE + "Question one?")
    answer = first.generate(turn1, GREEDY).token_ids
    worker = EngineWorker(first.engine.core, max_queue=1)
    worker.start()
    worker.stop()
    folder = first.engine.core.host_store.folder
    written = HostStore(folder.parent, folder.name).load(GIB)
    getattr(first.engine.core.target, "close", lambda: None)()  # llama.cpp frees its context

    second = start()
    assert len(second.engine.core.host.saved) == 1
    turn2 = turn1 + answer + second.encode("\nAnd a follow-up question:")
    fed = prefilled_tokens(second)
    out2 = second.generate(turn2, GREEDY)
    assert out2.cached_tokens >= len(turn1) and fed[0] <= len(turn2) - len(turn1)
    cold = start(host_cache_dir=None)
    cold.engine.core.prefix = cold.engine.core.host = None
    same(out2, cold.generate(turn2, GREEDY))
    return written, turn1, answer


def test_a_folder_without_the_tier_is_a_clear_error():
    with pytest.raises(ValueError, match=r"--host-cache-dir.*--host-cache-gib 0"):
        EngineLimits(host_cache_dir="kv", host_cache_bytes=0)


def test_the_folder_is_written_while_the_server_runs(tmp_path):
    """A server killed without stopping (a crash, SIGKILL, a power cut) used to lose the whole
    tier: it was written only at shutdown. The worker's writer puts each entry that leaves the
    cells on disk within its interval, and writes nothing while the tier is unchanged."""
    llm = llamacpp_llm(tmp_path, host_cache_dir=str(tmp_path / "kv"))
    store = llm.engine.core.host_store
    held, _ = evicted_turns(llm)  # turn 1's entry is in the tier, not in the cells
    saves, looks = watched(store, "save"), watched(llm.engine.core, "host_snapshot")
    worker = EngineWorker(llm.engine.core, max_queue=1, save_every=0.02)
    worker.start()
    try:
        assert saves.reached(1), "the writer never wrote the tier"
        written = HostStore(store.folder.parent, store.folder.name).load(GIB)  # what a restart would read
        assert [e.tokens for e in written] == [held[: len(e.tokens)] for e in written] and len(written) == 1
        assert looks.reached(looks.calls + 10), "the writer stopped looking"  # ten intervals with nothing new
        assert saves.calls == 1  # nothing rewritten
    finally:
        worker.stop()


@dataclasses.dataclass
class Calls:
    """How often a wrapped method was called, and a way to wait for a count (watched)."""

    calls: int = 0
    changed: threading.Condition = dataclasses.field(default_factory=threading.Condition)

    def reached(self, n: int, guard_s: float = 120.0) -> bool:
        """Wait until the method has returned n times (guard_s: a liveness guard only)."""
        with self.changed:
            return self.changed.wait_for(lambda: self.calls >= n, guard_s)


def watched(obj, name: str) -> Calls:
    """Count the calls of obj.name as they return: the test waits on the writer's own steps, not
    on the clock (a 10 s deadline and a 0.2 s sleep stood for them, and a loaded machine that
    stalled the first write past 10 s failed the test)."""
    method, seen = getattr(obj, name), Calls()

    def counted(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        finally:
            with seen.changed:
                seen.calls += 1
                seen.changed.notify_all()

    setattr(obj, name, counted)
    return seen
