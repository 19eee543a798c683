"""Automatic prefix caching (engine/prefix_cache.py): reuse is exact, bounded, and never leaks.

- The index alone: the longest prefix by chained block hashes, extended into a partial block,
  checked against the tokens, LRU eviction.
- Exactness: greedy float32 (tiny models on transformers, the tiny f32 GGUF on llama.cpp with
  its batch-invariant kernels, and the SmolLM2 pack with exact=True): a conversation's next turn
  started from a cached prefix, and n = 4 copies of one prompt, give the outputs of cold runs,
  with `cached_tokens` equal to the reused prefix and only the rest prefilled.
- Pressure: more distinct prefixes than the cache holds; every request finishes, a request the
  size of the whole cache is admitted at once, and afterwards the cache holds the entries alone
  (llama.cpp: no cell held by any other sequence; dropping them leaves an empty cache).
- Concurrency: requests sharing a prefix with a request that is cancelled mid-way.
- The server: a two-turn conversation through the openai SDK reports cached_tokens on turn 2.
"""

from __future__ import annotations

import time

import openai
import pytest
from server_proc import ServerProcess, metric_value
from tiny import steady_prices, tiny_model, tiny_tokenizer
from tiny_gguf import save_tiny_gguf, write_tiny_gguf

from specserve import SamplingParams
from specserve.backends import SeqInput
from specserve.backends.llamacpp import LlamaCppBackend
from specserve.backends.transformers import TransformersBackend
from specserve.bench.curves import LLAMACPP_2CORE_CURVE
from specserve.config import EngineLimits
from specserve.engine import prefix_cache
from specserve.engine.core import SPARE_CELLS
from specserve.engine.governor import CostModel
from specserve.engine.prefix_cache import BLOCK, PrefixCache, common_prefix
from specserve.llm import LLM

LIMITS = EngineLimits(max_num_seqs=4, max_num_batched_tokens=512, min_prefill_chunk=16)
FILE = (
    "class UserController:\n    def get_user(self, user_id):\n        return self.db.find(user_id)\n"
    "import os\nimport sys\n\nprint('hello world')\n"
) * 3
GREEDY = SamplingParams(max_tokens=24)


# -- the index alone ---------------------------------------------------------------------------
def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 5]) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 2, 3], limit=2) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([9], [1]) == 0


def test_index_finds_the_longest_prefix_and_evicts_lru():
    freed = []
    cache = PrefixCache(freed.append, max_entries=2)
    a = list(range(100))
    b = list(range(40)) + [999] * 60  # shares 40 tokens with a: two blocks and 8 more
    assert cache.keep(1, a, 70) and cache.keep(2, b, 100)
    hit = cache.match(list(range(90)) + [5])  # a holds 70 of its 90 shared tokens
    assert (hit.seq, hit.length, hit.entry, hit.whole) == (1, 70, True, True)
    hit = cache.match(list(range(40)) + [999] * 5 + [7])
    assert (hit.seq, hit.length, hit.whole) == (2, 45, False)
    assert cache.match(list(range(60))).length == 59  # never the last prompt token
    assert cache.match(list(range(BLOCK - 1)) + [5]) is None  # less than a block
    assert cache.match([7] + list(range(1, 40))) is None  # differs in the first block
    # a live sequence is found too, and never evicted
    cache.track(3, list(range(200, 300)), 50)
    assert cache.match(list(range(200, 260))).seq == 3
    assert cache.keep(4, list(range(500, 600)), 100)  # a third entry: the least recently used (2) goes
    assert freed == [2] and set(cache.owners) == {1, 3, 4} and cache.cells == 170
    hit = cache.match(list(range(40)) + [999] * 5 + [7])  # 2's blocks left the index; 1 shares 40 tokens
    assert (hit.seq, hit.length) == (1, 40)
    cache.clear()
    assert sorted(freed) == [1, 2, 4] and set(cache.owners) == {3} and cache.cells == 0


def test_an_unused_entry_pays_rent_until_it_goes():
    freed = []
    cache = PrefixCache(freed.append, max_entries=4, rent_limit=100)
    a, b = list(range(64)), list(range(100, 164))
    assert cache.keep(1, a, 64) and cache.keep(2, b, 64)
    assert cache.charge(60) == 0 and not freed
    assert cache.match(a + [7]).seq == 1  # chosen: its rent starts again
    assert cache.charge(50) == 1 and freed == [2]  # 110 tokens fed since b was kept
    assert cache.charge(49) == 0 and cache.charge(1) == 1 and freed == [2, 1]
    assert cache.entries == 0
    free_cache = PrefixCache(freed.append, max_entries=4)  # no rent_limit: entries cost nothing
    free_cache.keep(3, a, 64)
    assert free_cache.charge(10**6) == 0 and free_cache.entries == 1


