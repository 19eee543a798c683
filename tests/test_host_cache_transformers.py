"""The prefix cache's host tier on transformers (backends/transformers.py): a sequence's keys and
values copied to host memory come back bit for bit, and the tier's folder on disk is keyed by the
weights, dtype and device.

- The backend: a saved sequence restored under another id, from its own bytes or from a copy
  read back from disk, goes on exactly like one fed the same tokens (f32); a copy from another
  model shape or dtype is refused and leaves the sequence empty.
- The engine: test_host_cache.py runs its tests on both backends.
- The folder: a model loaded from files gets a key of its own per dtype; a model built in
  memory cannot be identified, so the folder is ignored with a warning rather than risk reading
  another model's copies. A restarted engine serves the next turn from the folder.
"""

from __future__ import annotations

import logging

import pytest
import torch
from test_host_cache import served_across_a_restart, transformers_llm
from tiny import tiny_model
from transformers import AutoModelForCausalLM

from specserve.backends import SeqInput
from specserve.backends.base import SavedSequence
from specserve.backends.transformers import TransformersBackend
from specserve.engine.host_store import store_key
from specserve.llm import LLM

IDS = list(range(5, 95))


# -- the backend -------------------------------------------------------------------------------
def test_a_saved_sequence_restores_bit_for_bit():
    b = TransformersBackend(tiny_model("qwen2"), max_sequences=8)
    seq, ref = b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(seq, IDS[:70], "none")])
    b.truncate(seq, 60)  # a rejected draft's rollback leaves the cache a view: saved all the same
    saved = b.save_sequence(seq)
    assert saved.length == 60 and saved.size > 0 and b.length(seq) == 60  # the sequence stays
    b.free_sequence(seq)
    again, from_disk = b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(ref, IDS[:1], "none")])
    with pytest.raises(ValueError):
        b.restore_sequence(ref, saved)  # not empty
    b.truncate(ref, 0)
    assert b.restore_sequence(again, saved) and b.length(again) == 60
    assert b.restore_sequence(from_disk, SavedSequence(bytearray(saved.data), 60))  # host_store reads a bytearray
    (got,) = b.forward([SeqInput(again, IDS[60:], "all")])  # [30, V]
    (got_disk,) = b.forward([SeqInput(from_disk, IDS[60:], "all")])
    b.forward([SeqInput(ref, IDS[:70], "none")])  # the same passes as `seq` (a pass's length sets its rounding)
    b.truncate(ref, 60)
    (want,) = b.forward([SeqInput(ref, IDS[60:], "all")])
    assert torch.equal(got, want) and torch.equal(got_disk, want)
    assert b.save_sequence(b.new_sequence()) is None  # an empty sequence has nothing to save


def test_a_copy_from_another_model_or_a_damaged_file_is_refused():
    b = TransformersBackend(tiny_model("qwen2"), max_sequences=4)
    deeper = TransformersBackend(tiny_model("qwen2", layers=3), max_sequences=4)
    f64 = TransformersBackend(tiny_model("qwen2").to(torch.float64), max_sequences=4)
    for other in (deeper, f64):
        seq = other.new_sequence()
        other.forward([SeqInput(seq, IDS[:20], "none")])
        dst = b.new_sequence()
        assert not b.restore_sequence(dst, other.save_sequence(seq))
        assert b.length(dst) == 0
        b.forward([SeqInput(dst, IDS[:4], "none")])  # still usable: nothing half restored
        b.free_sequence(dst)
    dst = b.new_sequence()
    assert not b.restore_sequence(dst, SavedSequence(bytearray(b"not a copy at all"), 3))  # a damaged file
    assert b.length(dst) == 0


# -- the folder ------------------------------------------------------------------------------------
def saved_model(folder) -> str:
    tiny_model("qwen2").save_pretrained(folder)
    return str(folder)


def test_the_folder_key_follows_the_weights_and_dtype(tmp_path):
    path = saved_model(tmp_path / "m")

    def key(dtype=torch.float32):
        return store_key(TransformersBackend(AutoModelForCausalLM.from_pretrained(path, dtype=dtype)))

    assert key() is not None and key() == key()
    assert key(torch.bfloat16) != key()
    assert store_key(TransformersBackend(tiny_model("qwen2"))) is None  # built in memory: no files say what it is


def test_a_model_built_in_memory_ignores_the_folder(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="specserve.engine"):
        llm = transformers_llm(host_cache_dir=str(tmp_path / "kv"))
    assert llm.engine.core.host is not None and llm.engine.core.host_store is None
    assert "host cache folder ignored" in caplog.text
    assert llm.engine.save_prefix_cache() is None and not (tmp_path / "kv").exists()


def test_a_restarted_engine_serves_the_next_turn_from_disk(tmp_path):
    path, folder = saved_model(tmp_path / "m"), str(tmp_path / "kv")

    def start(host_cache_dir=folder) -> LLM:
        return transformers_llm(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), None, host_cache_dir)

    written, _, _ = served_across_a_restart(start)
    assert len(written) == 1
