"""Sliding-window attention on llama.cpp (Gemma 3: 512 positions), on a tiny random GGUF whose
layers attend over WINDOW positions.

llama.cpp's cache for those layers treats a cell whose position has left its sequence's window as
free: a saved copy of the sequence leaves it out, and the default placement lets any pass
overwrite it. A sequence cut back below its longest length (a prompt sharing only the start of a
cached answer) would then attend over positions that are gone, and answer garbage. The host
tier therefore keeps no copy of a sequence longer than the window, and a prefix is copied from a
sequence only where its cells are known to be whole (`LlamaCppBackend.keeps_prefix`).
"""

from __future__ import annotations

import os
import subprocess
import sys

from test_host_cache import evicted_turns
from test_prefix_cache import GREEDY, LIMITS, same
from tiny import tiny_tokenizer
from tiny_gguf import write_tiny_swa_gguf

from specserve.backends import SeqInput
from specserve.backends.llamacpp import LlamaCppBackend
from specserve.config import EngineLimits
from specserve.llm import LLM

WINDOW = 16


def swa_llm(path, host_cache_bytes: int | None = None) -> LLM:
    limits = EngineLimits(**{**LIMITS.__dict__, "host_cache_bytes": host_cache_bytes})
    target = LlamaCppBackend(path, max_sequences=limits.max_num_seqs + 1, batch_invariant=True, prefix_sequences=4)
    return LLM.from_backends(target, tiny_tokenizer(), name="tiny-swa", limits=limits)


def test_a_branch_of_an_evicted_entry_answers_as_a_cold_run(tmp_path):
    """Turn 1 leaves the cells for the host tier; a prompt sharing its first half is then started
    from the saved copy cut to that half, which lacked every position more than WINDOW before the
    copy's end: the answer was garbage (before 2026-12-04). Now such a copy is never kept."""
    path = write_tiny_swa_gguf(tmp_path / "swa.gguf", WINDOW)
    warm, cold = swa_llm(path), swa_llm(path, host_cache_bytes=0)
    cold.engine.core.prefix = None
    held, _ = evicted_turns(warm)
    branch = held[: len(held) // 2] + warm.encode(" something else entirely")
    assert len(held) // 2 > 2 * WINDOW
    same(warm.generate(branch, GREEDY), cold.generate(branch, GREEDY))
    assert warm.engine.core.host.stats()["entries"] == 0  # turn 1 was longer than the window


def test_a_sequence_within_its_window_is_still_saved(tmp_path):
    b = LlamaCppBackend(write_tiny_swa_gguf(tmp_path / "swa.gguf", WINDOW), max_sequences=2, batch_invariant=True)
    seq = b.new_sequence()
    b.forward([SeqInput(seq, list(range(10, 10 + WINDOW)), "none")])
    assert b.save_sequence(seq) is not None
    b.forward([SeqInput(seq, [40], "none")])
    assert b.save_sequence(seq) is None


FRAGMENTED = r"""
import sys
import numpy as np
from specserve.backends import SeqInput
from specserve.backends.llamacpp import LlamaCppBackend
b = LlamaCppBackend(sys.argv[1], max_context=256, max_sequences=4, cache_tokens=512)
ids = [int(t) for t in np.random.default_rng(1).integers(10, 280, 200)]

def logits(seq, n):
    return b.forward([SeqInput(seq, ids[n : n + 1], "last")])[0][-1].clone()

ref = b.new_sequence()
b.forward([SeqInput(ref, ids[:30], "none")])
want = logits(ref, 30)
b.free_sequence(ref)
low, seq = b.new_sequence(), b.new_sequence()
b.forward([SeqInput(low, ids[:40], "none")])  # cells 0-39
b.forward([SeqInput(seq, ids[:60], "none")])  # cells 40-99
b.free_sequence(low)  # llama.cpp's search starts at cell 0 again
b.forward([SeqInput(seq, ids[60:120], "none")])  # 40 free cells, then 20 of positions 0-19 overwritten
dst = b.new_sequence()
b.copy_prefix(seq, dst, 30)
wrong = bool((logits(dst, 30) != want).any())
print(wrong, b.keeps_prefix(seq, 30), b.keeps_prefix(seq, 120))
"""


def test_the_default_placement_overwrites_cells_that_left_the_window(tmp_path):
    """With llama.cpp's own placement (LLAMA_KV_CELL_ORDER=0, a stock build), a pass takes cells
    whose positions left their sequence's window before free cells above them; a prefix of that
    sequence must not be copied then (the engine prefills it instead)."""
    path = write_tiny_swa_gguf(tmp_path / "swa.gguf", WINDOW)
    env = {**os.environ, "LLAMA_KV_CELL_ORDER": "0", "GGML_CPU_TILED_MM": "0", "GGML_CPU_LLAMAFILE": "0"}
    run = subprocess.run([sys.executable, "-c", FRAGMENTED, str(path)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    wrong, keeps_part, keeps_whole = run.stdout.split()
    assert wrong == "True"  # the copy lacks positions 15-19: its logits differ from a cold run's
    assert keeps_part == "False" and keeps_whole == "True"


# -- transformers ---------------------------------------------------------------------------------
def test_a_sliding_window_model_on_transformers_speculates_and_shares_prefixes():
    """A Hugging Face sliding-window model (Gemma 3, Mistral) got caches whose window layers drop
    what leaves the window: the first rejected draft past it failed the request ("`crop` was
    called, but the current layer does not track past states"). The backend now keeps every
    position; the answers equal transformers' own generate, with and without speculation, and
    from a cached prefix."""
    import torch
    from tiny import SLIDING_WINDOW, tiny_model

    from specserve import SamplingParams
    from specserve.backends.transformers import TransformersBackend

    model, tok = tiny_model("gemma3", layers=4), tiny_tokenizer()

    def llm(speculation: str) -> LLM:
        backend = TransformersBackend(model, max_sequences=LIMITS.max_num_seqs + 1 + 4)  # 4 cached entries
        return LLM.from_backends(backend, tok, name="g", speculation=speculation, limits=LIMITS)

    prompt = tok.encode("def add(a, b):\n    return a + b\n" * 3)
    params = SamplingParams(max_tokens=3 * SLIDING_WINDOW, temperature=0, ignore_eos=True)
    assert len(prompt) > SLIDING_WINDOW
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=params.max_tokens, do_sample=False)
    want = ref[0, len(prompt) :].tolist()
    plain = llm("none").generate(prompt, params)
    assert plain.token_ids == want
    wrong = want[:5] + [want[5] + 1] + want[6:]  # one divergence: a rejection past the window
    pred = llm("prediction").generate(prompt, params, prediction=wrong)
    assert pred.token_ids == want and pred.stats.accepted > 0
    assert llm("ngram").generate(prompt, params).token_ids == want
    cached = llm("none")
    cached.generate(prompt + want, SamplingParams(max_tokens=1, temperature=0))
    again = cached.generate(prompt, params)  # its prompt copied from the longer request's cells
    assert again.cached_tokens > SLIDING_WINDOW and again.token_ids == want