class BoundedEvictions(PrefixCache):
    """A PrefixCache whose evictions are counted, so that a loop that never ends fails the test."""

    evictions = 0

    def evict(self, keep=None):
        self.evictions += 1
        assert self.evictions < 10, "keep() evicts for ever"
        return super().evict(keep)


def test_keeping_an_entry_while_the_slots_shrink_keeps_it_not():
    """Keeping an entry evicts the older one, whose free fails: the engine retires that sequence
    and gives up its entry slot (EngineCore._lose), here the only one. keep() went on evicting
    with nothing left to evict, for ever."""
    cache = None

    def lose(seq: int) -> None:  # what EngineCore._free_entry does when the backend's free raises
        cache.max_entries -= 1

    cache = BoundedEvictions(lose, max_entries=1)
    assert cache.keep(1, list(range(40)), 40)
    assert not cache.keep(2, list(range(100, 140)), 40)  # the caller frees it
    assert cache.entries == 0 and not cache.owners and cache.max_entries == 0


def test_a_hash_collision_is_not_a_match(monkeypatch):
    monkeypatch.setattr(prefix_cache, "hash", lambda t: 0, raising=False)  # every block collides
    cache = PrefixCache(lambda seq: None, max_entries=1)
    cache.keep(1, list(range(40)), 40)
    assert cache.match([5] * 41) is None
    assert cache.match(list(range(41))).length == 40


# -- backends ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["transformers", "llama.cpp"])
def test_copy_prefix_continues_like_a_cold_sequence(backend, tmp_path):
    """A copied prefix gives the logits a sequence fed the same tokens gives, also once the
    source is freed (llama.cpp: its cells stay while the copy holds them)."""
    if backend == "llama.cpp":
        b = LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf", 0), max_sequences=3, batch_invariant=True)
    else:
        b = TransformersBackend(tiny_model("qwen2", 0), max_sequences=3)
    ids = tiny_tokenizer().encode(FILE)[:60]
    src, dst, ref = b.new_sequence(), b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(src, ids[:40], "none")])
    with pytest.raises(ValueError):
        b.copy_prefix(src, dst, 41)  # more than the source holds
    b.copy_prefix(src, dst, 30)
    assert b.length(dst) == 30 and b.length(src) == 40
    with pytest.raises(ValueError):
        b.copy_prefix(src, dst, 10)  # dst is not empty
    b.free_sequence(src)
    (got,) = b.forward([SeqInput(dst, ids[30:60], "all")])  # [30, V]
    b.forward([SeqInput(ref, ids[:30], "none")])
    (want,) = b.forward([SeqInput(ref, ids[30:60], "all")])
    if backend == "llama.cpp":
        assert (got == want).all()  # batch-invariant kernels: bit for bit
    else:
        assert (got - want).abs().max() < 1e-4 and (got.argmax(-1) == want.argmax(-1)).all()


def test_relocate_moves_a_scattered_sequence_bit_for_bit(tmp_path):
    """llama.cpp's `relocate` (save, remove, restore) keeps a sequence's keys and values: a
    sequence whose cells were interleaved with two others' goes on exactly like one fed the same
    tokens in one piece (batch-invariant kernels: bit for bit). An empty sequence is left alone."""
    b = LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf", 0), max_sequences=4, batch_invariant=True)
    ids = tiny_tokenizer().encode(FILE)[:90]
    first, seq, second, ref = b.new_sequence(), b.new_sequence(), b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(first, ids[:50], "none")])
    b.forward([SeqInput(seq, ids[:40], "none")])
    b.forward([SeqInput(second, ids[::-1][:50], "none")])
    b.forward([SeqInput(seq, ids[40:60], "none")])  # its cells now lie in two runs
    b.free_sequence(first)
    b.free_sequence(second)
    assert b.relocate(seq)
    assert b.length(seq) == 60
    (got,) = b.forward([SeqInput(seq, ids[60:90], "all")])  # [30, V]
    b.forward([SeqInput(ref, ids[:60], "none")])
    (want,) = b.forward([SeqInput(ref, ids[60:90], "all")])
    assert (got == want).all()
    empty = b.new_sequence()
    assert not b.relocate(empty)
    assert b.length(empty) == 0


