"""`gguf_read_once`: while transformers loads a GGUF, the file is parsed once (by a reader that
gives what gguf's own gives), its metadata is parsed once, and gguf's tensor name map is built
once per (arch, layers); outside the block gguf and transformers are untouched."""

from __future__ import annotations

import os

import gguf
import numpy as np
from transformers import modeling_gguf_pytorch_utils as hf_gguf

from specserve.models.gguf_reads import FastGGUFReader, gguf_read_once


def _tiny_gguf(path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_token_list(["<s>", "a", "b", "ab"])
    w.add_token_scores([0.0, -1.0, -2.0, -3.0])
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_one_reader_per_file_inside_the_block_and_gguf_restored_after(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _tiny_gguf(a)
    _tiny_gguf(b)
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_read_once():
        first = gguf.GGUFReader(str(a))
        assert gguf.GGUFReader(a) is first  # the same file, however it is named
        assert gguf.GGUFReader(str(b)) is not first
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert gguf.GGUFReader is reader_cls and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(str(a)) is not gguf.GGUFReader(str(a))


def test_a_rewritten_file_is_read_again(tmp_path):
    a = tmp_path / "a.gguf"
    _tiny_gguf(a)
    with gguf_read_once():
        first = gguf.GGUFReader(str(a))
        a.unlink()
        _tiny_gguf(a)
        os.utime(a, ns=(1, 1))  # a different mtime, as a rewrite has
        assert gguf.GGUFReader(str(a)) is not first


def test_the_fast_reader_reads_what_gguf_reads(tmp_path):
    a = tmp_path / "a.gguf"
    _tiny_gguf(a)
    stock, fast = gguf.GGUFReader(str(a)), FastGGUFReader(str(a))
    assert type(fast.data) is np.ndarray  # not the memmap subclass whose slicing is slow
    assert list(stock.fields) == list(fast.fields)
    for name, field in stock.fields.items():
        other = fast.fields[name]
        assert (field.data, field.types) == (other.data, other.types), name
        assert all(np.array_equal(x, y) for x, y in zip(field.parts, other.parts, strict=True)), name
    assert [(t.name, t.data.tobytes()) for t in stock.tensors] == [(t.name, t.data.tobytes()) for t in fast.tensors]


def test_metadata_is_parsed_once_and_handed_out_as_copies(tmp_path, monkeypatch):
    a = tmp_path / "a.gguf"
    _tiny_gguf(a)
    calls = []

    def load(path, return_tensors=False, model_to_load=None, torch_dtype=None):
        calls.append(return_tensors)
        return {"config": {"layers": 1}, "tensors": ["w"] if return_tensors else None}

    monkeypatch.setattr(hf_gguf, "load_gguf_checkpoint", load)
    with gguf_read_once():
        first = hf_gguf.load_gguf_checkpoint(str(a), return_tensors=False)
        first["config"]["layers"] = 99  # transformers edits the dicts it gets
        assert hf_gguf.load_gguf_checkpoint(str(a))["config"] == {"layers": 1}
        assert hf_gguf.load_gguf_checkpoint(str(a), return_tensors=True)["tensors"] == ["w"]  # weights: not memoized
    assert calls == [False, True]
    assert hf_gguf.load_gguf_checkpoint is load