def test_relocate_that_cannot_save_leaves_the_sequence_as_it_was(tmp_path, monkeypatch):
    """If llama.cpp cannot save the sequence, nothing is removed: it goes on as before."""
    b = LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf", 0), max_sequences=2, batch_invariant=True)
    ids = tiny_tokenizer().encode(FILE)[:50]
    seq, ref = b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(seq, ids[:40], "none")])
    monkeypatch.setattr(b._ll, "llama_state_seq_get_data", lambda *args: 0)
    assert not b.relocate(seq)
    monkeypatch.undo()
    assert b.length(seq) == 40
    (got,) = b.forward([SeqInput(seq, ids[40:50], "all")])
    b.forward([SeqInput(ref, ids[:40], "none")])
    (want,) = b.forward([SeqInput(ref, ids[40:50], "all")])
    assert (got == want).all()


# -- engines -----------------------------------------------------------------------------------
def tiny_llm(
    backend: str, prefix_caching: bool = True, limits: EngineLimits = LIMITS, entries: int = 4, folder=None
) -> LLM:
    """A tiny LLM on `backend`, the prefix cache on or off. Its prices are pinned (`steady_prices`):
    timed on a busy machine, the tiny model's passes priced drafts so dear that a prediction
    drafted 2 tokens a step, and a test that needs a draft past a given token failed by chance."""
    return steady_prices(_tiny_llm(backend, prefix_caching, limits, entries, folder))[0]


def _tiny_llm(backend: str, prefix_caching: bool, limits: EngineLimits, entries: int, folder) -> LLM:
    limits = EngineLimits(**{**limits.__dict__, "prefix_caching": prefix_caching})
    if backend == "llama.cpp":
        cells = limits.kv_cache_tokens + SPARE_CELLS if limits.kv_cache_tokens else None
        target = LlamaCppBackend(
            write_tiny_gguf(folder / f"t-{prefix_caching}.gguf", 0),
            max_sequences=limits.max_num_seqs + 1,
            batch_invariant=True,
            cache_tokens=cells,
            prefix_sequences=entries,
        )
        return LLM.from_backends(target, tiny_tokenizer(), name="tiny", limits=limits)
    target = TransformersBackend(tiny_model("qwen2", 0), max_sequences=limits.max_num_seqs + 1 + entries)
    return LLM.from_backends(target, tiny_tokenizer(), name="tiny", limits=limits)


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def pair(request, tmp_path_factory):
    """(with the prefix cache, without it) on the same weights."""
    folder = tmp_path_factory.mktemp("gguf")
    return tiny_llm(request.param, True, folder=folder), tiny_llm(request.param, False, folder=folder)


def prefilled_tokens(llm) -> list[int]:
    """Counts the prompt tokens the target is fed as prefill chunks (logits "none")."""
    fed = [0]
    backend = llm.engine.core.target
    forward = backend.forward

    def counting(inputs):
        fed[0] += sum(len(x.token_ids) for x in inputs if x.logits == "none")
        return forward(inputs)

    backend.forward = counting
    return fed


def same(a, b) -> None:
    assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)


def test_next_turn_equals_a_cold_run(pair):
    warm, cold = pair
    warm.engine.clear_prefix_cache()
    turn1 = warm.encode(FILE + "Question one?")
    out1 = warm.generate(turn1, GREEDY)
    assert out1.cached_tokens == 0
    turn2 = turn1 + out1.token_ids + warm.encode("\nAnd a follow-up question:")
    fed = prefilled_tokens(warm)
    out2 = warm.generate(turn2, GREEDY)
    same(out2, cold.generate(turn2, GREEDY))
    # turn 1's cache: its prompt and output, but the last token (never fed) unless it came in an accepted draft
    held = len(turn1) + len(out1.token_ids)
    assert out2.cached_tokens == out2.stats.cached_tokens in (held - 1, held)
    assert fed[0] == len(turn2) - 1 - out2.cached_tokens  # only the new part was prefilled
    # the prefix of an earlier, partly shared prompt: a branch from the middle of turn 1
    branch = turn1[: len(turn1) // 2] + warm.encode(" something else entirely")
    out3 = warm.generate(branch, GREEDY)
    same(out3, cold.generate(branch, GREEDY))
    assert out3.cached_tokens == common_prefix(branch, turn1, len(branch) - 1) >= BLOCK


def test_an_answer_ending_on_a_recovered_token_caches_no_rejected_draft(pair):
    """Turn 1 ends (here on a stop string; EOS and the context limit alike) at the token the target
    wrote where it rejected a draft token: that token was never fed, and the cell after the accepted
    tokens holds the rejected draft token's keys. The entry must not claim it, or turn 2 (which
    re-sends turn 1's answer) reads them as the answer's last token and writes other logprobs."""
    warm, cold = pair
    warm.engine.clear_prefix_cache()
    turn1 = warm.encode(FILE + "Question one?")
    plain = cold.generate(turn1, GREEDY).token_ids
    text = [warm.tokenizer.decode(plain[: i + 1]) for i in range(len(plain))]
    m = next(i for i in range(2, 8) if warm.tokenizer.decode([plain[i]]) not in text[i - 1] and text[i] != text[i - 1])
    wrong = next(t for t in range(10, 100) if t != plain[m])
    stop = SamplingParams(max_tokens=24, stop=(warm.tokenizer.decode([plain[m]]),))
    out1 = warm.generate(turn1, stop, prediction=plain[:m] + [wrong] + plain[m + 1 :], speculation="prediction")
    # the answer's last token (the stop string's, left out of token_ids) replaced the draft's wrong token
    assert out1.token_ids == plain[:m] and out1.stats.output_tokens == m + 1 and out1.finish_reason == "stop"
    last = out1.steps[-1]
    assert last["source"] == "prediction" and last["accepted"] < last["proposed"]
    turn2 = turn1 + plain[: m + 1] + warm.encode("\nAnd a follow-up question:")
    scored = SamplingParams(max_tokens=8, logprobs=3)
    out2, expected = warm.generate(turn2, scored), cold.generate(turn2, scored)
    same(out2, expected)
    assert [lp.logprob for lp in out2.logprobs] == pytest.approx([lp.logprob for lp in expected.logprobs], abs=1e-5)
    assert out2.cached_tokens == len(turn1) + m  # the answer's last token was never fed


def test_a_second_answer_to_the_same_file_releases_the_first(pair):
    """A request sharing most of an entry's prompt (a second edit of the same file) is its sibling:
    once it has the prefix, the entry goes, so on llama.cpp's unified cache the first answer's
    cells are not attended over by every pass of the second. An entry that shares only a little
    (a common opening) stays."""
    warm, cold = pair
    core = warm.engine.core
    warm.engine.clear_prefix_cache()
    first = warm.encode(FILE + "Question one?")
    warm.generate(first, GREEDY)
    (old,) = [o.seq for o in core.prefix.owners.values()]
    opening = warm.encode(FILE[:120] + " an unrelated question")  # shares a block or two: not a sibling
    assert 0 < (hit := core.prefix.match(opening)).length < prefix_cache.SIBLING_SHARE * len(first)
    assert not hit.sibling
    same(warm.generate(opening, GREEDY), cold.generate(opening, GREEDY))
    assert old in core.prefix.owners  # kept beside the new entry
    second = warm.encode(FILE + "Question two?")
    assert core.prefix.match(second).sibling
    out = warm.generate(second, GREEDY)
    same(out, cold.generate(second, GREEDY))
    assert out.cached_tokens >= len(warm.encode(FILE)) - BLOCK  # the file came from the cache
    assert old not in core.prefix.owners
    target = core.target
    if isinstance(target, LlamaCppBackend):  # none of its cells is held under its id any more
        assert target._ll.llama_memory_seq_pos_max(target._mem, old) == -1


def test_entries_pay_rent_on_llamacpp_alone(pair):
    """Only llama.cpp's unified cache makes held cells slow the other requests; there an entry
    that no request uses while the engine feeds rent_limit tokens is released."""
    warm, cold = pair
    core = warm.engine.core
    warm.engine.clear_prefix_cache()
    llamacpp = isinstance(core.target, LlamaCppBackend)
    # with a host tier an entry leaving the cells is saved, not lost, and its rent is far shorter
    # (with --exact too: its sequences keep their cells in position order, engine/core.py)
    # (transformers has the tier too, for entries pushed out by LRU: test_host_cache_transformers.py)
    assert core.prefix.rent_limit == (prefix_cache.SAVED_ENTRY_RENT_TOKENS if llamacpp else None)
    assert core.host is not None
    saved, core.prefix.rent_limit = core.prefix.rent_limit, (60 if llamacpp else None)
    try:
        warm.generate(warm.encode(FILE + "Question one?"), GREEDY)
        (old,) = [o.seq for o in core.prefix.owners.values()]
        other = warm.encode("Something else entirely: " + FILE[::-1][:150])  # ~70 tokens fed, nothing shared
        same(warm.generate(other, GREEDY), cold.generate(other, GREEDY))
        assert (old in core.prefix.owners) is not llamacpp
    finally:
        core.prefix.rent_limit = saved


def test_rent_counts_every_token_a_pass_verifies(pair):
    """A speculative step feeds its pending token and its draft, and an entry's rent grows by all
    of them: a request that writes its answer from a prediction in a few steps still charges
    every token it verified. (Charged after the commit, the step used to count one token.)"""
    warm, cold = pair
    core = warm.engine.core
    warm.engine.clear_prefix_cache()
    other = warm.encode("Something else entirely: " + FILE[::-1][:150])
    want = cold.generate(other, GREEDY)
    saved = core.prefix.rent_limit
    try:
        warm.generate(warm.encode(FILE + "Question one?"), GREEDY)
        (old,) = [o.seq for o in core.prefix.owners.values()]
        # fed: the prompt but its last token as prefill, then at least one token per output token
        core.prefix.rent_limit = len(other) - 1 + len(want.token_ids) - 1
        out = warm.generate(other, GREEDY, prediction=want.text, speculation="prediction")
        same(out, want)
        assert out.stats.steps < len(want.token_ids) - 2  # drafts were verified in bulk
        assert old not in core.prefix.owners
    finally:
        core.prefix.rent_limit = saved


def test_a_lone_request_moves_down_once_the_entry_below_it_goes(pair):
    """llama.cpp: a request admitted beside an entry is placed above the entry's cells. While the
    entry stays, nothing moves; once rent releases it mid-request, the request, alone in the
    cache, is moved to its start (`relocate`) once, and still writes what a cold run writes.
    Transformers keeps no shared cells and never moves anything."""
    warm, cold = pair
    core = warm.engine.core
    llamacpp = isinstance(core.target, LlamaCppBackend)
    assert core._compacts is llamacpp
    moved = []
    if llamacpp:
        relocate = core.target.relocate

        def spy(seq):
            moved.append(core.target.length(seq))
            relocate(seq)

        core.target.relocate = spy
    saved = core.prefix.rent_limit
    try:
        other = warm.encode("Something else entirely: " + FILE[::-1][:150])  # nothing shared with the first
        for rent in (None, 60):  # entries stay (nothing moves), then go after 60 fed tokens
            warm.engine.clear_prefix_cache()
            core.prefix.rent_limit = rent if llamacpp else None
            warm.generate(warm.encode(FILE + "Question one?"), GREEDY)
            same(warm.generate(other, GREEDY), cold.generate(other, GREEDY))
            if rent is None:
                assert moved == []
    finally:
        core.prefix.rent_limit = saved
        if llamacpp:
            del core.target.relocate
    assert len(moved) == (1 if llamacpp else 0)
    assert all(n > 0 for n in moved)


def test_n_copies_prefill_once(pair):
    warm, cold = pair
    warm.engine.clear_prefix_cache()
    prompt = warm.encode(FILE + "Summarise the file.")
    fed = prefilled_tokens(warm)
    outs = warm.generate([prompt] * 4, GREEDY)
    expected = cold.generate(prompt, GREEDY)
    for o in outs:
        same(o, expected)
    assert [o.cached_tokens for o in outs] == [0] + [len(prompt) - 1] * 3
    assert fed[0] == len(prompt) - 1  # one prefill for all four
    # a batch with a common system prompt: the shared part is prefilled once too
    prompts = [prompt + warm.encode(q) for q in (" First?", " Second one?", " Third, longer question here?")]
    warm.engine.clear_prefix_cache()
    fed[0] = 0
    outs = warm.generate(prompts, GREEDY)
    for p, o in zip(prompts, outs):
        same(o, cold.generate(p, GREEDY))
    assert fed[0] < 2 * len(prompt)


def test_sampled_choices_fork_from_one_prefill(pair):
    warm, cold = pair
    warm.engine.clear_prefix_cache()
    prompt = warm.encode(FILE + "Write more.")
    params = [SamplingParams(max_tokens=16, temperature=1.0, seed=s) for s in range(3)]
    outs = warm.generate([prompt] * 3, params)
    for p, o in zip(params, outs):
        same(o, cold.generate(prompt, p))
    assert all(o.cached_tokens == len(prompt) - 1 for o in outs[1:])


def test_cancel_the_request_others_share(pair):
    warm, cold = pair
    warm.engine.clear_prefix_cache()
    params = SamplingParams(max_tokens=40)
    prompts = [warm.encode(FILE + q) for q in ("One?", "Two, please?", "Three!")]
    expected = [cold.generate(p, params) for p in prompts]
    cancel = {"now": False}
    gens = [
        warm.stream(p, params, should_cancel=(lambda: cancel["now"]) if i == 0 else None) for i, p in enumerate(prompts)
    ]
    for g in gens:  # request 0 prefills the shared prefix and decodes; 1 and 2 start from its cache
        next(g)
    cancel["now"] = True  # the request whose cells the others share is cancelled
    warm.engine.core.step()
    assert gens[0].output.finish_reason == "abort" and not gens[1].request.finished
    warm.engine.clear_prefix_cache()  # its sequence is freed too, while 1 and 2 still use the shared cells
    for g in gens:
        list(g)
    same(gens[1].output, expected[1])
    same(gens[2].output, expected[2])
    assert gens[1].output.cached_tokens > BLOCK and gens[2].output.cached_tokens > BLOCK
    core = warm.engine.core
    assert core.scheduler.reserved == 0 and not any(o.live for o in core.prefix.owners.values())


def test_cancel_while_others_wait_for_its_prefill(pair, tmp_path):
    cold = pair[1]
    warm = tiny_llm(
        cold.backend_name,
        limits=EngineLimits(max_num_seqs=4, max_num_batched_tokens=64, min_prefill_chunk=16),
        folder=tmp_path,
    )
    prompt = warm.encode(FILE * 2 + "Cancelled before its prefill ends.")
    stop = {"now": False}
    first = warm.request(prompt, GREEDY, should_cancel=lambda: stop["now"])
    others = [warm.request(prompt, GREEDY) for _ in range(2)]
    core = warm.engine.core
    for r in [first] + others:
        core.add(r)
    core.step()  # the first prefills a chunk; the others wait for it
    assert first.phase == "prefill" and all(r.phase == "waiting" for r in others)
    stop["now"] = True
    while not all(r.finished for r in [first] + others):
        core.step()
    expected = cold.generate(prompt, GREEDY)
    assert first.output.finish_reason == "abort"
    for r in others:
        same(r.output, expected)
    assert others[0].output.cached_tokens >= 64 and others[1].output.cached_tokens == len(prompt) - 1


# -- capacity ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["transformers", "llama.cpp"])
def test_eviction_under_pressure(backend, tmp_path):
    limits = EngineLimits(max_num_seqs=2, kv_cache_tokens=300, max_num_batched_tokens=512, min_prefill_chunk=16)
    llm = tiny_llm(backend, limits=limits, entries=8, folder=tmp_path)
    cold = tiny_llm(backend, False, limits=limits, folder=tmp_path)
    core = llm.engine.core
    cap = core.scheduler.cache_tokens
    assert cap == 300
    prompts = [llm.encode(f"Prompt number {i}: " + FILE[:110]) for i in range(12)]  # ~40 tokens each
    params = SamplingParams(max_tokens=16)
    outs = llm.generate(prompts, params)
    for p, o in zip(prompts, outs):
        same(o, cold.generate(p, params))
    assert core.prefix.cells <= cap and 0 < core.prefix.entries < 8  # cells, not entry slots, bound it
    # a request that needs the whole cache joins at once: the entries go, it never waits for them
    head = llm.encode(FILE[:110])
    big = llm.request(head, SamplingParams(max_tokens=cap - len(head)))
    core.add(big)
    core.step()
    assert big.phase in ("prefill", "decode") and core.prefix.entries == 0
    big.should_cancel = lambda: True
    core.step()
    # no leak: the sequences left are the entries' alone; dropping them leaves an empty cache
    assert core.scheduler.reserved == 0 and not core.scheduler.running
    assert core.prefix.entries == 1 and not any(o.live for o in core.prefix.owners.values())
    entries = {o.seq: o.length for o in core.prefix.owners.values()}
    target = core.target
    held = {s: target.length(s) for s in (target._lengths if backend == "llama.cpp" else target._caches)}
    assert held == entries
    if backend == "llama.cpp":
        mem, ll = target._mem, target._ll
        assert {
            s: ll.llama_memory_seq_pos_max(mem, s) + 1
            for s in range(target.max_sequences)
            if ll.llama_memory_seq_pos_max(mem, s) >= 0
        } == entries
    llm.engine.clear_prefix_cache()
    assert not target._lengths
    if backend == "llama.cpp":
        assert all(ll.llama_memory_seq_pos_max(mem, s) == -1 for s in range(target.max_sequences))


# -- a real pack, exact kernels ------------------------------------------------------------------
def test_smollm2_exact_next_turn(smol_gguf):
    def make(prefix_caching):
        backend = LlamaCppBackend(
            smol_gguf, max_context=2048, max_sequences=3, batch_invariant=True, prefix_sequences=2
        )
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(smol_gguf.parent)
        limits = EngineLimits(max_num_seqs=2, prefix_caching=prefix_caching)
        llm = LLM.from_backends(backend, tok, name="smol", limits=limits, eos_token_ids=backend.eog_token_ids())
        llm.engine.use_prices(CostModel(LLAMACPP_2CORE_CURVE))  # auto drafts as on a 2-core CPU, unmeasured
        return llm

    warm, cold = make(True), make(False)
    messages = [{"role": "user", "content": "Explain this code:\n" + FILE}]
    turn1 = warm.apply_chat_template(messages)
    params = SamplingParams(max_tokens=32)
    out1 = warm.generate(turn1, params)
    messages += [{"role": "assistant", "content": out1.text}, {"role": "user", "content": "Shorter, please."}]
    turn2 = warm.apply_chat_template(messages)
    out2 = warm.generate(turn2, params)
    same(out2, cold.generate(turn2, params))
    assert out2.cached_tokens >= len(turn1) - 1


# -- the server ----------------------------------------------------------------------------------
def test_server_reports_cached_tokens(tmp_path):
    target = save_tiny_gguf(tmp_path / "target")
    # one running request, so one entry slot: each finished request's entry pushes out the last
    with ServerProcess(target, "--served-model-name", "tiny", "--exact", "--max-num-seqs", "1", dtype=None) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "Explain this code:\n" + FILE}]
        r1 = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
        assert r1.usage.prompt_tokens_details.cached_tokens == 0
        messages += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "And now?"},
        ]
        r2 = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
        assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1
        chunks = list(
            client.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=16,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1
        client.completions.create(model="tiny", prompt=FILE, max_tokens=4, temperature=0)
        c2 = client.completions.create(model="tiny", prompt=FILE + "more", max_tokens=4, temperature=0)
        assert c2.usage.prompt_tokens_details.cached_tokens > 0
        # the unrelated completions' entry pushed the conversation's out of the cells into host
        # memory, and asking again restores it from there
        r3 = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
        assert r3.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1
        assert r3.choices[0].message.content == chunks_text(chunks)
        health, metrics = settled_views(srv)
        assert health["hits"] >= 4 and health["tokens_saved"] > 0 and health["entries"] >= 1
        assert health["host"]["restores"] >= 1 and health["host"]["bytes"] > 0
        assert metric_value(metrics, "specserve_prompt_tokens_cached_total") == health["tokens_saved"]
        assert metric_value(metrics, "specserve_prefix_cache_cells") > 0  # read when scraped
        assert metric_value(metrics, "specserve_prefix_cache_host_bytes") == health["host"]["bytes"]
        assert metric_value(metrics, "specserve_prefix_cache_host_restored_tokens_total") >= r1.usage.prompt_tokens - 1


def settled_views(srv, tries: int = 50) -> tuple[dict, str]:
    """/health's prefix cache and /metrics read at one settled moment. The engine finishes a
    request's bookkeeping (its entry joins the cache and may push another out to host memory)
    just after the answer has gone back, so a read straight after the answer can see either."""
    for _ in range(tries):
        before = srv.health()["prefix_cache"]
        metrics = srv.metrics()
        if srv.health()["prefix_cache"] == before:
            return before, metrics
        time.sleep(0.1)
    raise AssertionError("the prefix cache never settled")


def chunks_text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# -- the draft model's cache follows the target's ---------------------------------------------
def fed_to(backend) -> list[int]:
    """Counts the tokens `backend` is fed (any logits)."""
    fed = [0]
    forward = backend.forward

    def counting(inputs):
        fed[0] += sum(len(x.token_ids) for x in inputs)
        return forward(inputs)

    backend.forward = counting
    return fed


def draft_pair_llm(backend: str, tmp_path, prefix_caching: bool) -> LLM:
    """A tiny target and draft model (speculation "draft") on `backend`, the prefix cache on or off."""
    limits = EngineLimits(**{**LIMITS.__dict__, "prefix_caching": prefix_caching})
    seqs = limits.max_num_seqs + 1
    if backend == "llama.cpp":
        t, d = (
            LlamaCppBackend(
                write_tiny_gguf(tmp_path / f"{name}-{prefix_caching}.gguf", seed),
                max_sequences=seqs,
                batch_invariant=True,
                prefix_sequences=4,
            )
            for name, seed in (("t", 0), ("d", 1))
        )
    else:
        t, d = (TransformersBackend(tiny_model("qwen2", seed), max_sequences=seqs + 4) for seed in (0, 1))
    return steady_prices(LLM.from_backends(t, tiny_tokenizer(), d, name="tiny", speculation="draft", limits=limits))[0]


@pytest.mark.parametrize("backend", ["transformers", "llama.cpp"])
def test_next_turn_shares_the_draft_models_prefix_too(backend, tmp_path):
    """Turn 2 feeds the draft model only what turn 1 did not give it (engine/draft_prefix.py),
    and its output equals a cold run's; with the prefix cache off the draft model is fed it all."""

    runs = {}
    for caching in (True, False):
        llm = draft_pair_llm(backend, tmp_path, caching)
        turn1 = llm.encode(FILE + "Question one?")
        out1 = llm.generate(turn1, GREEDY)
        turn2 = turn1 + out1.token_ids + llm.encode("\nAnd a follow-up question:")
        fed = fed_to(llm.engine.core.draft)
        out2 = llm.generate(turn2, GREEDY)
        assert out2.stats.by_source["draft"].proposed > 0  # the draft model drafted on turn 2
        runs[caching] = (out2, fed[0], len(turn2))
    (warm, warm_fed, n), (cold, cold_fed, _) = runs[True], runs[False]
    same(warm, cold)
    assert warm.cached_tokens > BLOCK
    assert cold_fed >= n - 1  # without the cache the draft model is fed the whole prompt again
    assert warm_fed < cold_fed - warm.cached_tokens + BLOCK  # with it, the shared prefix is not fed again


@pytest.mark.parametrize("backend", ["transformers", "llama.cpp"])
def test_n_choices_read_the_prompt_into_the_draft_model_once(backend, tmp_path):
    """n > 1 choices start from choice 0's prefill; its draft model reads the prompt only at its
    first proposal, after the others were admitted, so they take its draft prefix then (in the
    same step) instead of each feeding the whole prompt to the draft model again. Greedy and
    seeded sampled choices write what a run without any cache writes."""

    warm, cold = draft_pair_llm(backend, tmp_path, True), draft_pair_llm(backend, tmp_path, False)
    draft = warm.engine.core.draft
    reads, forward = [], draft.forward

    def counting(inputs):  # the draft model's reads of many tokens at once: a prompt
        reads.extend(len(x.token_ids) for x in inputs if len(x.token_ids) >= 2 * BLOCK)
        return forward(inputs)

    warm.engine.core.prices()  # measured beforehand: it feeds the draft model too
    draft.forward = counting
    prompt = warm.encode(FILE + "Summarise the file.")
    for params in (
        [GREEDY] * 3,
        [SamplingParams(max_tokens=16, temperature=1.0, seed=s) for s in range(3)],
    ):
        warm.engine.clear_prefix_cache()
        reads.clear()
        outs = warm.generate([prompt] * 3, params)
        for p, o in zip(params, outs):
            same(o, cold.generate(prompt, p))
        assert all(o.stats.by_source["draft"].proposed > 0 for o in outs)
        assert reads == [len(prompt)]  # once, not once per choice
